"""Model folders: strict loading (safetensors only, every tensor present, files inside the folder), saving, JSON.

Input folders are read as data: a file is read or copied only if it really lives inside the folder
(no symbolic link leading out of it); weights are read only from safetensors (a pickle-only folder
is refused with how to convert it); every tensor the architecture expects must be in the checkpoint
with its shape and a floating dtype where the model has one (nothing is initialised at random);
config.json must parse; every weight must be finite. Which file a folder's name points to is decided
by symfusion.io.folder (plain names inside the folder). Every failure is one SymfusionError line.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion
from transformers.models.auto import modeling_auto

from symfusion.arch import check_finite
from symfusion.errors import SymfusionError
from symfusion.families import FAMILIES, family_of
from symfusion.io.folder import FLOAT_DTYPES, first_line, inside, model_file, read_json, shard_header, weight_map

transformers.utils.logging.disable_progress_bar()   # stage logs stay readable
transformers.utils.logging.set_verbosity_error()    # load reports are turned into our own one-line errors

# Files a model folder carries beside weights and config (tokenizers, chat templates, image processors).
AUXILIARY_PATTERNS = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                      "chat_template*", "preprocessor_config.json", "*.model", "sentencepiece*")


def compute_device() -> torch.device:
    """The GPU when one is visible (SLURM pins one per job via CUDA_VISIBLE_DEVICES), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch dict with its tensors on `device`."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


