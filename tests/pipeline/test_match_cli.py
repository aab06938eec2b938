"""The match stage end to end: outputs, JSON fields, atomic writes and one-line errors."""
import json
import subprocess
import sys

import pytest
import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.families import check_compatible
from symfusion.errors import SymfusionError
from symfusion.pipeline.stages.match import run_match
from symfusion.matching import matching_config
from symfusion.measures import model_outputs, probe_inputs
from symfusion.io.modelio import load_model
from symfusion.symmetry import Transform, apply_transform
from tiny_models import VARIANT_IDS, VARIANTS, randomize, tiny_model

REQUIRED_FIELDS = {"matching", "distance_before", "distance_after", "relative_output_change", "seconds", "provenance",
                   "layers"}


def save(model, path):
    model.save_pretrained(str(path), safe_serialization=True)
    return str(path)


def run(source, anchor, output, name="rotation", **kwargs):
    return run_match(source, anchor, str(output), matching_config(name), name, **kwargs)


@pytest.mark.parametrize("family,overrides", VARIANTS, ids=VARIANT_IDS)
def test_matched_folder_computes_the_source_function(tmp_path, family, overrides):
    source = save(tiny_model(family, seed=1, **overrides), tmp_path / "source")
    anchor = save(tiny_model(family, seed=2, **overrides), tmp_path / "anchor")
    report = run(source, anchor, tmp_path / "out")
    assert REQUIRED_FIELDS <= set(report)
    assert report["distance_after"] < report["distance_before"]
    assert report["relative_output_change"] < 1e-4
    on_disk = json.loads((tmp_path / "out" / "match.json").read_text())
    assert on_disk["distance_after"] == pytest.approx(report["distance_after"])
    original, matched = load_model(source), load_model(tmp_path / "out")
    inputs = probe_inputs(original.config, seed=9)
    assert (model_outputs(original, inputs) - model_outputs(matched, inputs)).abs().max() < 1e-4
    # the saved transform reproduces the saved model
    layout = layout_of(original.config, original.state_dict())
    transform = Transform.load(tmp_path / "out" / "transform.safetensors")
    redone = apply_transform(original.state_dict(), layout, transform)
    for key, value in matched.state_dict().items():
        assert torch.allclose(redone[key], value, atol=1e-6)


def test_layer_subset_is_recorded(tmp_path):
    source = save(tiny_model("bert", seed=1, num_hidden_layers=3), tmp_path / "s")
    anchor = save(tiny_model("bert", seed=2, num_hidden_layers=3), tmp_path / "a")
    assert run(source, anchor, tmp_path / "o", last_layers=2)["layers"] == [1, 2]
    assert run(source, anchor, tmp_path / "o", layers=[0])["layers"] == [0]


@pytest.mark.parametrize("field,value", [
    ("hidden_size", 48), ("num_attention_heads", 8), ("num_hidden_layers", 3), ("intermediate_size", 40),
])
def test_mismatched_architectures_are_refused(tmp_path, field, value):
    source = save(tiny_model("bert", seed=1), tmp_path / "s")
    anchor = save(tiny_model("bert", seed=2, **{field: value}), tmp_path / "a")
    with pytest.raises(SymfusionError, match=field):
        run(source, anchor, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_unsupported_family_is_refused(tmp_path):
    config = tf.OPTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37, vocab_size=50,
                          word_embed_proj_dim=32)
    opt = save(tf.OPTModel(config), tmp_path / "g")
    with pytest.raises(SymfusionError, match="unsupported model_type 'opt'.*bert, roberta, deberta-v2, vit, llama"):
        run(opt, opt, tmp_path / "o")
    with pytest.raises(SymfusionError, match="deberta"):
        check_compatible(tf.DebertaConfig(), tf.DebertaConfig())   # DeBERTa v1 has a fused in_proj


