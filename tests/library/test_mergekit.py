"""A real client reads symfusion's aligned folders: align two tiny Llama decoders (grouped-query attention, tied
embeddings), merge the anchor with the aligned source by mergekit's own CLI (`mergekit-yaml`, local absolute paths,
offline), load the result in transformers, and compare it with symfusion's simple merge: equal to float32 rounding,
and, from a sharded aligned folder with bfloat16 output (the README's walkthrough), equal to bfloat16 rounding.

mergekit is a test and pipeline dependency (the `merge` extra of pyproject.toml, installed by scripts/setup.sh).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors import safe_open

import symfusion
from symfusion.fusion import merge_models
from symfusion.io.modelio import load_model
from tiny_decoders import tiny_decoder

pytestmark = [pytest.mark.extra, pytest.mark.slow]   # mergekit (the merge extra), its CLI in a subprocess

MERGEKIT = Path(sys.executable).parent / "mergekit-yaml"
FLOAT32_ROUNDING = torch.finfo(torch.float32).eps      # 2^-23: one ulp relative
BFLOAT16_ROUNDING = 2.0 ** -8                           # bfloat16's unit roundoff (8 significant bits)


def merge_with_mergekit(tmp_path: Path, name: str, anchor: Path, source: Path, dtype: str) -> Path:
    """mergekit-yaml's linear merge 0.5 / 0.5 of two local folders; the output folder."""
    assert MERGEKIT.is_file(), "mergekit is not installed: pip install -e '.[merge]' (scripts/setup.sh does)"
    config = tmp_path / f"{name}.yml"
    config.write_text(json.dumps({                     # YAML is a superset of JSON
        "merge_method": "linear", "dtype": dtype,
        "models": [{"model": str(anchor.resolve()), "parameters": {"weight": 0.5}},
                   {"model": str(source.resolve()), "parameters": {"weight": 0.5}}]}))
    out = tmp_path / name
    done = subprocess.run([str(MERGEKIT), str(config), str(out), "--no-write-model-card", "--no-copy-tokenizer"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def saved_dtypes(folder: Path) -> set:
    dtypes = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            dtypes |= {handle.get_slice(key).get_dtype() for key in handle.keys()}
    return dtypes


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """An anchor and a source tiny Llama (4 query / 2 KV heads, tied embeddings, every parameter random), the source
    aligned onto the anchor by symfusion.align from folders: once whole, once from a sharded folder."""
    root = tmp_path_factory.mktemp("mergekit")
    anchor, source = (tiny_decoder("llama", seed=seed, num_key_value_heads=2, tie_word_embeddings=True) for seed in (0, 1))
    anchor.save_pretrained(str(root / "anchor"))
    source.save_pretrained(str(root / "source"))
    source.save_pretrained(str(root / "source_sharded"), max_shard_size="60KB")
    aligned = {}
    for name in ("source", "source_sharded"):
        output, report = symfusion.align(str(root / name), str(root / "anchor"), matching="rotation",
                                         output=str(root / f"{name}_aligned"))
        assert report["distance_after"] < report["distance_before"]
        aligned[name] = Path(output)
    assert len(list(aligned["source_sharded"].glob("model-*.safetensors"))) > 2
    return root / "anchor", aligned


def test_mergekit_linear_merge_of_an_aligned_folder_is_symfusions_simple_merge(folders, tmp_path):
    anchor, aligned = folders
    out = merge_with_mergekit(tmp_path, "merged", anchor, aligned["source"], "float32")
    merged = tf.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    assert type(merged).__name__ == "LlamaForCausalLM" and merged.config.num_key_value_heads == 2
    assert merged.lm_head.weight is merged.model.embed_tokens.weight and saved_dtypes(out) == {"F32"}
    models = [load_model(anchor), load_model(aligned["source"])]
    expected = merge_models("simple", models)
    state = merged.state_dict()
    assert set(state) == set(expected)
    worst = 0.0
    for key, value in expected.items():
        difference = (state[key] - value).abs()
        assert bool((difference <= FLOAT32_ROUNDING * value.abs()).all()), key
        worst = max(worst, float(difference.max()))
    print(f"mergekit linear (float32) vs symfusion simple: max |difference| {worst:.1e}")
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    models[0].load_state_dict(expected)
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, models[0](input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_mergekit_reads_a_sharded_aligned_folder_and_writes_bfloat16(folders, tmp_path):
    anchor, aligned = folders
    out = merge_with_mergekit(tmp_path, "merged_bf16", anchor, aligned["source_sharded"], "bfloat16")
    assert saved_dtypes(out) == {"BF16"}
    merged = tf.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    # the sharded folder was aligned shard by shard to the same weights as the whole one
    whole, sharded = load_model(aligned["source"]).state_dict(), load_model(aligned["source_sharded"]).state_dict()
    assert all(torch.equal(whole[k], sharded[k]) for k in whole)
    anchor_state = load_model(anchor).state_dict()
    expected = merge_models("simple", [load_model(anchor), load_model(aligned["source_sharded"])])
    for key, value in expected.items():
        # mergekit rounds both inputs to bfloat16, then their average: within bfloat16's rounding of each
        bound = 1.01 * BFLOAT16_ROUNDING * (anchor_state[key].abs() + sharded[key].abs())
        assert bool(((merged.state_dict()[key] - value).abs() <= bound).all()), key
    assert not torch.equal(merged.state_dict()["model.layers.0.mlp.up_proj.weight"],
                           expected["model.layers.0.mlp.up_proj.weight"])          # really rounded to bfloat16
