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
import io
import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from symfusion.data.text.corpora import gensim_test_file
from symfusion.data.text.hub import (CONLL2003_TAGS, GOEMOTIONS_NAMES, HUB_TEXT_PRESETS, ONTONOTES_DOMAINS,
                                     ONTONOTES_TAGS)
from symfusion.errors import SymfusionError

SCHEMA = 1
MARKER = ".symfusion-standins"
MANIFEST = "manifest.json"
DEFAULT_OUTPUT = ".cache/symfusion/standins"
ROWS = {"train": 48, "validation": 24, "test": 24}        # text rows (or sentences) per split
IMAGE_ROWS = {"train": 120, "test": 40}                     # CIFAR-10 has no validation split

# ---------------------------------------------------------------------------------------------- models
# FacebookAI/roberta-base config.json (docs/data_card.md): flags kept, sizes scaled (real: 768, 12, 12, 3072, 50265).
ROBERTA_CONFIG = dict(architectures=["RobertaForMaskedLM"], attention_probs_dropout_prob=0.1, bos_token_id=0,
                      eos_token_id=2, hidden_act="gelu", hidden_dropout_prob=0.1, initializer_range=0.02,
                      layer_norm_eps=1e-05, max_position_embeddings=514, model_type="roberta", pad_token_id=1,
                      type_vocab_size=1)
ROBERTA_SIZE = dict(hidden_size=48, num_hidden_layers=4, num_attention_heads=12, intermediate_size=192)
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]         # ids 0-3; <mask> is the last id, as in roberta-base
# microsoft/DeBERTa experiments/language_model/rtd_large.json, the DeBERTa-v3-large discriminator (docs/data_card.md):
# every flag kept, sizes scaled (real: 1024 hidden, 24 layers, 16 heads of 64, 4096, vocab 128000 pieces + 100).
DEBERTA_CONFIG = dict(model_type="deberta-v2", attention_probs_dropout_prob=0.1, hidden_act="gelu",
                      hidden_dropout_prob=0.1, initializer_range=0.02, max_position_embeddings=512,
                      relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                      pos_att_type="p2c|c2p", layer_norm_eps=1e-7, max_relative_positions=-1,
                      position_biased_input=False, type_vocab_size=0)
DEBERTA_SIZE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=16, attention_head_size=4,
                    intermediate_size=256)
DEBERTA_EXTRA_VOCAB = 100      # DeBERTa-v3: 128,000 SentencePiece pieces, vocab_size 128,100 ([MASK] is id 128,000)
DEBERTA_TOKENIZER_CONFIG = {"do_lower_case": False, "vocab_type": "spm"}
TOKENIZER_VOCAB = 1000         # pieces / BPE tokens before the special tokens are added

MODELS = {   # conf/model name -> the Hub spec it stands in for
    "roberta_base": "hub:FacebookAI/roberta-base",
    "deberta_v3_large": "hub:microsoft/deberta-v3-large",
}

# ---------------------------------------------------------------------------------------------- datasets
ONTONOTES_POS = ["XX", "``", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "ADD", "AFX", "CC", "CD", "DT", "EX", "FW",
                 "HYPH", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NFP", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP",
                 "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT",
                 "WP", "WP$", "WRB"]                                                    # english_v4: 49 tags
CONLL2003_POS = ['"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
                 "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$", "RB", "RBR",
                 "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB"]
CONLL2003_CHUNKS = ["O"] + [f"{p}-{t}" for t in ("ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR",
                                                 "UCP", "VP") for p in ("B", "I")]
DAILYDIALOG_ACTS = ["__dummy__", "inform", "question", "directive", "commissive"]
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# OntoNotes document ids are <genre>/<source>/<nn>/<name> (e.g. bc/cctv/00/cctv_0001); one source per genre here
ONTONOTES_SOURCES = {"bc": "cctv", "bn": "cnn", "mz": "sinorama", "nw": "wsj", "tc": "ch", "wb": "eng"}
ONTONOTES_DOCUMENTS = {"train": 3, "validation": 2, "test": 2}     # per genre; 8 sentences each

