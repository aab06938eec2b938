"""Stand-ins for the paper profile's Hub models and datasets: tiny random models of the real classes and small local Parquet folders of the real schemas.

The rehearsal profile runs the paper profile's experiment lists on CPU with no Hub access. Each stand-in
differs from the real thing only in size and in where the files come from:

- models (models/<conf name>/): save_pretrained folders (safetensors) of the real classes and config flags
  (RobertaConfig as FacebookAI/roberta-base's config.json, DebertaV2Config with DeBERTa-v3-large's
  relative-attention settings), sizes scaled down, random weights (seeded), with tokenizers of the real
  kinds trained offline on gensim's Lee background corpus: a byte-level BPE (vocab.json, merges.txt,
  tokenizer.json: loaded by AutoTokenizer as RobertaTokenizer) and a SentencePiece unigram spm.model with
  tokenizer_config.json {"do_lower_case": false, "vocab_type": "spm"} and no tokenizer.json, as in the
  real repository (AutoTokenizer converts it to DebertaV2Tokenizer);
- datasets (datasets/<hub id with / as __>/): the file layout of the Hub repository or its Parquet export
  (a README.md `configs:` block where the Hub card has one, <config>/<split>/0000.parquet for
  refs/convert/parquet), the real columns, feature types, ClassLabel names and split names; text from the
  Lee corpus, labels random but valid, a few dozen rows per split.

The real schemas and their sources: docs/data_card.md ("Stand-ins"). `build_standins` writes everything
plus manifest.json, the one mapping a profile consumes: conf/model name -> {"base_model": folder} and
conf/task name -> {"options": {"dataset": folder}} (every other option of the task, its preset included,
stays as in the paper profile). Deterministic (seeded), idempotent (an up-to-date folder is left alone),
and it writes only into its output folder, which must be new, empty, or made by it (marker file).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.pipeline.data.standins.datasets import (DATASET_WRITERS, HUB_DATASETS, IMAGE_ROWS, ONTONOTES_DOCUMENTS,
                                                       ROWS, TASKS, _Text, corpus_sentences, random_bio, write_cifar10)
from symfusion.pipeline.data.standins.models import (DEBERTA_CONFIG, DEBERTA_SIZE, MODELS, ROBERTA_CONFIG, ROBERTA_SIZE,
                                                     TOKENIZER_VOCAB, write_deberta, write_roberta)

SCHEMA = 1
MARKER = ".symfusion-standins"
MANIFEST = "manifest.json"
DEFAULT_OUTPUT = ".cache/symfusion/standins"

# ---------------------------------------------------------------------------------------------- the folder

def fingerprint(seed: int) -> dict:
    """What determines the output: schema, seed, sizes and the versions of the libraries that write it."""
    from importlib.metadata import version

    libraries = {name: version(name) for name in ("transformers", "tokenizers", "datasets", "sentencepiece",
                                                  "safetensors", "pyarrow", "torch")}
    sizes = {"rows": ROWS, "image_rows": IMAGE_ROWS, "roberta": ROBERTA_SIZE, "deberta": DEBERTA_SIZE,
             "tokenizer_vocab": TOKENIZER_VOCAB, "ontonotes_documents": ONTONOTES_DOCUMENTS}
    return {"schema": SCHEMA, "seed": seed, "sizes": sizes, "libraries": libraries}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _file_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): _sha256(p) for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (MANIFEST, MARKER)}


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise SymfusionError(f"{output} is a file; give make_standins a folder")
    if output.is_dir() and any(output.iterdir()) and not (output / MARKER).is_file():
        raise SymfusionError(f"refusing to write into {output}: it is not empty and was not made by make_standins "
                             f"(no {MARKER} marker); give a new or empty folder")


def _up_to_date(output: Path, expected: dict) -> bool:
    try:
        manifest = json.loads((output / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("fingerprint") == expected and manifest.get("files") == _file_hashes(output)


def _manifest(output: Path, seed: int, hashes: dict) -> dict:
    root = output.resolve()
    datasets = {hub_id: str(root / "datasets" / name) for hub_id, name in HUB_DATASETS.items()}
    return {
        "fingerprint": fingerprint(seed),
        "models": {name: {"base_model": str(root / "models" / name)} for name in MODELS},
        "tasks": {task: {"options": {"dataset": datasets[hub_id]}} for task, hub_id in TASKS.items()},
        "vision_model": "vit_rehearsal",
        "stands_in_for": {"models": dict(MODELS), "datasets": datasets},
        "files": hashes,
    }


def build_standins(output: str | Path = DEFAULT_OUTPUT, seed: int = 0) -> dict:
    """Write every stand-in and manifest.json under `output` (left alone when up to date); the manifest."""
    output = Path(output)
    _check_output(output)
    expected = fingerprint(seed)
    if _up_to_date(output, expected):
        return json.loads((output / MANIFEST).read_text())
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        (tmp / MARKER).write_text("made by scripts/make_standins.py (symfusion.pipeline.data.standins); safe to delete\n")
        sentences = corpus_sentences()
        write_roberta(tmp / "models" / "roberta_base", sentences, seed)
        write_deberta(tmp / "models" / "deberta_v3_large", sentences, seed)
        for number, (hub_id, writer) in enumerate(DATASET_WRITERS.items()):
            writer(tmp / "datasets" / HUB_DATASETS[hub_id], _Text(sentences, seed * 1000 + number))
        write_cifar10(tmp / "datasets" / HUB_DATASETS["uoft-cs/cifar10"], seed)
        manifest = _manifest(output, seed, _file_hashes(tmp))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        old = None
        if output.exists():              # moved aside into a new folder of its own (never over a planted name)
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, old / "old")
        os.replace(tmp, output)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def load_manifest(output: str | Path = DEFAULT_OUTPUT) -> dict:
    """The manifest of a stand-in folder made by build_standins (one actionable line when missing)."""
    path = Path(output) / MANIFEST
    if not (Path(output) / MARKER).is_file() or not path.is_file():
        raise SymfusionError(f"{output} holds no stand-ins; run `python scripts/make_standins.py {output}` first")
    manifest = json.loads(path.read_text())
    if manifest.get("fingerprint", {}).get("schema") != SCHEMA:
        raise SymfusionError(f"{path} was written by another version of make_standins; run it again")
    return manifest


__all__ = ["build_standins", "load_manifest", "corpus_sentences", "random_bio", "MODELS", "TASKS", "HUB_DATASETS",
           "MANIFEST", "MARKER", "DEFAULT_OUTPUT", "ROBERTA_CONFIG", "DEBERTA_CONFIG"]
