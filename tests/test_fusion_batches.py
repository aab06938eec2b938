"""Statistic batches: shared by all models, or one list per model (each model's statistics on its own data)."""
import pytest
import torch

import symfusion.fusion.fisher as fisher
import symfusion.fusion.regmean as regmean
from symfusion.fusion import merge_models
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