HUB_DATASETS = {   # Hub id -> (local folder name, what the folder holds)
    "dair-ai/emotion": "dair-ai__emotion",
    "cardiffnlp/tweet_eval": "cardiffnlp__tweet_eval",
    "google-research-datasets/go_emotions": "google-research-datasets__go_emotions",
    "li2017dailydialog/daily_dialog": "li2017dailydialog__daily_dialog",
    "ontonotes/conll2012_ontonotesv5": "ontonotes__conll2012_ontonotesv5",
    "eriktks/conll2003": "eriktks__conll2003",
    "nyu-mll/glue": "nyu-mll__glue",
    "uoft-cs/cifar10": "uoft-cs__cifar10",
}
TASKS = {   # conf/task name of the paper profile -> the Hub dataset it reads
    "emo_dair": "dair-ai/emotion", "emo_tweeteval": "cardiffnlp/tweet_eval",
    "emo_goemotions": "google-research-datasets/go_emotions", "emo_dailydialog": "li2017dailydialog/daily_dialog",
    **{f"onto_{d}": "ontonotes/conll2012_ontonotesv5" for d in ONTONOTES_DOMAINS},
    "conll2003": "eriktks/conll2003", "glue_cola": "nyu-mll/glue", "glue_stsb": "nyu-mll/glue",
    "cifar10": "uoft-cs/cifar10",
}


# ---------------------------------------------------------------------------------------------- local text

def corpus_sentences() -> list[str]:
    """Sentences of gensim's Lee background corpus (300 Australian news articles, read as latin-1)."""
    path = gensim_test_file("lee_background.cor")
    lines = [" ".join(line.decode("latin-1").split()) for line in path.read_bytes().splitlines() if line.strip()]
    sentences = [s for line in lines for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", line)]
    return [s for s in sentences if 4 <= len(s.split()) <= 40]


def words_of(sentence: str) -> list[str]:
    """Whitespace words with trailing punctuation split off (CoNLL-style tokens)."""
    return [piece for word in sentence.split() for piece in re.findall(r"[\w'&$%-]+|[^\w\s]", word)]


def random_bio(rng: random.Random, length: int, types: list[str], rate: float = 0.2) -> list[str]:
    """A valid IOB2 tag sequence: entities of 1-3 tokens of random types, O elsewhere."""
    tags, i = [], 0
    while i < length:
        if rng.random() < rate:
            kind, span = rng.choice(types), rng.randint(1, 3)
            span = min(span, length - i)
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (span - 1)
            i += span
        else:
            tags.append("O")
            i += 1
    return tags


def _entity_types(names: list[str]) -> list[str]:
    return sorted({name[2:] for name in names if name.startswith("B-")})


# ---------------------------------------------------------------------------------------------- writers

def _features(spec: dict):
    import datasets

    return datasets.Features(spec)


def _write_parquet(path: Path, rows: list[dict], features) -> None:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {name: [row[name] for row in rows] for name in features}
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))


def _write_card(folder: Path, hub_id: str, configs: list[tuple[str, list[str], bool]], note: str) -> None:
    """README.md with the Hub card's `configs:` block: (config name, its splits, default?) -> <config>/<split>-*."""
    lines = ["---", "configs:"]
    for name, splits, default in configs:
        lines += [f"- config_name: {name}", "  data_files:"]
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
        if default:
            lines.append("  default: true")
    lines += ["---", f"# Stand-in for {hub_id}", "", note, ""]
    (folder / "README.md").write_text("\n".join(lines))


class _Text:
    """Seeded draws of corpus sentences."""

    def __init__(self, sentences: list[str], seed: int):
        self.sentences, self.rng = sentences, random.Random(seed)

    def sentence(self) -> str:
        return self.rng.choice(self.sentences)


def write_dair_emotion(folder: Path, text: _Text) -> None:
    features = _features({"text": _value("string"), "label": _class_label(HUB_TEXT_PRESETS["emotion_dair"]["source_label_names"])})
    for split, n in ROWS.items():
        rows = [{"text": text.sentence().lower(), "label": text.rng.randrange(6)} for _ in range(n)]
        _write_parquet(folder / "split" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "dair-ai/emotion", [("split", list(ROWS), True)], "Config `split` only (the real repository also has `unsplit`).")


