"""Red team, issue 55 classes 5, 6 and 8: values keep the type and precedence the user wrote; statistics say when
there is too little evidence; precision and data given to the API.

Class 5 enumerates every option of every command (its configuration composed) and fails for one without a check
in its declaration (CHECKS); every path or name option is given values Hydra reads as another type (1_2, true, 1e3, 0x1F, nan)
and must keep the text written; every integer option and every task kind's limit is given a negative value and
must be refused; every profile and every task kind: a task setting given on the command line wins over the
profile's. Class 6 enumerates the metrics of uncertainty.py and the CSV writers of src/. Class 8 enumerates the
floating dtypes narrower than float32 and the keys of a batch align() reads.
"""
from __future__ import annotations

import ast
import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from symfusion.errors import SymfusionError
from symfusion.pipeline import cli, command
from symfusion.pipeline.command import checks, compose, names
from symfusion.io import batches
from symfusion.matching import MatchConfig
from symfusion.pipeline.data.images import split_image_arrays
from symfusion.pipeline.data.text.lm import seeded_rows
from symfusion.pipeline.data.text.splits import _apply_limit
from symfusion.pipeline.report.barriers import barrier_rows
from symfusion.pipeline.report.effects import accuracy_effect, agreement, paired
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.report.results import csv_text
from symfusion.pipeline.uncertainty import METRICS, MIN_EXAMPLES, TOO_FEW, paired_effect, resamples, scores
from symfusion.pipeline.config import (_PARSER, check_values, command_line_first, given_options, group_names,
                                       load_group, text_override, texts_of)
from symfusion.pipeline.tasks import TASK_KINDS, sized_task
from hostile import assert_refused, outcome, snapshot
from test_language_report import eval_file
from test_report_figures import barrier_result
from test_vision_stages import merged_evaluation_files
from tiny_decoders import tiny_decoder
from tiny_models import randomize

SRC = Path(__file__).resolve().parents[2] / "src" / "symfusion"

# ---------------------------------------------------------------- class 5: types and precedence of values

# Hydra reads these as an int, a bool, a float, an int, a float: a path or name must stay the text written
RETYPED = ("1_2", "true", "1e3", "0x1F", "nan", "False")
# options of a command that are config groups or Hydra's own (chosen by name: a conf file, checked when composed)
GROUPS = {"hydra", "task", "profile", "matching", "fusion", "model"}
# every command's checks, from its declaration (every stage module imported)
CHECKS = {name: checks(name) for name in names()}


def options(name: str) -> set[str]:
    return set(compose(name, [])) - GROUPS


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_every_option_of_every_command_has_a_check(name):
    checked = {key.split(".")[0] for key in CHECKS[name]}
    assert options(name) - checked == set(), f"symfusion-{name}: options without a check in its declaration"


def test_every_command_is_enumerated():
    assert sorted(CHECKS) == sorted(command.COMMANDS) and {"data", "match", "merge", "report"} <= set(CHECKS)


PATH_KEYS = [(name, key) for name in sorted(CHECKS) for key in sorted(texts_of(CHECKS[name]))]


@pytest.mark.parametrize("name,key", PATH_KEYS, ids=[f"{n}-{k}" for n, k in PATH_KEYS])
def test_a_path_or_name_keeps_the_text_written(name, key):
    """Every value through the override rewriting; one of them (in turn) through Hydra's whole composition."""
    listed = CHECKS[name][key].describe.startswith("a list")
    for value in RETYPED:
        override = text_override(f"{key}=[{value},{value}x]" if listed else f"{key}={value}", texts_of(CHECKS[name]))
        found = _PARSER.parse_override(override).value()
        assert found == ([value, f"{value}x"] if listed else value), override
    value = RETYPED[PATH_KEYS.index((name, key)) % len(RETYPED)]
    cfg = compose(name, [f"{key}=[{value},{value}x]" if listed else f"{key}={value}"])
    found = OmegaConf.select(cfg, key)
    assert (list(found) if listed else found) == ([value, f"{value}x"] if listed else value)


