"""Fisher merging and RegMean: closed-form cases (the references' ViT settings among them), per-example Fisher,
padding, tiny models of two families."""
import pytest
import torch
import transformers as tf
from torch import nn

from symfusion.errors import SymfusionError
from symfusion.fusion import fisher, regmean, simple
from tiny_models import randomize, tiny_config, tiny_model

# vmap over CPU scaled_dot_product_attention warns that it falls back to a loop: expected here
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


class MixedLinear(nn.Module):
    """One nn.Linear on inputs x @ mix; the fixed (non-Linear) `mix` gives each model its own inputs."""

    def __init__(self, weight: torch.Tensor, mix: torch.Tensor):
        super().__init__()
        self.fc = nn.Linear(weight.shape[1], weight.shape[0])
        self.fc.weight.data.copy_(weight)
        self.register_buffer("mix", mix)

    def forward(self, x, labels=None):
        return self.fc(x @ self.mix)


def image_batches(n=1, size=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [{"pixel_values": torch.randn(size, 3, 8, 8, generator=gen),
             "labels": torch.randint(0, 3, (size,), generator=gen)} for _ in range(n)]


def text_batch(size=4, length=7, seed=0):
    """Token batch whose later rows are padded (attention_mask 0 at their ends)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(size, length, dtype=torch.long)
    for row in range(1, size):
        mask[row, length - row:] = 0
    return {"input_ids": torch.randint(5, 97, (size, length), generator=gen), "attention_mask": mask,
            "labels": torch.randint(0, 3, (size,), generator=gen)}


def linear_models(mixes, d_in=5, d_out=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [MixedLinear(torch.randn(d_out, d_in, generator=gen), mix) for mix in mixes]


# ---------------------------------------------------------------- RegMean


def test_regmean_alpha1_on_one_linear_is_the_least_squares_solution_and_not_the_average():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 5, generator=gen)
    mixes = [torch.randn(5, 5, generator=gen) for _ in range(3)]  # correlated, different inputs per model
    models = linear_models(mixes)
    merged = regmean.merge(models, [{"x": x, "labels": torch.zeros(64)}], alpha=1.0)["fc.weight"]

    inputs = torch.cat([(x @ m).double() for m in mixes])                                   # (k n, in)
    targets = torch.cat([(x @ m).double() @ mdl.fc.weight.double().T for m, mdl in zip(mixes, models)])
    expected = torch.linalg.lstsq(inputs, targets).solution.T                                # (out, in)
    assert torch.allclose(merged.double(), expected, atol=1e-5)
    assert not torch.allclose(merged, simple.merge(models)["fc.weight"], atol=1e-2)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_regmean_is_the_average_when_every_gram_is_the_same_scaled_identity(alpha):
    gen = torch.Generator().manual_seed(2)
    x = torch.linalg.qr(torch.randn(64, 5, generator=gen)).Q * 3.0                  # X^T X = 9 I
    mixes = [torch.linalg.qr(torch.randn(5, 5, generator=gen)).Q for _ in range(3)]  # orthogonal: G_i = 9 I
    models = linear_models(mixes)
    grams = [regmean.gram_matrices(m, [{"x": x}])["fc"] for m in models]
    assert all(torch.allclose(g, torch.eye(5, dtype=g.dtype) * 9 / 64, atol=1e-6) for g in grams)
    merged = regmean.merge(models, [{"x": x}], alpha=alpha)
    assert torch.allclose(merged["fc.weight"], simple.merge(models)["fc.weight"], atol=1e-5)


def test_regmean_alpha0_only_reads_the_diagonal():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 5, generator=gen)
    x = x / x.norm(dim=0)                                   # unit columns: diag(G) = I / n, G not diagonal
    signs = torch.diag(torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0]))
    models = linear_models([torch.eye(5), signs])         # same diag(G_i), different off-diagonals
    average = simple.merge(models)["fc.weight"]
    assert torch.allclose(regmean.merge(models, [{"x": x}], alpha=0.0)["fc.weight"], average, atol=1e-6)
    assert not torch.allclose(regmean.merge(models, [{"x": x}], alpha=1.0)["fc.weight"], average, atol=1e-2)


def test_diagonal_regmean_is_the_per_input_coordinate_weighted_average():
    """alpha = 0 (the reference's ViT regmean_diag): W[:, j] = sum_i G_i[j, j] W_i[:, j] / sum_i G_i[j, j]."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 5, generator=gen)
    mixes = [torch.diag(torch.rand(5, generator=gen) * 3 + 0.1) + 0.3 * torch.randn(5, 5, generator=gen)
             for _ in range(3)]                                       # inputs of other scales, correlated
    models = linear_models(mixes)
    merged = regmean.merge(models, [{"x": x}], alpha=0.0)["fc.weight"].double()

    energy = torch.stack([((x @ m).double() ** 2).mean(0) for m in mixes])             # (models, in): G_i[j, j]
    weights = torch.stack([mdl.fc.weight.double() for mdl in models])                  # (models, out, in)
    expected = (energy[:, None, :] * weights).sum(0) / energy.sum(0)                   # (out, in)
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(merged, simple.merge(models)["fc.weight"].double(), atol=1e-2)
    assert not torch.allclose(merged, regmean.merge(models, [{"x": x}], alpha=0.1)["fc.weight"].double(), atol=1e-3)


def test_regmean_of_vits_is_diagonal_with_the_anchors_classifier_weight_by_default():
    """The reference's ViT RegMean: diagonal Grams; multi_label_head_special keeps the anchor's classifier weight."""
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    batches = image_batches(n=2, size=3)
    merged = regmean.merge(models, batches)
    explicit = regmean.merge(models, batches, alpha=0.0, anchor_keys=[])
    anchor, average = models[0].state_dict(), simple.merge(models)
    assert torch.equal(merged["classifier.weight"], anchor["classifier.weight"])
    assert not torch.allclose(explicit["classifier.weight"], anchor["classifier.weight"], atol=1e-3)
    torch.testing.assert_close(merged["classifier.bias"], average["classifier.bias"])
    for key in explicit:
        if key != "classifier.weight":
            torch.testing.assert_close(merged[key], explicit[key], msg=key)
    text = [tiny_model("bert", seed=s) for s in (1, 2)]
    torch.testing.assert_close(regmean.merge(text, [text_batch()]), regmean.merge(text, [text_batch()], alpha=0.1))


def test_regmean_and_fisher_read_only_num_examples_examples():
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    first, more = image_batches(n=1, size=3, seed=1), image_batches(n=2, size=3, seed=1)
    for merge in (regmean.merge, fisher.merge):
        torch.testing.assert_close(merge(models, more, num_examples=3), merge(models, first), msg=str(merge))
        assert any(not torch.allclose(a, b) for a, b in zip(merge(models, more).values(), merge(models, first).values()))


def test_regmean_with_a_singular_gram_stays_finite_and_averaged():
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(4))  # 3 rows < 5 features: rank-3 Gram
    models = linear_models([torch.eye(5)] * 2)
    merged = regmean.merge(models, [{"x": x}], alpha=1.0)["fc.weight"]
    assert torch.isfinite(merged).all()
    assert torch.allclose(merged, simple.merge(models)["fc.weight"], atol=1e-5)


def test_gram_of_text_models_excludes_padded_tokens():
    model = tiny_model("bert", seed=1)
    batch = text_batch()
    grams = regmean.gram_matrices(model, [batch])

    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        embedded = model(**batch, output_hidden_states=True).hidden_states[0].double()  # (B, T, d)
    rows = embedded[mask]                                                                # (tokens kept, d)
    expected = rows.T @ rows / len(rows)
    assert torch.allclose(grams["bert.encoder.layer.0.attention.self.query"], expected, atol=1e-8)
    everything = embedded.reshape(-1, embedded.shape[-1])
    assert not torch.allclose(expected, everything.T @ everything / len(everything), atol=1e-3)

    changed = dict(batch, input_ids=torch.where(mask, batch["input_ids"], 1))  # other ids at padded positions
    grams_changed = regmean.gram_matrices(model, [changed])
    assert grams.keys() == grams_changed.keys()
    assert all(torch.allclose(grams[n], grams_changed[n], atol=1e-8) for n in grams)
    assert grams["classifier"].shape == (32, 32)  # the head on the pooled vector counts too


def test_gram_of_every_linear_is_exactly_that_of_its_own_inputs():
    """The query, key and value projections share one Gram product: each equals X^T X / n of the rows
    that layer itself received, bit for bit, over several batches."""
    model = tiny_model("bert", seed=2)
    batches = [text_batch(seed=0), text_batch(size=3, length=5, seed=1)]
    seen = {}
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    handles = [m.register_forward_pre_hook(lambda m, a, n=n: seen.setdefault(n, []).append(a[0].detach().clone()))
               for n, m in linears.items()]
    with torch.no_grad():
        for batch in batches:
            model(**batch)
    for handle in handles:
        handle.remove()
    grams = regmean.gram_matrices(model, batches)
    assert grams.keys() == seen.keys()
    for name, inputs in seen.items():
        rows = [regmean._rows(x, b["attention_mask"]).double() for x, b in zip(inputs, batches)]
        expected = (rows[0].T @ rows[0] + rows[1].T @ rows[1]) / (len(rows[0]) + len(rows[1]))
        assert torch.equal(grams[name], expected), name


class ChangesItsInputInPlace(nn.Module):
    """fc1 and fc2 read one tensor object, doubled in place between them."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, x):
        y = self.fc1(x)
        x.mul_(2.0)
        return y + self.fc2(x)


def test_gram_is_not_shared_when_the_input_changed_in_place():
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    grams = regmean.gram_matrices(ChangesItsInputInPlace(), [{"x": x.clone()}])
    assert torch.allclose(grams["fc2"], 4 * grams["fc1"], rtol=1e-12, atol=0)


# ---------------------------------------------------------------- Fisher


def test_fisher_is_the_average_when_fisher_values_are_equal(monkeypatch):
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    gen = torch.Generator().manual_seed(0)
    values = {n: torch.rand(p.shape, generator=gen) for n, p in models[0].named_parameters()}
    monkeypatch.setattr(fisher, "diagonal_fisher", lambda model, batches, **kw: values)
    merged, average = fisher.merge(models, image_batches()), simple.merge(models)
    assert all(torch.allclose(merged[k], average[k], rtol=0, atol=1e-6) for k in average)


def test_fisher_differs_from_the_average_and_lies_between_the_models():
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    merged, average = fisher.merge(models, image_batches()), simple.merge(models)
    a, b = models[0].state_dict(), models[1].state_dict()
    for key in merged:
        low, high = torch.minimum(a[key], b[key]), torch.maximum(a[key], b[key])
        assert (merged[key] >= low - 1e-6).all() and (merged[key] <= high + 1e-6).all(), key
    assert not torch.allclose(merged["vit.layers.1.mlp.fc2.weight"], average["vit.layers.1.mlp.fc2.weight"], atol=1e-3)
    # the key bias cancels in the softmax: no gradient, only ~1e-14 rounding noise against the ViT epsilon
    # 1e-10, so averaged up to a ~1e-4 fraction of the models' difference (the noise, and so the fraction,
    # depends on the CPU's kernels: within 1% of the midpoint on every machine)
    key_bias = "vit.layers.0.attention.k_proj.bias"
    assert ((merged[key_bias] - average[key_bias]).abs() <= 1e-2 * (a[key_bias] - b[key_bias]).abs()).all()
    assert not torch.allclose(merged[key_bias], a[key_bias], rtol=0, atol=1e-2)


def test_fisher_of_vits_averages_embeddings_and_classifier_as_the_reference():
    """The reference's ViT merger plainly averages every tensor named *embedding* or *classifier*."""
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    merged, average = fisher.merge(models, image_batches()), simple.merge(models)
    weighted = fisher.merge(models, image_batches(), plain_average=[])
    plain = [k for k in merged if "embedding" in k or "classifier" in k]
    assert "vit.embeddings.cls_token" in plain and "classifier.weight" in plain
    for key in merged:
        expected = average[key] if key in plain else weighted[key]
        torch.testing.assert_close(merged[key], expected, msg=key)
    assert not torch.allclose(weighted["classifier.weight"], average["classifier.weight"], atol=1e-3)


def planted_fisher(monkeypatch, values):
    """diagonal_fisher returns values[i] for models[i]."""
    calls = iter(values)
    monkeypatch.setattr(fisher, "diagonal_fisher", lambda model, batches, **kw: next(calls))


def test_param_normalised_fisher_is_the_closed_form(monkeypatch):
    """normalize=param: theta = sum_i c_i (F_i + eps) theta_i / sum_i c_i (F_i + eps), c_i ~ 1 / (||F_i|| + eps)."""
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    gen = torch.Generator().manual_seed(3)
    values = [{n: torch.rand(p.shape, generator=gen) * scale for n, p in models[0].named_parameters()}
              for scale in (1.0, 40.0)]
    planted_fisher(monkeypatch, values)
    merged = fisher.merge(models, image_batches(), normalize="param", plain_average=[], epsilon=1e-10)
    states = [m.state_dict() for m in models]
    for key in values[0]:
        w = [v[key].double() / v[key].double().norm() for v in values]              # F_i / ||F_i||
        expected = (w[0] * states[0][key] + w[1] * states[1][key]) / (w[0] + w[1])
        torch.testing.assert_close(merged[key].double(), expected, msg=key)


def test_param_normalised_fisher_of_proportional_fishers_is_the_average(monkeypatch):
    """F_2 = s F_1 in every tensor: the normalised weights agree, the merge is the plain average,
    where the unnormalised merge is (theta_1 + s theta_2) / (1 + s)."""
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    gen = torch.Generator().manual_seed(4)
    base = {n: torch.rand(p.shape, generator=gen) + 0.1 for n, p in models[0].named_parameters()}
    scale = 9.0
    values = [base, {n: v * scale for n, v in base.items()}]
    planted_fisher(monkeypatch, values)
    normalised = fisher.merge(models, image_batches(), normalize="param", plain_average=[])
    planted_fisher(monkeypatch, values)
    plain = fisher.merge(models, image_batches(), normalize="none", plain_average=[])
    a, b = (m.state_dict() for m in models)
    average = simple.merge(models)
    for key in base:
        torch.testing.assert_close(normalised[key], average[key], msg=key)
        torch.testing.assert_close(plain[key], (a[key] + scale * b[key]) / (1 + scale), msg=key)


def test_fisher_is_per_example_and_matches_a_manual_loop():
    model = tiny_model("vit", seed=1)
    batch = image_batches(size=5)[0]
    result = fisher.diagonal_fisher(model, [batch], chunk_size=2)  # vmap over chunks of 2, 2, 1
    params = dict(model.named_parameters())
    manual = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(5):
        loss = model(pixel_values=batch["pixel_values"][i:i + 1], labels=batch["labels"][i:i + 1]).loss
        for (name, p), g in zip(params.items(), torch.autograd.grad(loss, list(params.values()))):
            manual[name] += g.pow(2) / 5
    assert all(torch.allclose(result[n], manual[n], atol=1e-6, rtol=1e-4) for n in manual)
    model.zero_grad()
    model(**batch).loss.backward()
    squared_mean = {n: p.grad.pow(2) for n, p in params.items()}
    assert not torch.allclose(result["classifier.weight"], squared_mean["classifier.weight"], rtol=0.1)


def test_fisher_of_a_text_model_runs_in_eval_mode_and_restores_its_state():
    model = tiny_model("bert", seed=1).train()       # dropout 0.1 in training mode
    model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    batch = text_batch(size=3)
    first, second = fisher.diagonal_fisher(model, [batch]), fisher.diagonal_fisher(model, [batch])
    assert all(torch.equal(first[n], second[n]) for n in first)   # no dropout noise
    assert all(m.training for m in model.modules())
    assert not model.bert.embeddings.word_embeddings.weight.requires_grad
    assert model.classifier.weight.requires_grad
    assert first["bert.embeddings.word_embeddings.weight"].abs().sum() > 0  # frozen still gets a Fisher


def test_fisher_of_token_classification_skips_examples_without_labelled_tokens():
    config = tiny_config("bert")
    config.num_labels = 3
    models = [randomize(tf.BertForTokenClassification(config), seed) for seed in (1, 2)]
    batch = text_batch()
    labels = torch.randint(0, 3, batch["input_ids"].shape, generator=torch.Generator().manual_seed(0))
    labels[batch["attention_mask"] == 0] = -100
    labels[2] = -100                                   # (B, T) labels; example 2 has no labelled token
    batch["labels"] = labels
    values = fisher.diagonal_fisher(models[0], [batch])
    assert all(torch.isfinite(v).all() for v in values.values())
    merged = fisher.merge(models, [batch])
    assert all(torch.isfinite(v).all() for v in merged.values() if v.is_floating_point())


# ---------------------------------------------------------------- both methods


@pytest.mark.parametrize("method", ["fisher", "regmean"])
@pytest.mark.parametrize("family", ["vit", "bert"])
def test_three_models_give_the_anchor_layout(method, family):
    models = [tiny_model(family, seed=s) for s in (1, 2, 3)]
    batches = image_batches(n=2, size=3) if family == "vit" else [text_batch(seed=0), text_batch(seed=1)]
    merged = {"fisher": fisher.merge, "regmean": regmean.merge}[method](models, batches)
    anchor = models[0].state_dict()
    assert list(merged) == list(anchor)
    for key, tensor in anchor.items():
        assert merged[key].shape == tensor.shape and merged[key].dtype == tensor.dtype, key
        assert not merged[key].is_floating_point() or torch.isfinite(merged[key]).all(), key


@pytest.mark.parametrize("merge", [fisher.merge, regmean.merge])
def test_missing_batches_are_rejected(merge):
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    for batches in (None, []):
        with pytest.raises(SymfusionError, match="needs data batches"):
            merge(models, batches)


def test_bad_options_are_rejected():
    models = [tiny_model("vit", seed=1), tiny_model("vit", seed=2)]
    batch = image_batches()[0]
    with pytest.raises(SymfusionError, match="labels"):
        fisher.merge(models, [{"pixel_values": batch["pixel_values"]}])
    with pytest.raises(SymfusionError, match=r"regmean: option alpha must be a number in \[0, 1\], got 1.5"):
        regmean.merge(models, [batch], alpha=1.5)
    with pytest.raises(SymfusionError, match="fisher: option normalize must be one of none, param, got 'model'"):
        fisher.merge(models, [batch], normalize="model")
    with pytest.raises(SymfusionError, match="fisher: option epsilon must be a number > 0"):
        fisher.merge(models, [batch], epsilon=0)
    with pytest.raises(SymfusionError, match="anchor_keys names 'head.weight'"):
        regmean.merge(models, [batch], anchor_keys=["head.weight"])


def test_fisher_loop_with_sparse_embedding_rows_equals_the_dense_gradients():
    model = tiny_model("bert", seed=3)
    batch = text_batch(size=4)
    batch["input_ids"][0, 1:3] = batch["input_ids"][0, 4]     # a token repeated inside one example
    result = fisher.diagonal_fisher(model, [batch], vectorize=False)
    assert not any(m.sparse for m in model.modules() if isinstance(m, torch.nn.Embedding))   # restored
    params = dict(model.named_parameters())
    manual = {n: torch.zeros_like(p) for n, p in params.items()}
    for i in range(4):
        length = int(batch["attention_mask"][i].nonzero().max()) + 1
        one = {k: v[i:i + 1, :length] if v.dim() == 2 else v[i:i + 1] for k, v in batch.items()}
        loss = model(**one).loss
        for name, g in zip(params, torch.autograd.grad(loss, list(params.values()))):   # dense gradients
            manual[name] += g.pow(2) / 4
    word = "bert.embeddings.word_embeddings.weight"
    assert (manual[word].abs().sum(dim=1) > 0).sum() < manual[word].shape[0]           # most rows untouched
    assert all(torch.allclose(result[n], manual[n], atol=1e-7, rtol=1e-5) for n in manual)
