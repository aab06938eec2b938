"""The learned refinement (matching/learned.py) and the group it moves in: the full linear group of each head
(m_qk, m_vo; per-plane scales under RoPE) and per-neuron scales of gated FFNs keep the function, maps outside the
group break it; the refinement lowers its objective, returns an exact group element (the moved model computes
the source's function), is deterministic, and refuses wrong settings with one error line."""
import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import MatchConfig, MatchData, match_models, matching_config
from symfusion.matching import learned
from symfusion.matching.learned import soft_cross_entropy
from symfusion.presets import load_preset
from symfusion.stream import stream_layout
from symfusion.symmetry import LayerTransform, Transform, apply_transform, plane_rotations
from test_residual_matching import vit_batches
from test_residual_symmetry import MODEL_IDS, MODELS, build, relative_change

# The families' refinement settings as docs/matching.md states them (presets/families.yaml must say the same).
VIT_REFINE = {"refine_distill": 0.7, "refine_gains_lr": 3.0, "refine_minimax": (0.3, 0.5, 0.7)}
DECODER_REFINE = {"refine_lr": 0.1, "refine_alphas": (0.1, 0.9)}

GENERAL = [m for m in MODELS if m[1] != "qwen3"]          # qwen3's per-head q/k norms admit no Q/K map
GENERAL_IDS = [i for i, m in zip(MODEL_IDS, MODELS) if m in GENERAL]


