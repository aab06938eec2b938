"""Joint rotation+rescaling, multi-model (barycentric) matching, group composition and the multimodel stage."""
import json
import math

import pytest
import torch

from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import MatchConfig, match_many, match_models
from symfusion.matching.compose import match_attention_rotation, StageClock
from symfusion.matching.joint import match_attention_joint
from symfusion.matching.multi import compose, compose_layer, invert, invert_layer, match_group, pairwise_sq
from symfusion.measures import distance
from symfusion.pipeline.stages.multimodel import run_multimodel
from symfusion.symmetry import (Transform, apply_transform, random_orthogonal, random_transform,
                                rotate_bias, rotate_rows)
from symfusion.matching.multi import pairwise_distances
from symfusion.pipeline.report.multimodel import multimodel_rows, multimodel_summary
from tiny_models import VARIANT_IDS, VARIANTS, tiny_model

PARTS = ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm")


def state_and_layout(family="bert", seed=0, dtype=torch.float64, **overrides):
    model = tiny_model(family, seed=seed, dtype=dtype, **overrides)
    state = model.state_dict()
    return state, layout_of(model.config, state)


def noise(state, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    return {k: scale * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in state.items() if v.is_floating_point()}


def plus(state, delta):
    return {k: v + delta[k] if k in delta else v for k, v in state.items()}


def assert_same_state(a, b, atol):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=atol, rtol=0), key


def sq_norm(state):
    return sum(v.double().pow(2).sum().item() for v in state.values())


# ---------------------------------------------------------------- compose / invert

def test_compose_equals_applying_one_after_the_other():
    state, layout = state_and_layout("deberta-v2")
    t1, t2 = random_transform(layout, seed=1), random_transform(layout, seed=2)
    t2.layers[0].a_qk = t2.layers[0].r_vo = None                  # identity parts on one side only
    del t2.layers[1]                                              # and a layer only t1 moves
    both = apply_transform(apply_transform(state, layout, t1), layout, t2)
    assert_same_state(apply_transform(state, layout, compose(t1, t2)), both, atol=1e-10)
    layer = compose_layer(t1.layers[0], t2.layers[0])
    assert torch.equal(layer.ffn_perm, t1.layers[0].ffn_perm[t2.layers[0].ffn_perm])


def test_invert_undoes_a_transform():
    state, layout = state_and_layout("vit")
    t = random_transform(layout, seed=3)
    assert_same_state(apply_transform(apply_transform(state, layout, t), layout, invert(t)), state, atol=1e-10)
    identity = compose_layer(t.layers[0], invert_layer(t.layers[0]))
    assert torch.allclose(identity.r_qk, torch.eye(layout.head_dim, dtype=torch.float64).expand_as(identity.r_qk))
    assert torch.allclose(identity.a_vo, torch.ones(layout.num_heads, dtype=torch.float64))
    assert torch.equal(identity.ffn_perm, torch.arange(layout.ffn_size))


# ---------------------------------------------------------------- joint rotation + rescaling

def attention_sq(state, anchor, layout):
    """Squared distance over the parts the attention matching moves (QK maps, V, O weight)."""
    d = distance(state, anchor, layout)
    return d["attention_qk"] ** 2 + d["attention_vo"] ** 2


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_joint_never_worse_than_sequential_and_starts_there(family, overrides):
    anchor, layout = state_and_layout(family, seed=0, **overrides)
    source, _ = state_and_layout(family, seed=1, **overrides)
    sequential = match_models(source, anchor, layout, "rotation")
    joint = match_models(source, anchor, layout, "rotation_joint")
    after_seq = attention_sq(apply_transform(source, layout, sequential.transform), anchor, layout)
    after_joint = attention_sq(apply_transform(source, layout, joint.transform), anchor, layout)
    assert after_joint <= after_seq * (1 + 1e-12)
    # the recorded objectives are the real squared distances: iteration 1 = sequential, last = joint
    recorded = sum(info[side]["objective_sequential"] for info in joint.joint.values() for side in ("qk", "vo"))
    assert recorded == pytest.approx(after_seq, rel=1e-9)
    final = sum(info[side]["objective_joint"] for info in joint.joint.values() for side in ("qk", "vo"))
    assert final == pytest.approx(after_joint, rel=1e-9)
    for info in joint.joint.values():
        for side in ("qk", "vo"):
            history = info[side]["objective"]
            assert all(b <= a * (1 + 1e-12) for a, b in zip(history, history[1:]))
    # one iteration of the joint solver is exactly the paper's rotation-then-rescaling
    att = layout.layers[0].attention
    first, _ = match_attention_joint(source, anchor, att, layout.num_heads, max_iter=1)
    paper = match_attention_rotation(source, anchor, att, layout.num_heads, True, StageClock())
    for part in ("r_qk", "a_qk", "r_vo", "a_vo"):
        assert torch.equal(getattr(first, part), getattr(paper, part)), part


