"""Whole-group matching of model folders, streamed layer by layer (sharded_whole.py): it finds what matching the
whole state dicts finds, undoes a planted element, keeps the function, shards, dtypes and tie of the source."""
import json

import pytest
import torch
import transformers as tf

import symfusion
from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import match_models
from symfusion.measures import distance
from symfusion.stream import stream_layout
from symfusion.symmetry import apply_transform, random_residual, random_transform
from test_residual_symmetry import build

# (ViT folders store transformers 4's key names, which the layer-by-layer reader does not rename: not here)
CASES = [("enc", "bert", {}), ("dec", "llama", {"num_key_value_heads": 2}),
         ("dec", "llama", {"num_key_value_heads": 2, "tie_word_embeddings": True}), ("dec", "gpt2", {}),
         ("dec", "gpt2", {"tie_word_embeddings": False})]
IDS = ["bert", "llama", "llama-tied", "gpt2-tied", "gpt2-untied"]


def save(model, path, state=None, max_shard_size="20KB"):
    if state is not None:
        model.load_state_dict(state)
    model.save_pretrained(str(path), max_shard_size=max_shard_size)
    return path


@pytest.mark.parametrize("kind,family,overrides", CASES, ids=IDS)
def test_streamed_folders_find_what_whole_state_dicts_find(kind, family, overrides, tmp_path):
    anchor, source = build(kind, family, overrides, torch.float32, seed=1), build(kind, family, overrides, torch.float32, seed=2)
    whole = match_models(source.state_dict(), anchor.state_dict(), layout_of(anchor.config, anchor.state_dict()),
                         "full_symmetry")
    a, s = save(anchor, tmp_path / "a"), save(source, tmp_path / "s")
    assert len(list(s.glob("model-*.safetensors"))) > 1                       # really sharded
    out, report = symfusion.align(s, a, matching="full_symmetry", output=tmp_path / "out", in_memory=False)
    assert report["residual"]["group"] == whole.residual["group"]
    assert report["residual"]["folded_distance"] == pytest.approx(whole.residual["folded_distance"], rel=1e-4)
    assert report["residual"]["descent"] == sorted(report["residual"]["descent"], reverse=True)
    assert report["relative_output_change"] < 1e-4 and report["max_block_relative_output_change"] < 1e-4
    loaded = type(source).from_pretrained(str(out))
    if overrides.get("tie_word_embeddings", family == "gpt2"):
        assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(
        [p.name for p in s.glob("*.safetensors")] + ["transform.safetensors"])
    chosen = json.loads((out / "match.json").read_text())["residual"]["chosen"]
    assert chosen in ("paper", "descent", "paper, closer as stored") and chosen == whole.residual["chosen"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_planted_element_is_undone_from_folders(dtype, tmp_path):
    model = build("dec", "llama", {"num_key_value_heads": 2}, torch.float32)
    anchor_state = {k: v.clone() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, anchor_state)
    transform = random_transform(layout, seed=3, heads=True)
    transform.residual = random_residual(stream_layout(layout, anchor_state), "orthogonal", seed=4)
    source_state = apply_transform(anchor_state, layout, transform)
    a = save(model.to(dtype), tmp_path / "a", {k: v.to(dtype) for k, v in anchor_state.items()})
    s = save(model.to(dtype), tmp_path / "s", {k: v.to(dtype) for k, v in source_state.items()})
    out, report = symfusion.align(s, a, matching="full_symmetry", output=tmp_path / "out", in_memory=False)
    matched = type(model).from_pretrained(str(out))
    assert next(matched.parameters()).dtype == dtype
    before = distance(source_state, anchor_state)["total"]
    after = distance(matched.float().state_dict(), type(model).from_pretrained(str(a)).float().state_dict())["total"]
    assert after < (1e-5 if dtype == torch.float32 else 5e-2) * before      # bfloat16: its rounding (eps 7.8e-3) of both


def test_folder_whole_group_matching_refuses_what_it_cannot_do(tmp_path):
    anchor, source = build("enc", "bert", {}, torch.float32, seed=1), build("enc", "bert", {}, torch.float32, seed=2)
    a, s = save(anchor, tmp_path / "a"), save(source, tmp_path / "s")
    with pytest.raises(SymfusionError, match="post-LN"):
        symfusion.align(s, a, matching=symfusion.matching.MatchConfig(residual="orthogonal"), output=tmp_path / "o1")
    with pytest.raises(SymfusionError, match="every layer"):
        symfusion.align(s, a, matching="full_symmetry", output=tmp_path / "o2", layers=[0])
    with pytest.raises(SymfusionError, match="give data"):
        symfusion.align(s, a, matching="full_symmetry_learned", output=tmp_path / "o3")
    assert not any((tmp_path / n).exists() for n in ("o1", "o2", "o3"))
    assert isinstance(tf.AutoConfig.from_pretrained(str(a)), tf.BertConfig)