def invertible(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    """(n, d, d) well-conditioned, far from orthogonal: I + 0.4 G."""
    return torch.eye(d, dtype=torch.float64) + 0.4 * torch.randn(n, d, d, generator=gen, dtype=torch.float64)


def general_transform(layout, seed: int = 0, commuting: bool = True) -> Transform:
    """Every layer moved by an invertible V/O map, an invertible Q/K map (under RoPE a scale per plane and any
    invertible map of the non-rotary dims; commuting=False: a general map, no symmetry) and, for gated FFNs,
    per-neuron scales."""
    gen = torch.Generator().manual_seed(seed)
    kv, d = layout.kv_heads, layout.head_dim
    layers = {}
    for i, layer in enumerate(layout.layers):
        att = layer.attention
        m_qk = invertible(kv, d, gen)
        if att.qk_group == "rope" and commuting:
            half = att.rotary_dim // 2
            scales = torch.exp(0.5 * torch.randn(kv, half, generator=gen, dtype=torch.float64))
            block = torch.diag_embed(torch.cat([scales, scales], dim=1))              # (kv, rotary, rotary)
            m_qk[:, :att.rotary_dim, :] = 0.0
            m_qk[:, :, :att.rotary_dim] = 0.0
            m_qk[:, :att.rotary_dim, :att.rotary_dim] = block
        gated = layer.ffn.gate is not None
        layers[i] = LayerTransform(
            m_qk=m_qk if att.qk_group != "none" else None, m_vo=invertible(kv, d, gen),
            ffn_scale=torch.exp(torch.randn(layout.ffn_size, generator=gen, dtype=torch.float64)) if gated else None)
    return Transform(layers)


@pytest.mark.parametrize("kind,family,overrides", GENERAL, ids=GENERAL_IDS)
def test_the_full_linear_group_of_each_head_and_gated_neuron_scales_keep_the_function(kind, family, overrides):
    model = build(kind, family, overrides)
    layout = layout_of(model.config, model.state_dict())
    assert relative_change(model, general_transform(layout)) < 1e-10


def test_maps_outside_the_group_break_the_function():
    model = build("dec", "llama", {"num_key_value_heads": 2})
    layout = layout_of(model.config, model.state_dict())
    assert layout.layers[0].attention.qk_group == "rope"
    # a Q/K map that does not commute with the position's rotation
    assert relative_change(model, general_transform(layout, commuting=False)) > 1e-3
    # V/O: the output map not given the inverse
    transform = general_transform(layout)
    state = model.state_dict()
    broken = dict(apply_transform(state, layout, transform))
    key = layout.layers[0].attention.output.weight
    broken[key] = state[key]
    before = model(**{"input_ids": torch.arange(12)[None]}).logits
    model.load_state_dict(broken)
    after = model(**{"input_ids": torch.arange(12)[None]}).logits
    assert ((after - before).abs().max() / before.abs().max()).item() > 1e-3
    # per-neuron scales of a GELU FFN are no symmetry: refused
    vit = build("enc", "vit", {})
    vit_layout = layout_of(vit.config, vit.state_dict())
    with pytest.raises(SymfusionError, match="gated FFNs"):
        apply_transform(vit.state_dict(), vit_layout, Transform({0: LayerTransform(
            ffn_scale=torch.full((vit_layout.ffn_size,), 2.0, dtype=torch.float64))}))


def test_a_transform_with_the_general_parts_saves_and_loads(tmp_path):
    model = build("dec", "llama", {"num_key_value_heads": 2})
    layout = layout_of(model.config, model.state_dict())
    transform = general_transform(layout, seed=3)
    transform.save(tmp_path / "t.safetensors")
    loaded = Transform.load(tmp_path / "t.safetensors")
    for i, t in transform.layers.items():
        for name in ("m_qk", "m_vo", "ffn_scale"):
            assert torch.equal(getattr(loaded.layers[i], name), getattr(t, name))


def _data(kind, family, overrides, anchor):
    if family == "vit":
        return vit_batches(anchor)
    gen = torch.Generator().manual_seed(0)
    return [{"input_ids": (ids := torch.randint(0, anchor.config.vocab_size, (4, 12), generator=gen)), "labels": ids}
            for _ in range(3)]


REFINED = [("enc", "vit", {}), ("dec", "llama", {"num_key_value_heads": 2}),
           ("dec", "llama", {"num_key_value_heads": 2, "tie_word_embeddings": True})]
REFINED_IDS = ["vit", "llama-gqa", "llama-tied"]


def _refine(kind, family, overrides, **settings):
    anchor, source = build(kind, family, overrides, seed=1), build(kind, family, overrides, seed=2)
    layout = layout_of(anchor.config, anchor.state_dict())
    config = MatchConfig(attention="rotation", rescale=True, ffn="permutation", heads=True, residual="auto",
                         refine="loss", refine_steps=30, **settings)
    data = MatchData(build(kind, family, overrides, seed=3), _data(kind, family, overrides, anchor))
    return source, layout, match_models(source.state_dict(), anchor.state_dict(), layout, config, data=data)


@pytest.mark.parametrize("group", ["orthogonal", "general"])
@pytest.mark.parametrize("kind,family,overrides", REFINED, ids=REFINED_IDS)
def test_the_refinement_lowers_its_objective_and_returns_a_group_element(kind, family, overrides, group):
    source, layout, result = _refine(kind, family, overrides, refine_group=group, refine_alphas=(0.3, 0.7))
    refine = result.residual["refine"]
    assert refine["midpoint_loss_after"] < refine["midpoint_loss_before"] and refine["kept"] == "refined"
    assert relative_change(source, result.transform) < 1e-9
    r = result.transform.residual.r
    eye = torch.eye(r.shape[0], dtype=torch.float64)
    assert torch.allclose(r @ r.T, eye, atol=1e-9)
    if stream_layout(layout, source.state_dict()).norm == "layernorm":
        ones = torch.ones(r.shape[0], dtype=torch.float64)
        assert torch.allclose((r @ ones).abs(), ones, atol=1e-9)
    for i, t in result.transform.layers.items():
        att = layout.layers[i].attention
        for rotation in (t.r_qk, t.r_vo):
            if rotation is not None:
                assert torch.allclose(rotation @ rotation.transpose(1, 2), eye[: rotation.shape[1], : rotation.shape[1]],
                                      atol=1e-9)
        if group == "general":
            assert t.m_vo is not None and (t.m_qk is not None) == (att.qk_group != "none")
        if t.m_qk is not None and att.qk_group == "rope":          # commutes with every position's rotation
            angles = torch.linspace(0.1, 2.0, att.rotary_dim // 2, dtype=torch.float64)[None].expand(t.m_qk.shape[0], -1)
            rope = plane_rotations(angles, att.rotary_dim, t.m_qk.shape[1])
            assert torch.allclose(rope @ t.m_qk, t.m_qk @ rope, atol=1e-9)


def test_the_refinement_with_the_gauge_off_still_lowers_its_objective():
    source, _, result = _refine("enc", "vit", {}, refine_gauge=False, refine_schedule="constant")
    refine = result.residual["refine"]
    assert refine["midpoint_loss_after"] < refine["midpoint_loss_before"] and not refine["gauge"]
    assert relative_change(source, result.transform) < 1e-9


def test_the_refinement_is_deterministic():
    first = _refine("dec", "llama", {"num_key_value_heads": 2}, refine_group="general", refine_alphas=(0.2, 0.8))[2]
    second = _refine("dec", "llama", {"num_key_value_heads": 2}, refine_group="general", refine_alphas=(0.2, 0.8))[2]
    assert torch.equal(first.transform.residual.r, second.transform.residual.r)
    for i, t in first.transform.layers.items():
        for name, value in vars(t).items():
            assert (value is None and getattr(second.transform.layers[i], name) is None) or \
                torch.equal(value, getattr(second.transform.layers[i], name))


@pytest.mark.parametrize("settings,message", [
    ({"refine_group": "affine"}, "refine_group"), ({"refine_schedule": "step"}, "refine_schedule"),
    ({"refine_alphas": (0.8, 0.2)}, "refine_alphas"), ({"refine_alphas": (0.5,)}, "refine_alphas"),
    ({"refine_lr": 0.0}, "refine_lr"), ({"refine_steps": 0}, "refine_steps"),
    ({"refine_lr": "0.1"}, "refine_lr"), ({"refine_alphas": "0.2,0.8"}, "refine_alphas"),
    ({"refine_alphas": [0.2, True]}, "refine_alphas"), ({"refine_gauge": "yes"}, "refine_gauge"),
    ({"refine_distill": 1.5}, "refine_distill"), ({"refine_distill": -0.1}, "refine_distill"),
    ({"refine_distill": "0.5"}, "refine_distill"), ({"refine_gains_lr": 0.0}, "refine_gains_lr"),
    ({"refine_gains_lr": -1.0}, "refine_gains_lr"), ({"refine_gains_lr": "2"}, "refine_gains_lr"),
    ({"refine_lr": float("inf")}, "refine_lr"), ({"refine_gains_lr": float("inf")}, "refine_gains_lr"),
    ({"refine_gains_lr": float("nan")}, "refine_gains_lr"), ({"refine_alphas": (0.2, float("nan"))}, "refine_alphas"),
    ({"refine_minimax": "0.3,0.7"}, "refine_minimax"), ({"refine_minimax": 0.5}, "refine_minimax"),
    ({"refine_minimax": [0.3, 1.5]}, "refine_minimax"), ({"refine_minimax": [0.3, float("nan")]}, "refine_minimax"),
    ({"refine_minimax": [0.3, "0.7"]}, "refine_minimax")])
def test_wrong_refine_settings_are_refused_with_one_line(settings, message):
    with pytest.raises(SymfusionError, match=message):
        MatchConfig(residual="auto", refine="loss", **settings)
    with pytest.raises(SymfusionError, match=message):
        MatchConfig.from_mapping(OmegaConf.create({"residual": "auto", "refine": "loss", **settings}))


def test_the_presets_state_the_refinement_settings_the_declaration_defaults_and_a_list_reads_as_given():
    """full_symmetry (and full_symmetry_learned through it) states every refine_* setting, each equal to the
    MatchConfig default (one value, written twice: a drift fails here); a preset's list [lo, hi] is read as given."""
    preset = load_preset("matching", "full_symmetry")
    default = MatchConfig()
    for name in ("refine_steps", "refine_lr", "refine_schedule", "refine_alphas", "refine_minimax", "refine_group",
                 "refine_gauge", "refine_distill", "refine_gains_lr"):
        value = preset[name]
        assert (tuple(value) if name in ("refine_alphas", "refine_minimax") and value is not None else value) == \
            getattr(default, name), name
    learned = matching_config("full_symmetry_learned")
    assert learned.refine == "loss" and learned.refine_settings().alphas == (0.5, 0.5)
    config = MatchConfig.from_mapping(OmegaConf.create({"residual": "auto", "refine": "loss",
                                                        "refine_alphas": [0.2, 0.8], "refine_group": "general"}))
    assert config.refine_settings().alphas == (0.2, 0.8) and config.refine_settings().group == "general"


@pytest.mark.parametrize("kind,family,overrides", REFINED[:2], ids=REFINED_IDS[:2])
def test_the_refinement_settings_left_null_are_the_familys_and_a_value_given_wins(kind, family, overrides):
    """refine_lr / refine_alphas / refine_minimax / refine_group null (the presets): the family's (presets/families.yaml:
    the ViT's, the decoders', RefineSettings' own defaults for the rest), which the refinement reports using; a value
    given wins ([] for refine_minimax: none)."""
    model = build(kind, family, overrides, seed=1)
    layout = layout_of(model.config, model.state_dict())
    expected = {"refine_lr": 1e-2, "refine_alphas": (0.5, 0.5), "refine_minimax": (), "refine_group": "orthogonal",
                "refine_distill": 0.0, "refine_gains_lr": 1.0,
                **(DECODER_REFINE if layout.has_decoder_parts else VIT_REFINE)}
    learned = matching_config("full_symmetry_learned")
    assert (learned.refine_lr, learned.refine_alphas, learned.refine_group, learned.refine_distill,
            learned.refine_gains_lr) == (None,) * 5
    settings = learned.refine_settings(layout)
    assert (settings.learning_rate, settings.alphas, settings.minimax, settings.group, settings.distill,
            settings.gains_lr) == \
        (expected["refine_lr"], tuple(expected["refine_alphas"]), tuple(expected["refine_minimax"]),
         expected["refine_group"], expected["refine_distill"], expected["refine_gains_lr"])
    given = dataclasses.replace(learned, refine_lr=0.2, refine_alphas=(0.25, 0.75), refine_group="general",
                                refine_gains_lr=3.0, refine_minimax=())      # [] given: no minimax points
    assert (given.refine_settings(layout).learning_rate, given.refine_settings(layout).alphas,
            given.refine_settings(layout).minimax, given.refine_settings(layout).group,
            given.refine_settings(layout).gains_lr) == (0.2, (0.25, 0.75), (), "general", 3.0)
    refine = _refine(kind, family, overrides)[2].residual["refine"]
    assert (refine["learning_rate"], refine["alphas"], refine["minimax"], refine["group"], refine["distill"],
            refine["gains_lr"]) == \
        (expected["refine_lr"], list(expected["refine_alphas"]), list(expected["refine_minimax"]),
         expected["refine_group"], expected["refine_distill"], expected["refine_gains_lr"])


def test_soft_cross_entropy_on_one_hot_targets_is_the_task_loss():
    """The distillation term's cross-entropy, given the labels as one-hot targets, equals the model's own loss: a
    classifier's over its rows, a causal LM's over next-token positions with -100 labels left out."""
    gen = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 5, generator=gen, dtype=torch.float64), torch.randint(0, 5, (6,), generator=gen)
    one_hot = torch.nn.functional.one_hot(labels, 5).double()
    assert torch.allclose(soft_cross_entropy(logits, one_hot, labels),
                          torch.nn.functional.cross_entropy(logits, labels), rtol=1e-12)
    logits = torch.randn(3, 7, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 7), generator=gen)
    labels[0, 4:] = -100
    labels[2, 2] = -100
    targets = torch.zeros(3, 7, 11, dtype=torch.float64)
    targets[:, :-1] = torch.nn.functional.one_hot(labels[:, 1:].clamp_min(0), 11).double()
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 11), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)
    assert torch.allclose(soft_cross_entropy(logits, targets, labels), expected, rtol=1e-12)


