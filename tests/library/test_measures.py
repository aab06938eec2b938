"""measures.max_output_change and measures.model_outputs on known outputs: the largest deviation whatever its sign,
and padded positions left out (issue 59: a signed maximum, or padded positions kept, passed every other test); the
folders' measure (alignment.checks.whole_model_change) likewise."""
from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from symfusion.alignment.checks import whole_model_change
from symfusion.measures import max_output_change, model_outputs, probe_inputs
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model


class Shifted(torch.nn.Module):
    """`inner`'s logits plus `padded` at every padded position and plus `delta` at (row, position, label)."""

    def __init__(self, inner: torch.nn.Module, padded: float = 0.0, delta: float = 0.0, at=(0, 0, 0)):
        super().__init__()
        self.inner, self.padded, self.delta, self.at = inner, padded, delta, at

    def forward(self, **inputs):
        logits = self.inner(**inputs).logits.clone()
        logits[inputs["attention_mask"] == 0] += self.padded
        logits[self.at] += self.delta
        return SimpleNamespace(logits=logits)


def test_max_output_change_is_the_largest_absolute_deviation_whatever_its_sign():
    """f_a - f_b = (+0.5, -2, 0) on every input: the change is 2 in both orders (a signed maximum says 0.5 in one)."""
    a = tiny_model("bert", seed=0)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.classifier.bias += torch.tensor([-0.5, 2.0, 0.0])
    inputs = probe_inputs(a.config)
    assert max_output_change(a, b, inputs) == pytest.approx(2.0, abs=1e-5)
    assert max_output_change(b, a, inputs) == pytest.approx(2.0, abs=1e-5)
    assert max_output_change(a, a, inputs) == 0.0


def test_whole_model_change_of_folders_is_the_largest_absolute_deviation_relative(tmp_path):
    """The matched folder's logits moved by (+0.5, -2, 0): 2 / max |f_source| (a signed maximum says 0.5 / ...)."""
    source = tiny_model("bert", seed=0)
    matched = copy.deepcopy(source)
    with torch.no_grad():
        matched.classifier.bias += torch.tensor([0.5, -2.0, 0.0])
    source.save_pretrained(str(tmp_path / "source"))
    matched.save_pretrained(str(tmp_path / "matched"))
    scale = model_outputs(source, probe_inputs(source.config)).abs().max().item()
    assert whole_model_change(tmp_path / "source", tmp_path / "matched") == pytest.approx(2.0 / scale, rel=1e-5)
    assert whole_model_change(tmp_path / "source", tmp_path / "source") == 0.0


def test_max_output_change_leaves_padded_positions_out():
    """A change of 100 at every padded position counts for nothing; one of -3 at a real position counts as 3."""
    model = tiny_decoder("llama", seed=0)
    inputs = probe_inputs(model.config)
    assert (inputs["attention_mask"] == 0).any()
    assert max_output_change(model, Shifted(model, padded=100.0), inputs) == 0.0
    assert max_output_change(model, Shifted(model, padded=100.0, delta=-3.0), inputs) == pytest.approx(3.0, abs=1e-5)


@pytest.mark.parametrize("build", [lambda: tiny_model("bert", seed=0, head=None), lambda: tiny_decoder("llama", seed=0)],
                         ids=["encoder hidden states", "decoder logits"])
def test_model_outputs_are_the_real_positions_only(build):
    """(real tokens, width): the full output at the unpadded positions, in order, whatever the padded tokens are."""
    model = build()
    inputs = probe_inputs(model.config)
    mask = inputs["attention_mask"].bool()
    assert not mask.all()
    others = {**inputs, "input_ids": torch.where(mask, inputs["input_ids"], (inputs["input_ids"] + 1) % 97)}
    with torch.no_grad():
        out = model(**inputs)
    full = out.logits if hasattr(out, "logits") else out.last_hidden_state
    kept = model_outputs(model, inputs)
    assert kept.shape == (int(mask.sum()), full.shape[-1])
    assert torch.equal(kept, full[mask])
    assert torch.allclose(model_outputs(model, others), kept, atol=1e-6)
    with torch.no_grad():                                      # the padded tokens did change the padded outputs
        again = model(**others)
    changed = (again.logits if hasattr(again, "logits") else again.last_hidden_state)[~mask]
    assert (changed - full[~mask]).abs().max() > 1e-3


def test_a_classifiers_logits_are_kept_whole():
    model = tiny_model("bert", seed=0)
    inputs = probe_inputs(model.config)
    with torch.no_grad():
        assert torch.equal(model_outputs(model, inputs), model(**inputs).logits)
