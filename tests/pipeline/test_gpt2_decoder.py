"""GPT-2-layout decoders trained from scratch by a causal_lm task (conf/model/gpt2_*.yaml): the config a model config
builds (sizes, learned positions, untied embeddings, dropout), its refusals, and one training run end to end."""
import math
from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf

from symfusion.errors import SymfusionError
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline.tasks import lm_models
from test_causal_lm import toy_corpora, toy_task   # noqa: F401  (the toy grammar's corpora: a fixture)

CONF = Path(__file__).resolve().parents[2] / "conf" / "model" / "gpt2_mini.yaml"
TINY_GPT2 = {"name": "gpt2_test", "family": "gpt2", "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4}


def gpt2_parameters(V: int, P: int, d: int, f: int, L: int, tied: bool) -> int:
    """GPT-2's parameter count by its layout: token and position tables, per layer two LayerNorms, c_attn (d -> 3d),
    c_proj (d -> d), c_fc (d -> f), mlp c_proj (f -> d), all with biases; the final LayerNorm; an untied LM head."""
    layer = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d)
    return V * d + P * d + L * layer + 2 * d + (0 if tied else V * d)


def test_gpt2_mini_builds_the_gpt2_layout_it_states(toy_corpora):
    task = toy_task(toy_corpora)
    tokenizer = task.tokenizer()
    cfg = dict(OmegaConf.to_container(OmegaConf.load(CONF)))
    config = lm_models.gpt2_config(cfg, tokenizer, task.block_size)
    assert (config.n_embd, config.n_layer, config.n_head, config.n_inner) == (128, 4, 4, 512)
    assert config.n_positions == task.block_size and config.vocab_size == len(tokenizer)
    assert not config.tie_word_embeddings and config.resid_pdrop == config.embd_pdrop == config.attn_pdrop == 0.0
    model = lm_models.decoder_from_scratch(cfg, tokenizer, task.block_size)()
    assert isinstance(model, transformers.GPT2LMHeadModel)
    assert model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr()
    counts = lm_models.parameter_counts(model)
    V, P = len(tokenizer), task.block_size
    assert counts["num_parameters"] == gpt2_parameters(V, P, 128, 512, 4, tied=False)
    assert counts["num_parameters_non_embedding"] == counts["num_parameters"] - 2 * V * 128
    # the conf's comment at the task's own sizes (2,048 tokens, 128 positions): 1.33M in all, 0.81M outside
    assert round(gpt2_parameters(2048, 128, 128, 512, 4, False) / 1e6, 2) == 1.33
    assert round((gpt2_parameters(2048, 128, 128, 512, 4, False) - 2 * 2048 * 128) / 1e6, 2) == 0.81
    tied = lm_models.decoder_from_scratch({**cfg, "tie_word_embeddings": True}, tokenizer, task.block_size)()
    assert lm_models.parameter_counts(tied)["num_parameters"] == gpt2_parameters(V, P, 128, 512, 4, tied=True)
    dropped = lm_models.gpt2_config({**cfg, "dropout": 0.1}, tokenizer, task.block_size)
    assert dropped.resid_pdrop == dropped.embd_pdrop == dropped.attn_pdrop == 0.1


def test_gpt2_configs_that_cannot_be_built_are_refused_and_nothing_is_written(toy_corpora, tmp_path):
    task = toy_task(toy_corpora)
    for bad, match in ((dict(TINY_GPT2, hidden_size=30), "divisible"), ({"name": "half", "family": "gpt2",
                       "hidden_size": 32}, "lacks"), (dict(TINY_GPT2, dropout=1.0), "dropout"),
                       (dict(TINY_GPT2, num_hidden_layers=0), "positive")):
        with pytest.raises(SymfusionError, match=match):
            task.train(str(tmp_path / "x"), bad, 0)
    assert not (tmp_path / "x").exists()


def test_a_tiny_gpt2_trains_from_scratch_and_its_folder_scores_what_training_reported(toy_corpora, tmp_path):
    task = toy_task(toy_corpora)
    report = task.train(str(tmp_path / "g"), dict(TINY_GPT2), 0)
    model = load_model(tmp_path / "g")
    assert isinstance(model, transformers.GPT2LMHeadModel) and not model.config.tie_word_embeddings
    assert not torch.equal(model.lm_head.weight, model.transformer.wte.weight)
    assert report["validation_loss"] < report["unigram_baseline"]["validation"]["loss"] < math.log(len(load_tokenizer(tmp_path / "g")))
    again = task.evaluate(model, "validation", tmp_path / "g")["loss"]
    assert again == pytest.approx(report["validation_loss"], abs=1e-6)