@pytest.mark.parametrize("kind,family,overrides", REFINED[:2], ids=REFINED_IDS[:2])
def test_the_refinement_with_distillation_lowers_its_objective_and_keeps_the_function(kind, family, overrides):
    source, _, result = _refine(kind, family, overrides, refine_distill=0.5)
    refine = result.residual["refine"]
    assert refine["distill"] == 0.5 and refine["kept"] == "refined"
    assert refine["midpoint_loss_after"] < refine["midpoint_loss_before"]
    assert relative_change(source, result.transform) < 1e-9


def test_minimax_steps_are_taken_at_the_highest_of_the_points(monkeypatch):
    """refine_minimax: every step reads its batch at each point (with gradients) and backpropagates the loss of the
    point where it is the largest; the keep-or-not check still reads the midpoint; one point is the same
    refinement as alpha fixed there (refine_alphas [a, a]), to the bit."""
    calls, backward = [], []
    original = learned._Path.loss

    def recording(self, r, layers, gains, alpha, batch, moved=None):
        value = original(self, r, layers, gains, alpha, batch, moved)
        calls.append((alpha, torch.is_grad_enabled(), value.item()))
        if value.requires_grad:
            index = len(calls) - 1
            value.register_hook(lambda grad: backward.append(index))
        return value

    monkeypatch.setattr(learned._Path, "loss", recording)
    points = (0.2, 0.5, 0.8)
    _, _, result = _refine("enc", "vit", {}, refine_minimax=points, refine_distill=0.5)
    refine = result.residual["refine"]
    assert refine["minimax"] == list(points)
    assert len(backward) == 30                                       # one backward pass per step
    reads = [i for i, (_, grad, _) in enumerate(calls) if grad]
    assert len(reads) == 3 * 30
    chosen = []
    for step in range(30):
        read = reads[3 * step:3 * step + 3]
        assert [calls[i][0] for i in read] == list(points)
        highest = max(read, key=lambda i: calls[i][2])             # the first of equal ones
        assert backward[step] == highest
        chosen.append(calls[highest][0])
    assert len(set(chosen)) > 1 or chosen[0] != 0.5                 # the max is not always the midpoint here
    assert all(a == 0.5 and not grad for a, grad, _ in calls[:reads[0]]) and \
        all(a == 0.5 and not grad for a, grad, _ in calls[reads[-1] + 1:])
    monkeypatch.setattr(learned._Path, "loss", original)
    one = _refine("enc", "vit", {}, refine_minimax=(0.3,))[2].transform
    fixed = _refine("enc", "vit", {}, refine_alphas=(0.3, 0.3), refine_minimax=())[2].transform   # [] : none
    assert torch.equal(one.residual.r, fixed.residual.r)
    assert all(torch.equal(one.residual.gains[k], fixed.residual.gains[k]) for k in fixed.residual.gains)


