"""Statistic batches: shared by all models, or one list per model (each model's statistics on its own data)."""
import pytest
import torch

import symfusion.fusion.fisher as fisher
import symfusion.fusion.regmean as regmean
from symfusion.errors import SymfusionError
from symfusion.fusion import FUSION_METHODS, merge_models
from symfusion.fusion.common import batches_of
from tiny_models import tiny_model


def pixel_batches(seed):
    gen = torch.Generator().manual_seed(seed)
    return [{"pixel_values": torch.randn(4, 3, 8, 8, generator=gen), "labels": torch.randint(0, 3, (4,), generator=gen)}]


def test_batches_of_shared_and_per_model():
    shared, own = pixel_batches(0), [pixel_batches(1), pixel_batches(2)]
    assert batches_of(shared, 1) is shared
    assert batches_of(own, 0) == own[0] and batches_of(own, 1) == own[1]


@pytest.mark.parametrize("module,statistic", [(fisher, "diagonal_fisher"), (regmean, "gram_matrices")])
def test_each_model_gets_its_own_batches(monkeypatch, module, statistic):
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    own = [pixel_batches(3), pixel_batches(4)]
    seen, real = [], getattr(module, statistic)

    def record(model, batches, **kwargs):
        seen.append((model, batches))
        return real(model, batches, **kwargs)

    monkeypatch.setattr(module, statistic, record)
    per_model = merge_models(module.__name__.rsplit(".", 1)[1], models, own)
    assert [m for m, _ in seen] == models and [b for _, b in seen] == own
    shared = merge_models(module.__name__.rsplit(".", 1)[1], models, own[0])
    assert any(not torch.allclose(per_model[k], shared[k]) for k in per_model)


@pytest.mark.parametrize("name", ["fisher", "regmean"])
def test_precomputed_statistics_give_the_same_merge_bit_for_bit(name):
    """F_i / G_i computed once (model_statistic) and given to the merge: the merge computed in one go."""
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    own = [pixel_batches(3), pixel_batches(4)]
    method = FUSION_METHODS[name]
    both = [method.model_statistic(m, b) for m, b in zip(models, own)]
    reference = merge_models(name, models, own)
    for statistics, batches in (([both[0], None], own), (both, own), (both, None)):
        merged = merge_models(name, models, batches, statistics=statistics)
        assert merged.keys() == reference.keys()
        assert all(torch.equal(merged[k], reference[k]) for k in reference)
    swapped = merge_models(name, models, None, statistics=[both[1], both[0]])   # each other's statistics
    assert any(not torch.allclose(swapped[k], reference[k]) for k in reference)


def test_statistics_are_refused_by_a_method_without_one_and_must_match_the_models():
    models = [tiny_model("vit", seed=s) for s in (1, 2)]
    with pytest.raises(SymfusionError, match="takes no precomputed statistics"):
        merge_models("simple", models, None, statistics=[None, None])
    with pytest.raises(SymfusionError, match="3 statistics for 2 models"):
        merge_models("fisher", models, pixel_batches(0), statistics=[None, None, None])
    with pytest.raises(SymfusionError, match="needs data batches"):
        merge_models("regmean", models, None, statistics=[None, None])