def test_null_and_quoted_values_stay_as_hydra_reads_them():
    texts = frozenset({"output", "models"})
    assert text_override("output=null", texts) == "output=null"
    assert text_override("output='12'", texts) == "output='12'"
    assert text_override("models=[a,'b,c']", texts) == "models=[a,'b,c']"
    assert text_override("points=12", texts) == "points=12"


def test_the_path_options_are_those_the_commands_read_as_paths():
    """The named instances: every output, model folder and result list is among the text options."""
    for name, declared in CHECKS.items():
        assert {"output", "model_dir", "anchor", "source", "models", "inputs"} & set(declared) <= texts_of(declared), name


def test_output_1_2_writes_the_path_1_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, text = outcome(lambda: cli.data_main(["task=digits", "task.limit={train: 16, validation: 8, test: 8}",
                                                "output=1_2"]))
    assert code in ("ok", 0), text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1_2"]
    assert json.loads((tmp_path / "1_2").read_text())["task"] == "digits"


def test_an_earlier_number_is_not_a_path(tmp_path):
    """A value that is not text (a YAML number in a profile or a preset) is refused, not turned into a path."""
    cfg = OmegaConf.create({"output": 12})
    with pytest.raises(SymfusionError, match="output=12 must be a path or name"):
        check_values(cfg, {"output": CHECKS["data"]["output"]})


INTEGER_CASES = [(name, key) for name in sorted(CHECKS) for key, check in sorted(CHECKS[name].items())
                 if check.describe.startswith("an integer")]


@pytest.mark.parametrize("name,key", INTEGER_CASES, ids=[f"{n}-{k}" for n, k in INTEGER_CASES])
def test_a_negative_integer_is_refused_by_every_command(name, key):
    """KEY=-1 as Hydra composes it, against that option's check (the whole command: test_a_bad_limit_... below)."""
    cfg = compose(name, [f"++{key}=-1"])      # ++: a key the task may lack
    with pytest.raises(SymfusionError, match=f"^{key}=-1 must be an integer >= "):
        check_values(cfg, {key: CHECKS[name][key]})


BAD_LIMITS = ["{train: -1}", "{validation: -5}", "{test: 1.5}", "{dev: 3}", "{train: true}"]


def task_of_kind(kind: str) -> str:
    return next(n for n in group_names("task") if load_group("task", n).get("kind") == kind)


@pytest.mark.parametrize("kind", TASK_KINDS)
def test_a_bad_limit_is_refused_for_every_task_kind(kind, tmp_path):
    """A negative cap, and one more bad limit in turn, before any data is read."""
    for limit in (BAD_LIMITS[0], BAD_LIMITS[1 + TASK_KINDS.index(kind) % (len(BAD_LIMITS) - 1)]):
        output = tmp_path / "data.json"
        before = snapshot(tmp_path, output)
        code, text = outcome(lambda: cli.data_main([f"task={task_of_kind(kind)}", f"task.limit={limit}",
                                                    f"output={output}"]))
        assert "task.limit" in assert_refused(code, text, tmp_path, before, output, f"{kind} {limit}")


def _image_limit(limit):
    images, labels = np.zeros((40, 1, 2, 2), np.float32), np.arange(40) % 4
    return split_image_arrays({"train": (images, labels)}, limit=limit)


def _text_limit(limit):
    return _apply_limit({"train": [{"x": i} for i in range(10)], "validation": [], "test": []}, limit, 0)


def _block_limit(limit):
    return seeded_rows(10, limit["train"], 0)


# the reader that cuts each task kind's splits to its limit (the library's own check, beside the command line's)
LIMIT_READERS = {"image": _image_limit, "text_classification": _text_limit, "token_classification": _text_limit,
                 "regression": _text_limit, "causal_lm": _block_limit}


