"""Pinned Hub revisions in conf/ and the presets, refs pinned on first download through the lock file, and
safetensors-only base-model folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from symfusion.pipeline.config import load_group
from symfusion.pipeline.basemodels import HUB_PATTERNS, hub_folder, resolve_base, resolve_base_model
from symfusion.pipeline.data import load_image_splits
from symfusion.pipeline.data.text import load_text_splits
from symfusion.pipeline.data.text.hub import HUB_TEXT_PRESETS
from symfusion.errors import SymfusionError
from symfusion.pipeline import revisions
from symfusion.pipeline.revisions import LOCK_VARIABLE, LOCKED_REFS, is_pinned, pin_revision, read_lock

CONF = Path(__file__).resolve().parents[2] / "conf"


def _task(name: str):
    """conf/task/<name>.yaml with its bases merged in (the library's one rule, through load_group)."""
    return load_group("task", name)


def hub_specs() -> dict[str, tuple[str, object]]:
    """Every Hub source named in conf/: 'model <name>' / 'task <name>' -> (Hub id, revision)."""
    specs = {}
    for path in sorted((CONF / "model").glob("*.yaml")):
        model = OmegaConf.load(path)
        if str(model.get("base_model") or "").startswith("hub:"):
            specs[f"model {path.stem}"] = (model.base_model[len("hub:"):], model.get("revision"))
    for path in sorted((CONF / "task").glob("*.yaml")):
        task = _task(path.stem)
        options = OmegaConf.to_container(task.options) if task.get("options") else {}
        if task.get("source") == "hub_preset" and options.get("preset"):
            preset = {**HUB_TEXT_PRESETS[options["preset"]], **options}
            specs[f"task {path.stem}"] = (preset["dataset"], preset.get("revision"))
        elif task.get("source") == "hub":
            specs[f"task {path.stem}"] = (options["dataset"], options.get("revision"))
    return specs


def test_every_hub_source_in_conf_is_pinned_or_a_listed_ref():
    specs = hub_specs()
    paper = OmegaConf.load(CONF / "profile" / "paper.yaml")
    language = paper.language
    paper_tasks = [paper.vision.task, *language.emotion, *language.ner, language.ner_ood, *language.glue]
    assert {f"task {t}" for t in paper_tasks} | {f"model {m}" for m in language.models} <= set(specs)
    for where, (repo, revision) in specs.items():
        assert is_pinned(revision) or (isinstance(revision, str) and repo in LOCKED_REFS), (where, repo, revision)
    used = {repo for repo, revision in specs.values() if not is_pinned(revision)}
    assert used == set(LOCKED_REFS), "LOCKED_REFS lists a repository no ref uses (or misses one)"
    assert specs["model roberta_base"] == ("FacebookAI/roberta-base", "e2da8e2f811d1448a5b465c236feacd80ffbac7b")
    assert specs["model deberta_v3_large"] == ("microsoft/deberta-v3-large", "refs/pr/4")


def test_every_preset_is_pinned_or_a_listed_ref():
    for name, preset in HUB_TEXT_PRESETS.items():
        revision = preset.get("revision")
        assert is_pinned(revision) or preset["dataset"] in LOCKED_REFS, name


@pytest.fixture
def lock(tmp_path, monkeypatch):
    """A fresh lock file path, Hub access allowed, and a fake Hub whose refs point where `heads` says."""
    path = tmp_path / "project" / "hub-revisions.lock.json"
    path.parent.mkdir()
    monkeypatch.setenv(LOCK_VARIABLE, str(path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    heads, asked = {}, []

    def fake_commit(repo_id, ref, repo_type):
        asked.append((repo_type, repo_id, ref))
        return heads[(repo_id, ref)]

    monkeypatch.setattr(revisions, "hub_commit", fake_commit)
    return path, heads, asked


def test_a_ref_is_pinned_on_first_use_and_the_lock_file_is_enforced(lock):
    path, heads, asked = lock
    heads[("microsoft/deberta-v3-large", "refs/pr/4")] = "a" * 40
    assert pin_revision("microsoft/deberta-v3-large", "refs/pr/4", "model", "here") == "a" * 40
    assert read_lock(path) == {"model microsoft/deberta-v3-large@refs/pr/4": {"commit": "a" * 40,
                                                                             "resolved": read_lock(path)[
                                                                                 "model microsoft/deberta-v3-large@refs/pr/4"]["resolved"]}}
    heads[("microsoft/deberta-v3-large", "refs/pr/4")] = "b" * 40                 # the ref moves on the Hub ...
    assert pin_revision("microsoft/deberta-v3-large", "refs/pr/4", "model", "here") == "a" * 40   # ... the lock holds
    assert asked == [("model", "microsoft/deberta-v3-large", "refs/pr/4")]        # asked once, at the first download
    assert pin_revision("org/x", "c" * 40, "model", "here") == "c" * 40           # a commit is used as it is
    assert pin_revision("org/x", None, "model", "here") is None
    assert len(asked) == 1


def test_every_hub_loader_reads_a_ref_at_its_locked_commit(lock, tmp_path, monkeypatch):
    path, heads, asked = lock
    seen = []
    monkeypatch.setattr("huggingface_hub.snapshot_download",
                        lambda repo_id, revision=None, local_dir=None, allow_patterns=None: seen.append(revision)
                        or _model_folder(Path(local_dir), {"model.safetensors": {"w": torch.zeros(1)}}))
    heads[("microsoft/deberta-v3-large", "refs/pr/4")] = "d" * 40
    record = resolve_base("hub:microsoft/deberta-v3-large", revision="refs/pr/4", cache_dir=tmp_path / "cache")
    assert record.revision == "d" * 40 and seen == ["d" * 40]                     # provenance records the commit
    assert Path(record.folder).name == f"microsoft__deberta-v3-large@{'d' * 40}"

    class Refused(Exception):
        pass

    def fake_load(dataset, *args, revision=None, **kwargs):
        seen.append(revision)
        raise Refused
    monkeypatch.setattr("datasets.load_dataset", fake_load)
    heads[("eriktks/conll2003", "refs/convert/parquet")] = "e" * 40
    with pytest.raises(SymfusionError):
        load_text_splits("hub_preset", preset="conll2003", hf_cache_dir=str(tmp_path / "hf"))
    heads[("uoft-cs/cifar10", "main")] = "f" * 40
    with pytest.raises(SymfusionError):
        load_image_splits("hub", dataset="uoft-cs/cifar10", revision="main")
    assert seen[1:] == ["e" * 40, "f" * 40]
    assert {entry["commit"] for entry in read_lock(path).values()} == {"d" * 40, "e" * 40, "f" * 40}


def test_offline_a_ref_missing_from_the_lock_file_is_one_line(lock, monkeypatch):
    path, heads, asked = lock
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    for call in (lambda: hub_folder("microsoft/deberta-v3-large", path.parent, "refs/pr/4"),
                 lambda: load_text_splits("hub_preset", preset="ontonotes_bc", hf_cache_dir=str(path.parent))):
        with pytest.raises(SymfusionError, match="not pinned in .* yet and HF_HUB_OFFLINE=1") as error:
            call()
        assert "\n" not in str(error.value)
    assert asked == [] and not path.exists()


def test_a_foreign_or_broken_lock_file_is_refused_and_kept(lock):
    path, heads, asked = lock
    heads[("org/m", "main")] = "1" * 40
    for content in ("{not json", json.dumps({"something": "else"}),
                    json.dumps({"format": "symfusion-hub-lock/1", "revisions": {"model org/m@main": {"commit": "x"}}})):
        path.write_text(content)
        with pytest.raises(SymfusionError, match="lock file") as error:
            pin_revision("org/m", "main", "model", "here")
        assert "\n" not in str(error.value) and path.read_text() == content and asked == []


# ---------------------------------------------------------------------------------------------- safetensors only

def _model_folder(folder: Path, files: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    for name, content in files.items():
        if isinstance(content, dict):
            save_file(content, str(folder / name))
        else:
            (folder / name).write_text(content)
    return folder


def test_a_folder_counts_only_with_safetensors_weights(tmp_path):
    pickled = _model_folder(tmp_path / "pickled", {"pytorch_model.bin": "not read", "spm.model": "x"})
    with pytest.raises(SymfusionError, match=r"no safetensors weights.*only pytorch_model.bin") as error:
        resolve_base(str(pickled))
    assert "\n" not in str(error.value)
    tensor = {"w": torch.zeros(2)}
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    sharded = _model_folder(tmp_path / "sharded", {"model.safetensors.index.json": json.dumps(index),
                                                   "model-00001-of-00002.safetensors": tensor})
    with pytest.raises(SymfusionError, match="missing shards"):
        resolve_base(str(sharded))
    save_file(tensor, str(sharded / "model-00002-of-00002.safetensors"))
    record = resolve_base(str(sharded))
    assert record.source == "local" and record.revision is None
    assert record.weights == ("model.safetensors.index.json", "model-00001-of-00002.safetensors",
                              "model-00002-of-00002.safetensors")
    single = _model_folder(tmp_path / "single", {"model.safetensors": tensor})
    assert resolve_base_model(str(single)) == single


def test_hub_download_without_weights_is_refused_and_never_reused(tmp_path, monkeypatch):
    """DeBERTa-v3-large's main branch through the download filter: JSON and spm.model only -> refused."""
    calls = []

    def fake_download(repo_id, revision=None, local_dir=None, allow_patterns=None):
        calls.append((repo_id, revision, allow_patterns))
        _model_folder(Path(local_dir), {"tokenizer_config.json": "{}", "spm.model": "x"})

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_download)
    commit = "0" * 40
    for attempt in range(2):                                     # the incomplete folder is downloaded again, not reused
        with pytest.raises(SymfusionError, match="has no safetensors weights.*pickles are never loaded") as error:
            hub_folder("org/pickled", tmp_path, commit)
        assert "\n" not in str(error.value)
    assert calls == [("org/pickled", commit, HUB_PATTERNS)] * 2
    assert not any(p.endswith(".bin") or p.endswith(".h5") for p in HUB_PATTERNS)

    def fake_safetensors(repo_id, revision=None, local_dir=None, allow_patterns=None):
        calls.append((repo_id, revision, allow_patterns))
        _model_folder(Path(local_dir), {"model.safetensors": {"w": torch.zeros(1)}})

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_safetensors)
    record = resolve_base("hub:org/good", revision=commit, cache_dir=tmp_path)
    assert record.source == "hub" and record.revision == commit and record.weights == ("model.safetensors",)
    assert Path(record.folder) == tmp_path / f"org__good@{commit}"          # one folder per pinned revision
    assert resolve_base("hub:org/good", revision=commit, cache_dir=tmp_path) == record      # reused: no new call
    assert len(calls) == 3
    other = "1" * 40
    resolve_base("hub:org/good", revision=other, cache_dir=tmp_path)                          # a new pin downloads anew
    assert calls[-1] == ("org/good", other, HUB_PATTERNS)


def test_offline_with_an_incomplete_folder_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _model_folder(tmp_path / "org__half", {"pytorch_model.bin": "x"})
    with pytest.raises(SymfusionError, match=r"has no safetensors weights.*HF_HUB_OFFLINE=1"):
        hub_folder("org/half", tmp_path)
