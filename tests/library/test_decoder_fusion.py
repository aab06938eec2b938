"""Fisher and RegMean on decoder LLMs (Llama layout: grouped-query attention, SwiGLU, tied or untied embeddings) equal
their closed forms, computed here independently of symfusion's statistic code."""
import pytest
import torch

from symfusion.fusion import merge_models
from symfusion.fusion.fisher import diagonal_fisher
from symfusion.fusion.regmean import gram_matrices
from tiny_decoders import tiny_decoder


def decoders(tied: bool):
    return [tiny_decoder("llama", seed=seed, num_key_value_heads=2, tie_word_embeddings=tied) for seed in (0, 1)]


def lm_batches(seed: int, count: int = 2, size: int = 4, length: int = 12) -> list[dict]:
    """Causal-LM statistic batches as the causal_lm task makes them: labels = inputs (the model shifts them)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        ids = torch.randint(0, 97, (size, length), generator=gen)
        batches.append({"input_ids": ids, "labels": ids.clone()})
    return batches


def fisher_by_loop(model, batches) -> dict:
    """Mean over examples of the squared gradient of each example's loss, one backward pass per example."""
    named = dict(model.named_parameters())
    sums, count = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in named.items()}, 0
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            model.zero_grad()
            model(input_ids=batch["input_ids"][i:i + 1], labels=batch["labels"][i:i + 1]).loss.backward()
            for n, p in named.items():
                sums[n] += p.grad.double() ** 2
            count += 1
    model.zero_grad()
    return {n: s / count for n, s in sums.items()}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_fisher_merge_of_decoders_is_the_fisher_weighted_average(tied):
    models = decoders(tied)
    batches = [lm_batches(0), lm_batches(1)]                  # each model's own data, as pairwise merges do
    expected_fishers = [fisher_by_loop(m, b) for m, b in zip(models, batches)]
    for model, own, expected in zip(models, batches, expected_fishers):
        for vectorize in (True, False):                      # vmap over examples, and the loop (sparse embeddings)
            found = diagonal_fisher(model, own, chunk_size=3, vectorize=vectorize)
            for name, value in expected.items():
                assert torch.allclose(found[name].double(), value, rtol=1e-4, atol=1e-12), (vectorize, name)
    merged = merge_models("fisher", models, batches)
    epsilon = 1e-8                                            # the method's default outside ViTs, normalize none
    states = [m.state_dict() for m in models]
    names = {n for n, _ in models[0].named_parameters(remove_duplicate=False)}
    for key in names:
        owner = key if key in expected_fishers[0] else "model.embed_tokens.weight"    # the tied LM head's Fisher
        weights = [f[owner] + epsilon for f in expected_fishers]
        expected = sum(w * s[key].double() for w, s in zip(weights, states)) / sum(weights)
        assert torch.allclose(merged[key].double(), expected, rtol=1e-4, atol=1e-6), key
    if tied:        # one tensor, one value: the LM head and the embeddings it shares agree in the merged state
        assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])


def inputs_by_hook(model, batches) -> dict:
    """Every nn.Linear's input rows, captured by forward hooks, by module name."""
    rows, handles = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_hook(
                lambda m, args, out, name=name: rows.setdefault(name, []).append(args[0].reshape(-1, args[0].shape[-1]))))
    with torch.no_grad():
        for batch in batches:
            model(input_ids=batch["input_ids"])
    for handle in handles:
        handle.remove()
    return {name: torch.cat(parts).double() for name, parts in rows.items()}


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_regmean_merge_of_decoders_solves_each_linear_in_closed_form(tied):
    models, alpha = decoders(tied), 0.5
    batches = [lm_batches(2), lm_batches(3)]
    merged = merge_models("regmean", models, batches, alpha=alpha)
    states = [m.state_dict() for m in models]
    grams = []
    for model, own in zip(models, batches):
        grams.append({name: x.T @ x / len(x) for name, x in inputs_by_hook(model, own).items()})   # (in, in)
    found = gram_matrices(models[0], batches[0])
    assert set(found) == set(grams[0]) - ({"lm_head"} if tied else set())
    solved = 0
    for name in grams[0]:
        key = f"{name}.weight"
        if tied and name == "lm_head":   # shared with the embedding lookup: averaged with it, never solved alone
            average = (states[0][key].double() + states[1][key].double()) / 2
            assert torch.allclose(merged[key].double(), average, atol=1e-6)
            continue
        assert torch.allclose(found[name], grams[0][name], rtol=1e-6, atol=1e-9), name
        scaled = [alpha * g[name] + (1 - alpha) * torch.diag(g[name].diagonal()) for g in grams]
        expected = torch.linalg.solve(sum(scaled), sum(g @ s[key].double().T for g, s in zip(scaled, states))).T
        assert torch.allclose(merged[key].double(), expected, rtol=1e-5, atol=1e-6), name
        solved += 1
    assert solved == 7 * 2 + (0 if tied else 1)              # q, k, v, o, gate, up, down per layer (+ an untied head)
    norm = "model.layers.0.input_layernorm.weight"           # what is no linear map is averaged
    assert torch.allclose(merged[norm], (states[0][norm] + states[1][norm]) / 2)
    if tied:
        assert torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
        assert not torch.allclose(merged["model.layers.0.mlp.up_proj.weight"],
                                  (states[0]["model.layers.0.mlp.up_proj.weight"]
                                   + states[1]["model.layers.0.mlp.up_proj.weight"]) / 2)


def test_simple_merge_of_tied_decoders_keeps_the_tie():
    models = decoders(True)
    merged = merge_models("simple", models)
    model = tiny_decoder("llama", seed=5, num_key_value_heads=2, tie_word_embeddings=True)
    model.load_state_dict(merged)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    expected = (models[0].lm_head.weight + models[1].lm_head.weight) / 2
    assert torch.equal(model.lm_head.weight, expected)
