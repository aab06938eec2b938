"""benchmarks/bench_whole_ablation.py's input-aware variant of the first layer: its covariance is LayerNorm's input
seen without the gain (trace d, centred), and weighing each model's first-layer readers by its own input keeps a
planted whole-group element the optimum (the weighting moves with the stream), while the identity weighting leaves
the match unchanged (one weighting shared by both models would not: the planted map then leaves 11 of 6,046 in
distance)."""
import torch
import torch.nn.functional as F

import symfusion.matching.learned as learned_module
import symfusion.matching.pairs as pairs_module
from symfusion.arch import layout_of
from symfusion.measures import distance
from symfusion.matching import match_models
from symfusion.stream import fold_norms, stream_layout
from symfusion.symmetry import LayerTransform, Transform, apply_transform
from benchmark_scripts import load_benchmark
from test_residual_matching import FULL, planted
from tiny_models import tiny_model

ABLATION = load_benchmark("bench_whole_ablation")


def pixels(model, seed=0, images=5):
    gen = torch.Generator().manual_seed(seed)
    c, s = model.config.num_channels, model.config.image_size
    return [{"pixel_values": torch.randn(images, c, s, s, generator=gen, dtype=torch.float64)} for _ in range(2)]


def test_the_measured_covariance_is_layer_norm_s_input_and_the_weights_estimate_is_centred():
    model = tiny_model("vit", dtype=torch.float64)
    batches = pixels(model)
    d = model.config.hidden_size
    measured = ABLATION.input_covariance_from_data(model, batches)
    with torch.no_grad():
        tokens = torch.cat([F.layer_norm(model(**b, output_hidden_states=True).hidden_states[0], (d,), eps=0.0)
                            .flatten(0, 1) for b in batches])                 # (images * tokens, d)
    assert torch.allclose(measured, tokens.T @ tokens * d / tokens.pow(2).sum(), atol=1e-10)
    for sigma in (measured, ABLATION.input_covariance_from_weights(model.state_dict())):
        assert torch.allclose(sigma, sigma.T) and torch.linalg.eigvalsh(sigma).min() > -1e-10
        assert abs(float(sigma.trace()) - d) < 1e-9
        assert float((sigma @ torch.ones(d, dtype=torch.float64)).abs().max()) < 1e-10


def weighted_match(source, anchor, layout, sigmas):
    with ABLATION.replaced(pairs_module.StatePair, "__init__", ABLATION.first_input_pair(sigmas)):
        return match_models(source, anchor, layout, FULL)


def test_weighing_the_first_layer_by_its_input_keeps_a_planted_optimum_and_the_identity_changes_nothing():
    model = tiny_model("vit", seed=3)
    anchor, source, layout = planted(model, "orthogonal")
    before = distance(source, anchor)["total"]
    found = weighted_match(source, anchor, layout, None)                # each model's own input, from its weights
    assert before > 1.0 and distance(apply_transform(source, layout, found.transform), anchor)["total"] < 1e-6 * before
    eye = torch.eye(model.config.hidden_size, dtype=torch.float64)
    same, plain = weighted_match(source, anchor, layout, (eye, eye)), match_models(source, anchor, layout, FULL)
    assert same.residual["folded_distance"] == plain.residual["folded_distance"]
    assert torch.equal(same.transform.residual.r, plain.transform.residual.r)


class _HeldOut:
    """A stand-in for the refinement's path: its point is the recorded parameter; its held-out loss |p - target|^2."""

    def params(self, r, layers, gains, alpha):
        return r

    def output(self, point, batch):
        return type("Out", (), {"loss": (point - batch["target"]).pow(2).sum()})()


def test_the_selecting_optimiser_keeps_the_checkpoint_with_the_least_held_out_loss():
    """select=K (Generalized LMC's choice among validation checkpoints): training pulls p from 0 towards 10, the
    held-out loss is least near 3, so the kept iterate is the checkpoint nearest 3, not the last one, and it is
    what the parameters hold after the last step; every K-th iterate (and the last) is a checkpoint."""
    steps, every, recorded = 20, 4, {"path": _HeldOut()}
    p = torch.zeros(1, requires_grad=True)
    optimiser = ABLATION.selecting_adam(steps, every, [{"target": torch.tensor([3.0])}], recorded)([p], lr=0.5)
    values = []
    for _ in range(steps):
        recorded["args"] = (p.detach().clone(), None, None)        # the point the step's loss call reads
        values.append(float(p.detach()))
        optimiser.zero_grad()
        (p - 10.0).pow(2).sum().backward()
        optimiser.step()
    index, loss, checkpoints = recorded["chosen"]
    assert [k for k, _ in checkpoints] == [3, 7, 11, 15, 19]
    best = min((abs(values[k] - 3.0), k) for k, _ in checkpoints)[1]
    assert index == best and best != steps - 1
    assert float(p.detach()) == values[best] and abs(loss - (values[best] - 3.0) ** 2) < 1e-6


