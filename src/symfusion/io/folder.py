"""The files a model folder names, resolved one way for every reader and writer: plain names inside the folder, read with one-line errors.

A model folder names files in two places: its fixed files (config.json, model.safetensors, the index,
a stage's report) and the shards its `model.safetensors.index.json` lists in `weight_map`. Every
name goes through `model_file`: a plain file name (no folder part, no absolute path, no `..`), a
regular file that really lives inside the folder after every symbolic link is followed. So an index
can never make a reader open, or a writer that keeps the source's shard names create, a file outside
the folder it was given. `weight_map` reads a folder's index (or its single file) and checks it
against the shards' own headers: every listed tensor is in the shard the index names, no shard holds
a tensor the index does not list, every shard is a readable safetensors file, every weight and bias is
stored in a floating-point dtype. Every failure is one
SymfusionError line.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors import SafetensorError, safe_open

from symfusion.errors import SymfusionError, as_symfusion_error
from symfusion.io.regular import read_regular

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def first_line(error: BaseException) -> str:
    """`Type: the first line of its message` (at most 200 characters), for a one-line error."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__


def inside(folder: Path, item: Path) -> bool:
    """Whether `item` really lives inside `folder` (after following every symbolic link)."""
    root, target = Path(os.path.realpath(folder)), Path(os.path.realpath(item))
    return root in target.parents


def plain_name(name, folder: Path, where: str) -> str:
    """`name` when it is a plain file name (no folder part, not absolute, not `.`/`..`); else a one-line error."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name \
            or "\0" in name or name != name.strip():
        raise SymfusionError(f"{where} names the file {name!r}, which is not a plain file name in {folder}; "
                             "a model folder's files lie directly in it (re-export the model with save_pretrained)")
    return name


def model_file(folder: str | Path, name, where: str | None = None, must_exist: bool = True) -> Path:
    """The path of file `name` of model folder `folder`: a plain name, a regular file really inside the folder.

    `where` says who named the file (for the error line); must_exist=False allows a missing file.
    """
    folder = Path(folder)
    where = where or str(folder)
    path = folder / plain_name(name, folder, where)
    if os.path.lexists(path):
        if not inside(folder, path):
            raise SymfusionError(f"{path} is a link to {os.path.realpath(path)}, outside the model folder; "
                                 "copy the real files into the folder (input folders are read as data)")
        if not path.is_file():
            raise SymfusionError(f"{path} ({where}) is not a regular file; re-export the model")
    elif must_exist:
        raise SymfusionError(f"{where} names {name}, which is not in {folder}; re-export the model")
    return path


def read_json(folder: str | Path, name: str, what: str = "JSON file") -> object:
    """The parsed JSON file `name` of a model folder (resolved by model_file), or a one-line error."""
    path = model_file(folder, name)
    try:
        return json.loads(read_regular(path))           # bounded, never waits on a FIFO (io/regular.py)
    except (UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"{path} is not a readable {what} ({first_line(error)}); re-export the model") from error


def shard_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (safetensors dtype, shape) of one safetensors file (its header only), or a one-line error."""
    try:
        with open(path, "rb"):             # the system's own reason (permission denied, ...), which safe_open hides
            pass
    except OSError as error:
        raise as_symfusion_error(error) from error
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = {}
            for key in handle.keys():
                piece = handle.get_slice(key)
                header[key] = (piece.get_dtype(), tuple(piece.get_shape()))
            return header
    except (SafetensorError, OSError, ValueError) as error:
        raise SymfusionError(f"{path} is not a readable safetensors file ({first_line(error)}); "
                             "re-export the model") from error


FLOAT_DTYPES = {"F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}


def check_parameters(header: dict[str, tuple[str, tuple[int, ...]]], path: Path) -> None:
    """Refuse (one line) a weight or bias stored in an integer or boolean dtype: every parameter of the supported
    families is floating point (buffers such as position_ids may be integers)."""
    for key, (dtype, _) in header.items():
        if key.endswith((".weight", ".bias")) and dtype not in FLOAT_DTYPES:
            raise SymfusionError(f"{path} stores {key!r} as {dtype}, not a floating-point type; re-export the model")


def weight_map(folder: str | Path) -> tuple[dict[str, str], dict | None]:
    """(tensor name -> shard file name, the index's metadata or None for a single-file folder), checked
    against the shards' headers; refuses pickle-only folders and any index naming files outside the folder."""
    folder = Path(folder)
    if os.path.lexists(folder / SINGLE):
        path = model_file(folder, SINGLE)
        header = shard_header(path)
        check_parameters(header, path)
        return {key: SINGLE for key in header}, None
    if not os.path.lexists(folder / INDEX):
        pickles = [name for name in PICKLE_WEIGHTS if (folder / name).is_file()]
        if pickles:
            raise SymfusionError(
                f"{folder} holds only pickled weights ({', '.join(pickles)}); symfusion reads safetensors only. Convert "
                "them where you trust the file: AutoModel.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)")
        raise SymfusionError(f"{folder} has no weights ({SINGLE} or {INDEX}); pass a save_pretrained folder")
    index = read_json(folder, INDEX, "safetensors index")
    mapping = index.get("weight_map") if isinstance(index, dict) else None
    metadata = index.get("metadata", {}) if isinstance(index, dict) else None
    if not isinstance(mapping, dict) or not mapping or not isinstance(metadata, dict) \
            or not all(isinstance(v, str) for v in mapping.values()):
        raise SymfusionError(f"{folder / INDEX} is not a safetensors index (a non-empty weight_map of tensor names to "
                             "shard file names); re-export the model")
    where = str(folder / INDEX)
    for shard in dict.fromkeys(mapping.values()):
        if not plain_name(shard, folder, where).endswith(".safetensors"):
            raise SymfusionError(f"{where} names the shard {shard!r}, not a .safetensors file; re-export the model")
        listed = {key for key, value in mapping.items() if value == shard}
        held = shard_header(model_file(folder, shard, where))
        check_parameters(held, folder / shard)
        missing, extra = sorted(listed - set(held)), sorted(set(held) - listed)
        if missing:
            raise SymfusionError(f"{where} puts {missing[0]!r} in {shard}, which does not hold it"
                                 f"{f' (nor {len(missing) - 1} more)' if len(missing) > 1 else ''}; re-export the model")
        if extra:
            raise SymfusionError(f"{shard} holds {extra[0]!r}, which {where} does not list; re-export the model")
    return dict(mapping), metadata


__all__ = ["INDEX", "SINGLE", "PICKLE_WEIGHTS", "FLOAT_DTYPES", "check_parameters", "first_line", "inside", "plain_name", "model_file", "read_json",
           "shard_header", "weight_map"]