def test_joint_strictly_better_on_planted_conflict():
    """Query maps from one rotation of the anchor scaled by 3, key maps from another scaled by 1/3."""
    anchor, layout = state_and_layout("bert", seed=0)
    att, heads = layout.layers[0].attention, layout.num_heads
    gen = torch.Generator().manual_seed(0)
    source = dict(anchor)
    for projections, scale in ((att.query_like, 3.0), (att.key_like, 1 / 3)):
        r = random_orthogonal(heads, layout.head_dim, gen)
        for p in projections:
            source[p.weight] = scale * rotate_rows(anchor[p.weight], r)
            source[p.bias] = scale * rotate_bias(anchor[p.bias], r)
    _, info = match_attention_joint(source, anchor, att, heads)
    sequential, joint = info["qk"]["objective_sequential"], info["qk"]["objective_joint"]
    assert joint < 0.9 * sequential                               # measured: 443.4 -> 362.4
    assert info["qk"]["iterations"] > 1


def test_joint_needs_rotation_and_rescaling():
    with pytest.raises(SymfusionError, match="joint"):
        MatchConfig(attention="rotation", rescale=False, joint=True)
    with pytest.raises(SymfusionError, match="rescal"):
        MatchConfig(attention="permutation", rescale=True, joint=True)


# ---------------------------------------------------------------- multi-model matching

def planted_group(k=4, sigma=1e-2, scales=False, family="bert"):
    """k noisy copies of one model, each moved by a random symmetry; returns (states, layout, noise)."""
    base, layout = state_and_layout(family, seed=0)
    deltas = [noise(base, seed=100 + i, scale=sigma) for i in range(k)]
    states = [plus(apply_transform(base, layout, random_transform(layout, seed=10 + i, scales=scales)), deltas[i])
              for i in range(k)]
    return states, layout, deltas


def test_barycenter_recovers_planted_group_in_any_order():
    states, layout, deltas = planted_group()
    results = {}
    for order in ([0, 1, 2, 3], [2, 0, 3, 1], [3, 2, 1, 0]):
        group = [states[i] for i in order]
        result = match_group(group, layout, "rotation_no_rescale", method="barycenter")
        matched = [apply_transform(s, layout, t) for s, t in zip(group, result.transforms)]
        assert result.transforms[0].layers == {}
        assert all(matched[0][k] is group[0][k] for k in group[0])   # the anchor is untouched
        for a in range(4):                                            # every pair at the noise level
            for b in range(a + 1, 4):
                expected = math.sqrt(sq_norm(deltas[order[a]]) + sq_norm(deltas[order[b]]))
                assert distance(matched[a], matched[b])["total"] < 1.05 * expected
        history = result.info["objective"]
        assert all(y <= x * (1 + 1e-12) for x, y in zip(history, history[1:]))
        assert result.info["pairwise_sq_after"] == pytest.approx(pairwise_sq(matched), rel=1e-12)
        results[tuple(order)] = result.info["pairwise_sq_after"]
    values = list(results.values())
    assert max(values) - min(values) <= 1e-6 * min(values)           # measured: equal to ~1e-9
    assert values[0] < 1e-3 * result.info["pairwise_sq_before"]