def write_tweet_eval(folder: Path, text: _Text) -> None:
    names = HUB_TEXT_PRESETS["emotion_tweeteval"]["source_label_names"]
    features = _features({"text": _value("string"), "label": _class_label(names)})
    for split, n in ROWS.items():
        rows = [{"text": text.sentence(), "label": text.rng.randrange(len(names))} for _ in range(n)]
        _write_parquet(folder / "emotion" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "cardiffnlp/tweet_eval", [("emotion", list(ROWS), False)],
                "Config `emotion` only (the real repository has one config per TweetEval task).")


def write_go_emotions(folder: Path, text: _Text) -> None:
    import datasets

    features = _features({"text": _value("string"), "labels": datasets.List(_class_label(GOEMOTIONS_NAMES)),
                          "id": _value("string")})
    for split, n in ROWS.items():
        rows = []
        for _ in range(n):
            count = 1 if text.rng.random() < 0.8 else text.rng.randint(2, 3)      # most comments carry one label
            labels = sorted(text.rng.sample(range(len(GOEMOTIONS_NAMES)), count))
            rows.append({"text": text.sentence(), "labels": labels,
                         "id": "".join(text.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(7))})
        _write_parquet(folder / "simplified" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "google-research-datasets/go_emotions", [("simplified", list(ROWS), True)],
                "Config `simplified` only (the real repository also has `raw`).")


def write_daily_dialog(folder: Path, text: _Text) -> None:
    """The Parquet export layout (refs/convert/parquet): default/<split>/0000.parquet."""
    import datasets

    emotions = HUB_TEXT_PRESETS["emotion_dailydialog"]["source_label_names"]
    features = _features({"dialog": datasets.List(_value("string")), "act": datasets.List(_class_label(DAILYDIALOG_ACTS)),
                          "emotion": datasets.List(_class_label(emotions))})
    for split, n in ROWS.items():
        rows, utterances = [], 0
        while utterances < n:
            turns = text.rng.randint(2, 6)
            rows.append({"dialog": [text.sentence() for _ in range(turns)],
                         "act": [text.rng.randint(1, 4) for _ in range(turns)],          # 0 (__dummy__) never occurs
                         "emotion": [0 if text.rng.random() < 0.5 else text.rng.randrange(7) for _ in range(turns)]})
            utterances += turns
        _write_parquet(folder / "default" / split / "0000.parquet", rows, features)


def _ontonotes_sentence(text: _Text, part_id: int) -> dict:
    rng, words = text.rng, words_of(text.sentence())
    n = len(words)
    pos = [rng.randrange(len(ONTONOTES_POS)) for _ in range(n)]
    verb = rng.randrange(n)
    lemmas = [words[i].lower() if i == verb else None for i in range(n)]
    frames = ["B-V" if i == verb else "O" for i in range(n)]
    tree = "(TOP (S " + " ".join(f"({ONTONOTES_POS[p]} {w})" for p, w in zip(pos, words)) + "))"
    start = rng.randrange(n)
    return {"part_id": part_id, "words": words, "pos_tags": pos, "parse_tree": tree, "predicate_lemmas": lemmas,
            "predicate_framenet_ids": ["01" if i == verb else None for i in range(n)],
            "word_senses": [1.0 if i == verb else None for i in range(n)], "speaker": "-",
            "named_entities": [ONTONOTES_TAGS.index(t) for t in random_bio(rng, n, _entity_types(ONTONOTES_TAGS))],
            "srl_frames": [{"verb": words[verb], "frames": frames}],
            "coref_spans": [[rng.randrange(5), start, min(n - 1, start + rng.randint(0, 2))]]}


