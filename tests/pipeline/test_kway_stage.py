"""The k-way experiment's scores (symfusion.interpolation's simplex, pipeline/kway.py) and its stage (symfusion-kway),
on tiny digits ViTs: the simplex barrier of k identical models is 0, the centroid merge of the models as trained is
the mean of their weights, the logit ensemble of k identical models is the model, the table and figure writer reads
the stage's JSONs in the registry's order, and every mistake is one `error:` line with nothing written."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import transformers as tf

from symfusion.interpolation import barrier_height, mixture, simplex_barrier, simplex_grid
from symfusion.matching import MatchConfig, matching_config
from symfusion.pipeline import cli, kway
from symfusion.pipeline.command import compose
from symfusion.pipeline.report import artefacts
from symfusion.pipeline.report.audit import table_section
from symfusion.pipeline.report.compare import compare_run
from symfusion.pipeline.report.registry import experiment
from symfusion.pipeline.tasks import make_task
import symfusion.pipeline.data.text.lm as lm
from symfusion.io.modelio import load_model
from symfusion.pipeline.stages.kway import run_kway
from hostile import assert_refused, outcome, snapshot
from test_causal_lm import TINY_LLAMA, toy_documents, toy_task
from tiny_models import digits_vit_folders

DIGITS = ("task=digits", "task.limit={train: 64, validation: 32, test: 48}")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    return digits_vit_folders(tmp_path_factory.mktemp("vits"))


@pytest.fixture(scope="module")
def task():
    cfg = compose("kway", list(DIGITS))                 # the task as the stage composes it (task_of)
    return make_task(cfg.task, cfg.get("profile"))


def listed(paths) -> str:
    return "[" + ",".join(str(p) for p in paths) + "]"


def run(*args: str):
    return outcome(lambda: cli.kway_main([*DIGITS, *args]))


def states(paths) -> list[dict]:
    return [tf.ViTForImageClassification.from_pretrained(str(p)).state_dict() for p in paths]


def test_the_simplex_grid_and_barrier():
    """13 points for k = 3 in steps of 1/4 (12 with two or three nonzero weights, then the centroid); at k = 4 the
    centroid is on the grid; at k = 2 the simplex barrier is the barrier above the straight line."""
    grid = simplex_grid(3, 4)
    assert len(grid) == 13 and grid[-1] == (1 / 3, 1 / 3, 1 / 3)
    assert all(abs(sum(p) - 1) < 1e-12 and sum(w > 0 for w in p) >= 2 for p in grid)
    assert len(simplex_grid(4, 4)) == len(set(simplex_grid(4, 4))) and (0.25,) * 4 in simplex_grid(4, 4)
    alphas, losses = [0, 0.25, 0.5, 0.75, 1], [1.0, 1.7, 2.1, 1.4, 0.6]
    inner = [((1 - a), a) for a in alphas[1:-1]]        # (weight of the first end model, of the second)
    assert simplex_barrier(inner, losses[1:-1], [losses[0], losses[-1]]) == pytest.approx(
        barrier_height(alphas, losses), abs=1e-12)
    assert simplex_barrier(grid, [2.5] * len(grid), [2.5, 2.5, 2.5]) == pytest.approx(0, abs=1e-12)
    with pytest.raises(Exception, match="k >= 2"):
        simplex_grid(1, 4)


def test_the_centroid_of_naive_averaging_is_the_mean_of_the_weights(folders, task, tmp_path):
    ours = states(folders)
    centroid = mixture(ours, [1 / 3] * 3)
    for key, value in ours[0].items():
        mean = torch.stack([s[key] for s in ours]).mean(0)
        assert torch.allclose(centroid[key], mean, rtol=0, atol=1e-6), key
    out = tmp_path / "naive.json"
    code, text = run(f"ends={listed(folders)}", f"models={listed(folders)}", f"output={out}", "way=anchor/none")
    assert code == 0, text
    report = json.loads(out.read_text())
    model = tf.ViTForImageClassification.from_pretrained(str(folders[0]))
    model.load_state_dict({k: torch.stack([s[k] for s in ours]).mean(0) for k in ours[0]})
    by_hand = task.evaluate(model.eval(), "test")
    assert report["centroid"]["accuracy"] == by_hand["accuracy"]
    assert report["centroid"]["loss"] == pytest.approx(by_hand["loss"], rel=1e-5)
    assert len(report["points"]) == 13 and report["way"] == "anchor/none"
    assert report["barrier"] == max(p["loss"] - sum(w * e for w, e in zip(p["weights"], report["end_losses"]))
                                    for p in report["points"])


def test_k_identical_models_have_barrier_zero_and_are_their_own_ensemble(folders, task, tmp_path):
    copies = []
    for i in range(3):
        copies.append(tmp_path / f"copy{i}")
        shutil.copytree(folders[1], copies[-1])
    out = tmp_path / "same.json"
    code, text = run(f"ends={listed(copies)}", f"models={listed(copies)}", f"output={out}", "grid=2", "examples=20")
    assert code == 0, text
    report = json.loads(out.read_text())
    assert abs(report["barrier"]) < 1e-5 and len(report["points"]) == 4
    assert report["end_losses"] == [report["end_losses"][0]] * 3
    alone = task.evaluate(tf.ViTForImageClassification.from_pretrained(str(folders[1])).eval(), "test")
    assert report["centroid"]["accuracy"] == alone["accuracy"]
    models = [tf.ViTForImageClassification.from_pretrained(str(p)) for p in copies]
    together = kway.ensemble(models, task)
    assert together["accuracy"] == alone["accuracy"] and together["loss"] == pytest.approx(alone["loss"], rel=1e-6)


def test_the_end_models_their_best_and_the_writer(folders, task, tmp_path):
    ends = tmp_path / "ends.json"
    assert run(f"ends={listed(folders)}", f"output={ends}")[0] == 0
    data = json.loads(ends.read_text())
    assert [e["accuracy"] for e in data["end_evals"]] == [
        task.evaluate(tf.ViTForImageClassification.from_pretrained(str(p)).eval(), "test")["accuracy"] for p in folders]
    assert data["best"]["accuracy"] == max(e["accuracy"] for e in data["end_evals"])
    ways = {}
    for way, models in (("anchor/none", folders), ("universe/full_symmetry", folders[::-1])):
        ways[way] = tmp_path / f"{way.replace('/', '_')}.json"
        assert run(f"ends={listed(folders)}", f"models={listed(models)}", f"output={ways[way]}", f"way={way}",
                   "grid=1")[0] == 0
    entry = experiment("table_kway")
    rows = artefacts.writer_of(entry).build([str(ends), *map(str, ways.values())], entry).rows
    assert [r["way"] for r in rows] == ["anchor/none", "universe/full_symmetry", "best", "ensemble"]
    assert rows[0]["barrier_of_naive_pct"] == 100 and rows[0]["centroid"] == 100 * json.loads(
        ways["anchor/none"].read_text())["centroid"]["accuracy"]
    figure = artefacts.writer_of(experiment("fig_kway")).build([str(ends), str(ways["anchor/none"])],
                                                               experiment("fig_kway"))
    assert figure.files[".png"][:4] == b"\x89PNG" and figure.rows[-1]["way"] == "ensemble"
    with pytest.raises(Exception, match="does not declare"):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**json.loads(ways["anchor/none"].read_text()), "way": "anchor/rotation"}))
        artefacts.writer_of(entry).build([str(ends), str(bad)], entry)


def test_a_way_reads_the_end_models_line_from_their_json_bit_for_bit(folders, task, tmp_path):
    """The end models' losses on the barrier's examples are computed once (without models=, the rule kway_ends) and
    read by each way (line=): its scores are those of a way that computes them itself, to the bit."""
    ends = tmp_path / "ends.json"
    assert run(f"ends={listed(folders)}", f"output={ends}", "examples=20")[0] == 0
    line = json.loads(ends.read_text())["line"]
    assert line["examples"] == 20 and line["end_losses"] == [
        task.evaluate(tf.ViTForImageClassification.from_pretrained(str(p)).eval(), "test", examples=20)["loss"]
        for p in folders]
    moved = folders[::-1]
    alone, read = tmp_path / "alone.json", tmp_path / "read.json"
    assert run(f"ends={listed(folders)}", f"models={listed(moved)}", f"output={alone}", "examples=20", "grid=2")[0] == 0
    code, text = run(f"ends={listed(folders)}", f"models={listed(moved)}", f"output={read}", "examples=20", "grid=2",
                     f"line={ends}")
    assert code == 0, text
    ours, theirs = json.loads(alone.read_text()), json.loads(read.read_text())
    assert theirs["end_losses"] == ours["end_losses"] == line["end_losses"]
    assert theirs["barrier"] == ours["barrier"] and theirs["points"] == ours["points"]
    assert theirs["centroid"] == ours["centroid"] and theirs["line_from"] == str(ends) and ours["line_from"] is None


def test_a_line_of_other_ends_or_examples_is_refused(folders, tmp_path):
    """line= must be the end models' JSON of the same ends (in order), task and examples: else one line, nothing
    written."""
    ends, two = tmp_path / "ends.json", listed(folders[:2])
    assert run(f"ends={two}", f"output={ends}", "examples=20")[0] == 0
    world = tmp_path / "world"
    world.mkdir()
    out, junk, way = world / "out.json", world / "junk.json", world / "way.json"
    junk.write_text("not json")
    assert run(f"ends={two}", f"models={two}", f"output={way}", "examples=20", "grid=1")[0] == 0
    cases = {
        "other examples": ([f"ends={two}", f"models={two}", "examples=10", f"line={ends}"], "examples=20"),
        "other order": ([f"ends={listed(folders[1::-1])}", f"models={two}", "examples=20", f"line={ends}"], "order"),
        "a way's JSON": ([f"ends={two}", f"models={two}", "examples=20", f"line={way}"], "no end models' line"),
        "not JSON": ([f"ends={two}", f"models={two}", "examples=20", f"line={junk}"], "not a JSON"),
        "missing": ([f"ends={two}", f"models={two}", "examples=20", f"line={world / 'nope.json'}"], "nope.json"),
        "without models": ([f"ends={two}", "examples=20", f"line={ends}"], "line="),
    }
    for name, (args, word) in cases.items():
        before = snapshot(world, out)
        line = assert_refused(*run(*args, f"output={out}"), world, before, out, name)
        assert word in line, f"{name}: {line}"


def decoder_like(path: Path, out: Path, task="lm_toy", shift=0.0) -> Path:
    """A stage JSON of a ViT turned into a decoder's (task lm_toy, metric perplexity = exp(loss)), for the writer."""
    data = json.loads(path.read_text())
    data.update(task=task, metric="perplexity")
    for score in ([data["centroid"]] if "centroid" in data else data["end_evals"] + [data["best"], data["ensemble"]]):
        score["loss"] += shift
        score["perplexity"] = float(torch.tensor(score.pop("accuracy") * 0 + score["loss"]).exp())
    out.write_text(json.dumps(data))
    return out


