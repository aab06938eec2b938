"""The causal_lm task: document splits, the BPE tokenizer, token blocks, training a Llama-layout decoder from scratch,
held-out perplexity with per-block records, and every stage (data, train, match, statistics, merge, evaluate, barrier)
on tiny decoders, by function and through the command line."""
import json
import math
import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open

import symfusion.pipeline.data.text.lm as lm
from symfusion.pipeline import cli
from symfusion.errors import SymfusionError
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline import uncertainty
from symfusion.pipeline.data.text.bpe import END_OF_TEXT, tokenizer_digest, train_bpe
from symfusion.pipeline.stages.barrier import run_barrier
from symfusion.pipeline.stages.data import run_data
from symfusion.pipeline.stages.evaluate import run_evaluate
from symfusion.pipeline.stages.match import run_match
from symfusion.pipeline.stages.merge import fusion_config, run_merge_evaluate
from symfusion.pipeline.stages.statistics import run_statistics
from symfusion.matching import matching_config
from symfusion.pipeline.tasks import CausalLMTask, causal_lm, lm_models, load_task, make_task
from tiny_decoders import tiny_decoder
from tiny_models import tiny_model

NOUNS = ["cat", "dog", "bird", "fox", "horse", "child", "farmer", "teacher"]
VERBS = ["sees", "chases", "likes", "finds", "follows", "helps"]
ADJECTIVES = ["small", "old", "quick", "brown", "happy", "tired"]


def toy_documents(name: str, count: int):
    """Documents of a toy grammar ("the quick fox chases the old dog. ..."), 3 per group: context makes them
    predictable (a noun follows an adjective, "the" starts a phrase), so a tiny decoder beats the unigram model."""
    rng = random.Random(name)
    documents = []
    for i in range(count):
        sentences = [f"the {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the "
                     f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS)}." for _ in range(rng.randint(2, 5))]
        documents.append((f"{name}-group{i // 3}", " ".join(sentences)))
    return documents


@pytest.fixture(scope="module")
def toy_corpora():
    patch = pytest.MonkeyPatch()
    for name, count in (("toy_fables", 300), ("toy_tales", 150)):
        patch.setitem(lm.LM_CORPORA, name, (lambda name=name, count=count: toy_documents(name, count),
                                            lambda: lm.gensim_test_file("lee.cor")))
    yield ["toy_fables", "toy_tales"]
    patch.undo()


def toy_task(corpora, **overrides):
    config = {"name": "toy_lm", "kind": "causal_lm", "source": "lm_corpora", "options": {"corpora": corpora},
              "split_seed": 0, "block_size": 32, "tokenizer": {"vocab_size": 300, "min_frequency": 2}, "limit": None,
              "train": {"epochs": 2, "batch_size": 8, "lr": 1.0e-2, "weight_decay": 0.0, "warmup_ratio": 0.1},
              "eval_batch_size": 16, "fusion_batch_size": 4, **overrides}
    return make_task(OmegaConf.create(config))


