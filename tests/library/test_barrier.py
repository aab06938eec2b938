"""Loss-barrier arithmetic on closed-form cases, and the path on a tiny model."""
import pytest
import torch

from symfusion.interpolation import alpha_grid, barrier_height, barrier_range, interpolate, loss_path
from tiny_models import tiny_model


def test_barrier_of_a_straight_line_is_zero_and_of_a_bump_is_its_height():
    alphas = alpha_grid(5)
    assert alphas == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert barrier_height(alphas, [1.0, 1.25, 1.5, 1.75, 2.0]) == pytest.approx(0.0)
    assert barrier_height(alphas, [1.0, 2.0, 3.5, 2.0, 2.0]) == pytest.approx(2.0)
    assert barrier_height(alphas, [1.0, 0.5, 0.5, 0.5, 1.0]) == pytest.approx(0.0)   # convex path: 0 at ends


def test_the_papers_barrier_is_the_range_of_the_loss_along_the_path():
    assert barrier_range([1.0, 1.25, 1.5, 1.75, 2.0]) == pytest.approx(1.0)      # a straight line has a range
    assert barrier_range([1.0, 2.0, 3.5, 2.0, 2.0]) == pytest.approx(2.5)
    assert barrier_range([1.0, 0.5, 0.5, 0.5, 1.0]) == pytest.approx(0.5)        # a valley counts too


def test_interpolate_endpoints_and_midpoint():
    a, b = {"w": torch.ones(3), "n": torch.tensor(4)}, {"w": torch.zeros(3), "n": torch.tensor(7)}
    assert torch.equal(interpolate(a, b, 1.0)["w"], a["w"])
    assert torch.equal(interpolate(a, b, 0.0)["w"], b["w"])
    assert torch.allclose(interpolate(a, b, 0.25)["w"], torch.full((3,), 0.25))
    assert interpolate(a, b, 0.5)["n"].item() == 4


def test_path_ends_are_the_end_models():
    model_a, model_b = tiny_model("vit", seed=1), tiny_model("vit", seed=2)
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(0))

    def evaluate(model):
        return {"loss": model(pixel_values=x).logits.pow(2).mean().item()}

    expected_a, expected_b = evaluate(model_a)["loss"], evaluate(model_b)["loss"]
    result = loss_path(tiny_model("vit", seed=3), model_a.state_dict(), model_b.state_dict(), evaluate, points=3)
    assert result["path"][0]["loss"] == pytest.approx(expected_b)
    assert result["path"][-1]["loss"] == pytest.approx(expected_a)
    mid = result["path"][1]["loss"]
    assert result["barrier_linear"] == pytest.approx(max(0.0, mid - (expected_a + expected_b) / 2))
    losses = [expected_b, mid, expected_a]
    assert result["barrier"] == pytest.approx(max(losses) - min(losses))     # the paper's: the range