def write_ontonotes(folder: Path, text: _Text) -> None:
    """The Parquet export layout: english_v4/<split>/0000.parquet; documents of every genre, 8 sentences each."""
    import datasets

    sentence = {"part_id": _value("int32"), "words": datasets.List(_value("string")),
                "pos_tags": datasets.List(_class_label(ONTONOTES_POS)), "parse_tree": _value("string"),
                "predicate_lemmas": datasets.List(_value("string")),
                "predicate_framenet_ids": datasets.List(_value("string")),
                "word_senses": datasets.List(_value("float32")), "speaker": _value("string"),
                "named_entities": datasets.List(_class_label(ONTONOTES_TAGS)),
                "srl_frames": datasets.List({"verb": _value("string"), "frames": datasets.List(_value("string"))}),
                "coref_spans": datasets.List(datasets.List(_value("int32"), length=3))}
    features = _features({"document_id": _value("string"), "sentences": datasets.List(sentence)})
    number = 0
    for split, documents in ONTONOTES_DOCUMENTS.items():
        rows = []
        for genre in ONTONOTES_DOMAINS:
            source = ONTONOTES_SOURCES[genre]
            for _ in range(documents):
                rows.append({"document_id": f"{genre}/{source}/00/{source}_{number:04d}",
                             "sentences": [_ontonotes_sentence(text, k) for k in range(8)]})
                number += 1
        _write_parquet(folder / "english_v4" / split / "0000.parquet", rows, features)


def write_conll2003(folder: Path, text: _Text) -> None:
    """The Parquet export layout: conll2003/<split>/0000.parquet."""
    import datasets

    features = _features({"id": _value("string"), "tokens": datasets.List(_value("string")),
                          "pos_tags": datasets.List(_class_label(CONLL2003_POS)),
                          "chunk_tags": datasets.List(_class_label(CONLL2003_CHUNKS)),
                          "ner_tags": datasets.List(_class_label(CONLL2003_TAGS))})
    for split, n in ROWS.items():
        rows = []
        for i in range(n):
            tokens, rng = words_of(text.sentence()), text.rng
            rows.append({"id": str(i), "tokens": tokens, "pos_tags": [rng.randrange(len(CONLL2003_POS)) for _ in tokens],
                         "chunk_tags": [rng.randrange(len(CONLL2003_CHUNKS)) for _ in tokens],
                         "ner_tags": [CONLL2003_TAGS.index(t) for t in random_bio(rng, len(tokens), _entity_types(CONLL2003_TAGS))]})
        _write_parquet(folder / "conll2003" / split / "0000.parquet", rows, features)


def write_glue(folder: Path, text: _Text) -> None:
    """Configs cola and stsb; GLUE's test labels are hidden (-1)."""
    cola = _features({"sentence": _value("string"), "label": _class_label(["unacceptable", "acceptable"]),
                      "idx": _value("int32")})
    stsb = _features({"sentence1": _value("string"), "sentence2": _value("string"), "label": _value("float32"),
                      "idx": _value("int32")})
    for split, n in ROWS.items():
        hidden = split == "test"
        _write_parquet(folder / "cola" / f"{split}-00000-of-00001.parquet",
                       [{"sentence": text.sentence(), "label": -1 if hidden else text.rng.randrange(2), "idx": i}
                        for i in range(n)], cola)
        _write_parquet(folder / "stsb" / f"{split}-00000-of-00001.parquet",
                       [{"sentence1": text.sentence(), "sentence2": text.sentence(),
                         "label": -1.0 if hidden else round(text.rng.uniform(0, 5), 2), "idx": i} for i in range(n)], stsb)
    _write_card(folder, "nyu-mll/glue", [("cola", list(ROWS), False), ("stsb", list(ROWS), False)],
                "Configs `cola` and `stsb` only (the real repository has one config per GLUE task).")


def write_cifar10(folder: Path, seed: int) -> None:
    import datasets
    from PIL import Image

    features = _features({"img": datasets.Image(), "label": _class_label(CIFAR10_NAMES)})
    rng = np.random.default_rng(seed)
    for split, n in IMAGE_ROWS.items():
        pixels = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        rows = [{"img": Image.fromarray(image), "label": int(label)}
                for image, label in zip(pixels, rng.integers(0, 10, n))]
        _write_parquet(folder / "plain_text" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "uoft-cs/cifar10", [("plain_text", list(IMAGE_ROWS), True)], "32x32 RGB noise, random labels.")


