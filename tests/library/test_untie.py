"""matching.untie (full_symmetry_untie): a tied decoder aligned as its untied form, so the residual map is any
orthogonal map. The aligned model computes its source's function (float64), is a standard untied model of its class
(transformers loads it; mergekit merges it with a tied anchor), a planted orthogonal residual map between a tied model
and its rotated copy is undone (which the tied matching cannot do), and the option is refused in one line where it
cannot apply."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors import safe_open

import symfusion
from symfusion.arch import layout_of
from symfusion.errors import NOTES, SymfusionError
from symfusion.fusion import merge_models
from symfusion.io.untie import is_tied, untied
from symfusion.matching import match_models, matching_config
from symfusion.pipeline.stages.common import load_models
from symfusion.stream import is_signed_permutation, stream_layout
from symfusion.symmetry import apply_transform, random_residual, random_transform
from test_residual_symmetry import build
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

MERGEKIT = Path(sys.executable).parent / "mergekit-yaml"
TIED = [("llama", {"num_key_value_heads": 2}), ("gpt2", {})]       # RMSNorm with GQA; LayerNorm, biases, Conv1D
TIED_IDS = [family for family, _ in TIED]


def tied_decoder(family: str, seed: int, dtype=torch.float32, **overrides):
    """A tiny tied decoder; in float64 with its RMSNorms computed in float64 too (test_residual_symmetry.build)."""
    return build("dec", family, {"tie_word_embeddings": True, **overrides}, dtype=dtype, seed=seed)


def logits64(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model.double()(input_ids=ids).logits


def ids_for(model) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))


def lm_keys(folder: Path) -> set:
    keys = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as handle:
            keys |= set(handle.keys())
    return keys


@pytest.mark.parametrize("family,overrides", TIED, ids=TIED_IDS)
def test_the_untied_aligned_model_computes_its_sources_function(family, overrides, tmp_path):
    source, anchor = (tied_decoder(family, seed, dtype=torch.float64, **overrides) for seed in (1, 0))
    matched, report = symfusion.align(source, anchor, matching="full_symmetry_untie")
    tied_matched, tied_report = symfusion.align(source, anchor, matching="full_symmetry")
    assert not is_tied(matched) and matched.config.tie_word_embeddings is False and type(matched) is type(source)
    assert is_tied(source) and source.config.tie_word_embeddings           # the caller's model stays tied
    assert report["residual"]["group"] in ("orthogonal", "orthogonal_centred")
    assert tied_report["residual"]["group"] in ("signed_permutation", "permutation")
    # the moved stream is no signed permutation: lm_head is no longer the embeddings
    head, embeddings = matched.get_output_embeddings().weight, matched.get_input_embeddings().weight
    assert not torch.equal(head, embeddings)
    ids = ids_for(source)
    before, after = logits64(source, ids), logits64(matched, ids)
    assert (after - before).abs().max() <= 1e-10 * before.abs().max()        # float64: the same function
    # as a folder: a standard untied model of the class, as transformers loads it
    source32, anchor32 = tied_decoder(family, 1, **overrides), tied_decoder(family, 0, **overrides)
    source32.save_pretrained(str(tmp_path / "s"))
    anchor32.save_pretrained(str(tmp_path / "a"))
    out, folder_report = symfusion.align(tmp_path / "s", tmp_path / "a", matching="full_symmetry_untie",
                                         output=tmp_path / "o")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    head_key = "lm_head.weight"
    assert head_key in lm_keys(out) and head_key not in lm_keys(tmp_path / "s")
    loaded = tf.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    assert type(loaded) is type(source32) and not is_tied(loaded)
    reference = logits64(tied_decoder(family, 1, **overrides), ids)
    assert (logits64(loaded, ids) - reference).abs().max() <= 1e-5 * reference.abs().max()   # float32 weights
    assert folder_report["distance_after"] == pytest.approx(report["distance_after"], rel=1e-4)


@pytest.mark.parametrize("tied_role", ["source", "anchor"])
@pytest.mark.parametrize("family,overrides", TIED, ids=TIED_IDS)
def test_a_planted_orthogonal_residual_map_between_a_tied_model_and_its_rotated_copy_is_undone(
        family, overrides, tied_role):
    model = tied_decoder(family, 3, dtype=torch.float64, **overrides)
    free = untied(model)
    state = {k: v.detach().clone() for k, v in free.state_dict().items()}
    layout = layout_of(free.config, state)
    transform = random_transform(layout, seed=5, heads=True)
    transform.residual = random_residual(stream_layout(layout, state, tied=False), "orthogonal", seed=6)
    rotated = untied(model)
    rotated.load_state_dict(apply_transform(state, layout, transform))
    ids = ids_for(model)
    assert (logits64(rotated, ids) - logits64(model, ids)).abs().max() <= 1e-10 * logits64(model, ids).abs().max()
    source, anchor = (model, rotated) if tied_role == "source" else (rotated, model)
    _, report = symfusion.align(source, anchor, matching="full_symmetry_untie")
    assert report["distance_before"] > 1.0 and report["distance_after"] < 1e-8 * report["distance_before"]
    if tied_role == "source":          # kept tied, the source's stream moves by signed permutations only
        _, tied_report = symfusion.align(source, anchor, matching="full_symmetry")
        assert tied_report["distance_after"] > 0.1 * tied_report["distance_before"]


def test_a_tied_anchor_and_the_untied_aligned_source_merge_untied_by_symfusion_and_by_mergekit(tmp_path):
    tied_decoder("llama", 0, num_key_value_heads=2).save_pretrained(str(tmp_path / "a"))
    tied_decoder("llama", 1, num_key_value_heads=2).save_pretrained(str(tmp_path / "s"))
    out, _ = symfusion.align(tmp_path / "s", tmp_path / "a", matching="full_symmetry_untie", output=tmp_path / "o")
    anchor, source = load_models([str(tmp_path / "a"), str(out)])        # the merge stage's loading
    assert not is_tied(anchor) and anchor.config.tie_word_embeddings is False
    assert torch.equal(anchor.lm_head.weight, anchor.model.embed_tokens.weight)
    expected = merge_models("simple", [anchor, source])
    assert torch.equal(expected["lm_head.weight"], (anchor.lm_head.weight + source.lm_head.weight) / 2)
    if not MERGEKIT.is_file():
        pytest.skip("mergekit is not installed in this environment (the merge extra)")
    config = tmp_path / "merge.yml"
    config.write_text(json.dumps({"merge_method": "linear", "dtype": "float32", "models": [
        {"model": str((tmp_path / "a").resolve()), "parameters": {"weight": 0.5}},
        {"model": str(out.resolve()), "parameters": {"weight": 0.5}}]}))
    done = subprocess.run([str(MERGEKIT), str(config), str(tmp_path / "mk"), "--no-write-model-card",
                           "--no-copy-tokenizer"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    merged = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mk"), dtype=torch.float32, local_files_only=True)
    assert not is_tied(merged)
    state = merged.state_dict()
    assert set(state) == set(expected)
    for key, value in expected.items():
        assert bool(((state[key] - value).abs() <= torch.finfo(torch.float32).eps * value.abs()).all()), key


def test_untie_is_refused_in_one_line_where_it_cannot_apply(tmp_path):
    with pytest.raises(SymfusionError, match="matching.untie=true .* has none") as refused:
        dataclasses.replace(matching_config("rotation"), untie=True)
    assert "\n" not in str(refused.value)
    with pytest.raises(SymfusionError, match="matching.untie=true must be true or false|untie='yes'"):
        dataclasses.replace(matching_config("full_symmetry"), untie="yes")
    vit = tiny_model("vit", seed=0)       # an encoder classifier: no lm_head to untie
    with pytest.raises(SymfusionError, match="has no lm_head") as refused:
        symfusion.align(tiny_model("vit", seed=1), vit, matching="full_symmetry_untie")
    assert "\n" not in str(refused.value)
    tied_decoder("llama", 0).save_pretrained(str(tmp_path / "a"))
    tied_decoder("llama", 1).save_pretrained(str(tmp_path / "s"))
    with pytest.raises(SymfusionError, match="in_memory"):
        symfusion.align(tmp_path / "s", tmp_path / "a", matching="full_symmetry_untie", output=tmp_path / "o",
                        in_memory=False)
    assert not (tmp_path / "o").exists()
    tied = tied_decoder("llama", 0)
    state = tied.state_dict()
    with pytest.raises(SymfusionError, match="untie=true unties models, not state dicts"):
        match_models(state, state, layout_of(tied.config, state), "full_symmetry_untie", tied=True)


def test_a_pair_with_nothing_tied_is_matched_as_full_symmetry_with_a_note():
    source, anchor = tiny_decoder("llama", seed=1), tiny_decoder("llama", seed=0)
    noted = len(NOTES)
    matched, report = symfusion.align(source, anchor, matching="full_symmetry_untie")
    same, plain = symfusion.align(source, anchor, matching="full_symmetry")
    assert any("nothing to untie" in line for line in report["notes"]) and len(NOTES) >= noted
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in matched.state_dict().items())
    assert report["distance_after"] == plain["distance_after"]


@pytest.mark.parametrize("family,overrides", TIED, ids=TIED_IDS)
def test_k_tied_decoders_are_aligned_untied_into_one_basis(family, overrides, tmp_path):
    """align_many(matching="full_symmetry_untie"): each of k tied decoders aligned as its untied copy, so the shared
    basis is reached by orthogonal maps that are no signed permutations (kept tied: signed permutations only); each
    computes its source's function in float64; the caller's models stay tied; as folders, k standard untied models
    of the class (lm_head saved), as transformers loads them."""
    models = [tied_decoder(family, seed, dtype=torch.float64, **overrides) for seed in (0, 1, 2)]
    aligned, report = symfusion.align_many(models, matching="full_symmetry_untie")
    _, tied_report = symfusion.align_many(models, matching="full_symmetry")
    assert not any(is_signed_permutation(t.residual.r) for t in report["transforms"])
    assert all(is_signed_permutation(t.residual.r) for t in tied_report["transforms"])
    ids = ids_for(models[0])
    for model, moved in zip(models, aligned):
        assert is_tied(model) and not is_tied(moved) and moved.config.tie_word_embeddings is False
        assert type(moved) is type(model)
        before, after = logits64(model, ids), logits64(moved, ids)
        assert (after - before).abs().max() <= 1e-10 * before.abs().max()
    folders = []
    for seed in (0, 1, 2):
        tied_decoder(family, seed, **overrides).save_pretrained(str(tmp_path / f"m{seed}"))
        folders.append(tmp_path / f"m{seed}")
    written, _ = symfusion.align_many(folders, matching="full_symmetry_untie", output=tmp_path / "out")
    for folder, out in zip(folders, written):
        assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
        assert "lm_head.weight" in lm_keys(out) and "lm_head.weight" not in lm_keys(folder)
        source, loaded = (tf.AutoModelForCausalLM.from_pretrained(str(f)).eval() for f in (folder, out))
        before, after = logits64(source, ids), logits64(loaded, ids)
        assert (after - before).abs().max() <= 1e-4 * before.abs().max()          # float32 weights as stored


def test_k_models_untie_is_refused_or_noted_as_for_a_pair():
    """align_many with untie: a model without an lm_head is refused in one line naming it; k untied decoders are
    aligned as they are, with the note."""
    vits = [tiny_model("vit", seed) for seed in (0, 1)]
    with pytest.raises(SymfusionError, match="model 1 .*has no lm_head"):
        symfusion.align_many([tied_decoder("llama", 0), vits[1]], matching="full_symmetry_untie")
    untied_models = [untied(tied_decoder("llama", seed)) for seed in (0, 1)]
    noted = len(NOTES)
    aligned, _ = symfusion.align_many(untied_models, matching="full_symmetry_untie")
    assert any("nothing to untie" in line for line in NOTES[noted:]) and len(aligned) == 2


def test_k_untied_aligned_folders_merge_by_mergekit_to_their_centroid(tmp_path):
    """The k folders align_many writes for full_symmetry_untie are standard untied models that mergekit's linear merge
    (weights 1/k) takes: its merge is their centroid (float32 rounding) with its own lm_head, untied."""
    folders = []
    for seed in (0, 1, 2):
        tied_decoder("llama", seed, num_key_value_heads=2).save_pretrained(str(tmp_path / f"m{seed}"))
        folders.append(tmp_path / f"m{seed}")
    written, _ = symfusion.align_many(folders, matching="full_symmetry_untie", output=tmp_path / "out")
    aligned = load_models([str(f) for f in written])
    states = [m.state_dict() for m in aligned]
    centroid = {k: sum(s[k].double() for s in states) / 3 for k in states[0]}
    if not MERGEKIT.is_file():
        pytest.skip("mergekit is not installed in this environment (the merge extra)")
    config = tmp_path / "merge.yml"
    config.write_text(json.dumps({"merge_method": "linear", "dtype": "float32", "models": [
        {"model": str(f.resolve()), "parameters": {"weight": 1 / 3}} for f in written]}))
    done = subprocess.run([str(MERGEKIT), str(config), str(tmp_path / "mk"), "--no-write-model-card",
                           "--no-copy-tokenizer"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    merged = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "mk"), dtype=torch.float32, local_files_only=True)
    assert not is_tied(merged) and merged.config.tie_word_embeddings is False
    state = merged.state_dict()
    assert set(state) == set(centroid)
    eps = torch.finfo(torch.float32).eps
    for key, value in centroid.items():
        scale = max(float(s[key].abs().max()) for s in states)
        assert float((state[key].double() - value).abs().max()) <= 4 * eps * scale, key