def test_the_gains_learning_rate_scales_the_gains_step_alone():
    """refine_gains_lr k: the unfolding gains learn at k times refine_lr. After one Adam step (its first step is
    lr x g / (|g| + eps), the same direction whatever k) the log-gains have moved by k times one step, so over
    k = 1, 2, 3 the logs form an arithmetic sequence; every other learned part takes the same step."""
    anchor, source = build("enc", "vit", {}, seed=1), build("enc", "vit", {}, seed=2)
    layout = layout_of(anchor.config, anchor.state_dict())
    data = MatchData(build("enc", "vit", {}, seed=3), _data("enc", "vit", {}, anchor))
    results = []
    for k in (1.0, 2.0, 3.0):
        config = MatchConfig(attention="rotation", rescale=True, ffn="permutation", heads=True, residual="auto",
                             refine="loss", refine_steps=1, refine_schedule="constant", refine_gains_lr=k)
        result = match_models(source.state_dict(), anchor.state_dict(), layout, config, data=data)
        assert result.residual["refine"]["kept"] == "refined" and result.residual["refine"]["gains_lr"] == k
        results.append(result.transform.residual)
    assert all(torch.equal(r.r, results[0].r) for r in results)
    for key in results[0].gains:
        logs = [r.gains[key].double().abs().log() for r in results]
        step = logs[1] - logs[0]
        assert step.abs().max() > 1e-4                                  # the gains moved
        assert torch.allclose(logs[2] - logs[1], step, atol=1e-9)
