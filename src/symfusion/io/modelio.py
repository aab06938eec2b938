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
import shutil
from functools import lru_cache
from pathlib import Path

import torch
import transformers
from symfusion.arch import check_finite
from symfusion.errors import SymfusionError
from symfusion.io.folder import FLOAT_DTYPES, INDEX as SAFETENSORS_INDEX, PICKLE_WEIGHTS, first_line, inside, model_file, \
    shard_header, weight_map

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


def model_class(config):
    """The transformers class a checkpoint was saved from (its config's architectures), else AutoModel."""
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def skeleton_of(config, path: str | Path) -> torch.nn.Module:
    """The model config.json builds, on the meta device (its structure and names, no memory); one line if none."""
    cls = model_class(config)
    try:
        with torch.device("meta"):
            return cls.from_config(config) if cls is transformers.AutoModel else cls(config)
    except Exception as error:  # noqa: BLE001 - a config that transformers cannot build is a bad input
        raise SymfusionError(f"{path}/config.json does not describe a model transformers can build "
                             f"({first_line(error)}); re-export the model") from error


# ---------------------------------------------------------------- reading a folder as data

def check_model_folder(path: str | Path) -> Path:
    """A folder holding config.json whose every file lives inside it; a one-line error otherwise."""
    path = Path(path)
    if not path.is_dir() or not os.path.lexists(path / "config.json"):
        raise SymfusionError(f"{path} is not a model folder (no config.json); pass a save_pretrained directory")
    model_file(path, "config.json")
    try:
        items = list(path.iterdir())
    except OSError as error:
        raise SymfusionError(f"cannot list the model folder {path} ({error.strerror})") from error
    for item in items:
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
        first = first_line(error)
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
        raise SymfusionError(f"cannot load a tokenizer from {model_dir}: {first_line(error)}") from error


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a folder (one file, or an index and its shards, checked against their headers:
    folder.weight_map); refuses pickles and any file outside the folder."""
    shards, _ = weight_map(path)
    return [Path(path) / shard for shard in dict.fromkeys(shards.values())]


def checkpoint_dtypes(files: list[Path]) -> dict[str, str]:
    """Tensor name -> safetensors dtype of every tensor in the files (reads only their headers)."""
    return {key: dtype for file in files for key, (dtype, _) in shard_header(file).items()}


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A model from a local save_pretrained folder, in eval mode, every weight finite; never downloads, never
    initialises a weight."""
    config = load_config(path)
    path = Path(path)
    files = weight_files(path)
    dtypes = checkpoint_dtypes(files)
    cls = model_class(config)
    try:
        model, info = cls.from_pretrained(str(path), dtype=dtype, local_files_only=True, trust_remote_code=False,
                                          use_safetensors=True, output_loading_info=True)
    except Exception as error:  # noqa: BLE001 - weights that do not fit their config are a bad input
        first = first_line(error)
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