# The auto classes whose model a folder may hold when its config's `architectures` names no class transformers knows.
HEAD_MAPPINGS = ("MODEL_MAPPING_NAMES", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
                 "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
                 "MODEL_FOR_MASKED_LM_MAPPING_NAMES", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES")


def model_class(config, keys=None):
    """The transformers class a checkpoint was saved from: the one its config's architectures names; else, given the
    checkpoint's tensor names `keys`, the class of its model type whose parameters are exactly those (a head the
    config does not name is still the model's: a final check must see it); else AutoModel (the bare body)."""
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    if keys:
        keys = set(keys)
        for mapping in HEAD_MAPPINGS:
            cls = getattr(transformers, getattr(modeling_auto, mapping).get(config.model_type, ""), None)
            if cls is not None and _holds_exactly(skeleton_of(config, cls=cls), keys):
                return cls
    return transformers.AutoModel


def skeleton_of(config, path: str | Path | None = None, cls=None) -> torch.nn.Module:
    """The model `cls` (default: model_class) of a config built on the meta device (its structure and names, no
    memory), or a one-line error naming the folder `path` when given."""
    cls = cls or model_class(config)
    try:
        with torch.device("meta"):
            return cls.from_config(config) if cls is transformers.AutoModel else cls(config)
    except Exception as error:  # noqa: BLE001 - a config that transformers cannot build is a bad input
        where = f"{path}/config.json" if path is not None else f"config.json ({getattr(config, 'model_type', '?')})"
        raise SymfusionError(f"{where} does not describe a model transformers can build ({first_line(error)}); "
                             "re-export the model") from error


def file_names(model: torch.nn.Module) -> tuple[dict, set]:
    """(the model's state dict, its parameters' names (a tied one once)) under the names its checkpoint files use
    (transformers renames some families' tensors on load: ViT's attention.attention.query -> attention.q_proj)."""
    state = revert_weight_conversion(model, dict(model.state_dict()))
    return state, set(revert_weight_conversion(model, dict(model.named_parameters())))


def _holds_exactly(model: torch.nn.Module, keys: set) -> bool:
    """Whether `keys` are the model's own tensor names: every parameter (a tied one once), nothing else."""
    state, parameters = file_names(model)
    return keys <= set(state) and parameters <= keys


# ---------------------------------------------------------------- reading a folder as data

def check_model_folder(path: str | Path) -> Path:
    """A folder holding config.json whose every file, at any depth, lives inside it and is a regular file or a
    folder (transformers opens tokenizer files, chat templates and their subfolders by name: none may lead out
    of the folder or block a read, as a FIFO or a device would); a one-line error otherwise."""
    path = Path(path)
    if not path.is_dir() or not os.path.lexists(path / "config.json"):
        raise SymfusionError(f"{path} is not a model folder (no config.json); pass a save_pretrained directory")
    model_file(path, "config.json")
    failed = []
    for top, folders, files in os.walk(path, onerror=failed.append):     # links to folders: listed, not entered
        for item in (Path(top) / name for name in folders + files):
            if item.is_symlink() and not inside(path, item):
                raise SymfusionError(f"{item} is a link to {os.path.realpath(item)}, outside the model folder; "
                                     "copy the real files into the folder (input folders are read as data)")
            if not (item.is_file() or item.is_dir()):
                raise SymfusionError(f"{item} is not a regular file (a FIFO, a device, a socket or a broken link); "
                                     "a model folder holds files only")
    if failed:
        raise SymfusionError(f"cannot list the model folder {path} ({failed[0].strerror})")
    return path


def check_tokenizer_names(path: Path) -> None:
    """Refuse (one line) a tokenizer_config.json naming a tokenizer file that is not a plain name in the folder:
    transformers opens `fast_tokenizer_files`' choice relative to the folder (`../x` would lead out of it); the
    other `*_file` keys it replaces by the folder's own files (transformers >= 5), so they are never opened."""
    if not os.path.lexists(path / "tokenizer_config.json"):
        return
    config = read_json(path, "tokenizer_config.json", "tokenizer config")
    names = config.get("fast_tokenizer_files") if isinstance(config, dict) else None
    for name in names if isinstance(names, list) else [] if names is None else [names]:
        model_file(path, name, f"{path / 'tokenizer_config.json'} (fast_tokenizer_files)", must_exist=False)


CONFIG_BYTES = 16 * 2**20      # at most this much config.json is read (a real one: a few KiB, label names included)
MAX_LAYERS = 4096              # more layers than any model has (the largest have a few hundred): never built


def load_config(path: str | Path):
    """The model's config from config.json, parsed and checked, never downloaded, no remote code; its claims are
    checked against the weights' headers before transformers builds anything from them (check_claims)."""
    path = check_model_folder(path)
    check_claims(path)
    try:
        return transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - any failure to parse a user's config.json is a bad input
        first = first_line(error)
        raise SymfusionError(f"{path}/config.json is not a valid model config ({first}); "
                             "re-export the model with save_pretrained") from error


def check_claims(path: Path) -> None:
    """Refuse (one line) a config.json whose size, model type or layer count an untrusted folder could make a command
    spend unbounded time and memory on: a config class builds per-layer lists (Qwen2's layer_types: 12 s for 3
    million layers) and every model per-layer modules, so the layers claimed must be the layers the tensors hold."""
    file = model_file(path, "config.json")
    if file.stat().st_size > CONFIG_BYTES:
        raise SymfusionError(f"{file} is {file.stat().st_size} bytes, more than a model config holds "
                             f"({CONFIG_BYTES} at most); re-export the model")
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return                                    # AutoConfig says what is wrong, in one line
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        return
    family = FAMILIES[family_of(SimpleNamespace(model_type=raw["model_type"]))]     # a supported family, or one line
    names = getattr(transformers.CONFIG_MAPPING[raw["model_type"]], "attribute_map", {}) or {}
    field = names.get("num_hidden_layers", "num_hidden_layers")
    claimed = raw.get(field)
    if claimed is None:
        return                                    # the config class's own default
    if not isinstance(claimed, int) or isinstance(claimed, bool) or not 0 <= claimed <= MAX_LAYERS:
        raise SymfusionError(f"{file}: {field}={claimed!r} is not a layer count (0..{MAX_LAYERS}); re-export the model")
    try:
        keys = weight_map(path)[0]
    except SymfusionError:                        # no readable weights: the caller says so
        return
    found = family.layer_count(keys)
    if claimed != found:
        raise SymfusionError(f"{file} claims {field}={claimed}, but the weights hold {found} layers; the checkpoint "
                             "and its config disagree")


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved in a local model folder; never downloads, never runs remote code. Loaded once per
    folder in a process (a merge evaluates several models with one tokenizer)."""
    return _tokenizer(os.path.realpath(model_dir))


@lru_cache(maxsize=4)
def _tokenizer(model_dir: str):
    load_config(model_dir)                              # a clear error when the folder is no model folder
    check_tokenizer_names(Path(model_dir))
    try:
        return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                                          trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - a broken tokenizer file is a bad input
        raise SymfusionError(f"cannot load a tokenizer from {model_dir}: {first_line(error)}") from error


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder (one file, or an index and its shards, checked against their headers:
    folder.weight_map); refuses pickles and any file outside the folder."""
    shards, _ = weight_map(path)
    return [Path(path) / shard for shard in dict.fromkeys(shards.values())]


def checkpoint_dtypes(files: list[Path]) -> dict[str, str]:
    """Tensor name -> safetensors dtype of every tensor in the files (reads only their headers)."""
    return {key: dtype for file in files for key, (dtype, _) in shard_header(file).items()}


def _meta(dtype: str, shape) -> torch.Tensor:
    """A shape-and-dtype-only tensor of a safetensors header entry (an unknown dtype: as uint8)."""
    found = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}.get(dtype)
    return torch.empty(shape, dtype=found or (torch.int64 if dtype.startswith(("I", "U")) else torch.uint8),
                       device="meta")