def test_the_writer_has_a_section_per_track_and_says_which_way_was_not_run(folders, tmp_path):
    """Two tracks' results (the ViTs', then a decoder's without the barycentric way): one section each, in the
    inputs' order, each way's barrier against its own naive averaging's, the decoder's barycentric row saying it was
    not run; the figure draws both; report.md's summary has a line per section."""
    ends = tmp_path / "ends.json"
    assert run(f"ends={listed(folders)}", f"output={ends}", "examples=20")[0] == 0
    vision = {}
    for way, models in (("anchor/none", folders), ("barycenter/rotation", folders[::-1]),
                        ("universe/full_symmetry", folders[1:] + folders[:1])):
        vision[way] = tmp_path / f"{way.replace('/', '_')}.json"
        assert run(f"ends={listed(folders)}", f"models={listed(models)}", f"output={vision[way]}", f"way={way}",
                   "grid=1", "examples=20", f"line={ends}")[0] == 0
    decoder = [decoder_like(ends, tmp_path / "d_ends.json"),
               decoder_like(vision["anchor/none"], tmp_path / "d_none.json", shift=1.0),
               decoder_like(vision["universe/full_symmetry"], tmp_path / "d_universe.json")]
    entry = experiment("table_kway")
    paths = [str(ends), *map(str, vision.values()), *map(str, decoder)]
    built = artefacts.writer_of(entry).build(paths, entry)
    rows = built.rows
    assert [(r["task"], r["way"]) for r in rows] == [
        ("digits", "anchor/none"), ("digits", "barycenter/rotation"), ("digits", "universe/full_symmetry"),
        ("digits", "best"), ("digits", "ensemble"), ("lm_toy", "anchor/none"), ("lm_toy", "barycenter/rotation"),
        ("lm_toy", "universe/full_symmetry"), ("lm_toy", "best"), ("lm_toy", "ensemble")]
    naive = json.loads((tmp_path / "d_none.json").read_text())
    assert rows[5]["metric"] == "perplexity" and rows[5]["centroid"] == naive["centroid"]["perplexity"]
    assert rows[7]["barrier_of_naive_pct"] == 100 * json.loads(decoder[2].read_text())["barrier"] / naive["barrier"]
    assert rows[6]["centroid"] is None and "not run" in rows[6]["label"] and "encoder" in rows[6]["label"]
    assert rows[2]["barrier_of_naive_pct"] == 100 * json.loads(vision["universe/full_symmetry"].read_text())[
        "barrier"] / json.loads(vision["anchor/none"].read_text())["barrier"]
    assert built.files[".md"].count("| way |") == 2
    csv_path = tmp_path / "table_kway.csv"
    csv_path.write_text(built.files[".csv"])
    lines = artefacts.writer_of(entry).summary(csv_path, entry)
    assert len(lines) == 2 and "digits" in lines[0] and "lm_toy" in lines[1] and "not run" not in lines[1]
    figure = artefacts.writer_of(experiment("fig_kway")).build(paths, experiment("fig_kway"))
    assert figure.files[".png"][:4] == b"\x89PNG" and figure.rows == rows
    with pytest.raises(Exception, match="two results of the end models of lm_toy"):
        artefacts.writer_of(entry).build(paths + [str(decoder[0])], entry)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """Three tiny Llamas trained (1 epoch) on test_causal_lm's toy grammar, and that task."""
    patch = pytest.MonkeyPatch()
    patch.setitem(lm.LM_CORPORA, "toy_fables", (lambda: toy_documents("toy_fables", 120),
                                                lambda: lm.gensim_test_file("lee.cor")))
    task = toy_task(["toy_fables"], train={"epochs": 1, "batch_size": 8, "lr": 1.0e-2, "weight_decay": 0.0,
                                           "warmup_ratio": 0.1})
    root = tmp_path_factory.mktemp("decoders")
    for seed in range(3):
        task.train(str(root / f"d{seed}"), dict(TINY_LLAMA), seed)
    yield [root / f"d{seed}" for seed in range(3)], task
    patch.undo()


