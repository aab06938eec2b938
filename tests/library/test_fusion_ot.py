"""OT fusion: planted permutations (residual stream, FFN neurons, Q/K/V units across heads) are undone; the
reference's cost, standardization, token window and residual policy hold exactly on tiny cases."""
import copy

import pytest
import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.fusion import merge_models
from symfusion.fusion.ot import merge_acts, merge_acts_emd, merge_wts
from symfusion.fusion.ot_acts import _CrossMoments, activation_maps, record_activations, window_positions
from symfusion.fusion.ot_align import TransportMaps, align_state
from symfusion.fusion.ot_wts import vit_value_maps, weight_maps
from symfusion.fusion.transport import alignment, ground_cost
from tiny_models import SMALL, VARIANT_IDS, VARIANTS, tiny_config, tiny_model

# The oracle, written independently of ot_align.py: residual axes of the tensors outside the layers.
# If it missed a tensor, the planted model would not compute the same logits.
_TEXT = {
    "embeddings.word_embeddings.weight": (1,), "embeddings.position_embeddings.weight": (1,),
    "embeddings.token_type_embeddings.weight": (1,), "LayerNorm.weight": (0,), "LayerNorm.bias": (0,),
    "pooler.dense.weight": (0, 1), "pooler.dense.bias": (0,), "classifier.weight": (1,),
    "classifier.dense.weight": (0, 1), "classifier.dense.bias": (0,), "classifier.out_proj.weight": (1,),
    "rel_embeddings.weight": (1,),
}
ORACLE = {
    "bert": _TEXT, "roberta": _TEXT, "deberta-v2": _TEXT,
    "vit": {
        "cls_token": (2,), "embeddings.position_embeddings": (2,), "projection.weight": (0,),
        "projection.bias": (0,), "layernorm_before.weight": (0,), "layernorm_before.bias": (0,),
        "layernorm_after.weight": (0,), "layernorm_after.bias": (0,), "layernorm.weight": (0,),
        "layernorm.bias": (0,), "classifier.weight": (1,),
    },
}