def test_bias_translations_keep_the_function_and_the_anchor_s_biases_make_the_merge_s_affine_part_the_average():
    """A ViT's bias translations (a norm's bias with its readers', a value bias with the attention output's) are
    exact in float64 for any shift; with the source's biases set to the anchor's, the midpoint's value-bias path
    W_o b_v + b_o is the average of the two models' (no cross term), and a wrong compensation breaks the function."""
    model, other = tiny_model("vit", seed=1, dtype=torch.float64), tiny_model("vit", seed=2, dtype=torch.float64)
    batch = pixels(model)[0]
    gen = torch.Generator().manual_seed(0)
    source, anchor = ({k: torch.randn(v.shape, generator=gen, dtype=v.dtype) if k.endswith("bias") else v
                       for k, v in m.state_dict().items()} for m in (model, other))     # initialised biases are 0
    model.load_state_dict(source)
    with torch.no_grad():
        before = model(**batch).logits
    translations = ABLATION.bias_translations(source)
    assert len(translations) == 3 * model.config.num_hidden_layers + 1
    deltas = [torch.randn(source[b].shape, generator=gen, dtype=torch.float64) for b, _ in translations]
    moved = ABLATION.anchor_biases(source, anchor)
    for state in (ABLATION.translated(source, translations, deltas), moved):
        model.load_state_dict(state)
        with torch.no_grad():
            assert torch.allclose(model(**batch).logits, before, rtol=0, atol=1e-10 * before.abs().max())
    assert all(torch.allclose(moved[b], anchor[b], rtol=0, atol=1e-15) for b, _ in translations)
    p = "vit.layers.0.attention."
    path = lambda s: s[f"{p}o_proj.weight"] @ s[f"{p}v_proj.bias"] + s[f"{p}o_proj.bias"]
    middle = {k: 0.5 * (anchor[k] + moved[k]) for k in anchor}
    assert torch.allclose(path(middle), 0.5 * (path(anchor) + path(moved)), atol=1e-12)
    plain = {k: 0.5 * (anchor[k] + source[k]) for k in anchor}                     # untranslated: a cross term
    assert not torch.allclose(path(plain), 0.5 * (path(anchor) + path(source)), atol=1e-6)
    broken = dict(source)
    broken[f"{p}v_proj.bias"] = source[f"{p}v_proj.bias"] + deltas[2]                 # no compensation in o_proj
    model.load_state_dict(broken)
    with torch.no_grad():
        assert (model(**batch).logits - before).abs().max() > 1e-3


def test_the_stream_scale_keeps_the_function_and_its_fit_is_the_least_squares_scale():
    """A pre-LN ViT's residual stream times any c > 0 (embeddings, attention and FFN outputs) computes the same
    function (every reader is a LayerNorm; float64, up to its eps); `fit` is the c that brings the writers closest
    to the anchor's (the distance is larger at c +- 1%), `norm` equalises their norms; leaving one writer out
    breaks the function."""
    model, other = tiny_model("vit", seed=1, dtype=torch.float64), tiny_model("vit", seed=2, dtype=torch.float64)
    batch = pixels(model)[0]
    source, anchor = model.state_dict(), other.state_dict()
    writers = ABLATION.stream_writers(source)
    assert len(writers) == 4 + 4 * model.config.num_hidden_layers
    with torch.no_grad():
        before = model(**batch).logits
    for c in (0.3, 2.5):
        model.load_state_dict(ABLATION.scaled_stream(source, c))
        with torch.no_grad():
            assert torch.allclose(model(**batch).logits, before, rtol=0, atol=1e-8 * before.abs().max())
    distance = lambda c: sum(float((anchor[k] - c * source[k]).pow(2).sum()) for k in writers)
    fit = ABLATION.stream_scale(source, anchor, "fit")
    assert distance(fit) < min(distance(fit * 0.99), distance(fit * 1.01))
    norm = ABLATION.stream_scale(source, anchor, "norm")
    scaled = ABLATION.scaled_stream(source, norm)
    assert abs(sum(float(scaled[k].pow(2).sum()) for k in writers) / sum(float(anchor[k].pow(2).sum())
                                                                          for k in writers) - 1) < 1e-12
    broken = ABLATION.scaled_stream(source, 2.0)
    broken[writers[-2]] = source[writers[-2]]                                        # the last FFN output left alone
    model.load_state_dict(broken)
    with torch.no_grad():
        assert (model(**batch).logits - before).abs().max() > 1e-3


def test_activation_matching_of_the_ffn_recovers_planted_neuron_permutations():
    """correlated_ffn re-chooses each layer's FFN permutation from the neuron outputs on data: a source that is the
    anchor with its FFN neurons permuted gets permutations that put every neuron back (the moved source's FFN maps
    equal the anchor's), composed with the blocks it was given, before the refinement it wraps is called."""
    model = tiny_model("vit", seed=4)
    anchor = {k: v.detach().clone() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, anchor)
    gen = torch.Generator().manual_seed(5)
    planted_perms = {i: torch.randperm(layout.ffn_size, generator=gen) for i in range(layout.num_layers)}
    source = apply_transform(anchor, layout, Transform({i: LayerTransform(ffn_perm=p) for i, p in planted_perms.items()}))
    stream = stream_layout(layout, source)
    fs, fa = (fold_norms(layout.canonical(s), stream.folds) for s in (source, anchor))
    given = Transform({0: LayerTransform(ffn_perm=torch.randperm(layout.ffn_size, generator=gen))})  # found: composed
    seen = {}
    fake = lambda *args: seen.setdefault("blocks", args[6])
    with ABLATION.replaced(learned_module, "refine_by_loss", fake):
        refine = ABLATION.correlated_ffn(2, {})
    batches = [{k: v.float() for k, v in b.items()} for b in pixels(model, images=16)]
    refine(fs, fa, anchor, layout, stream, torch.eye(stream.hidden, dtype=torch.float64), given, model, batches, None)
    moved = apply_transform(source, layout, seen["blocks"])
    for i in range(layout.num_layers):
        ffn = layout.layers[i].ffn
        for key in (ffn.input.weight, ffn.output.weight):
            assert torch.equal(moved[key], anchor[key])
        assert not torch.equal(planted_perms[i], torch.arange(layout.ffn_size))