def test_every_task_kind_has_a_limit_reader():
    assert sorted(LIMIT_READERS) == sorted(TASK_KINDS)


@pytest.mark.parametrize("kind", TASK_KINDS)
def test_a_negative_limit_is_refused_by_every_reader(kind):
    with pytest.raises(SymfusionError, match="non-negative integer"):
        LIMIT_READERS[kind]({"train": -3})
    LIMIT_READERS[kind]({"train": 3})                 # and a good one is read


def _with_profile(task: str, profile: str, given: dict, composed: bool = False):
    """The task as a stage sizes it when the command line gives `given` (dotted task keys -> values)."""
    argv = [f"++task.{k}={json.dumps(v).replace(chr(34), '')}" for k, v in given.items()]   # {train: 3, ...}
    if composed:                         # the whole command line, as Hydra composes it
        cfg = compose("data", [f"task={task}", f"profile={profile}", *argv])
    else:                                # the same, cheaper: the task's and the profile's yaml, the values set
        cfg = OmegaConf.create({"task": load_group("task", task), "profile": load_group("profile", profile)})
        for key, value in given.items():
            OmegaConf.update(cfg, f"task.{key}", value, force_add=True)
    command_line_first(cfg, given_options(argv))
    return sized_task(cfg.task, cfg.profile)


GIVEN = {"limit": {"train": 3, "validation": 2, "test": 1}, "train.epochs": 7, "split_seed": 11}


@pytest.mark.parametrize("profile", group_names("profile"))
def test_the_command_line_wins_over_every_profile(profile):
    if OmegaConf.select(load_group("profile", profile), "sources"):
        pytest.skip("its sources manifest is written by scripts/make_standins.py (the refusal: the next test)")
    for kind in TASK_KINDS:
        task = task_of_kind(kind)
        given = _with_profile(task, profile, GIVEN)
        assert OmegaConf.to_container(given.limit) == GIVEN["limit"], (kind, given.limit)
        assert (given.train.epochs, given.split_seed) == (7, 11), kind
        one = _with_profile(task, profile, {"limit.train": 4})     # one cap given: the profile keeps the others
        plain = sized_task(load_group("task", task), load_group("profile", profile))
        assert one.limit.train == 4, kind
        assert {k: v for k, v in (plain.limit or {}).items() if k != "train"} == \
            {k: v for k, v in one.limit.items() if k != "train"}, kind


def test_the_command_line_wins_through_hydra():
    """The same through the composed command line (the smoke profile shrinks text tasks to 32 training examples)."""
    assert _with_profile("rt_d0", "smoke", GIVEN, composed=True).limit.train == 3
    assert _with_profile("rt_d0", "smoke", {}, composed=True).limit.train == 32


def test_a_setting_the_profiles_sources_decide_is_refused(tmp_path):
    manifest = tmp_path / "sources.json"
    manifest.write_text(json.dumps({"tasks": {"rt_d0": {"source": "standins/rt", "limit": {"train": 8}}}}))
    cfg = compose("data", ["task=rt_d0", "profile=smoke", f"+profile.sources={manifest}"])
    with pytest.raises(SymfusionError, match="task.limit is set by profile smoke's sources"):
        command_line_first(cfg, {"task.limit"})
    command_line_first(cfg, {"task.max_length"})                   # one it does not decide: the command line's


def test_a_model_setting_the_profiles_sources_decide_is_refused(tmp_path):
    """The manifest's models patch (profile_model) would replace a base model given on the command line silently."""
    manifest = tmp_path / "sources.json"
    manifest.write_text(json.dumps({"models": {"minilm": {"base_model": str(tmp_path / "standin")}}}))
    cfg = compose("train", ["task=rt_d0", "model=minilm", "profile=smoke", f"+profile.sources={manifest}"])
    with pytest.raises(SymfusionError, match="model.base_model is set by profile smoke's sources"):
        command_line_first(cfg, {"model.base_model"})
    command_line_first(cfg, {"model.tie_word_embeddings"})         # one it does not decide: the command line's


