"""Text examples as fixed, seeded train / validation / test splits: task kinds, label sets, grouped splitting, limits.

Every text source (offline corpora, silver NER, Hub datasets) returns raw examples; this module is
the one place that knows the task kinds, the shared NER label space and how raw examples become
TextSplits. It imports nothing else of symfusion's data modules.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from symfusion.errors import SymfusionError

TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, REGRESSION = "text_classification", "token_classification", "regression"
KINDS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, REGRESSION)
SPLITS = ("train", "validation", "test")

# One NER label space for every NER source (silver and Hub), so models of different domains share a head.
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]

SPLIT_FRACTIONS = (0.70, 0.15, 0.15)  # sources without official splits
CARVE_FRACTION = 0.10                 # a missing validation (or test) split carved from an official train split


@dataclass
class TextSplits:
    kind: str                      # "text_classification" | "token_classification" | "regression"
    splits: dict[str, list[dict]]  # "train", "validation", "test" -> examples
    label_names: list[str] | None  # class names / BIO tag names (index = label id); None for regression
    info: dict = field(default_factory=dict)   # provenance: source, options, sizes, files, timings



def repair_bio(tags: list[str]) -> list[str]:
    """Valid BIO: an I-X that follows O or another type becomes B-X."""
    fixed, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            tag = "B-" + tag[2:]
        fixed.append(tag)
        previous = tag
    return fixed


def is_valid_bio(tags: list[str]) -> bool:
    return repair_bio(list(tags)) == list(tags)



def _group_key(example: dict, index: int) -> str:
    return str(example["group"]) if "group" in example else f"#{index}"


def grouped_split(examples: list[dict], fractions: tuple[float, ...], seed: int) -> list[list[int]]:
    """Index lists (ascending) of a seeded split by groups: the groups in a seeded order fill the parts in turn."""
    groups: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        groups.setdefault(_group_key(example, index), []).append(index)
    keys = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(keys))
    targets = [int(round(f * len(examples))) for f in fractions[:-1]]
    parts: list[list[int]] = [[] for _ in fractions]
    for k in order:
        members = groups[keys[k]]
        part = next((p for p, target in enumerate(targets) if len(parts[p]) < target), len(fractions) - 1)
        parts[part].extend(members)
    return [sorted(part) for part in parts]


def _split_raw(raw: dict, seed: int) -> dict[str, list[dict]]:
    if "splits" in raw:
        official = {name: list(examples) for name, examples in raw["splits"].items() if examples is not None}
        unknown = set(official) - set(SPLITS)
        if unknown or "train" not in official:
            raise SymfusionError(f"a source returned splits {sorted(official)}; it needs train (and optionally validation, test)")
        missing = [name for name in SPLITS if name not in official]
        if len(missing) == 2:
            parts = grouped_split(official["train"], SPLIT_FRACTIONS, seed)
            return {name: [official["train"][i] for i in part] for name, part in zip(SPLITS, parts)}
        for offset, name in enumerate(missing):
            keep, held = grouped_split(official["train"], (1 - CARVE_FRACTION, CARVE_FRACTION), seed + 1 + offset)
            official[name] = [official["train"][i] for i in held]
            official["train"] = [official["train"][i] for i in keep]
        return {name: official[name] for name in SPLITS}
    examples = raw["examples"]
    parts = grouped_split(examples, SPLIT_FRACTIONS, seed)
    return {name: [examples[i] for i in part] for name, part in zip(SPLITS, parts)}


def _apply_limit(splits: dict[str, list[dict]], limit: dict | None, seed: int) -> dict[str, list[dict]]:
    for name, cap in (limit or {}).items():
        if name not in splits:
            raise SymfusionError(f"limit names split {name!r}; splits are {', '.join(SPLITS)}")
        if cap is None:
            continue
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0:
            raise SymfusionError(f"limit for {name!r} must be a non-negative integer, got {cap!r}")
        # a seeded subset, not the first items: the files are often sorted (by movie, debate, document)
        chosen = np.sort(np.random.default_rng(seed + 2).permutation(len(splits[name]))[: int(cap)])
        splits[name] = [splits[name][i] for i in chosen]
    return splits


def _check(raw: dict, source: str) -> None:
    kind, names = raw.get("kind"), raw.get("label_names")
    if kind not in KINDS:
        raise SymfusionError(f"source {source!r} returned kind {kind!r}; kinds are {', '.join(KINDS)}")
    examples = raw["examples"] if "examples" in raw else [e for split in raw["splits"].values() for e in split]
    for example in examples:
        if kind == TOKEN_CLASSIFICATION:
            if len(example["tokens"]) != len(example["tags"]) or any(not 0 <= t < len(names) for t in example["tags"]):
                raise SymfusionError(f"source {source!r} produced a bad token example {example!r}")
        elif kind == TEXT_CLASSIFICATION:
            if not 0 <= example["label"] < len(names):
                raise SymfusionError(f"source {source!r} produced label {example['label']!r} outside its {len(names)} classes")


def assemble_splits(raw: dict, seed: int = 0, limit: dict | None = None, keep_groups: bool = False, source: str = "?") -> TextSplits:
    """TextSplits from a loader's raw output: fixed seeded splits, seeded limits, private keys dropped."""
    _check(raw, source)
    splits = _apply_limit(_split_raw(raw, seed), limit, seed)
    if not keep_groups:
        splits = {name: [{k: v for k, v in e.items() if k != "group"} for e in examples] for name, examples in splits.items()}
    info = dict(raw.get("info") or {})
    info["sizes"] = {name: len(examples) for name, examples in splits.items()}
    return TextSplits(kind=raw["kind"], splits=splits, label_names=raw["label_names"], info=info)