def check_fits_config(config, state, path: Path, complete: bool = False, cls=None, model=None) -> None:
    """Refuse (one line) a folder whose tensors (`state`: name -> a tensor or its meta twin) disagree with what its
    config.json builds: a shape, or an integer dtype where the model has a floating-point parameter; with
    complete=True also a parameter the checkpoint lacks (transformers would allocate it at its claimed size).
    `state` uses the files' names; `model`: the skeleton (meta device), when the caller has built it."""
    model = model if model is not None else skeleton_of(config, path, cls or model_class(config, state))
    prefix = getattr(model, "base_model_prefix", "") or ""
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or ()]
    names, parameters = file_names(model)
    for name, expected in names.items():
        candidates = (name, f"{prefix}.{name}", name[len(prefix) + 1:] if name.startswith(prefix + ".") else None)
        key = next((c for c in candidates if c and c in state), None)
        if key is None:
            if complete and name in parameters and not any(p.search(name) for p in ignored):
                raise SymfusionError(f"checkpoint {path} lacks tensors ({name}, {tuple(expected.shape)}) for "
                                     f"{type(model).__name__} as its config.json describes it; the checkpoint and its "
                                     "config disagree")
            continue                    # tied weights, or a layer's missing tensor (named by the block check)
        found = state[key]
        if tuple(found.shape) != tuple(expected.shape):
            raise SymfusionError(f"checkpoint {path} stores {key!r} with shape {tuple(found.shape)}, but its "
                                 f"config.json implies {tuple(expected.shape)}; the checkpoint and its config disagree")
        if expected.is_floating_point() and not found.is_floating_point():
            raise SymfusionError(f"checkpoint {path} stores {key!r} as {found.dtype}, not a floating-point type; "
                                 "re-export the model")


def checked_weights(path: Path) -> tuple[type, dict[str, str]]:
    """(the class the folder's checkpoint was saved from, tensor name -> safetensors dtype) of a model folder whose
    files (config.json, index, shards) live inside it and whose tensors are every one that class has, shaped as
    config.json says (headers only: a config's claims cost no memory); a one-line error otherwise."""
    config = load_config(path)
    headers = {key: info for file in weight_files(path) for key, info in shard_header(file).items()}
    cls = model_class(config, headers)
    check_fits_config(config, {k: _meta(dtype_name, shape) for k, (dtype_name, shape) in headers.items()}, path,
                      complete=True, cls=cls)
    return cls, {key: dtype_name for key, (dtype_name, _) in headers.items()}