def test_decoders_are_scored_by_next_token_loss_and_read_their_line(decoders, tmp_path):
    """k = 3 decoders: the end models' line is each one's loss on the test blocks, a way reading it scores bit for bit
    as one computing it, the centroid's perplexity is exp of its loss, the best end model the lowest loss, and the
    ensemble of the models beats none of them by more than it should (its loss is at most the mean of theirs)."""
    folders, task = decoders
    names = [str(f) for f in folders]
    ends = run_kway(names, None, task, str(tmp_path / "ends.json"))
    alone = [task.evaluate(load_model(f).eval(), "test", model_dir=folders[0]) for f in folders]
    assert ends["metric"] == "perplexity" and ends["line"]["end_losses"] == [a["loss"] for a in alone]
    assert ends["best"]["loss"] == min(a["loss"] for a in alone)
    assert ends["ensemble"]["loss"] <= sum(a["loss"] for a in alone) / 3 + 1e-9
    moved = names[1:] + names[:1]
    computed = run_kway(names, moved, task, str(tmp_path / "a.json"), grid=2, way="universe/x")
    read = run_kway(names, moved, task, str(tmp_path / "b.json"), grid=2, way="universe/x",
                    line=str(tmp_path / "ends.json"))
    assert read["end_losses"] == computed["end_losses"] == ends["line"]["end_losses"]
    assert read["points"] == computed["points"] and read["barrier"] == computed["barrier"]
    assert read["centroid"]["perplexity"] == pytest.approx(math.exp(read["centroid"]["loss"]), rel=1e-12)


