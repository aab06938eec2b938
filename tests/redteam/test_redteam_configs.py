"""Red team, class 4 of issue 36: two models whose configs differ beyond their weights (activation, norm epsilon,
RoPE base or scaling, position-embedding kind, attention variant, tie, ...). families.FUNCTION_FIELDS decides per
field and use (matching, merging) to refuse (one error line naming the field) or to proceed (one note line, and a
result that computes the source's function).

The class test enumerates the fields from the family registry and fails for one without a rule: every field of
every supported model type's transformers config class (its signature, its to_dict(), its aliases) must be a
shape field (SHAPE_FIELDS, a family's config_fields: must agree), a FUNCTION_FIELDS entry, or NEUTRAL_FIELDS
(dropout, bookkeeping: nothing the weights compute). Then every FUNCTION_FIELDS entry is tried on every model
type whose config has it.
"""
from __future__ import annotations

import copy
import inspect

import pytest
import torch
import transformers as tf

import symfusion
from symfusion import errors
from symfusion.pipeline import cli
from symfusion.errors import SymfusionError
from symfusion.families import (FAMILIES, FUNCTION_FIELDS, MODEL_TYPES, NEUTRAL_FIELDS, SHAPE_FIELDS,
                                check_compatible)
from symfusion.measures import model_outputs, probe_inputs
from hostile import assert_refused, outcome, snapshot
from tiny_decoders import decoder_config
from tiny_models import randomize, tiny_config


def build(model_type: str, seed: int, **changes) -> torch.nn.Module:
    """A tiny random model of a model type with config fields changed."""
    if model_type in ("bert", "roberta", "deberta-v2", "vit"):
        config = tiny_config(model_type)
        config.num_labels = 3
        for key, value in changes.items():
            setattr(config, key, value)
        torch.manual_seed(seed)
        model = tf.ViTForImageClassification(config) if model_type == "vit" else \
            tf.AutoModelForSequenceClassification.from_config(config)
        return randomize(model, seed)
    config = decoder_config(model_type)
    for key, value in changes.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    return randomize(tf.AutoModelForCausalLM.from_config(config), seed, scale=0.3)


def fields_of(model_type: str) -> set[str]:
    cls = tf.CONFIG_MAPPING[model_type]
    names = {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")}
    return names | set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))


def test_every_config_field_has_a_rule():
    """A new transformers field, or a new family, fails here until FUNCTION_FIELDS or NEUTRAL_FIELDS has it."""
    unclassified = {}
    for model_type, family in MODEL_TYPES.items():
        known = set(SHAPE_FIELDS) | set(FAMILIES[family].config_fields) | set(FUNCTION_FIELDS) | NEUTRAL_FIELDS
        missing = sorted(fields_of(model_type) - known)
        if missing:
            unclassified[model_type] = missing
    assert unclassified == {}
    assert all(r.match in ("refuse", "proceed") and r.merge in ("refuse", "proceed") and r.why
               for r in FUNCTION_FIELDS.values())
    shapes = set(SHAPE_FIELDS).union(*(spec.config_fields for spec in FAMILIES.values()))
    assert not set(FUNCTION_FIELDS) & (shapes | NEUTRAL_FIELDS)


def other_value(value, field: str):
    """A different valid value for a config field."""
    if field in ("hidden_act", "activation_function", "pooler_act", "pooler_hidden_act"):
        return "relu" if value != "relu" else "gelu"
    if isinstance(value, bool):
        return not value
    if field == "rope_parameters":
        return {**value, "rope_theta": 2 * value["rope_theta"]}
    if field == "layer_types":
        return list(reversed(["sliding_attention"] + value[1:]))
    if isinstance(value, float):
        return value * 10
    if isinstance(value, int):
        return value + 1
    if value is None:
        return 16
    raise AssertionError(f"no other value for {field}={value!r}")


CASES = sorted((field, t) for field in FUNCTION_FIELDS for t in MODEL_TYPES if field in fields_of(t))


