"""Model folders: strict loading (safetensors only, every tensor present, files inside the folder), saving, JSON.

Input folders are read as data: a file is read or copied only if it really lives inside the folder
(no symbolic link leading out of it); weights are read only from safetensors (a pickle-only folder
is refused with how to convert it); every tensor the architecture expects must be in the checkpoint
with its shape and a floating dtype where the model has one (nothing is initialised at random);
config.json must parse. Every failure is one SymfusionError line.
"""
from __future__ import annotations

import json
import os
import shutil
from functools import lru_cache
from pathlib import Path

import torch
import transformers
from safetensors import SafetensorError, safe_open

from symfusion.errors import SymfusionError

transformers.utils.logging.disable_progress_bar()   # stage logs stay readable
transformers.utils.logging.set_verbosity_error()    # load reports are turned into our own one-line errors

# Files a model folder carries beside weights and config (tokenizers, chat templates, image processors).
AUXILIARY_PATTERNS = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                      "chat_template*", "preprocessor_config.json", "*.model", "sentencepiece*")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
SAFETENSORS_INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}


def compute_device() -> torch.device:
    """The GPU when one is visible (SLURM pins one per job via CUDA_VISIBLE_DEVICES), else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def to_device(batch: dict, device: torch.device) -> dict:
    """A batch dict with its tensors on `device`."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def model_class(config):
    """The transformers class a checkpoint was saved from (its config's architectures), else AutoModel."""
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


# ---------------------------------------------------------------- reading a folder as data

def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__


def inside(folder: Path, item: Path) -> bool:
    """Whether `item` really lives inside `folder` (after following every symbolic link)."""
    root, target = Path(os.path.realpath(folder)), Path(os.path.realpath(item))
    return root in target.parents


def check_model_folder(path: str | Path) -> Path:
    """A folder holding config.json whose every file lives inside it; a one-line error otherwise."""
    path = Path(path)
    if not path.is_dir() or not (path / "config.json").is_file():
        raise SymfusionError(f"{path} is not a model folder (no config.json); pass a save_pretrained directory")
    for item in path.iterdir():
        if item.is_symlink() and not inside(path, item):
            raise SymfusionError(f"{item} is a link to {os.path.realpath(item)}, outside the model folder; "
                                 "copy the real files into the folder (input folders are read as data)")
    return path


def load_config(path: str | Path):
    """The model's config from config.json, parsed and checked, never downloaded, no remote code."""
    path = check_model_folder(path)
    try:
        return transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as error:  # noqa: BLE001 - any failure to parse a user's config.json is a bad input
        first = _first_line(error)
        raise SymfusionError(f"{path}/config.json is not a valid model config ({first}); "
                             "re-export the model with save_pretrained") from error


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved in a local model folder; never downloads, never runs remote code. Loaded once per
    folder in a process (a merge evaluates several models with one tokenizer)."""
    return _tokenizer(os.path.realpath(model_dir))


@lru_cache(maxsize=4)
def _tokenizer(model_dir: str):
    load_config(model_dir)                              # a clear error when the folder is no model folder
    try:
        return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                                          trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - a broken tokenizer file is a bad input
        raise SymfusionError(f"cannot load a tokenizer from {model_dir}: {_first_line(error)}") from error


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder (one file, or an index and its shards); refuses pickles."""
    single, index = path / "model.safetensors", path / SAFETENSORS_INDEX
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise SymfusionError(f"{index} is not a valid safetensors index; re-export the model") from error
        files = [path / shard for shard in shards]
        for file in files:
            if not file.is_file() or not inside(path, file):
                raise SymfusionError(f"{index} names the shard {file.name}, which is not in {path}; re-export the model")
        return files
    pickles = [name for name in PICKLE_WEIGHTS if (path / name).is_file()]
    if pickles:
        raise SymfusionError(
            f"{path} holds only pickled weights ({', '.join(pickles)}); symfusion reads safetensors only. Convert "
            "them where you trust the file: AutoModel.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)")
    raise SymfusionError(f"{path} has no weights (model.safetensors or {SAFETENSORS_INDEX}); pass a save_pretrained folder")


def checkpoint_dtypes(files: list[Path]) -> dict[str, str]:
    """Tensor name -> safetensors dtype of every tensor in the files (reads only their headers)."""
    dtypes = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    dtypes[key] = handle.get_slice(key).get_dtype()
        except (SafetensorError, OSError, ValueError) as error:
            first = _first_line(error)
            raise SymfusionError(f"{file} is not a readable safetensors file ({first}); re-export the model") from error
    return dtypes


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A model from a local save_pretrained folder, in eval mode; never downloads, never initialises a weight."""
    config = load_config(path)
    path = Path(path)
    files = weight_files(path)
    dtypes = checkpoint_dtypes(files)
    cls = model_class(config)
    try:
        model, info = cls.from_pretrained(str(path), dtype=dtype, local_files_only=True, trust_remote_code=False,
                                          use_safetensors=True, output_loading_info=True)
    except Exception as error:  # noqa: BLE001 - weights that do not fit their config are a bad input
        first = _first_line(error)
        if "ignore_mismatched_sizes" in first or "size mismatch" in first:
            first = "a tensor's shape disagrees with config.json"
        raise SymfusionError(f"cannot load weights from {path}: {first}") from error
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
    return model.eval()


# ---------------------------------------------------------------- writing

def copy_auxiliary_files(source: str | Path, target: str | Path) -> None:
    """Copy tokenizer / image-processor files between model folders (not weights, configs or results);
    only regular files that really live inside `source`."""
    source = Path(source)
    for pattern in AUXILIARY_PATTERNS:
        for item in source.glob(pattern):
            if item.is_file() and inside(source, item):
                shutil.copy2(item, Path(target) / item.name)


def write_json(data: dict, path: str | Path) -> None:
    """JSON with sorted keys (inside a temp folder or temp file that a Claim swaps in)."""
    with open(path, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True, default=str)
        handle.write("\n")
