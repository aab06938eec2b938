"""Pinned Hub revisions: what a pin is, the named placeholders of the revisions that could not be found, and the refusal.

Every Hub model and dataset of the paper profile names the commit it is read at (conf/model/*.yaml
`revision`, HUB_TEXT_PRESETS[...]["revision"], conf/task/cifar10.yaml options.revision). Where no full
commit could be confirmed from a source, the revision is a placeholder `UNPINNED:<ref>` and the loaders
refuse it with one line that says how to find the commit and where to set it (docs/data_card.md, "Pinned
revisions"). A local folder needs no revision: the placeholder is only refused when the Hub would be asked.
"""
from __future__ import annotations

import re

from symfusion.errors import SymfusionError

UNPINNED_PREFIX = "UNPINNED:"
COMMIT = re.compile(r"[0-9a-f]{40}")

# Hub repository -> why its revision is a placeholder and how to find the commit (checked by tests/test_pins.py).
UNPINNABLE: dict[str, str] = {
    "microsoft/deberta-v3-large": (
        "its main branch holds only pickled weights (pytorch_model.bin, tf_model.h5); model.safetensors exists only "
        "on the pull-request ref refs/pr/4 (commit d0eb112...), whose full hash no source at hand gave; read it with "
        "huggingface_hub.HfApi().list_repo_commits('microsoft/deberta-v3-large', revision='refs/pr/4')[0].commit_id"),
    "li2017dailydialog/daily_dialog": (
        "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet), whose commit no source at "
        "hand gave; read it with huggingface_hub.HfApi().list_repo_refs('li2017dailydialog/daily_dialog', "
        "repo_type='dataset').converts"),
    "ontonotes/conll2012_ontonotesv5": (
        "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet), whose commit no source at "
        "hand gave; read it with huggingface_hub.HfApi().list_repo_refs('ontonotes/conll2012_ontonotesv5', "
        "repo_type='dataset').converts"),
    "eriktks/conll2003": (
        "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet), whose commit no source at "
        "hand gave; read it with huggingface_hub.HfApi().list_repo_refs('eriktks/conll2003', repo_type='dataset')"
        ".converts"),
}


def unpinned(ref: str) -> str:
    """The placeholder for a revision whose commit is unknown: `UNPINNED:<the ref it should be a commit of>`."""
    return f"{UNPINNED_PREFIX}{ref}"


def is_placeholder(revision) -> bool:
    return isinstance(revision, str) and revision.startswith(UNPINNED_PREFIX)


def is_pinned(revision) -> bool:
    """A full 40-hex commit (branches, tags and refs move; a commit does not)."""
    return isinstance(revision, str) and COMMIT.fullmatch(revision) is not None


def check_revision(repo_id: str, revision, where: str) -> None:
    """Refuse a placeholder revision before the Hub is asked for `repo_id` (one actionable line)."""
    if not is_placeholder(revision):
        return
    reason = UNPINNABLE.get(repo_id, "no full commit of it was confirmed")
    raise SymfusionError(f"{repo_id} has no pinned revision ({revision}): {reason}; set that 40-hex commit as "
                         f"{where}, or point to a local copy")


__all__ = ["UNPINNED_PREFIX", "UNPINNABLE", "unpinned", "is_placeholder", "is_pinned", "check_revision"]