def _from_pretrained(cls, path: Path, **options):
    """(model, loading info) of cls.from_pretrained on a checked folder: local safetensors, no remote code."""
    try:
        return cls.from_pretrained(str(path), local_files_only=True, trust_remote_code=False, use_safetensors=True,
                                   output_loading_info=True, **options)
    except Exception as error:  # noqa: BLE001 - weights that do not fit their config are a bad input
        first = first_line(error)
        if "ignore_mismatched_sizes" in first or "size mismatch" in first:
            first = "a tensor's shape disagrees with config.json"
        raise SymfusionError(f"cannot load weights from {path}: {first}") from error


def load_pretrained_body(path: str | Path, cls, **options) -> torch.nn.Module:
    """A fine-tuning start: the model `cls` (a task head over the folder's body) with the folder's weights read as
    load_model reads them (files inside the folder, safetensors only, every tensor of the checkpoint's own class
    present, shaped and finite); only what the checkpoint's class lacks (the new head) is initialised."""
    path = Path(path)
    checked_weights(path)
    model, info = _from_pretrained(cls, path, **options)
    prefix = getattr(model, "base_model_prefix", "") or ""
    body = [k for k in info.get("missing_keys") or [] if prefix and k.startswith(prefix + ".")]
    if body or info.get("mismatched_keys"):
        shown = (body or [str(k) for k in info["mismatched_keys"]])[:3]
        raise SymfusionError(f"checkpoint {path} lacks or mis-shapes tensors ({', '.join(map(str, shown))}) for "
                             f"{cls.__name__}; the checkpoint and its config disagree")
    check_finite(model.state_dict(), f"model {path}")
    return model


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A model from a local save_pretrained folder, in eval mode, every weight finite; never downloads, never
    initialises a weight. The folder's tensors are checked against its config (headers only) before transformers
    allocates anything, so a config's claims cost no memory."""
    path = Path(path)
    cls, dtypes = checked_weights(path)
    model, info = _from_pretrained(cls, path, dtype=dtype)
    problems = {kind: sorted(info.get(kind) or []) for kind in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    for kind, keys in problems.items():
        if keys:
            shown = ", ".join(str(k) for k in keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            what = {"missing_keys": "lacks", "unexpected_keys": "has unexpected", "mismatched_keys": "has mis-shaped"}[kind]
            raise SymfusionError(f"checkpoint {path} {what} tensors ({shown}) for {cls.__name__} as its config.json "
                                 "describes it; the checkpoint and its config disagree")
    state = model.state_dict()
    for key, file_dtype in dtypes.items():
        if key in state and state[key].is_floating_point() and file_dtype not in FLOAT_DTYPES:
            raise SymfusionError(f"checkpoint {path} stores {key} as {file_dtype}, not a floating-point type; "
                                 "re-export the model")
    check_finite(state, f"model {path}")                # every path into matching, merging and evaluation
    return model.eval()


# ---------------------------------------------------------------- writing

def copy_auxiliary_files(source: str | Path, target: str | Path) -> None:
    """Copy tokenizer / image-processor files between model folders (not weights, configs or results);
    only regular files that really live inside `source` (folder.model_file), never over a file `target` has."""
    source = Path(source)
    for pattern in AUXILIARY_PATTERNS:
        for item in sorted(source.glob(pattern)):
            if item.is_file() and inside(source, item) and not item.name.endswith(".safetensors") \
                    and not os.path.lexists(Path(target) / item.name):
                shutil.copyfile(model_file(source, item.name), Path(target) / item.name)


def write_json(data: dict, path: str | Path) -> None:
    """JSON with sorted keys (inside a temp folder or temp file that a Claim swaps in)."""
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
