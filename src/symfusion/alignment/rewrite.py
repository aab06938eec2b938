"""Writing a moved state dict in the layout of the folder it came from: the source's shard files, index, key order, dtypes and config.

A matched model is the source model with some tensors moved by a symmetry, so its folder should be
the source's folder with those tensors replaced: the same shard files (names, tensor order, safetensors
metadata), the same index, each tensor in the source's dtype (a float16 or bfloat16 model stays so;
moved weights are rounded once when stored), the same config.json and generation_config.json, and the
tokenizer files. `write_like` does that through the same reader and writer as folder matching
(sharded.ShardedFolder, sharded.ShardWriter), so every name it writes is a plain shard name of the
checked source index (symfusion.io.folder), created new in the target.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Mapping

import torch
from transformers.core_model_loading import revert_weight_conversion

from symfusion.alignment.checks import stored_in
from symfusion.io.folder import INDEX, model_file
from symfusion.io.modelio import copy_auxiliary_files
from symfusion.alignment.sharded import ShardWriter, ShardedFolder, check_shard_names

# Files copied as they are from the source folder beside the weights.
CONFIG_FILES = ("config.json", "generation_config.json")


def stored_dtypes(source: str | Path) -> dict[str, torch.dtype]:
    """Tensor name -> dtype of every tensor in a model folder's safetensors files (headers only)."""
    folder = ShardedFolder(source)
    return {folder.file_keys[key]: tensor.dtype for key, tensor in folder.meta_state().items()}


def file_names(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the model's state-dict names) under the names its checkpoint files use: transformers renames some
    families' tensors on load (ViT's attention.attention.query -> attention.q_proj) and back in save_pretrained."""
    return revert_weight_conversion(model, dict(state))


def plan_like(model: torch.nn.Module, source_state: Mapping[str, torch.Tensor],
              moved_state: Mapping[str, torch.Tensor], source: str | Path) -> tuple[dict | None, dict]:
    """(moved_state under the source files' names when every moved tensor has its own entry in the source's files,
    else None: write with save_pretrained; state name -> the dtype the source's files store it in).

    `model` holds `source_state`, loaded from the folder `source`. The dtypes say how a functional check must
    round the moved weights to check what is written (as_stored)."""
    files = stored_dtypes(source)
    moved = file_names(model, moved_state)
    original = file_names(model, source_state)
    changed = [k for k, v in moved.items() if k not in original or not torch.equal(v, original[k])]
    names = {id(t): k for k, t in source_state.items()}
    dtypes = {names[id(t)]: files[k] for k, t in original.items() if id(t) in names and k in files}
    floats = {d for d in files.values() if d.is_floating_point}
    if len(floats) == 1:                       # renamed by a conversion that made new tensors: the folder's one dtype
        dtypes.update({k: next(iter(floats)) for k, t in source_state.items() if t.is_floating_point() and k not in dtypes})
    return (moved if all(k in files for k in changed) else None), dtypes


def as_stored(state: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype]) -> dict[str, torch.Tensor]:
    """`state` as a folder stores it: each floating tensor rounded to the dtype its file keeps, in its own dtype
    again (the identity for a float32 folder; a value beyond the stored dtype's range is refused: checks.stored_in).
    A functional check of this state checks what is written."""
    out = {}
    for key, tensor in state.items():
        stored = dtypes.get(key)
        out[key] = stored_in(tensor, stored, key).to(tensor.dtype) if stored is not None \
            and tensor.is_floating_point() and stored.is_floating_point and stored != tensor.dtype else tensor
    return out


def write_like(source: str | Path, state: Mapping[str, torch.Tensor], target: str | Path) -> None:
    """Write the source folder's weights into the new folder `target`, each tensor from `state` where it has it
    (cast to the source file's dtype) and from the source otherwise; then its index, configs and tokenizer."""
    src, target = ShardedFolder(source), Path(target)
    check_shard_names(src)
    meta = src.meta_state()
    for shard, keys in src.shards().items():
        writer = ShardWriter(target / shard, {k: meta[k] for k in keys}, src.handle(shard).metadata(), src.file_keys)
        try:
            for key in keys:                           # `state` speaks the files' names, the folder the model's
                name = src.file_keys[key]
                writer.write(key, state[name] if name in state else src.read([key])[key])
        finally:
            writer.file.close()
        writer.close()
    if src.index_metadata is not None:
        (target / INDEX).write_text(json.dumps({"metadata": src.index_metadata, "weight_map": src.files},
                                               indent=2) + "\n")
    for name in CONFIG_FILES:
        path = model_file(src.path, name, must_exist=False)
        if path.is_file():
            shutil.copyfile(path, target / name)
    copy_auxiliary_files(src.path, target)