# ---------------------------------------------------------------- class 6: statistics with too little evidence

def better_and_worse(metric: str, n: int) -> tuple[dict, dict]:
    """Per-example records of one metric on n examples: `with` better than `without` on every one of them."""
    if metric == "accuracy":
        return {"correct": [1] * n}, {"correct": [0] * n}
    if metric == "loss":
        return {"loss": [0.1] * n}, {"loss": [2.0] * n}
    if metric in ("macro_f1", "mcc"):
        reference = [i % 2 for i in range(n)]
        return {"prediction": reference, "reference": reference}, \
               {"prediction": [1 - r for r in reference], "reference": reference}
    if metric == "pearson_spearman":
        reference = [float(i) for i in range(n)]
        return {"prediction": reference, "reference": reference}, \
               {"prediction": reference[::-1], "reference": reference}
    if metric == "span_f1":
        return {"tp": [2] * n, "predicted": [2] * n, "gold": [2] * n}, {"tp": [0] * n, "predicted": [2] * n,
                                                                       "gold": [2] * n}
    raise AssertionError(metric)


def test_every_metric_has_a_case():
    for metric in METRICS:
        better_and_worse(metric, 3)


@pytest.mark.parametrize("metric", ["accuracy", "loss", "macro_f1", "mcc", "pearson_spearman", "span_f1"])
def test_an_effect_over_too_few_examples_is_not_judged(metric):
    expected = "hurts" if metric == "loss" else "helps"        # lower is better for a loss: `with` is lower
    for n in range(1, MIN_EXAMPLES):
        with_, without = better_and_worse(metric, n)
        found = paired_effect(metric, [(with_, without, "t")])
        assert found["verdict"] == TOO_FEW, (metric, n, found)
    with_, without = better_and_worse(metric, 40)
    assert paired_effect(metric, [(with_, without, "t")])["verdict"] in (expected, "helps")


def test_one_example_reaches_the_table_as_too_few(tmp_path):
    """The named instance: a table's effect over one test example (a zero-width interval) is not "helps"."""
    with_ = {"p": {"results": [{"task": "digits", "per_example": {"correct": [1]}}]}}
    without = {"p": {"results": [{"task": "digits", "per_example": {"correct": [0]}}]}}
    found = accuracy_effect(with_, without)
    assert found["low"] == found["high"] == 100.0                 # the interval the bootstrap gives: width 0
    assert found["verdict"] == "too few examples" and agreement(found["verdict"], "helps") == "not detectable"


def test_the_barrier_change_over_too_few_examples_is_not_judged(tmp_path):
    paths = []
    for seed, (matching, bump) in enumerate((("none", 1.0), ("rotation", 0.2), ("attn_only", 0.9))):
        path, data = barrier_result(tmp_path, matching, tmp_path / "matched" / matching, bump=bump, seed=seed)
        for point in data["path"]:                                  # three test examples per point of the path
            point["per_example"]["loss"] = point["per_example"]["loss"][:3]
        Path(path).write_text(json.dumps({**data, "examples": 3}))
        paths.append(path)
    _, _, _, summary = barrier_rows(paths, experiment("fig5_barrier"))
    assert {s["verdict"] for s in summary.values()} == {"too few examples"}


BAD_IDS = [1.5, -1, True, None, "2", float("nan")]


@pytest.mark.parametrize("metric", ["macro_f1", "mcc"])
@pytest.mark.parametrize("key", ["prediction", "reference"])
def test_class_ids_are_checked_before_a_table_is_built(metric, key):
    for bad in BAD_IDS:
        good = {"prediction": [0, 1, 2, 1, 0, 2], "reference": [0, 1, 2, 2, 0, 1]}
        wrong = {**good, key: good[key][:-1] + [bad]}
        with pytest.raises(SymfusionError, match=f"per_example.{key} holds .*class ids are integers >= 0"):
            paired(metric, [(wrong, good, "t")])