def test_the_permutation_universe_preset_is_the_benchmarks_configuration():
    assert matching_config("full_permutation") == MatchConfig(attention="permutation", rescale=False, ffn="permutation",
                                                              heads=True, residual="permutation")


def test_mistakes_are_one_line_and_write_nothing(folders, tmp_path):
    world = tmp_path / "world"
    world.mkdir()
    out = world / "out.json"
    two, three = listed(folders[:2]), listed(folders)
    cases = {
        "k models for other k ends": ([f"ends={three}", f"models={two}"], "3 end models"),
        "an end model twice": ([f"ends={listed([folders[0], folders[0]])}"], "twice"),
        "a grid of step 1/0": ([f"ends={two}", f"models={two}", "grid=0"], "grid"),
        "a missing folder": ([f"ends={listed([folders[0], world / 'nope'])}"], "nope"),
        "one end model": ([f"ends={listed(folders[:1])}"], "ends"),
        "no ends": ([], "ends"),
        "an input as output": ([f"ends={two}", f"output={folders[0]}"], "error"),
    }
    for name, (args, word) in cases.items():
        target = out if not any(a.startswith("output=") for a in args) else Path(args[-1].split("=", 1)[1])
        before = snapshot(world, out)
        inputs = [snapshot(p) for p in folders]
        code, text = run(*args, *([] if target != out else [f"output={out}"]))
        if target == out:
            line = assert_refused(code, text, world, before, out, name)
        else:
            lines = [x for x in text.strip().splitlines() if not x.startswith("usage: ")]
            assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), (name, text)
            line = lines[0]
        assert word in line, f"{name}: {line}"
        assert [snapshot(p) for p in folders] == inputs, name


def test_report_md_names_the_entry_and_compare_checks_it_only_when_both_runs_have_it(tmp_path):
    results, figures, reference = tmp_path / "results" / "mini", tmp_path / "figures" / "mini", tmp_path / "reference"
    for folder in (results, figures, reference):
        folder.mkdir(parents=True)
    section = table_section(results, experiment("table_kway"))
    assert f"snakemake --cores 2 {results}/table_kway.csv --config profile=mini" in section
    (reference / "table2.csv").write_text("way,centroid\nx,1.0\n")
    (results / "table2.csv").write_text("way,centroid\nx,1.0\n")
    (results / "table_kway.csv").write_text("way,centroid\nanchor/none,18.0\n")     # the run has it, the reference not
    assert compare_run(results, figures, reference, tmp_path, 0.5)[0] == []
    (reference / "table_kway.csv").write_text("way,centroid\nanchor/none,20.0\n")   # both: its numbers are checked
    problems, _ = compare_run(results, figures, reference, tmp_path, 0.5)
    assert len(problems) == 1 and problems[0].startswith("table_kway.csv row 0 (anchor/none) centroid: 18 vs ")
