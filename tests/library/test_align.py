"""symfusion.align() on modules and on sharded folders: function kept, shard layout kept, transform undone."""
import json

import pytest
import torch
import transformers as tf
from safetensors.torch import load_file

import symfusion
from symfusion.arch import layout_of
from symfusion.errors import SymfusionError
from symfusion.matching import match_models
from symfusion.measures import distance, model_outputs, probe_inputs
from symfusion.alignment.sharded import ShardWriter, ShardedFolder, data_order, match_folders
from symfusion.symmetry import apply_transform, random_transform
from tiny_decoders import tiny_decoder


def planted_pair(family="llama", dtype=torch.float32, seed=0, **overrides):
    """(anchor model, source model = anchor moved by a random symmetry, the planted transform)."""
    anchor = tiny_decoder(family, seed=seed, dtype=dtype, **overrides)
    layout = layout_of(anchor.config, anchor.state_dict())
    planted = random_transform(layout, seed=seed + 1)
    source = type(anchor)(anchor.config).to(dtype)
    source.load_state_dict(apply_transform(anchor.state_dict(), layout, planted))
    return anchor, source.eval(), planted


def save_sharded(model, path, shard="40KB"):
    model.save_pretrained(str(path), safe_serialization=True, max_shard_size=shard)
    return path


def test_align_modules_returns_a_matched_copy():
    anchor, source, _ = planted_pair(num_key_value_heads=2)
    before = {k: v.clone() for k, v in source.state_dict().items()}
    matched, report = symfusion.align(source, anchor, matching="rotation")
    assert all(torch.equal(v, before[k]) for k, v in source.state_dict().items())      # source untouched
    assert report["distance_after"] < 1e-5 * report["distance_before"]
    assert report["relative_output_change"] < 1e-5
    inputs = probe_inputs(source.config, seed=4)
    assert torch.allclose(model_outputs(matched, inputs), model_outputs(source, inputs), rtol=0, atol=1e-4)