def batches_for(family, seed=0, count=2, size=6, seq=9):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        labels = torch.randint(0, 3, (size,), generator=gen)
        if family == "vit":
            out.append({"pixel_values": torch.randn(size, 3, 8, 8, generator=gen), "labels": labels})
            continue
        lengths = torch.randint(3, seq + 1, (size,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()           # (size, seq), right padding
        batch = {"input_ids": torch.randint(2, 97, (size, seq), generator=gen) * mask, "attention_mask": mask,
                 "labels": labels}
        if family == "bert":
            batch["token_type_ids"] = torch.randint(0, 2, (size, seq), generator=gen)
        out.append(batch)
    return out


@torch.no_grad()
def logits(model, batches):
    return torch.cat([model(**{k: v for k, v in b.items() if k != "labels"}).logits for b in batches])


def loaded(model, state):
    clone = copy.deepcopy(model)
    clone.load_state_dict(state)
    return clone


def _take(tensor, index, axis):
    return tensor.index_select(axis, index)


def head_permutation(heads, d, gen):
    """Rows (heads*d) of a permutation that moves whole heads (sigma) and coordinates within them: row
    (h, c) of the permuted map is row (sigma[h], rho[h, c]) of the original."""
    sigma = torch.randperm(heads, generator=gen)
    while heads > 1 and bool((sigma == torch.arange(heads)).all()):
        sigma = torch.randperm(heads, generator=gen)
    rho = torch.stack([torch.randperm(d, generator=gen) for _ in range(heads)])
    return (sigma[:, None] * d + rho).reshape(-1)


def planted(model, seed=7):
    """A copy computing the same function with the residual stream, each FFN's neurons and each layer's
    Q/K and V/O units permuted; whole heads move too, so Q/K/V units change heads."""
    state = model.state_dict()
    layout = layout_of(model.config, state)
    gen = torch.Generator().manual_seed(seed)
    heads, d = layout.num_heads, layout.head_dim
    res = torch.randperm(layout.hidden_size, generator=gen)
    out = dict(state)
    inside = set()
    perms = []
    for layer in layout.layers:
        att, ffn = layer.attention, layer.ffn
        qk = head_permutation(heads, d, gen)
        sigma = qk.view(heads, d)[:, 0] // d                                    # the same head move for V/O
        vo = (sigma[:, None] * d + torch.stack([torch.randperm(d, generator=gen) for _ in range(heads)])).reshape(-1)
        neurons = torch.randperm(layout.ffn_size, generator=gen)
        perms.append({"q": qk, "k": qk, "v": vo, "fc1": neurons})
        for proj, rows in [(p, qk) for p in att.query_like + att.key_like] + [(att.value, vo), (ffn.input, neurons)]:
            out[proj.weight] = _take(_take(out[proj.weight], rows, 0), res, 1)
            if proj.bias:
                out[proj.bias] = _take(out[proj.bias], rows, 0)
            inside.update(proj.keys())
        for proj, cols in [(att.output, vo), (ffn.output, neurons)]:
            out[proj.weight] = _take(_take(out[proj.weight], cols, 1), res, 0)
            if proj.bias:
                out[proj.bias] = _take(out[proj.bias], res, 0)
            inside.update(proj.keys())
    for key in set(state) - inside:
        axes = next((a for s, a in ORACLE[layout.family].items() if key.endswith(s)), ())
        for axis in axes:
            out[key] = _take(out[key], res, axis)
    source = loaded(model, out)
    source.planted = {"residual": res, "layers": perms}
    return source


def permutation_matrix(index):
    """P (anchor x source) of a source whose unit i is the anchor's unit index[i]: P[index[i], i] = 1."""
    p = torch.zeros(len(index), len(index), dtype=torch.float64)
    p[index, torch.arange(len(index))] = 1.0
    return p


# every layout variant, plus DeBERTa-v3's layer-normed relative embeddings without absolute positions
PLANTED = VARIANTS + [("deberta-v2", {"norm_rel_ebd": "layer_norm", "position_biased_input": False})]
PLANTED_IDS = VARIANT_IDS + ["deberta-v3-style"]


@pytest.mark.parametrize("family,overrides", PLANTED, ids=PLANTED_IDS)
def test_emd_undoes_planted_permutation(family, overrides):
    anchor = tiny_model(family, seed=0, **overrides)
    source = planted(anchor)
    batches = batches_for(family)
    torch.testing.assert_close(logits(source, batches), logits(anchor, batches), atol=1e-5, rtol=1e-5)
    assert max((source.state_dict()[k] - v).abs().max() for k, v in anchor.state_dict().items()) > 0.1

    merged = merge_acts_emd([anchor, source], batches)
    for key, tensor in anchor.state_dict().items():
        torch.testing.assert_close(merged[key], tensor, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("family", ["vit", "bert", "deberta-v2"])
def test_q_k_v_maps_recover_units_moved_across_heads(family):
    """The Euclidean-cost maps of Q, K and V are the planted permutations, which move units between heads."""
    anchor = tiny_model(family, seed=0)
    source = planted(anchor, seed=5)
    layout = layout_of(anchor.config, anchor.state_dict())
    d = layout.head_dim
    (acts,) = activation_maps([anchor, source], layout, batches_for(family), None, "euclidean", "all", "all")
    wts = weight_maps(_float(anchor), _float(source), layout, 1e-3, "euclidean", "mean")
    for i, planted_layer in enumerate(source.planted["layers"]):
        assert (planted_layer["q"] // d != torch.arange(layout.num_heads).repeat_interleave(d)).any()
        for name in ("q", "k", "v", "fc1"):
            expected = permutation_matrix(planted_layer[name])
            torch.testing.assert_close(getattr(acts, name)[i], expected, msg=f"acts {name}.{i}")
            torch.testing.assert_close(getattr(wts, name)[i], expected, atol=1e-6, rtol=0, msg=f"wts {name}.{i}")


def _float(model):
    return {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}


def initialised_model(family, seed):
    """A model with transformers' own initialisation: tiny_model's large random weights make the
    activations of deeper layers nearly collinear (rank collapse), which no soft map can resolve."""
    config = tiny_config(family)
    config.num_labels = 3
    torch.manual_seed(seed)
    model = tf.ViTForImageClassification(config) if family == "vit" else \
        tf.AutoModelForSequenceClassification.from_config(config)
    return model.eval()


@pytest.mark.parametrize("family", ["vit", "bert", "deberta-v2"])
def test_soft_maps_nearly_undo_planted_permutation(family):
    anchor = initialised_model(family, seed=0)
    source = planted(anchor, seed=3)
    batches = batches_for(family)
    expected = logits(anchor, batches)
    merged = merge_acts([anchor, source], batches, reg=0.01)
    torch.testing.assert_close(logits(loaded(anchor, merged), batches), expected, atol=1e-3, rtol=1e-3)
    merged = merge_wts([anchor, source], reg=0.01)
    if family == "vit":   # the class token's weight-based map sees only its entries' signs: it stays mixed
        merged["vit.embeddings.cls_token"] = anchor.state_dict()["vit.embeddings.cls_token"]
    torch.testing.assert_close(logits(loaded(anchor, merged), batches), expected, atol=1e-3, rtol=1e-3)


def test_weight_based_class_token_map_only_moves_mass_between_entries_of_one_sign():
    """The reference normalises the class token's one-entry rows: OT-WTS compares only their signs."""
    anchor = initialised_model("vit", seed=0)
    source = planted(anchor, seed=3)
    layout = layout_of(anchor.config, anchor.state_dict())
    p = vit_value_maps(_float(source), _float(anchor), layout, 0.01, "euclidean", unit=True)["class_token"]
    sign_a = anchor.state_dict()["vit.embeddings.cls_token"].reshape(-1).sign()
    sign_s = source.state_dict()["vit.embeddings.cls_token"].reshape(-1).sign()
    same = sign_a[:, None] == sign_s[None, :]                                   # (anchor, source)
    assert p[~same].max() < 1e-6 < p[same].min()
    assert p.max() < 0.5                                                        # no unit is matched to one unit


def test_ground_cost_is_euclidean_over_its_maximum():
    gen = torch.Generator().manual_seed(0)
    source, anchor = torch.randn(5, 3, generator=gen), torch.randn(4, 3, generator=gen)
    distance = ((source[:, None, :] - anchor[None, :, :]) ** 2).sum(-1).sqrt().double()     # (5, 4)
    torch.testing.assert_close(ground_cost(source, anchor, "euclidean"), distance / distance.max())
    torch.testing.assert_close(ground_cost(source, anchor, "sqeuclidean"), distance ** 2 / (distance ** 2).max())


def test_activation_cost_is_the_distance_of_the_references_standardized_activations():
    """Moments over two batches give cdist((y - mean) / (std + 1e-9), (x - mean) / (std + 1e-9)) / max,
    with the unbiased std, as the reference's transform_acts then GroundMetric."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 4, generator=gen).double() * torch.tensor([1.0, 3.0, 0.5, 2.0]) + 2.0  # anchor (samples, n)
    y = torch.cat([x[:, [2, 0]] * 1.5 - 1.0, torch.randn(40, 3, generator=gen).double()], dim=1)  # source (samples, m)
    moments = _CrossMoments()
    moments.update(y[:15], x[:15])
    moments.update(y[15:], x[15:])
    standard = lambda a: (a - a.mean(0)) / (a.std(0) + 1e-9)                    # noqa: E731 - torch.std: unbiased
    for cost, power in (("euclidean", 1), ("sqeuclidean", 2)):
        distance = torch.cdist(standard(y).T, standard(x).T) ** power           # (m, n)
        torch.testing.assert_close(moments.cost(cost), distance / distance.max())
    assert moments.cost("euclidean")[0, 2] < 1e-6 and moments.cost("euclidean")[1, 0] < 1e-6


def test_alignment_is_m_times_the_transposed_plan():
    """P = m T^T: the exact plan of a permuted copy gives the permutation, Sinkhorn a column-stochastic map."""
    gen = torch.Generator().manual_seed(2)
    anchor = torch.randn(6, 5, generator=gen)
    index = torch.randperm(6, generator=gen)
    source = anchor[index]                                                   # source unit i = anchor unit index[i]
    cost = ground_cost(source, anchor, "euclidean")
    torch.testing.assert_close(alignment(cost, None), permutation_matrix(index))
    soft = alignment(cost, 0.5)
    torch.testing.assert_close(soft.sum(0), torch.ones(6, dtype=torch.float64))
    assert soft.shape == (6, 6) and (soft.argmax(0) == index).all()


def test_window_positions_are_the_references_mask_on_its_8x8_grid():
    # the reference's WINDOW_6 (ot_utils.py): the CLS token and rows/columns 1..6 of the 8x8 patch grid
    expected = [0] + [1 + 8 * row + col for row in range(1, 7) for col in range(1, 7)]
    assert window_positions(8, 6).tolist() == expected
    assert window_positions(7, 6).tolist() == [0] + [1 + 7 * r + c for r in range(6) for c in range(6)]
    assert window_positions(2, 6).tolist() == [0, 1, 2, 3, 4]                   # a grid smaller than the window


def test_vit_activations_are_the_window_and_the_last_layers_cls_token():
    config = tf.ViTConfig(image_size=32, patch_size=4, num_channels=3, num_labels=3, **SMALL)   # 8x8 grid, 65 tokens
    torch.manual_seed(0)
    model = tf.ViTForImageClassification(config).eval()
    layout = layout_of(model.config, model.state_dict())
    batch = {"pixel_values": torch.randn(3, 3, 32, 32)}
    seen = {}
    hooks = [model.vit.layers[i].get_submodule(name).register_forward_hook(
        lambda m, a, o, key=(i, name): seen.setdefault(key, o.detach()))
        for i in (0, 1) for name in ("attention.q_proj", "mlp.fc1")]
    acts = record_activations(model, layout, batch, "window_6", "only_cls")
    for hook in hooks:
        hook.remove()
    window = window_positions(8, 6)
    torch.testing.assert_close(acts["q.0"], seen[(0, "attention.q_proj")][:, window].reshape(-1, 32))
    torch.testing.assert_close(acts["q.1"], seen[(1, "attention.q_proj")][:, window].reshape(-1, 32))
    torch.testing.assert_close(acts["fc1.0"], seen[(0, "mlp.fc1")][:, window].reshape(-1, 37))   # before GELU
    torch.testing.assert_close(acts["fc1.1"], seen[(1, "mlp.fc1")][:, 0])                      # last layer: CLS
    assert acts["patches"].shape == (3 * 64, 32)                                 # every patch of every image


def test_text_activations_skip_padded_tokens():
    model = tiny_model("bert", seed=1)
    layout = layout_of(model.config, model.state_dict())
    batch = batches_for("bert", count=1)[0]
    acts = record_activations(model, layout, batch, "all", "all")
    kept = int(batch["attention_mask"].sum())
    assert kept < batch["attention_mask"].numel()
    assert all(a.shape[0] == kept for a in acts.values())
    assert record_activations(model, layout, batch, "only_cls", "only_cls")["q.0"].shape[0] == len(batch["labels"])


def random_maps(layout, gen, vit):
    """Arbitrary (not stochastic, not permutation) maps: the closed form holds for any matrices."""
    h, w, f = layout.hidden_size, layout.num_heads * layout.head_dim, layout.ffn_size
    r = lambda n: torch.randn(n, n, generator=gen, dtype=torch.float64)  # noqa: E731
    layers = range(layout.num_layers)
    embeddings = {"class_token": r(h), "positions": r(h), "patches": r(h)} if vit else {"stream": r(h)}
    return TransportMaps(embeddings=embeddings, q=[r(w) for _ in layers], k=[r(w) for _ in layers],
                         v=[r(w) for _ in layers], o=[r(h) for _ in layers], fc1=[r(f) for _ in layers],
                         fc2=[r(h) for _ in layers])


@pytest.mark.parametrize("policy", ["mean", "no_resid", "only_resid"])
def test_residual_policy_closed_form_on_a_one_layer_vit(policy):
    model = tiny_model("vit", seed=3, num_hidden_layers=1)
    state = {k: v.double() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, state)
    m = random_maps(layout, torch.Generator().manual_seed(4), vit=True)
    combine = {"mean": lambda resid, block: (resid + block) / 2, "no_resid": lambda resid, block: block,
               "only_resid": lambda resid, block: resid}[policy]
    p_in = combine(m.embeddings["positions"], m.embeddings["patches"])        # hf_vit_fusion's embedding policy
    p_mid = combine(p_in, m.o[0])
    p_out = combine(p_mid, m.fc2[0])
    s, a = state, "vit.layers.0."
    expected = {
        "vit.embeddings.cls_token": s["vit.embeddings.cls_token"] @ m.embeddings["class_token"].T,
        "vit.embeddings.position_embeddings": s["vit.embeddings.position_embeddings"] @ m.embeddings["positions"].T,
        "vit.embeddings.patch_embeddings.projection.weight":
            torch.einsum("ij,jcxy->icxy", m.embeddings["patches"], s["vit.embeddings.patch_embeddings.projection.weight"]),
        "vit.embeddings.patch_embeddings.projection.bias": m.embeddings["patches"] @ s["vit.embeddings.patch_embeddings.projection.bias"],
        a + "layernorm_before.weight": p_in @ s[a + "layernorm_before.weight"],
        a + "layernorm_before.bias": p_in @ s[a + "layernorm_before.bias"],
        a + "layernorm_after.weight": p_mid @ s[a + "layernorm_after.weight"],
        a + "layernorm_after.bias": p_mid @ s[a + "layernorm_after.bias"],
        "vit.layernorm.weight": p_out @ s["vit.layernorm.weight"],
        "vit.layernorm.bias": p_out @ s["vit.layernorm.bias"],
        "classifier.weight": s["classifier.weight"] @ p_out.T,
        "classifier.bias": s["classifier.bias"],
    }
    for name, p_rows, p_cols in [("attention.q_proj", m.q[0], p_in), ("attention.k_proj", m.k[0], p_in),
                                 ("attention.v_proj", m.v[0], p_in), ("attention.o_proj", m.o[0], m.v[0]),
                                 ("mlp.fc1", m.fc1[0], p_mid), ("mlp.fc2", m.fc2[0], m.fc1[0])]:
        expected[a + name + ".weight"] = p_rows @ s[a + name + ".weight"] @ p_cols.T
        expected[a + name + ".bias"] = p_rows @ s[a + name + ".bias"]
    aligned = align_state(model.state_dict(), layout, m, policy)
    assert set(expected) == set(aligned)
    for key, tensor in expected.items():
        torch.testing.assert_close(aligned[key], tensor, msg=key)


def test_mean_policy_closed_form_on_a_one_layer_bert():
    """Post-LN: the attention block's LayerNorm takes P_mid, the FFN's P_out, the embeddings P_stream."""
    model = tiny_model("bert", seed=3, num_hidden_layers=1)
    state = {k: v.double() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, state)
    m = random_maps(layout, torch.Generator().manual_seed(5), vit=False)
    p_in = m.embeddings["stream"]
    p_mid, a = (p_in + m.o[0]) / 2, "bert.encoder.layer.0."
    p_out = (p_mid + m.fc2[0]) / 2
    aligned = align_state(model.state_dict(), layout, m, "mean")
    checks = {
        "bert.embeddings.word_embeddings.weight": state["bert.embeddings.word_embeddings.weight"] @ p_in.T,
        "bert.embeddings.LayerNorm.weight": p_in @ state["bert.embeddings.LayerNorm.weight"],
        a + "attention.self.query.weight": m.q[0] @ state[a + "attention.self.query.weight"] @ p_in.T,
        a + "attention.output.dense.bias": m.o[0] @ state[a + "attention.output.dense.bias"],
        a + "attention.output.LayerNorm.weight": p_mid @ state[a + "attention.output.LayerNorm.weight"],
        a + "intermediate.dense.weight": m.fc1[0] @ state[a + "intermediate.dense.weight"] @ p_mid.T,
        a + "output.dense.weight": m.fc2[0] @ state[a + "output.dense.weight"] @ m.fc1[0].T,
        a + "output.LayerNorm.bias": p_out @ state[a + "output.LayerNorm.bias"],
        "bert.pooler.dense.weight": p_out @ state["bert.pooler.dense.weight"] @ p_out.T,
        "classifier.weight": state["classifier.weight"] @ p_out.T,
    }
    for key, tensor in checks.items():
        torch.testing.assert_close(aligned[key], tensor, msg=key)


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_three_models_keep_anchor_keys_shapes_dtypes(family, overrides):
    models = [tiny_model(family, seed=s, **overrides) for s in (0, 1, 2)]
    batches = batches_for(family, count=1)
    anchor = models[0].state_dict()
    for method in ("ot_acts", "ot_acts_emd", "ot_wts"):
        merged = merge_models(method, models, batches)
        assert list(merged) == list(anchor)
        for key, tensor in anchor.items():
            assert merged[key].shape == tensor.shape and merged[key].dtype == tensor.dtype, key
            assert torch.isfinite(merged[key].float()).all(), key
        assert torch.isfinite(logits(loaded(models[0], merged), batches)).all()


def test_examples_beyond_num_examples_are_not_read():
    models = [initialised_model("vit", seed=s) for s in (0, 1)]
    first = batches_for("vit", seed=1, count=1, size=5)
    more = first + batches_for("vit", seed=2, count=1, size=5)
    torch.testing.assert_close(merge_acts(models, more, num_examples=5), merge_acts(models, first))
    assert any(not torch.allclose(a, b) for a, b in zip(merge_acts(models, more).values(),
                                                         merge_acts(models, first).values()))


def test_bfloat16_models_keep_their_dtype():
    models = [tiny_model("vit", seed=s, dtype=torch.bfloat16) for s in (0, 1)]
    merged = merge_acts(models, batches_for("vit", count=1))
    assert all(t.dtype == torch.bfloat16 for t in merged.values())


def test_activation_methods_need_batches():
    models = [tiny_model("vit", seed=s) for s in (0, 1)]
    for merge in (merge_acts, merge_acts_emd):
        with pytest.raises(SymfusionError, match="batches"):
            merge(models, None)


def test_bad_options_raise():
    models = [tiny_model("vit", seed=s) for s in (0, 1)]
    with pytest.raises(SymfusionError, match="option reg must be a number > 0"):
        merge_wts(models, reg=0.0)
    with pytest.raises(SymfusionError, match="has no option alpha"):
        merge_acts(models, batches_for("vit"), alpha=0.5)
    with pytest.raises(SymfusionError, match="option tokens must be"):
        merge_acts(models, batches_for("vit"), tokens="window_x")
    with pytest.raises(SymfusionError, match="option residual must be one of mean, no_resid, only_resid"):
        merge_wts(models, residual="weighted_scalar")
    text = [tiny_model("bert", seed=s) for s in (0, 1)]
    with pytest.raises(SymfusionError, match="needs a patch grid"):
        merge_acts(text, batches_for("bert"), tokens="window_6")


def test_unsupported_family_raises():
    config = tf.OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, ffn_dim=24,
                          word_embed_proj_dim=16)
    models = [tf.OPTModel(config).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="unsupported model_type"):
        merge_wts(models)
    # GPT-2 is a supported family for matching, but OT fusion stays encoder-only and says so
    gpt = [tf.GPT2Model(tf.GPT2Config(vocab_size=50, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="OT fusion supports the encoder families"):
        merge_wts(gpt)


def test_unknown_tensor_raises():
    config = tiny_model("bert").config
    models = [tf.BertForMaskedLM(config).eval() for _ in range(2)]
    with pytest.raises(SymfusionError, match="residual axes of"):
        merge_wts(models)