def test_barycenter_with_rescaling_is_monotone_and_independent_of_the_others_order():
    states, layout, deltas = planted_group(scales=True)
    sums = []
    for order in ([0, 1, 2, 3], [0, 3, 1, 2]):                       # same anchor, others permuted
        result = match_group([states[i] for i in order], layout, "rotation_joint", method="barycenter")
        history = result.info["objective"]
        assert all(y <= x * (1 + 1e-12) for x, y in zip(history, history[1:]))
        anchor = match_group([states[i] for i in order], layout, "rotation_joint", method="anchor")
        assert result.info["pairwise_sq_after"] <= anchor.info["pairwise_sq_after"]
        sums.append(result.info["pairwise_sq_after"])
    assert sums[0] == pytest.approx(sums[1], rel=1e-6)
    noise_sq = 3 * sum(sq_norm(d) for d in deltas)                   # (k-1) sum_i |noise_i|^2
    assert sums[0] < 4 * noise_sq                                     # scales in [0.5, 2] stretch the noise


@pytest.mark.parametrize("matching", ["rotation", "rotation_no_rescale", "git_rebasin"])
def test_barycenter_no_farther_than_anchor_on_unrelated_models(matching):
    states = [state_and_layout("vit", seed=s)[0] for s in range(4)]
    layout = state_and_layout("vit", seed=0)[1]
    anchor = match_group(states, layout, matching, method="anchor", max_iter=10)
    bary = match_group(states, layout, matching, method="barycenter", max_iter=10)
    assert bary.info["pairwise_sq_after"] <= anchor.info["pairwise_sq_after"] * (1 + 1e-12)
    assert bary.info["objective"][0] == pytest.approx(anchor.info["objective"][0], rel=1e-9)
    assert bary.info["pairwise_sq_after"] < bary.info["pairwise_sq_before"]
    assert bary.transforms[0].layers == {}


def test_anchor_method_is_match_many():
    states = [state_and_layout("roberta", seed=s, dtype=torch.float32)[0] for s in range(3)]
    layout = state_and_layout("roberta", seed=0)[1]
    result = match_group(states, layout, "rotation", method="anchor")
    expected = match_many(states[1:], states[0], layout, "rotation")
    assert result.transforms[0].layers == {}
    for got, want in zip(result.transforms[1:], expected):
        assert got.layers.keys() == want.transform.layers.keys()
        for i in got.layers:
            for part in PARTS:
                assert torch.equal(getattr(got.layers[i], part), getattr(want.transform.layers[i], part))


def test_group_matching_refuses_bad_input():
    state, layout = state_and_layout("bert")
    with pytest.raises(SymfusionError, match="at least 2"):
        match_group([state], layout)
    with pytest.raises(SymfusionError, match="barycenter"):
        match_group([state, state], layout, method="mean")


# ---------------------------------------------------------------- the stage

def save(model, path):
    model.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def test_run_multimodel_writes_report_and_models(tmp_path):
    dirs = [save(tiny_model("bert", seed=s), tmp_path / f"m{s}") for s in range(3)]
    report = run_multimodel(dirs, str(tmp_path / "multi.json"), "rotation", output_models_dir=str(tmp_path / "matched"))
    on_disk = json.loads((tmp_path / "multi.json").read_text())
    assert {"models", "k", "methods", "joint_vs_sequential", "sum_pairwise_distance_before", "provenance"} <= set(on_disk)
    assert set(on_disk["methods"]) == {"anchor", "barycenter"}
    for summary in on_disk["methods"].values():
        assert {"sum_pairwise_distance", "sum_pairwise_sq_distance", "seconds", "iterations"} <= set(summary)
        assert summary["sum_pairwise_distance"] < on_disk["sum_pairwise_distance_before"]
    methods = report["methods"]
    assert methods["barycenter"]["sum_pairwise_sq_distance"] <= methods["anchor"]["sum_pairwise_sq_distance"] * (1 + 1e-6)
    pairs = on_disk["joint_vs_sequential"]
    assert [(p["anchor"], p["source"]) for p in pairs] == [(0, 1), (0, 2), (1, 2)]
    assert all(p["distance_rotation_joint"] <= p["distance_rotation"] * (1 + 1e-6) for p in pairs)
    for i in range(3):
        folder = tmp_path / "matched" / str(i)
        assert (folder / "config.json").is_file() and (folder / "transform.safetensors").is_file()
    assert Transform.load(tmp_path / "matched" / "0" / "transform.safetensors").layers == {}
    assert all(entry["max_output_change"] < 1e-4 for entry in report["output_models"])