def _value(dtype: str):
    import datasets

    return datasets.Value(dtype)


def _class_label(names: list[str]):
    import datasets

    return datasets.ClassLabel(names=list(names))


DATASET_WRITERS = {
    "dair-ai/emotion": write_dair_emotion, "cardiffnlp/tweet_eval": write_tweet_eval,
    "google-research-datasets/go_emotions": write_go_emotions, "li2017dailydialog/daily_dialog": write_daily_dialog,
    "ontonotes/conll2012_ontonotesv5": write_ontonotes, "eriktks/conll2003": write_conll2003, "nyu-mll/glue": write_glue,
}


# ---------------------------------------------------------------------------------------------- tokenizers and models

def train_bpe(sentences: list[str], folder: Path):
    """A byte-level BPE (RoBERTa's kind) on the sentences: vocab.json, merges.txt, tokenizer.json, tokenizer_config.json."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(sentences, vocab_size=TOKENIZER_VOCAB, min_frequency=2, special_tokens=ROBERTA_SPECIALS,
                            show_progress=False)
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    merges = [tuple(line.split(" ")) for line in (folder / "merges.txt").read_text().splitlines()[1:] if line]
    tokenizer = transformers.RobertaTokenizer(vocab=vocab, merges=merges)      # adds <mask> as the last id
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def train_spm(sentences: list[str], folder: Path) -> int:
    """A SentencePiece unigram model (DeBERTa-v3's kind: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3) as spm.model; its size."""
    try:
        import sentencepiece
    except ImportError as error:
        raise SymfusionError("the DeBERTa-v3 stand-in needs sentencepiece: pip install sentencepiece protobuf") from error
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=TOKENIZER_VOCAB, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", character_coverage=1.0, num_threads=1, minloglevel=2)
    (folder / "spm.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(DEBERTA_TOKENIZER_CONFIG) + "\n")
    return TOKENIZER_VOCAB


def write_roberta(folder: Path, sentences: list[str], seed: int) -> None:
    import torch
    import transformers

    folder.mkdir(parents=True)
    tokenizer = train_bpe(sentences, folder)
    config = transformers.RobertaConfig(vocab_size=len(tokenizer), **ROBERTA_SIZE,
                                        **{k: v for k, v in ROBERTA_CONFIG.items() if k != "model_type"})
    torch.manual_seed(seed)
    transformers.RobertaForMaskedLM(config).save_pretrained(str(folder))


def write_deberta(folder: Path, sentences: list[str], seed: int) -> None:
    import torch
    import transformers

    folder.mkdir(parents=True)
    pieces = train_spm(sentences, folder)
    config = {**DEBERTA_CONFIG, **DEBERTA_SIZE, "vocab_size": pieces + DEBERTA_EXTRA_VOCAB}
    torch.manual_seed(seed)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**{k: v for k, v in config.items() if k != "model_type"}))
    model.save_pretrained(str(folder))
    # the real config.json: the flags above, no `architectures` (rtd_large.json's discriminator has none)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


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
        (tmp / MARKER).write_text("made by scripts/make_standins.py (symfusion.standins); safe to delete\n")
        sentences = corpus_sentences()
        write_roberta(tmp / "models" / "roberta_base", sentences, seed)
        write_deberta(tmp / "models" / "deberta_v3_large", sentences, seed)
        for number, (hub_id, writer) in enumerate(DATASET_WRITERS.items()):
            writer(tmp / "datasets" / HUB_DATASETS[hub_id], _Text(sentences, seed * 1000 + number))
        write_cifar10(tmp / "datasets" / HUB_DATASETS["uoft-cs/cifar10"], seed)
        manifest = _manifest(output, seed, _file_hashes(tmp))
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        old = None
        if output.exists():
            old = output.parent / f".{output.name}.old-{os.getpid()}"
            os.replace(output, old)
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
