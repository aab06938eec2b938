"""Loading and atomically saving model folders (save_pretrained + safetensors) and result JSON."""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers

from symfusion.errors import SymfusionError

transformers.utils.logging.disable_progress_bar()  # stage logs stay readable

# Files a model folder carries beside weights and config (tokenizers, image processors).
AUXILIARY_PATTERNS = ("tokenizer*", "vocab*", "merges.txt", "special_tokens_map.json", "added_tokens.json",
                      "preprocessor_config.json", "*.model", "sentencepiece*")


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


def load_config(path: str | Path):
    path = Path(path)
    if not (path / "config.json").is_file():
        raise SymfusionError(f"{path} is not a model folder (no config.json); pass a save_pretrained directory")
    return transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=False)


def load_tokenizer(model_dir: str | Path):
    """The tokenizer saved in a local model folder; never downloads, never runs remote code."""
    load_config(model_dir)                              # a clear error when the folder is no model folder
    try:
        return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True,
                                                          trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise SymfusionError(f"cannot load a tokenizer from {model_dir}: {str(error).splitlines()[0]}") from error


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A model from a local save_pretrained folder, in eval mode; never downloads."""
    config = load_config(path)
    cls = model_class(config)
    try:
        model = cls.from_pretrained(str(path), dtype=dtype, local_files_only=True, trust_remote_code=False)
    except OSError as error:
        raise SymfusionError(f"cannot load weights from {path}: {str(error).splitlines()[0]}") from error
    return model.eval()


def remove_stale(parent: Path, prefix: str) -> None:
    """Delete temp files/folders `prefix*` in `parent` left by a killed writer of the same output."""
    for stale in parent.glob(f"{glob.escape(prefix)}*"):
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink(missing_ok=True)


@contextmanager
def atomic_directory(output: str | Path):
    """Yield a temp dir beside `output`; on success it replaces `output` in one rename."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(output.parent, f".{output.name}.tmp-")
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)          # mkdtemp makes 0700; results are shared like any folder
    try:
        yield tmp
        replace_directory(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_directory(new: Path, output: Path) -> None:
    """Move `new` to `output`, replacing any old `output` (the old one is removed after the swap)."""
    old = None
    if output.exists():
        old = output.parent / f".{output.name}.old-{os.getpid()}"
        os.replace(output, old)
    os.replace(new, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def copy_auxiliary_files(source: str | Path, target: str | Path) -> None:
    """Copy tokenizer / image-processor files between model folders (not weights, configs or results)."""
    for pattern in AUXILIARY_PATTERNS:
        for item in Path(source).glob(pattern):
            if item.is_file():
                shutil.copy2(item, Path(target) / item.name)


def write_json_atomic(data: dict, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent, f".{path.name}.tmp-")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=2, sort_keys=True, default=str)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
