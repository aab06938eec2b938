"""Red team, class 6 of issue 36: the Python API's contract. symfusion.align() given an argument of the wrong type
ends in one SymfusionError line naming that argument, with nothing written; the caller's modules come back exactly
as they went in (every submodule's mode, every parameter's requires_grad, every tensor's bits, dtype and device),
whether align() succeeds or refuses.

The class test enumerates align()'s arguments from its signature and the matching variants from the presets (src/symfusion/presets/matching/),
and fails for an argument without a wrong-type case.
"""
from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import symfusion
from symfusion.errors import SymfusionError
from symfusion.matching import matching_config
from symfusion.presets import preset_names
from hostile import snapshot
from tiny_decoders import tiny_decoder

# argument -> values of a wrong type or out of its range (the other arguments good: two modules, or two folders)
WRONG = {
    "source": [3, None, b"folder", ["a", "b"]],
    "anchor": [3, None, {"weights": 1}],
    "matching": [3, None, {"attention": "rotation"}, ["rotation"]],
    "output": [3, ["out"], b"out"],
    "layers": ["0", 3, [True], [-1], [0.5], {"0": 0}],
    "last_layers": [-1, "2", 1.5, True],
    "max_relative_output_change": ["1e-3", float("nan"), float("inf"), 0, -1.0, True, None],
    "data": ["batches", [1], {"input_ids": 1}, [{"input_ids": torch.ones(1, 4, dtype=torch.long)}]],  # the last:
    # good batches given to the default matching, which reads the weights only (refused, not silently unread)
    "in_memory": ["yes", 1, [True]],
    "record": ["provenance", ["a"], {1: "x"}],
    "progress": ["yes", 1, [True]],
}
FOLDERS = ("output", "in_memory", "record")   # wrong values tried with two folders (the others with modules)


def test_every_argument_has_a_wrong_type_case():
    assert list(WRONG) == list(inspect.signature(symfusion.align).parameters)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    source, anchor = tiny_decoder("llama", seed=1), tiny_decoder("llama", seed=0)
    source.save_pretrained(str(root / "source"))
    anchor.save_pretrained(str(root / "anchor"))
    return root, source, anchor


CASES = [(name, value) for name, values in WRONG.items() for value in values]


@pytest.mark.parametrize("name,value", CASES, ids=[f"{n}={v!r}" for n, v in CASES])
def test_a_wrong_argument_is_one_line_naming_it(pair, tmp_path, monkeypatch, name, value):
    root, source, anchor = pair
    monkeypatch.chdir(tmp_path)                     # an output taken as a relative name would appear here
    given = {"source": source, "anchor": anchor} if name not in FOLDERS else \
        {"source": str(root / "source"), "anchor": str(root / "anchor"), "output": tmp_path / "out"}
    given[name] = value
    before = snapshot(tmp_path)
    with pytest.raises(SymfusionError) as error:
        symfusion.align(**given)
    assert name in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert snapshot(tmp_path) == before


def layers_given_once(source, anchor):
    """A generator of layer indices is read once (it used to be checked, then found empty)."""
    _, report = symfusion.align(source, anchor, layers=(i for i in [1]))
    assert report["layers"] == [1]


def as_given(module: torch.nn.Module) -> dict:
    """Everything about a module that align() must leave as it was."""
    return {"modes": [(n, m.training) for n, m in module.named_modules()],
            "grads": [(n, p.requires_grad) for n, p in module.named_parameters()],
            "tensors": {k: (v.dtype, v.device, v.detach().clone()) for k, v in module.state_dict().items()}}


def same(a: dict, b: dict) -> bool:
    return a["modes"] == b["modes"] and a["grads"] == b["grads"] and a["tensors"].keys() == b["tensors"].keys() \
        and all(x[:2] == y[:2] and torch.equal(x[2], y[2]) for x, y in zip(a["tensors"].values(), b["tensors"].values()))


def careless(module: torch.nn.Module) -> torch.nn.Module:
    """The modes a caller may leave a module in: training, one layer in eval, an embedding frozen."""
    module.train()
    module.model.layers[0].eval()
    module.get_input_embeddings().weight.requires_grad_(False)
    return module


def data_of(model) -> list[dict]:
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}]


@pytest.mark.parametrize("matching", preset_names("matching") + ["refused", "bfloat16"])
def test_the_callers_modules_come_back_as_they_went_in(matching):
    """Every matching variant (and a refusal, and bfloat16 modules): the caller's modules as they were."""
    dtype = torch.bfloat16 if matching == "bfloat16" else torch.float32
    source = careless(tiny_decoder("llama", seed=1, num_key_value_heads=2, dtype=dtype))
    anchor = careless(tiny_decoder("llama", seed=0, num_key_value_heads=2, dtype=dtype))
    before = as_given(source), as_given(anchor)
    if matching == "refused":                       # refused inside the match, after the modules were used
        with pytest.raises(SymfusionError, match="outside"):
            symfusion.align(source, anchor, layers=[99])
    elif matching == "bfloat16":
        symfusion.align(source, anchor)
    else:
        config = matching_config(matching)
        if config.refine != "none":     # 40 refinement steps (the synthetic's 600 write as many batches of text): what
            config = dataclasses.replace(config, refine_steps=40)   # is checked is the caller's modules, at any count
        matched, report = symfusion.align(source, anchor, matching=config,
                                          data=data_of(source) if config.needs_data else None)
        assert report["relative_output_change"] <= report["tolerance"]
        assert not any(a is b for a, b in zip(matched.parameters(), source.parameters()))
    assert same(as_given(source), before[0]) and same(as_given(anchor), before[1])
    if matching == "rotation":
        layers_given_once(source, anchor)