def test_run_multimodel_refuses_bad_input(tmp_path):
    one = save(tiny_model("bert", seed=1), tmp_path / "one")
    other = save(tiny_model("bert", seed=2, num_attention_heads=8), tmp_path / "other")
    with pytest.raises(SymfusionError, match="at least two"):
        run_multimodel([one], str(tmp_path / "o.json"))
    with pytest.raises(SymfusionError, match="num_attention_heads"):
        run_multimodel([one, other], str(tmp_path / "o.json"))
    with pytest.raises(SymfusionError, match="does not exist"):
        run_multimodel([one, str(tmp_path / "missing")], str(tmp_path / "o.json"))
    with pytest.raises(SymfusionError, match="unknown matching"):
        run_multimodel([one, one], str(tmp_path / "o.json"), matching="procrustes")
    assert not (tmp_path / "o.json").exists()


def test_multimodel_table_has_a_row_group_per_model_and_a_summary_line_each(tmp_path):
    """The table takes the end ViTs' report (no merged evals) beside a language model's report."""

    vit_dirs = [save(tiny_model("vit", seed=s), tmp_path / f"v{s}") for s in range(2)]
    vit_report = str(tmp_path / "results" / "multimodel" / "digits.json")
    run_multimodel(vit_dirs, vit_report, "rotation")
    bert_dirs = [save(tiny_model("bert", seed=s), tmp_path / f"b{s}") for s in range(3)]
    lang_report = str(tmp_path / "results" / "lang" / "minilm" / "multimodel.json")
    run_multimodel(bert_dirs, lang_report, "attn_only_no_rescale")
    rows = multimodel_rows([vit_report, lang_report])
    assert {(r["model"], r["comparison"]) for r in rows} == {
        ("vit", "group matching"), ("vit", "joint vs sequential"),
        ("minilm", "group matching"), ("minilm", "joint vs sequential")}
    assert sum(r["model"] == "vit" and r["comparison"] == "joint vs sequential" for r in rows) == 1
    assert sum(r["model"] == "minilm" and r["comparison"] == "joint vs sequential" for r in rows) == 3
    assert all(r["merged_ood_score"] is None for r in rows)
    as_csv = [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]
    lines = multimodel_summary(as_csv)
    assert [line.split(",")[0] for line in lines] == ["Beyond the paper (minilm", "Beyond the paper (vit"]
    assert "k=2" in lines[1] and "OOD" not in lines[1] and "joint rotation+rescaling" in lines[1]


@pytest.mark.slow
@pytest.mark.parametrize("multi", ["anchor", "barycenter"])
def test_multimodel_cli_writes_the_models_of_matching_multi(tmp_path, multi):
    import subprocess
    import sys

    from safetensors.torch import load_file


    dirs = [save(tiny_model("vit", seed=s), tmp_path / f"m{s}") for s in range(3)]
    cli = [sys.executable, "-c", "from symfusion.pipeline.cli import multimodel_main; multimodel_main()",
           f"models=[{','.join(dirs)}]", "matching=rotation", f"matching.multi={multi}"]
    ok = subprocess.run(cli + [f"output={tmp_path / 'r.json'}", f"output_models={tmp_path / 'out'}"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["output_models_multi"] == multi
    written = [load_file(str(tmp_path / "out" / str(i) / "model.safetensors")) for i in range(3)]
    written = [{k: v.double() for k, v in state.items()} for state in written]
    assert sum(pairwise_distances(written)) == pytest.approx(report["methods"][multi]["sum_pairwise_distance"], rel=1e-5)
    other = "barycenter" if multi == "anchor" else "anchor"
    assert report["methods"][other]["sum_pairwise_distance"] != report["methods"][multi]["sum_pairwise_distance"]


@pytest.mark.slow
def test_multimodel_cli_refuses_an_unknown_multi_method(tmp_path):
    import subprocess
    import sys

    dirs = [save(tiny_model("bert", seed=s), tmp_path / f"m{s}") for s in range(2)]
    cli = [sys.executable, "-c", "from symfusion.pipeline.cli import multimodel_main; multimodel_main()",
           f"models=[{','.join(dirs)}]", "matching.multi=mean", f"output={tmp_path / 'r.json'}"]
    bad = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["error: matching.multi='mean'; choose one of anchor, barycenter"]
    assert not (tmp_path / "r.json").exists()
