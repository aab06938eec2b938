"""Pinned Hub revisions in conf/ and the presets, placeholder refusals, and safetensors-only base-model folders."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

from symfusion.pipeline.basemodels import HUB_PATTERNS, hub_folder, resolve_base, resolve_base_model
from symfusion.pipeline.data import load_image_splits
from symfusion.pipeline.data.text import load_text_splits
from symfusion.pipeline.data.text.hub import HUB_TEXT_PRESETS
from symfusion.errors import SymfusionError
from symfusion.pipeline.revisions import UNPINNABLE, is_pinned, is_placeholder, unpinned

CONF = Path(__file__).resolve().parents[1] / "conf"


def _task(name: str):
    config = OmegaConf.load(CONF / "task" / f"{name}.yaml")
    bases = [d for d in config.pop("defaults", []) if d != "_self_"]
    return OmegaConf.merge(*(_task(base) for base in bases), config) if bases else config


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


def test_every_hub_source_in_conf_is_pinned_or_listed_as_unpinnable():
    specs = hub_specs()
    paper = OmegaConf.load(CONF / "profile" / "paper.yaml")
    language = paper.language
    paper_tasks = [paper.vision.task, *language.emotion, *language.ner, language.ner_ood, *language.glue]
    assert {f"task {t}" for t in paper_tasks} | {f"model {m}" for m in language.models} <= set(specs)
    for where, (repo, revision) in specs.items():
        assert is_pinned(revision) or (is_placeholder(revision) and repo in UNPINNABLE), (where, repo, revision)
    used = {repo for repo, revision in specs.values() if is_placeholder(revision)}
    assert used == set(UNPINNABLE), "UNPINNABLE lists a repository no placeholder uses (or misses one)"
    assert specs["model roberta_base"] == ("FacebookAI/roberta-base", "e2da8e2f811d1448a5b465c236feacd80ffbac7b")
    assert specs["model deberta_v3_large"] == ("microsoft/deberta-v3-large", unpinned("refs/pr/4"))


def test_every_preset_is_pinned_or_listed():
    for name, preset in HUB_TEXT_PRESETS.items():
        revision = preset.get("revision")
        assert is_pinned(revision) or (is_placeholder(revision) and preset["dataset"] in UNPINNABLE), name


@pytest.mark.parametrize("call", [
    lambda tmp: hub_folder("microsoft/deberta-v3-large", tmp, unpinned("refs/pr/4")),
    lambda tmp: resolve_base("hub:microsoft/deberta-v3-large", revision=unpinned("refs/pr/4"), cache_dir=tmp),
    lambda tmp: load_text_splits("hub_preset", preset="conll2003", hf_cache_dir=str(tmp)),
    lambda tmp: load_text_splits("hub_preset", preset="ontonotes_bc", hf_cache_dir=str(tmp)),
    lambda tmp: load_image_splits("hub", dataset="uoft-cs/cifar10", revision=unpinned("main")),
])
def test_placeholders_are_refused_before_the_hub_is_asked(call, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)          # the refusal, not the offline switch, must stop it
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda *a, **k: pytest.fail("the Hub was asked"))
    with pytest.raises(SymfusionError, match="has no pinned revision") as error:
        call(tmp_path)
    assert "\n" not in str(error.value) and ("set that 40-hex commit" in str(error.value))


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