def test_a_huge_class_id_is_read_as_the_class_it_names():
    """10^12 is a class id like 2 (both metrics ignore classes never seen): the same scores, exactly, at once."""
    small = {"prediction": [0, 1, 2, 1, 0, 2, 2, 1], "reference": [0, 1, 2, 2, 0, 1, 2, 0]}
    huge = {k: [10**12 if v == 2 else v for v in values] for k, values in small.items()}
    index = resamples(8, "t")
    for metric in ("macro_f1", "mcc"):
        assert np.array_equal(scores(metric, small, index), scores(metric, huge, index))


def test_a_table_with_a_fractional_prediction_is_refused_in_one_line(tmp_path):
    c = "text_classification"
    paths = [eval_file(tmp_path, "eval/b-onto-a/none/simple.json", "simple", "none", [("a", c, 0.4)]),
             eval_file(tmp_path, "eval/b-onto-a/attn_only_no_rescale/simple.json", "simple", "attn_only_no_rescale",
                       [("a", c, 0.6)])]
    data = json.loads(Path(paths[1]).read_text())
    data["results"][0]["per_example"]["prediction"][3] = 0.5
    Path(paths[1]).write_text(json.dumps(data))
    output = tmp_path / "out" / "table1.csv"
    output.parent.mkdir()
    before = snapshot(tmp_path, output)
    code, text = outcome(lambda: cli.report_main(["artefact=table1", f"inputs=[{','.join(paths)}]",
                                                  f"output={output}"]))
    assert "class ids" in assert_refused(code, text, tmp_path, before, output, "fractional prediction")
    assert list(output.parent.iterdir()) == []


FORMULAS = ["=HYPERLINK(\"http://x\")", "+1+2", "-2+cmd|' /C calc'!A0", "@SUM(A1)", "\tx", "\rx"]


def test_every_csv_writer_is_the_checked_one():
    """The one CSV writer of src/ (results.csv_text) is where cells are checked: no other module writes CSV."""
    writers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("writer", "DictWriter", "to_csv") \
                    and isinstance(node.value, ast.Name) and node.value.id in ("csv", "pd", "pandas"):
                writers.append(str(path.relative_to(SRC)))
    assert writers == ["pipeline/report/results.py"]


@pytest.mark.parametrize("formula", FORMULAS)
def test_no_text_reaches_a_csv_cell_as_a_formula(formula):
    with pytest.raises(SymfusionError, match="formula"):
        csv_text([{"model": "a", "effect": 1.0}, {"model": formula, "effect": -2.5}])
    with pytest.raises(SymfusionError, match="formula"):
        csv_text([{"model": "a", formula: 1.0}])
    rows = list(csv.DictReader(io.StringIO(csv_text([{"model": "a", "effect": -2.5, "note": "-1.5e-3"}]))))
    assert rows == [{"model": "a", "effect": "-2.5", "note": "-1.5e-3"}]     # numbers (a minus sign) are kept


@pytest.mark.parametrize("method", ["=HYPERLINK(\"http://x\")", "average", "Simple"])
def test_an_unknown_method_is_refused_by_every_table_reader(method, tmp_path):
    """Artefacts that read evaluations refuse a method symfusion lacks (results.check_inputs, which run_report calls
    for every registry entry before its writer reads anything)."""
    c = "text_classification"
    language = [eval_file(tmp_path, "eval/b-onto-a/none/simple.json", method, "none", [("a", c, 0.4)])]
    vision = merged_evaluation_files(tmp_path / "v", {"none": 0.5}) if (tmp_path / "v").mkdir() is None else []
    data = json.loads(Path(vision[0]).read_text())
    Path(vision[0]).write_text(json.dumps({**data, "method": method}))
    for artefact, inputs, suffix in (("table1", language, ".csv"), ("table2", vision, ".csv"),
                                     ("fig3_ablation", vision, ".png")):
        output = tmp_path / "out" / f"{artefact}{suffix}"
        output.parent.mkdir(exist_ok=True)
        before = snapshot(tmp_path, output)
        code, text = outcome(lambda: cli.report_main([f"artefact={artefact}", f"inputs=[{','.join(inputs)}]",
                                                      f"output={output}"]))
        line = assert_refused(code, text, tmp_path, before, output, f"{artefact} method={method}")
        assert "is no fusion method of symfusion" in line, line


