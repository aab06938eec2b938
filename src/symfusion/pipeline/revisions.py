"""Pinned Hub revisions: a commit as it is, and a ref (branch, tag, pull request, Parquet export) pinned on first download through a lock file.

Every Hub model and dataset of the paper profile names the revision it is read at (conf/model/*.yaml
`revision`, HUB_TEXT_PRESETS[...]["revision"], conf/task/cifar10.yaml options.revision). Most are full
40-hex commits. A few exist only on a ref whose commit no source at hand gave (LOCKED_REFS: DeBERTa-v3-large's
safetensors on `refs/pr/4`, three datasets' `refs/convert/parquet` exports). Such a ref is resolved to its
commit on the first download and recorded in the lock file (`hub-revisions.lock.json` in the working
directory, the project's root for a pipeline run, or $SYMFUSION_HUB_LOCK), as a package manager's lock
file records versions: every later run reads that commit, even after the ref has moved, so a paper run
is pinned after its first download without anyone editing conf/. Commit the lock file with the results.
Offline (HF_HUB_OFFLINE=1) a ref missing from the lock file is refused with one line. A local folder
needs no revision: nothing is resolved for it.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import re
from pathlib import Path

from symfusion.errors import SymfusionError
from symfusion.io.marks import open_lock, write_own

COMMIT = re.compile(r"[0-9a-f]{40}")
LOCK_VARIABLE = "SYMFUSION_HUB_LOCK"
LOCK_FILE = "hub-revisions.lock.json"
LOCK_FORMAT = "symfusion-hub-lock/1"

# Hub repository -> why conf/ names a ref rather than a commit (checked by tests/workflow/test_pins.py).
LOCKED_REFS: dict[str, str] = {
    "microsoft/deberta-v3-large": (
        "its main branch holds only pickled weights (pytorch_model.bin, tf_model.h5); model.safetensors exists only "
        "on the pull-request ref refs/pr/4 (commit d0eb112...), whose full hash no source at hand gave"),
    "li2017dailydialog/daily_dialog": "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet)",
    "ontonotes/conll2012_ontonotesv5": "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet)",
    "eriktks/conll2003": "a loading-script dataset read from the Hub's Parquet export (refs/convert/parquet)",
}


def is_pinned(revision) -> bool:
    """A full 40-hex commit (branches, tags and refs move; a commit does not)."""
    return isinstance(revision, str) and COMMIT.fullmatch(revision) is not None


def lock_path() -> Path:
    """The lock file: $SYMFUSION_HUB_LOCK, else hub-revisions.lock.json in the working directory."""
    return Path(os.environ.get(LOCK_VARIABLE) or LOCK_FILE)


def read_lock(path: Path | None = None) -> dict[str, dict]:
    """The lock file's entries ("model ORG/NAME@REF" -> {"commit", "resolved"}), {} when there is none yet."""
    path = path or lock_path()
    if not os.path.lexists(path):
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SymfusionError(f"{path} is not a readable Hub lock file ({type(error).__name__}); restore it from "
                             f"version control, or set {LOCK_VARIABLE} to another path") from error
    entries = data.get("revisions") if isinstance(data, dict) and data.get("format") == LOCK_FORMAT else None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) and is_pinned(e.get("commit"))
                                                for e in entries.values()):
        raise SymfusionError(f"{path} is not a symfusion Hub lock file ({LOCK_FORMAT}); symfusion does not overwrite "
                             f"it: move it away, or set {LOCK_VARIABLE} to another path")
    return entries


def _record(path: Path, key: str, commit: str) -> str:
    """Add `key` -> commit to the lock file under an exclusive lock (concurrent jobs); the commit it holds
    after that (an entry another job recorded first wins)."""
    fd, _ = open_lock(path.parent / f".{path.name}.lock")   # never through a link planted under its name (marks.py)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        entries = read_lock(path)
        if key in entries:
            return entries[key]["commit"]
        entries[key] = {"commit": commit, "resolved": datetime.datetime.now(datetime.timezone.utc).isoformat()}
        text = json.dumps({"format": LOCK_FORMAT, "revisions": entries}, indent=2, sort_keys=True) + "\n"
        if not write_own(path, lambda name: Path(name).write_text(text)):
            raise SymfusionError(f"{path} is not this user's file; move it away, or set {LOCK_VARIABLE} to another path")
        return commit
    finally:
        os.close(fd)


def hub_commit(repo_id: str, ref: str, repo_type: str) -> str:
    """The commit a ref of a Hub repository points to now (asks the Hub)."""
    from huggingface_hub import HfApi

    try:
        sha = HfApi().repo_info(repo_id, repo_type=repo_type, revision=ref).sha
    except Exception as error:  # noqa: BLE001 - network, authentication, unknown id or ref: one line
        raise SymfusionError(f"cannot resolve {repo_id} at {ref} on the Hub ({type(error).__name__}); check the id, "
                             "the revision and your network") from error
    if not is_pinned(sha):
        raise SymfusionError(f"the Hub gave no commit for {repo_id} at {ref} (got {sha!r})")
    return sha


def pin_revision(repo_id: str, revision, repo_type: str, where: str):
    """The commit to read `repo_id` (a "model" or "dataset") at: a commit as it is; a ref as the lock file
    records it, or resolved on the Hub now and recorded (first download); None stays None."""
    if revision is None or is_pinned(revision):
        return revision
    if not isinstance(revision, str) or not revision.strip():
        raise SymfusionError(f"{repo_id}: revision {revision!r} is neither a commit nor a ref; fix {where}")
    path, key = lock_path(), f"{repo_type} {repo_id}@{revision}"
    entries = read_lock(path)
    if key in entries:
        return entries[key]["commit"]
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise SymfusionError(f"{repo_id} at {revision} is not pinned in {path} yet and HF_HUB_OFFLINE=1; run once with "
                             f"Hub access (the commit is then recorded there), or set a 40-hex commit as {where}")
    return _record(path, key, hub_commit(repo_id, revision, repo_type))


__all__ = ["COMMIT", "LOCKED_REFS", "LOCK_FILE", "LOCK_VARIABLE", "is_pinned", "lock_path", "read_lock", "hub_commit",
           "pin_revision"]