TINY_LLAMA = {"name": "llama_test", "family": "llama", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture(scope="module")
def trained(toy_corpora, tmp_path_factory):
    """Two tiny Llama decoders trained from scratch on the toy task with seeds 0 and 1."""
    root = tmp_path_factory.mktemp("lm")
    task = toy_task(toy_corpora)
    reports = [task.train(str(root / f"m{seed}"), dict(TINY_LLAMA), seed) for seed in (0, 1)]
    return root, task, reports


# ---------------------------------------------------------------- data

def test_document_splits_are_disjoint_seeded_and_keep_groups_together(toy_corpora):
    documents = lm.load_lm_documents(toy_corpora, seed=0)
    splits = documents.splits
    groups = {text: group for name in toy_corpora for group, text in lm.LM_CORPORA[name][0]()}
    where = {}
    for split, texts in splits.items():
        for text in texts:
            assert where.setdefault(groups[text], split) == split          # a group never spans two splits
    assert sum(map(len, splits.values())) + documents.info["duplicates_dropped"] == 450
    for name, count in (("toy_fables", 300), ("toy_tales", 150)):          # each corpus split 70 / 15 / 15 on its own
        record = documents.info["corpora"][name]
        assert abs(record["train"]["documents"] - 0.7 * count) <= 3 and abs(record["test"]["documents"] - 0.15 * count) <= 3
    assert lm.load_lm_documents(toy_corpora, seed=0).splits == splits
    assert lm.load_lm_documents(toy_corpora, seed=1).splits["test"] != splits["test"]
    with pytest.raises(SymfusionError, match="give distinct corpora"):
        lm.load_lm_documents(["toy_fables", "nope"])


def test_real_corpora_split_without_shared_documents():
    documents = lm.load_lm_documents(["debates", "headlines", "lee"], seed=0)
    sets = {name: set(texts) for name, texts in documents.splits.items()}
    assert not (sets["train"] & sets["test"]) and not (sets["train"] & sets["validation"])
    assert not (sets["validation"] & sets["test"])
    lee = documents.info["corpora"]["lee"]
    assert lee["train"]["documents"] + lee["validation"]["documents"] + lee["test"]["documents"] >= 290
    assert all(len(texts) > 500 for texts in documents.splits.values())


def test_bpe_tokenizer_is_deterministic_byte_level_and_blocks_join_documents(toy_corpora):
    texts = lm.load_lm_documents(toy_corpora, seed=0).splits["train"]
    first, second = train_bpe(texts, 300), train_bpe(list(texts), 300)
    assert tokenizer_digest(first) == tokenizer_digest(second) and len(first) == 300
    assert first.eos_token == END_OF_TEXT and first.convert_tokens_to_ids(END_OF_TEXT) == 0
    unseen = "Zürich's naïve café: 3½ €"                     # bytes never seen in training still round-trip
    assert first.decode(first(unseen, add_special_tokens=False)["input_ids"]) == unseen
    blocks = lm.token_blocks(["the cat", "the dog sees"], first, 3)
    ids = first("the cat", add_special_tokens=False)["input_ids"] + [0] + first("the dog sees", add_special_tokens=False)["input_ids"] + [0]
    assert blocks.shape == (len(ids) // 3, 3) and blocks.reshape(-1).tolist() == ids[: blocks.numel()]
    rows = lm.seeded_rows(10, 4, 0)
    assert list(rows) == sorted(rows) and len(set(rows)) == 4 and list(lm.seeded_rows(10, None, 0)) == list(range(10))


def test_tokenizer_and_blocks_cache_is_keyed_by_what_they_are_computed_from(toy_corpora, tmp_path, monkeypatch):
    fresh = toy_task(toy_corpora).tokenizer()                                          # no cache_dir, 300 tokens
    first = toy_task(toy_corpora, cache_dir=str(tmp_path), tokenizer={"vocab_size": 290, "min_frequency": 2})
    tokenizer = first.tokenizer()
    assert len(tokenizer) == 290 and len(list(tmp_path.glob("lm-tokenizer-*.json"))) == 1
    blocks = first.blocks("test", tokenizer)
    assert len(list(tmp_path.glob("lm-blocks-*.safetensors"))) == 1
    calls = []
    monkeypatch.setattr(causal_lm, "_documents", lambda *a: calls.append(a))           # a hit reads no document
    again = toy_task(toy_corpora, cache_dir=str(tmp_path), tokenizer={"vocab_size": 290, "min_frequency": 2})
    assert torch.equal(again.blocks("test", tokenizer), blocks) and not calls
    monkeypatch.undo()
    assert tokenizer_digest(fresh) != tokenizer_digest(tokenizer)
    other = toy_task(toy_corpora, cache_dir=str(tmp_path), block_size=16)
    assert other.blocks("test", tokenizer).shape[1] == 16 and len(list(tmp_path.glob("lm-blocks-*"))) == 2
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------- training and evaluation

def test_trained_decoders_carry_the_task_tokenizer_and_beat_the_unigram_model(trained):
    root, task, reports = trained
    manifest = task.manifest()
    for seed, report in enumerate(reports):
        folder = root / f"m{seed}"
        model, tokenizer = load_model(folder), load_tokenizer(folder)
        config = model.config
        assert (type(model).__name__, config.num_attention_heads, config.num_key_value_heads) == ("LlamaForCausalLM", 4, 2)
        assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
        assert config.vocab_size == len(tokenizer) == 300
        assert tokenizer_digest(tokenizer) == manifest["tokenizer"]["sha256"] == report["tokenizer"]["sha256"]
        result = task.evaluate(model, "test", folder)
        record = result["per_example"]
        assert result["n"] == manifest["splits"]["test"]["size"] == len(record["loss"])
        assert math.isclose(math.fsum(record["loss"]) / sum(record["tokens"]), result["loss"], rel_tol=1e-12)
        assert math.isclose(result["perplexity"], math.exp(result["loss"]))
        baseline = manifest["unigram_baseline"]["test"]
        assert result["tokens"] == baseline["tokens"]
        assert result["loss"] < baseline["loss"] - 1.0, (result["loss"], baseline)
        assert report["best_epoch"] in (1, 2) and report["validation_loss"] == min(
            h["validation_loss"] for h in report["history"])
    weights = [load_model(root / f"m{seed}").state_dict() for seed in (0, 1)]
    assert not torch.equal(weights[0]["model.layers.0.self_attn.q_proj.weight"],
                           weights[1]["model.layers.0.self_attn.q_proj.weight"])


def test_same_seed_gives_the_same_decoder(trained, tmp_path):
    root, task, _ = trained
    task.train(str(tmp_path / "again"), dict(TINY_LLAMA), 0)
    again, first = load_model(tmp_path / "again").state_dict(), load_model(root / "m0").state_dict()
    assert all(torch.equal(again[k], first[k]) for k in first)


def test_an_interrupted_decoder_training_resumes_to_the_same_weights(trained, tmp_path, monkeypatch):
    """The checkpoint holds the tied embeddings / LM head once each (safetensors refuses shared tensors)."""
    root, task, reports = trained
    real, calls = lm_models.evaluate_causal_lm, []

    def interrupt_in_second_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_models, "evaluate_causal_lm", interrupt_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        task.train(str(tmp_path / "resumed"), dict(TINY_LLAMA), 0)
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.checkpoint").is_dir()
    monkeypatch.setattr(lm_models, "evaluate_causal_lm", real)
    report = task.train(str(tmp_path / "resumed"), dict(TINY_LLAMA), 0)
    assert report["resumed_after_epoch"] == 1 and report["history"] == reports[0]["history"]
    resumed, full = load_model(tmp_path / "resumed").state_dict(), load_model(root / "m0").state_dict()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_the_tasks_patience_stops_a_decoder_training_at_its_best_epoch(toy_corpora, tmp_path, monkeypatch):
    """train.patience (the lm_english_plateau recipe's early stopping) reaches training.fit: scripted validation
    losses 2, 3, 3 end a 5-epoch run after epoch 3, and the saved decoder is the one scored at epoch 1."""
    task = toy_task(toy_corpora, train={"epochs": 5, "batch_size": 8, "lr": 1.0e-2, "weight_decay": 0.0,
                                        "warmup_ratio": 0.1, "patience": 2})
    real, scored = lm_models.evaluate_causal_lm, []

    def scripted(model, blocks, batch_size=32):
        scored.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        return {**real(model, blocks, batch_size), "loss": [2.0, 3.0, 3.0, 1.0, 1.0][len(scored) - 1]}

    monkeypatch.setattr(lm_models, "evaluate_causal_lm", scripted)
    report = task.train(str(tmp_path / "stopped"), dict(TINY_LLAMA), 0)
    assert (report["patience"], report["epochs_run"], report["stopped_early"], report["best_epoch"]) == (2, 3, True, 1)
    assert len(scored) == 3 and report["validation_loss"] == 2.0 and report["epochs"] == 5
    saved = load_model(tmp_path / "stopped").state_dict()
    assert all(torch.equal(saved[k], scored[0][k]) for k in saved)
    assert not torch.equal(scored[0]["model.norm.weight"], scored[2]["model.norm.weight"])


def test_the_bf16_autocast_path_trains_a_decoder_and_saves_float32_weights(toy_corpora, tmp_path):
    """precision=bf16 on the CPU keeps alive the path a GPU takes with precision=auto."""
    task = toy_task(toy_corpora, train={"epochs": 1, "batch_size": 8, "lr": 1.0e-2, "weight_decay": 0.0,
                                        "warmup_ratio": 0.1})
    report = task.train(str(tmp_path / "bf16"), dict(TINY_LLAMA), 0, precision="bf16")
    assert report["bf16_autocast"] and math.isfinite(report["validation_loss"])
    assert report["validation_loss"] < task.manifest()["unigram_baseline"]["validation"]["loss"]
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(key).get_dtype() for key in handle.keys()} == {"F32"}


def test_statistic_batches_are_seeded_validation_blocks(trained):
    root, task, _ = trained
    batches = task.statistic_batches(3, root / "m0")
    assert len(batches) == 3 and all(b["input_ids"].shape == (4, 32) and torch.equal(b["input_ids"], b["labels"])
                                     for b in batches)
    validation = task.blocks("validation", load_tokenizer(root / "m0"))
    rows = {tuple(r) for r in validation.tolist()}
    assert all(tuple(r) in rows for b in batches for r in b["input_ids"].tolist())
    assert torch.equal(torch.cat([b["input_ids"] for b in task.statistic_batches(3, root / "m0")]),
                       torch.cat([b["input_ids"] for b in batches]))


def test_statistic_batches_of_the_train_split_are_seeded_train_blocks(trained):
    root, task, _ = trained
    batches = task.statistic_batches(2, root / "m0", split="train")
    rows = {tuple(r) for r in task.blocks("train", load_tokenizer(root / "m0")).tolist()}
    assert len(batches) == 2 and all(tuple(r) in rows for b in batches for r in b["input_ids"].tolist())
    with pytest.raises(SymfusionError, match="test split scores"):
        task.statistic_batches(1, root / "m0", split="test")


def test_the_task_refuses_what_it_cannot_train_or_score(trained, tmp_path):
    root, task, _ = trained
    with pytest.raises(SymfusionError, match="no decoder LLM config"):
        task.train(str(tmp_path / "x"), {"name": "vit_mini", "family": "vit", "patch_size": 4}, 0)
    with pytest.raises(SymfusionError, match="lacks"):
        task.train(str(tmp_path / "y"), {"name": "half", "family": "llama", "hidden_size": 32}, 0)
    with pytest.raises(SymfusionError, match="not a causal language model"):
        task.evaluate(tiny_model("bert"), "test", root / "m0")
    gpt2 = tiny_decoder("gpt2", vocab_size=300)                 # any causal LM of a supported family is scored
    assert task.evaluate(gpt2, "test", root / "m0")["n"] == task.manifest()["splits"]["test"]["size"]
    with pytest.raises(SymfusionError, match="has 300 tokens, the model's vocabulary 97"):
        task.evaluate(tiny_decoder("llama"), "test", root / "m0")
    with pytest.raises(SymfusionError, match="causal_lm tasks read"):
        toy_task(["toy_fables"], source="rotten_tomatoes")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


# ---------------------------------------------------------------- the stages

def test_stages_match_merge_evaluate_and_barrier_decoders_with_per_block_records(trained, tmp_path):
    root, task, _ = trained
    anchor, source = str(root / "m0"), str(root / "m1")
    manifest = run_data(task, str(tmp_path / "data.json"))
    assert manifest["splits"]["test"]["size"] > 0 and manifest["tokenizer"]["tokens"] == 300
    matched = {}
    for name in ("rotation", "git_rebasin"):
        report = run_match(source, anchor, str(tmp_path / name), matching_config(name), name)
        assert report["distance_after"] < report["distance_before"] and report["relative_output_change"] < 1e-4
        assert tokenizer_digest(load_tokenizer(tmp_path / name)) == tokenizer_digest(load_tokenizer(anchor))
        matched[name] = str(tmp_path / name)
    fusions = [fusion_config(m, {"num_batches": 2} if m != "simple" else None) for m in ("simple", "fisher", "regmean")]
    statistics = str(tmp_path / "anchor.safetensors")
    run_statistics(anchor, fusions[1:], task, statistics)
    evaluations = {}
    for name, folder in (("none", source), *matched.items()):
        reports = run_merge_evaluate([anchor, folder], fusions, task, str(tmp_path / "eval" / name), [task],
                                     statistics=[statistics])
        evaluations[name] = {r["method"]: r for r in reports}
        for report in reports:
            assert report["matching"] == name and report["results"][0]["metric"] == "perplexity"
            assert math.isclose(report["metrics"]["perplexity"], math.exp(report["metrics"]["loss"]))
    end = run_evaluate(anchor, [task], str(tmp_path / "anchor.json"))
    end_loss = end["metrics"]["loss"]
    assert evaluations["none"]["simple"]["metrics"]["loss"] > end_loss      # averaging unaligned decoders costs loss
    # the per-block records give paired bootstrap intervals over held-out blocks (as the report computes them)
    with_, without = (evaluations[m]["simple"]["results"][0]["per_example"] for m in ("rotation", "none"))
    effect = uncertainty.paired_effect("loss", [(with_, without, "toy_lm/test")])
    difference = evaluations["rotation"]["simple"]["metrics"]["loss"] - evaluations["none"]["simple"]["metrics"]["loss"]
    assert math.isclose(effect["effect"], difference, rel_tol=1e-9, abs_tol=1e-12)
    assert effect["low"] <= effect["effect"] <= effect["high"] and effect["verdict"] in (
        "helps", "hurts", "no detectable change")
    with pytest.raises(SymfusionError, match="OT fusion supports the encoder families"):   # kept refusal, one line
        run_merge_evaluate([anchor, source], [fusion_config("ot_wts")], task, str(tmp_path / "ot"), [task])
    assert not (tmp_path / "ot").exists()
    barrier = run_barrier(anchor, matched["rotation"], task, str(tmp_path / "barrier.json"), points=3)
    path = barrier["path"]
    assert [row["alpha"] for row in path] == [0.0, 0.5, 1.0] and barrier["matching"] == "rotation"
    assert math.isclose(path[-1]["loss"], end_loss, rel_tol=1e-9)            # alpha = 1 is the anchor itself
    assert math.isclose(path[1]["loss"], evaluations["rotation"]["simple"]["metrics"]["loss"], rel_tol=1e-6)
    assert all(len(row["per_example"]["loss"]) == end["metrics"]["n"] for row in path)
    subset = run_barrier(anchor, source, task, str(tmp_path / "subset.json"), points=2, examples=5)
    assert all(row["n"] == 5 for row in subset["path"])


# ---------------------------------------------------------------- the command line, on the real task

def stage(name: str, *args: str) -> None:
    assert cli.run_command(name, list(args)) == 0


@pytest.mark.slow
def test_commands_run_the_decoder_track_on_lm_english(tmp_path, capsys):
    """symfusion-data/-train/-match/-statistics/-merge/-evaluate/-barrier with task=lm_english model=llama_mini
    (shrunk: 1 layer of width 32, 24 train blocks of 32 tokens)."""
    task = ["task=lm_english", "task.block_size=32", "task.limit.train=24", "task.limit.validation=8",
            "task.limit.test=12", "task.train.epochs=1", "task.fusion_batch_size=4"]
    model = ["model=llama_mini", "model.hidden_size=32", "model.intermediate_size=48", "model.num_hidden_layers=1"]
    stage("data", *task, f"output={tmp_path}/data.json")
    assert json.loads((tmp_path / "data.json").read_text())["tokenizer"]["tokens"] == 2048
    for seed in (0, 1):
        stage("train", *task, *model, f"seed={seed}", f"output={tmp_path}/m{seed}", "threads=1")
    stage("match", f"source={tmp_path}/m1", f"anchor={tmp_path}/m0", f"output={tmp_path}/m1_rot", "matching=rotation")
    stage("statistics", *task, f"model_dir={tmp_path}/m0", "method_options={fisher: {num_batches: 1}, "
          "regmean: {num_batches: 1}}", f"output={tmp_path}/s0.safetensors")
    stage("merge", *task, f"models=[{tmp_path}/m0,{tmp_path}/m1_rot]", "methods=[simple,fisher,regmean]",
          "method_options={fisher: {num_batches: 1}, regmean: {num_batches: 1}}", f"eval_dir={tmp_path}/eval",
          f"statistics=[{tmp_path}/s0.safetensors]")
    stage("evaluate", *task, f"model_dir={tmp_path}/m0", f"output={tmp_path}/m0.json")
    stage("barrier", *task, f"anchor={tmp_path}/m0", f"source={tmp_path}/m1_rot", "points=3",
          f"output={tmp_path}/barrier.json")
    end = json.loads((tmp_path / "m0.json").read_text())
    assert end["metrics"]["n"] == 12 and len(end["results"][0]["per_example"]["tokens"]) == 12
    for method in ("simple", "fisher", "regmean"):
        merged = json.loads((tmp_path / "eval" / f"{method}.json").read_text())
        assert merged["method"] == method and merged["matching"] == "rotation" and merged["metrics"]["tokens"] == 12 * 31
    barrier = json.loads((tmp_path / "barrier.json").read_text())
    assert math.isclose(barrier["path"][-1]["loss"], end["metrics"]["loss"], rel_tol=1e-9)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_code:          # a text encoder is no decoder: one error line, nothing written
        cli.run_command("train", [*task, "model=minilm", "seed=0", f"output={tmp_path}/bad"])
    assert exit_code.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: model=minilm is no decoder LLM config (family 'bert'); causal_lm tasks train e.g. model=llama_mini "
        "from scratch or fine-tune model=smollm2_135m"]
    assert not (tmp_path / "bad").exists()