def test_qk_norm_model_is_refused_for_rotation_with_one_line_naming_the_module(tmp_path):
    """Qwen3's per-head q_norm breaks the rotation symmetry: refused, and git_rebasin (exact) is offered."""
    config = tf.Qwen3Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, intermediate_size=37)
    qwen = save(randomize(tf.Qwen3ForCausalLM(config), 1), tmp_path / "q")
    other = save(randomize(tf.Qwen3ForCausalLM(config), 2), tmp_path / "q2")
    with pytest.raises(SymfusionError, match=r"^rotation matching is not exact.*self_attn\.q_norm.*git_rebasin") as error:
        run(qwen, other, tmp_path / "o")
    assert "\n" not in str(error.value) and not (tmp_path / "o").exists()
    report = run(qwen, other, tmp_path / "o", name="git_rebasin")
    assert report["family"] == "qwen3" and report["relative_output_change"] < 1e-4


@pytest.mark.parametrize("model_cls,config", [
    (tf.LlamaForCausalLM, tf.LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=37)),
    (tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4)),
])
def test_match_stage_takes_decoders(tmp_path, model_cls, config):
    source = save(randomize(model_cls(config), 1), tmp_path / "s")
    anchor = save(randomize(model_cls(config), 2), tmp_path / "a")
    report = run(source, anchor, tmp_path / "o")
    assert report["distance_after"] < report["distance_before"] and report["relative_output_change"] < 1e-4


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(tmp_path, bad):
    model = tiny_model("roberta", seed=1)
    with torch.no_grad():
        model.roberta.encoder.layer[1].attention.self.value.weight[0, 0] = bad
    source = save(model, tmp_path / "s")
    anchor = save(tiny_model("roberta", seed=2), tmp_path / "a")
    with pytest.raises(SymfusionError, match="non-finite.*layer.1.attention.self.value.weight"):
        run(source, anchor, tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_missing_folders_and_unknown_matching(tmp_path):
    anchor = save(tiny_model("vit", seed=2), tmp_path / "a")
    with pytest.raises(SymfusionError, match="no such directory"):
        run(str(tmp_path / "missing"), anchor, tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SymfusionError, match="not a model folder"):
        run(str(tmp_path / "empty"), anchor, tmp_path / "o")
    with pytest.raises(SymfusionError, match="unknown matching 'procrustes'; choose one of attn_only, attn_only_no_rescale"):
        matching_config("procrustes")


def test_interrupted_write_leaves_no_output(tmp_path, monkeypatch):
    source = save(tiny_model("bert", seed=1), tmp_path / "s")
    anchor = save(tiny_model("bert", seed=2), tmp_path / "a")
    run(source, anchor, tmp_path / "o", name="none")
    before = (tmp_path / "o" / "match.json").read_text()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(Transform, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        run(source, anchor, tmp_path / "o", name="rotation")
    assert (tmp_path / "o" / "match.json").read_text() == before        # old output intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "o", "s"]  # no temp folder left


@pytest.mark.slow
def test_console_script(tmp_path):
    source = save(tiny_model("deberta-v2", seed=1), tmp_path / "s")
    anchor = save(tiny_model("deberta-v2", seed=2), tmp_path / "a")
    cli = [sys.executable, "-m", "symfusion.pipeline.cli"]
    ok = subprocess.run(cli + [f"source={source}", f"anchor={anchor}", f"output={tmp_path / 'o'}",
                               "matching=git_rebasin", "layers=[1]"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    report = json.loads((tmp_path / "o" / "match.json").read_text())
    assert report["matching"] == "git_rebasin" and report["layers"] == [1]
    assert report["provenance"]["config"]["matching"]["ffn"] == "permutation"
    bad = subprocess.run(cli + [f"source={source}", f"anchor={tmp_path / 'nope'}", f"output={tmp_path / 'o2'}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: anchor={tmp_path / 'nope'}: no such directory"]
    assert not (tmp_path / "o2").exists()
