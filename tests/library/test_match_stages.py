"""A match report's costs and distances (issue 56): seconds_by_stage names every stage a user waits for and its parts
add up to no more than `seconds`; the distances are a plain float64 sum, bit for bit, though measured without
float64 copies; the matched module holds the moved weights without sharing the source's memory, ties kept."""
from __future__ import annotations

import math

import pytest
import torch

import symfusion
from symfusion.alignment.sharded import ALIGNMENT, ShardedFolder
from symfusion.arch import layout_of
from symfusion.measures import BLOCK, squared_difference
from symfusion.symmetry import apply_transform, random_transform
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model


def plain_distance(source: dict, anchor: dict) -> float:
    """sqrt(sum over tensors of |s - a|^2): each tensor's float64 difference squared and summed per BLOCK elements,
    added in the source's order, the parts made by whole float64 copies (what the distances were before issue 56)."""
    total = 0.0
    for key, s in source.items():
        a = anchor[key]
        if not s.is_floating_point() or a.shape != s.shape:
            continue
        fs, fa = s.reshape(-1).double(), a.reshape(-1).double()
        total += sum((fs[i:i + BLOCK] - fa[i:i + BLOCK]).pow(2).sum().item() for i in range(0, fs.numel(), BLOCK))
    return math.sqrt(total)


def moved_pair(seed: int = 0):
    """(anchor, source: the anchor moved by a random symmetry plus noise) of a tiny BERT classifier."""
    anchor = tiny_model("bert", seed=seed)
    layout = layout_of(anchor.config, anchor.state_dict())
    state = apply_transform(anchor.state_dict(), layout, random_transform(layout, seed=seed + 1))
    gen = torch.Generator().manual_seed(seed + 2)
    source = tiny_model("bert", seed=seed)
    source.load_state_dict({k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                            for k, v in state.items()})
    return anchor, source.eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_squared_difference_is_the_float64_sum_per_block_bit_for_bit(dtype):
    """Over two and a half blocks (a last partial one), in each dtype: == the sum of whole float64 copies' parts."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(5 * BLOCK // 2 + 7, generator=gen) * 3).to(dtype)
    y = (x.float() + torch.randn(x.shape, generator=gen) * 1e-2).to(dtype)
    assert math.sqrt(squared_difference(x, y)) == plain_distance({"w": x}, {"w": y})
    expected = 0.0
    for i in range(0, x.numel(), BLOCK):
        expected += (x[i:i + BLOCK].double() - y[i:i + BLOCK].double()).pow(2).sum().item()
    assert squared_difference(x, y) == expected                 # exactly, not approximately
    assert squared_difference(x[:0], y[:0]) == 0.0


def test_distances_of_a_match_equal_a_plain_float64_computation_exactly():
    anchor, source = moved_pair()
    before = {k: v.clone() for k, v in source.state_dict().items()}
    matched, report = symfusion.align(source, anchor, matching="rotation")
    assert report["distance_before"] == plain_distance(source.state_dict(), anchor.state_dict())
    assert report["distance_after"] == plain_distance(matched.state_dict(), anchor.state_dict())
    assert report["distance_after"] < report["distance_before"]
    assert all(torch.equal(v, before[k]) for k, v in source.state_dict().items())       # the source is as it was
    own = {p.untyped_storage().data_ptr() for p in source.parameters()}
    assert not own & {p.untyped_storage().data_ptr() for p in matched.parameters()}      # nothing shared with it
    assert [n for n, _ in matched.named_parameters()] == [n for n, _ in source.named_parameters()]
    assert all(p.dtype == q.dtype and p.requires_grad == q.requires_grad
               for p, q in zip(matched.parameters(), source.parameters()))


def test_a_tied_decoder_stays_tied_in_its_matched_copy():
    anchor = tiny_decoder("llama", seed=0, tie_word_embeddings=True)
    layout = layout_of(anchor.config, anchor.state_dict())
    source = tiny_decoder("llama", seed=0, tie_word_embeddings=True)
    source.load_state_dict(apply_transform(anchor.state_dict(), layout, random_transform(layout, seed=1)))
    matched, report = symfusion.align(source.eval(), anchor, matching="rotation")
    assert matched.lm_head.weight is matched.model.embed_tokens.weight
    assert matched.lm_head.weight is not source.lm_head.weight
    assert report["relative_output_change"] < 1e-5


def stages_add_up(report: dict, expected: set[str]) -> None:
    stages = report["seconds_by_stage"]
    assert set(stages) == expected
    assert all(s >= 0 for s in stages.values())
    assert sum(stages.values()) <= report["seconds"] + 1e-6      # disjoint parts of the whole call, never more


def test_seconds_by_stage_of_modules_and_of_folders(tmp_path):
    anchor, source = moved_pair()
    _, report = symfusion.align(source, anchor, matching="rotation")
    stages_add_up(report, {"solve", "copy", "check", "distances"})
    assert set(report["solve_seconds_by_stage"]) >= {"ffn"}                  # the solve's own parts, as before
    anchor.save_pretrained(str(tmp_path / "anchor"))
    source.save_pretrained(str(tmp_path / "source"))
    _, streamed = symfusion.align(str(tmp_path / "source"), str(tmp_path / "anchor"), matching="rotation",
                                  output=tmp_path / "streamed")
    stages_add_up(streamed, {"load", "solve", "distances", "check", "write"})
    # equal to the last bit: a folder's tensors are read into aligned memory (MKL's results depend on alignment:
    # on an AMD EPYC Zen 3 safetensors' own buffers moved the per-head rotations by 1e-8; the next test)
    assert streamed["distance_before"] == report["distance_before"]
    assert streamed["distance_after"] == report["distance_after"]
    _, loaded = symfusion.align(str(tmp_path / "source"), str(tmp_path / "anchor"), matching="full_symmetry",
                                output=tmp_path / "loaded", in_memory=True)
    stages_add_up(loaded, {"load", "solve", "copy", "check", "write", "distances"})
    assert loaded["distance_before"] == report["distance_before"]


def test_a_folders_tensors_are_read_into_aligned_memory(tmp_path):
    # safetensors hands out float32 tensors at 12 bytes past a 64-byte boundary; read() copies those, so a folder's
    # solve sees its weights where a module's lie (MKL picks its kernels by the inputs' alignment)
    anchor, _ = moved_pair()
    anchor.save_pretrained(str(tmp_path / "anchor"))
    folder = ShardedFolder(tmp_path / "anchor")
    keys = list(folder.meta_state())
    for dtype in (None, torch.float64):
        read = folder.read(keys, dtype)
        assert all(t.data_ptr() % ALIGNMENT == 0 for t in read.values())
        state = anchor.state_dict()
        assert all(torch.equal(read[k], state[k].to(read[k].dtype)) for k in keys)