def test_lm_task_configs_are_causal_lm_tasks():
    for name in ("lm_english", "lm_debates", "lm_plots"):
        config = load_task(name)
        assert config.kind == "causal_lm" and isinstance(make_task(config), CausalLMTask)
    assert load_task("lm_plots").options.corpora == ["rt_plots"] and load_task("lm_plots").block_size == 256
    assert np.all([c in lm.LM_CORPORA for c in load_task("lm_english").options.corpora])


def test_data_seed_orders_the_data_and_keeps_the_initialisation(toy_corpora, tmp_path):
    """symfusion-train data_seed=D: the blocks' order from D, the initialisation from seed. data_seed equal to seed
    trains the very model of seed alone; another data_seed trains another model from the same start (with lr 0
    the weights stay the start: equal for one seed and any data order, not for another seed)."""
    def weights(folder):
        return load_model(str(folder)).state_dict()

    task = toy_task(toy_corpora)
    plain = task.train(str(tmp_path / "plain"), dict(TINY_LLAMA), 0)
    same = task.train(str(tmp_path / "same"), dict(TINY_LLAMA), 0, data_seed=0)
    other = task.train(str(tmp_path / "other"), dict(TINY_LLAMA), 0, data_seed=1)
    assert (plain["seed"], plain["data_seed"], other["data_seed"]) == (0, 0, 1)
    a, b, c = weights(tmp_path / "plain"), weights(tmp_path / "same"), weights(tmp_path / "other")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain["history"] == same["history"]
    assert any(not torch.equal(a[k], c[k]) for k in a) and plain["history"] != other["history"]

    still = toy_task(toy_corpora, train={"epochs": 1, "batch_size": 8, "lr": 0.0, "weight_decay": 0.0,
                                         "warmup_ratio": 0.1})
    for name, seed, data_seed in (("s0d0", 0, None), ("s0d1", 0, 1), ("s1d0", 1, 0)):
        still.train(str(tmp_path / name), dict(TINY_LLAMA), seed, data_seed=data_seed)
    start0, start0_other_order, start1 = (weights(tmp_path / n) for n in ("s0d0", "s0d1", "s1d0"))
    assert all(torch.equal(start0[k], start0_other_order[k]) for k in start0)
    assert any(not torch.equal(start0[k], start1[k]) for k in start0)