def test_every_rule_is_tried():
    # position_embedding_type and DeBERTa's norm_rel_ebd: read with getattr by older models, in no config class
    assert {field for field, _ in CASES} == set(FUNCTION_FIELDS) - {"position_embedding_type", "norm_rel_ebd"}


@pytest.mark.parametrize("field,model_type", CASES, ids=[f"{f}-{t}" for f, t in CASES])
def test_a_difference_beyond_the_weights_is_refused_or_said(field, model_type):
    anchor = build(model_type, 0)
    value = other_value(getattr(anchor.config, field), field)
    both = {"use_sliding_window": {"sliding_window": 16}, "layer_types": {"sliding_window": 16},
            "add_cross_attention": {"is_decoder": True}}.get(field, {})      # what the field needs to mean anything
    anchor = build(model_type, 0, **both)
    source = build(model_type, 1, **both, **{field: value})
    if getattr(source.config, field) == getattr(anchor.config, field):
        pytest.skip(f"{model_type}'s config class normalises {field}={value!r} back")
    rule = FUNCTION_FIELDS[field]
    bits = copy.deepcopy(source.state_dict())
    matching = "git_rebasin" if FAMILIES[MODEL_TYPES[model_type]].qk_norm else "rotation"   # Qwen3: no Q/K rotation
    results = []                        # what the one align() call returned (no second call to get it)
    code, text = outcome(lambda: results.append(symfusion.align(source, anchor, matching=matching)))
    if rule.match == "refuse":
        assert code == "error" and field in text and "not matched" in text and "\n" not in text.strip(), text
    else:
        assert code == "ok", text[-1500:]
        matched, report = results[0]
        assert any(field in line and "proceeding" in line for line in report["notes"])
        inputs = probe_inputs(source.config)
        before, after = model_outputs(source, inputs), model_outputs(matched, inputs)
        assert (after - before).abs().max() <= 1e-3 * before.abs().max()           # the source's function
    assert all(torch.equal(bits[k], v) for k, v in source.state_dict().items())
    if rule.merge == "refuse":
        with pytest.raises(SymfusionError, match=f"differ in {field} .*not merged"):
            check_compatible(source.config, anchor.config, use="merge")
    else:
        assert any(field in n for n in check_compatible(source.config, anchor.config, use="merge"))


@pytest.fixture(scope="module")
def vits(tmp_path_factory):
    root = tmp_path_factory.mktemp("vits")
    for name, changes in (("a", {}), ("eps", {"layer_norm_eps": 1e-3}), ("act", {"hidden_act": "relu"})):
        model = build("vit", 1 if name != "a" else 0, image_size=8, patch_size=4, num_channels=1, num_labels=10,
                      **changes)
        model.save_pretrained(str(root / name))
    return root


@pytest.mark.parametrize("command", ["symfusion-match", "symfusion-merge", "symfusion-barrier"])
def test_the_commands_refuse_in_one_line_or_note_after_their_result(vits, tmp_path, command, capsys):
    """Through the real entry points: a refused difference is the one line on stderr, nothing written; one they
    proceed with is one note line, printed once the result is written."""
    def run(source, out):
        args = {"symfusion-match": ["matching=rotation", f"source={source}", f"anchor={vits / 'a'}", f"output={out}"],
                "symfusion-merge": ["task=digits", "fusion=simple", f"models=[{vits / 'a'},{source}]", f"output={out}"],
                "symfusion-barrier": ["task=digits", f"anchor={vits / 'a'}", f"source={source}", "points=2",
                                      "examples=8", f"output={out}.json"]}[command]
        return outcome(lambda: getattr(cli, command.replace("symfusion-", "") + "_main")(args))
    before = snapshot(tmp_path)
    code, text = run(vits / "act", tmp_path / "refused")
    assert "hidden_act" in assert_refused(code, text, tmp_path, before, tmp_path / "refused", command)
    code, text = run(vits / "eps", tmp_path / "noted")
    notes = [line for line in text.strip().splitlines() if line.startswith("note:")]
    assert code == 0 and len(notes) == 1 and "layer_norm_eps" in notes[0] and "proceeding" in notes[0], text
    assert errors.NOTES == []