# ---------------------------------------------------------------- class 8: precision and data given to the API

# the floating dtypes a folder may store whose range a matched finite model can pass: a model's values are at most
# 1.8e19 (arch.check_finite) and a rotation grows them by at most sqrt(width), so bfloat16 (3.4e38) is never passed
NARROW = [d for d in (torch.float16, torch.bfloat16, torch.float32) if torch.finfo(d).max < 1e30]
NO_RESCALE = "attn_only_no_rescale"          # rotates heads, scales nothing: the rotated values grow by up to sqrt(d)


def overflowing_pair(dtype):
    """A float16 source whose value maps hold +-60000 in one input column: rotating a head's rows gives entries up
    to 60000 sqrt(d) (1.1e5 here), past float16's 65504; the anchor is an ordinary model."""
    source, anchor = tiny_decoder("llama", seed=1, dtype=dtype), tiny_decoder("llama", seed=0, dtype=dtype)
    with torch.no_grad():
        value = source.model.layers[0].self_attn.v_proj.weight
        value[:, 0] = 60000.0 * torch.sign(torch.randn(value.shape[0], generator=torch.Generator().manual_seed(0)))
        source.model.layers[0].self_attn.o_proj.weight.mul_(1e-4)
    return source, anchor


def test_every_narrow_dtype_is_enumerated():
    assert NARROW == [torch.float16]


def test_a_bfloat16_source_of_the_same_values_matches():
    """bfloat16 stores 1.1e5 (rounded): the same model in bfloat16 is matched, not refused."""
    import symfusion
    source, anchor = overflowing_pair(torch.bfloat16)
    matched, _ = symfusion.align(source, anchor, matching=NO_RESCALE)
    value = matched.model.layers[0].self_attn.v_proj.weight.detach()
    assert value.dtype == torch.bfloat16 and float(value.float().abs().max()) > 65504


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("how", ["modules", "folders in memory", "folders streamed", "symfusion-match"])
def test_matched_weights_beyond_the_stored_range_are_refused_naming_it(dtype, how, tmp_path):
    import symfusion
    source, anchor = overflowing_pair(dtype)
    source.save_pretrained(str(tmp_path / "source"))
    anchor.save_pretrained(str(tmp_path / "anchor"))
    output = tmp_path / "matched"
    before = snapshot(tmp_path, output)
    calls = {
        "modules": lambda: symfusion.align(source, anchor, matching=NO_RESCALE),
        "folders in memory": lambda: symfusion.align(str(tmp_path / "source"), str(tmp_path / "anchor"),
                                                     matching=NO_RESCALE, output=output, in_memory=True),
        "folders streamed": lambda: symfusion.align(str(tmp_path / "source"), str(tmp_path / "anchor"),
                                                    matching=NO_RESCALE, output=output, in_memory=False),
        "symfusion-match": lambda: cli.match_main([f"source={tmp_path / 'source'}", f"anchor={tmp_path / 'anchor'}",
                                                   f"matching={NO_RESCALE}", f"output={output}"]),
    }
    code, text = outcome(calls[how])
    line = assert_refused(code, text, tmp_path, before, output, how)
    limit = f"{torch.finfo(dtype).max:.6g}"
    assert f"beyond {str(dtype)[6:]}'s range (|x| <= {limit})" in line and "bug" not in line, line