@pytest.mark.parametrize("family,overrides", [("llama", {"num_key_value_heads": 2}), ("gpt2", {}), ("qwen2", {})])
def test_align_sharded_folders_keeps_layout_and_function(tmp_path, family, overrides):
    anchor, source, _ = planted_pair(family, **overrides)
    a_dir, s_dir = save_sharded(anchor, tmp_path / "anchor"), save_sharded(source, tmp_path / "source")
    index = json.loads((s_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) >= 3                               # really sharded
    out, report = symfusion.align(str(s_dir), str(a_dir), matching="rotation", output=tmp_path / "out")
    assert report["distance_after"] < 1e-5 * report["distance_before"]
    assert report["max_block_relative_output_change"] < 1e-5
    assert report["relative_output_change"] < 1e-5                                   # whole-model logits check ran
    assert json.loads((out / "model.safetensors.index.json").read_text())["weight_map"] == index["weight_map"]
    for shard in set(index["weight_map"].values()):
        ours, theirs = load_file(str(out / shard)), load_file(str(s_dir / shard))
        assert list(ours) == list(theirs) and all(ours[k].dtype == theirs[k].dtype for k in ours)
        assert data_order(out / shard) == data_order(s_dir / shard)                  # same tensor order in the file
        assert (out / shard).stat().st_size == (s_dir / shard).stat().st_size
    matched = tf.AutoModelForCausalLM.from_pretrained(str(out)).eval()
    inputs = probe_inputs(source.config, seed=5)
    assert torch.allclose(model_outputs(matched, inputs), model_outputs(source, inputs), rtol=0, atol=1e-4)
    assert distance(matched.state_dict(), anchor.state_dict())["total"] < 1e-5 * report["distance_before"]
    assert {"transform.safetensors", "match.json", "config.json"} <= {p.name for p in out.iterdir()}


def test_folder_path_finds_the_in_memory_transform(tmp_path):
    """Layer by layer from shards gives the transform that match_models finds on the whole state dicts."""
    anchor = tiny_decoder("llama", seed=0, num_key_value_heads=2)
    source = tiny_decoder("llama", seed=1, num_key_value_heads=2)                      # unrelated: a real optimisation
    a_dir, s_dir = save_sharded(anchor, tmp_path / "a"), save_sharded(source, tmp_path / "s")
    layout = layout_of(source.config, source.state_dict())
    whole = match_models(source.state_dict(), anchor.state_dict(), layout, "rotation").transform
    sharded, report = match_folders(s_dir, a_dir, tmp_path / "o", "rotation")
    for i, t in whole.layers.items():
        for name in ("r_qk", "a_qk", "r_vo", "a_vo", "ffn_perm", "head_perm"):
            a, b = getattr(t, name), getattr(sharded.layers[i], name)
            assert (a is None and b is None) or torch.allclose(a.double(), b.double(), atol=1e-9)
    assert report["distance_after"] < report["distance_before"]


def test_bfloat16_folder_is_matched_in_float32_and_stored_in_bfloat16(tmp_path):
    anchor, source, _ = planted_pair(dtype=torch.bfloat16, num_key_value_heads=2)
    a_dir, s_dir = save_sharded(anchor, tmp_path / "a"), save_sharded(source, tmp_path / "s")
    out, report = symfusion.align(str(s_dir), str(a_dir), output=tmp_path / "o")
    assert report["tolerance"] == pytest.approx(4 * torch.finfo(torch.bfloat16).eps)
    assert report["max_block_relative_output_change"] <= report["tolerance"]
    assert report["distance_after"] < 0.05 * report["distance_before"]               # up to bfloat16 rounding
    assert all(t.dtype == torch.bfloat16 for t in ShardedFolder(out).read(ShardedFolder(out).weight_map).values())


def test_layer_subset_copies_other_layers_bit_for_bit(tmp_path):
    anchor, source, _ = planted_pair(num_key_value_heads=2)
    a_dir, s_dir = save_sharded(anchor, tmp_path / "a"), save_sharded(source, tmp_path / "s")
    out, report = symfusion.align(str(s_dir), str(a_dir), output=tmp_path / "o", layers=[1])
    assert report["layers"] == [1]
    src, matched = ShardedFolder(s_dir), ShardedFolder(out)
    for key in src.weight_map:
        same = torch.equal(src.read([key])[key], matched.read([key])[key])
        assert same == (".layers.1.self_attn." not in key and ".layers.1.mlp." not in key), key


def test_shard_writer_round_trip(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {"b": torch.randn(3, 5, generator=gen).to(torch.bfloat16), "a": torch.arange(7), "c": torch.randn(2, generator=gen)}
    writer = ShardWriter(tmp_path / "x.safetensors", tensors, {"format": "pt"})
    for key in ("c", "a", "b"):                                                           # any order
        writer.write(key, tensors[key])
    writer.close()
    back = load_file(str(tmp_path / "x.safetensors"))
    assert list(back) == ["b", "a", "c"] and all(torch.equal(back[k], tensors[k]) for k in tensors)
    unfinished = ShardWriter(tmp_path / "y.safetensors", tensors, None)
    unfinished.write("a", tensors["a"])
    with pytest.raises(SymfusionError, match="2 tensors were never written"):
        unfinished.close()


def test_align_errors_are_one_line(tmp_path):
    anchor, source, _ = planted_pair()
    a_dir = save_sharded(anchor, tmp_path / "a")
    cases = [
        (lambda: symfusion.align(source, str(a_dir)), "two nn.Modules or two model folders"),
        (lambda: symfusion.align(str(a_dir), str(a_dir)), "needs output=DIR"),
        (lambda: symfusion.align(str(tmp_path / "nope"), str(a_dir), output=tmp_path / "o"), "no such directory"),
        (lambda: symfusion.align(source, anchor, matching="procrustes"), "unknown matching 'procrustes'"),
    ]
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text((a_dir / "config.json").read_text())
    cases.append((lambda: symfusion.align(str(tmp_path / "empty"), str(a_dir), output=tmp_path / "o"), "has no weights"))
    for call, message in cases:
        with pytest.raises(SymfusionError, match=message) as error:
            call()
        assert "\n" not in str(error.value)
    assert not (tmp_path / "o").exists()