def test_the_same_source_in_float32_matches():
    """The refusal's advice holds: the float32 copy of that model matches, within the usual tolerance."""
    import symfusion
    source, anchor = overflowing_pair(torch.float16)
    _, report = symfusion.align(source.float(), anchor.float(), matching=NO_RESCALE)
    assert report["relative_output_change"] <= 1e-3


def _batch(ids: torch.Tensor, **more) -> dict:
    return {"input_ids": ids, "labels": ids.clone(), **more}


IDS = torch.arange(16).reshape(2, 8) % 97
# a batch key align() reads -> batches that break its rule (a causal LM of vocabulary 97)
BAD_BATCHES = {
    "input_ids": [_batch(IDS + 200), _batch(IDS - 50), {"input_ids": IDS.float(), "labels": IDS},
                  {"input_ids": IDS.tolist(), "labels": IDS}, {"labels": IDS}, _batch(IDS[0])],
    "labels": [{"input_ids": IDS, "labels": IDS + 97}, {"input_ids": IDS, "labels": IDS - 300},
               {"input_ids": IDS, "labels": IDS.float()}, {"input_ids": IDS, "labels": IDS[:, :3]},
               {"pixel_values": torch.ones(2, 1, 8, 8), "labels": torch.tensor([0, 10])},     # a ViT of 10 classes
               {"pixel_values": torch.ones(2, 1, 8, 8), "labels": torch.tensor([[0], [1]])}],
    "attention_mask": [_batch(IDS, attention_mask=torch.ones(3, 3))],
    "token_type_ids": [_batch(IDS, token_type_ids=torch.zeros(2, 7, dtype=torch.long))],
    "pixel_values": [{"pixel_values": torch.full((2, 1, 8, 8), float("nan")), "labels": torch.tensor([0, 1])},
                     {"pixel_values": torch.ones(2, 1, 8, 8, dtype=torch.long), "labels": torch.tensor([0, 1])}],
}
LEARNED = dict(attention="rotation", rescale=True, ffn="permutation", heads=True, residual="auto", refine="loss",
               refine_steps=1)


def test_every_key_a_batch_holds_has_a_case():
    keys = set(ast.literal_eval(n.value) for n in ast.walk(ast.parse(Path(batches.__file__).read_text()))
               if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "batch"
               for n in [n.slice] if isinstance(n, ast.Constant))
    keys |= set(batches.SAME_SHAPE) | {"input_ids", "labels", "pixel_values"}
    assert sorted(BAD_BATCHES) == sorted(keys)


@pytest.fixture(scope="module")
def pairs():
    import transformers as tf
    vit = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    return {"text": (tiny_decoder("llama", seed=1), tiny_decoder("llama", seed=0)),
            "image": tuple(randomize(tf.ViTForImageClassification(vit), s) for s in (1, 0))}


CASES8 = [(key, i) for key, batches in BAD_BATCHES.items() for i in range(len(batches))]


@pytest.mark.parametrize("key,i", CASES8, ids=[f"{k}-{i}" for k, i in CASES8])
def test_align_data_is_checked_in_one_line(pairs, key, i):
    import symfusion
    batch = BAD_BATCHES[key][i]
    source, anchor = pairs["image" if "pixel_values" in batch else "text"]
    code, text = outcome(lambda: symfusion.align(source, anchor, matching=MatchConfig(**LEARNED), data=[batch]))
    assert code == "error" and len(text.strip().splitlines()) == 1, text[-800:]
    assert f"data[0][{key!r}]" in text, text


def test_good_data_is_read(pairs):
    import symfusion
    source, anchor = pairs["text"]
    ignored = IDS.clone()
    ignored[:, 0] = -100                                   # transformers' ignored label is a label too
    _, report = symfusion.align(source, anchor, matching=MatchConfig(**LEARNED), data=[_batch(IDS),
                                                                                      {"input_ids": IDS, "labels": ignored}])
    assert report["data"] == {"batches": 2}
