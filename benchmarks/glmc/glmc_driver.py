"""Driver run in Generalized LMC's environment: their weight matching (data-free, and learned) on two GPT-2 folders, and its curves' per-block losses.

    VENV/bin/python benchmarks/glmc/glmc_driver.py --checkout DIR --anchor DIR --source DIR \
        --blocks blocks.safetensors --output curves.json [--points 11] [--iterations 15] [--seed 0] \
        [--forms ... learned --trainer-dir NEW_DIR --learned-max-steps N]

Run by benchmarks/bench_glmc.py in the environment benchmarks/glmc/setup_glmc.sh makes (their transformers 4.50.1):
it imports their package from --checkout (never copied into this repository: it has no licence) and calls
its entry point GPTMerger(model0, model1, token_freqs=None, permutations_only=...) then, per point,
set_sampler(None, fixed_coeff=alpha): their merged model at alpha * model0 + (1 - alpha) * model1 (model0 = the
anchor, so alpha = 1 is the anchor, as in symfusion.interpolation). Curves ("forms"):

    vanilla            the raw GPT-2 weights interpolated key by key, as their eval.py's vanilla sweep does
    circuit_unmatched  GPTMerger with iterations=0: their rewritten form (LayerNorm folded into RMSNorm, every head as
                       its full QK and OV products, head size d+1), no matching: what the rewriting alone changes
    weight_matching    GPTMerger as their README merges (15 alternations, orthogonal residual map), data-free
    permutations_only  the same with a permutation for the residual map (their strict-permutation setting)
    learned            their learned merger: GPTMerger(model0, model1, token_freqs=...) (15 alternations), its
                       projections (residual: orthogonal by SVD; heads, MLP: permutations by a straight-through
                       Hungarian projection) trained by transformers' Trainer with the sampler and arguments their
                       train_merger.py sets (see `learned_curve`), on the train and validation blocks of --blocks
                       (ours), then swept at fixed coefficients like the others

Each point is scored on the given blocks as symfusion scores a causal LM (lm_models.evaluate_causal_lm): the summed
next-token cross-entropy of each block (tokens 1..L-1 from those before them), in float64 sums. The blocks come
from bench_glmc.py (our test split, cut with our tokenizer). Written: JSON {forms: {name: {alphas, block_loss
(points x blocks), seconds}}, tokens_per_block, versions}; the learned form adds its training record (steps, the
Trainer's log, the best checkpoint). The output must not exist; nothing else is written but the Trainer's
checkpoints under --trainer-dir (a new folder).
This file is our own code; it runs only inside their environment and is not imported by symfusion.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import json
import os
import sys
import time

import torch


def block_losses(model, blocks: torch.Tensor, batch_size: int) -> list[float]:
    """Each block's summed next-token cross-entropy (float64 sum of float32 token losses)."""
    sums = []
    with torch.inference_mode():
        for batch in blocks.split(batch_size):
            logits = model(input_ids=batch).logits[:, :-1]
            each = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:], reduction="none")
            sums += each.double().sum(dim=1).tolist()
    return sums


def vanilla_curve(anchor, source, blocks, alphas, batch_size):
    """The raw weights interpolated: alpha * anchor + (1 - alpha) * source for every floating tensor."""
    a, b = anchor.state_dict(), source.state_dict()
    model = copy.deepcopy(anchor).eval()
    rows = []
    for alpha in alphas:
        model.load_state_dict({k: alpha * v + (1 - alpha) * b[k] if v.is_floating_point() else v for k, v in a.items()})
        rows.append(block_losses(model, blocks, batch_size))
    return rows


def merger_curve(GPTMerger, anchor, source, blocks, alphas, batch_size, seed, **options):
    """Their GPTMerger built on copies of the two models (it rewrites them in place), swept at fixed coefficients."""
    torch.manual_seed(seed)                       # their near-identity starts of the projections, their dummy inputs
    merger = GPTMerger(copy.deepcopy(anchor), copy.deepcopy(source), token_freqs=None, **options).eval()
    rows = []
    for alpha in alphas:
        merger.set_sampler(None, fixed_coeff=float(alpha))
        rows.append(block_losses(merger, blocks, batch_size))
    return rows


# Their learned merger's settings, as their train_merger.py (pinned 8c6f323) sets them: TrainingArguments at lines
# 157-177 (eval and save every 50 steps, log every 25, keep 2 checkpoints, load the best by validation loss, AdamW
# 3e-4, cosine, 5% warm-up, weight decay 0.01, fp16 on CUDA only, so float32 here), argparse defaults at lines 43-68
# (seed 42, patience 10 evaluations), and the flags of their merge runs (seed3_train_merge_eval_slurm.sh:51-63, and
# run_merger.sh of 6b207cc: --epochs 10 --batch_size 32 --early_stop --sampler NARROW_UNIFORM, which set_sampler
# lowercases to narrow_uniform: a coefficient drawn from U(0.4, 0.6) at every forward, merger.py:395-396). Their
# evaluation_strategy is transformers 4.50.1's deprecated name of eval_strategy (mapped to it there).
THEIR_TRAINING = {"eval_strategy": "steps", "eval_steps": 50, "logging_strategy": "steps", "logging_steps": 25,
                  "save_steps": 50, "save_total_limit": 2, "load_best_model_at_end": True,
                  "metric_for_best_model": "eval_loss", "greater_is_better": False, "gradient_accumulation_steps": 1,
                  "learning_rate": 3e-4, "lr_scheduler_type": "cosine", "warmup_ratio": 0.05, "weight_decay": 0.01,
                  "fp16": False, "report_to": "none"}
THEIR_BATCH, THEIR_EPOCHS, THEIR_PATIENCE, THEIR_SEED, THEIR_SAMPLER = 32, 10.0, 10, 42, "narrow_uniform"


class Blocks(torch.utils.data.Dataset):
    """Token blocks as the Trainer's examples: labels = inputs (the model shifts them), as their collator makes them
    when no pad token occurs (theirs: DataCollatorForLanguageModeling(mlm=False), pad = eos, absent from their text)."""

    def __init__(self, blocks: torch.Tensor):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


def moved(before: dict, after: dict, project, MatrixType) -> dict:
    """How far training moved each projection: the Frobenius norm of the change of its raw parameter, and for the
    permutations (heads, MLP) how many rows their hard projection sends elsewhere than before training."""
    record = {}
    for name, start in before.items():
        end = after[name].detach()
        record[name] = {"change": float((end - start).norm())}
        if name != "residual":
            record[name]["rows_moved"] = int((project(start, MatrixType.PERM).argmax(1)
                                              != project(end, MatrixType.PERM).argmax(1)).sum())
    return record


def learned_curve(their, anchor, source, data, alphas, args) -> tuple[list, dict]:
    """Their learned merger on copies of the two models: GPTMerger (weight matching first, token frequencies of our
    train split), its projections trained by transformers' Trainer as their train_merger.py trains them (best
    checkpoint by validation loss), then swept at fixed coefficients. Returns the rows and the training record."""
    import transformers

    transformers.set_seed(THEIR_SEED)                               # train_merger.py:344, before building the merger
    models = [copy.deepcopy(anchor), copy.deepcopy(source)]
    for m in models:                                                # train_merger.py:110-115
        m.config.attn_implementation = "eager"
        m._attn_implementation = "eager"
    merger = their["GPTMerger"](*models, token_freqs=data.get("token_freqs"), permutations_only=False,
                                iterations=args.iterations)
    merger.set_sampler(sampler_type=THEIR_SAMPLER)
    before = {name: p.detach().clone() for name, p in merger.proj.items()}
    model = their["GPTMergerWrapper"](config=models[0].config, merger_model=merger)
    settings = dict(THEIR_TRAINING)
    if "warmup_ratio" not in inspect.signature(transformers.TrainingArguments).parameters:
        settings["warmup_steps"] = settings.pop("warmup_ratio")    # transformers 5 (our tests): a float below 1 is it
    training = transformers.TrainingArguments(
        output_dir=args.trainer_dir, num_train_epochs=THEIR_EPOCHS, max_steps=args.learned_max_steps,
        per_device_train_batch_size=THEIR_BATCH, use_cpu=True, disable_tqdm=True, **settings)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=Blocks(data["train"]),
                                   eval_dataset=Blocks(data["validation"]),
                                   callbacks=[transformers.EarlyStoppingCallback(early_stopping_patience=THEIR_PATIENCE)])
    start = time.process_time()
    trainer.train()
    merger = trainer.model.merger_model.eval()                      # the best checkpoint's projections
    record = {"steps": trainer.state.global_step, "max_steps": trainer.state.max_steps,
              "best_checkpoint": trainer.state.best_model_checkpoint, "best_eval_loss": trainer.state.best_metric,
              "log": trainer.state.log_history, "train_cpu_seconds": time.process_time() - start,
              "train_blocks": len(data["train"]), "validation_blocks": len(data["validation"]),
              "token_freqs": None if data.get("token_freqs") is None else int((data["token_freqs"] > 0).sum()),
              "moved": moved(before, dict(merger.proj.items()), their["project"], their["MatrixType"])}
    rows = []
    for alpha in alphas:
        merger.set_sampler(None, fixed_coeff=float(alpha))
        rows.append(block_losses(merger, data["blocks"], args.batch_size))
    return rows, record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", required=True, help="their repository's working tree (setup_glmc.sh)")
    parser.add_argument("--anchor", required=True, help="GPT-2 folder: model0, alpha = 1")
    parser.add_argument("--source", required=True, help="GPT-2 folder: model1, alpha = 0")
    parser.add_argument("--blocks", required=True, help="safetensors with an int64 tensor 'blocks' (rows, L)")
    parser.add_argument("--output", required=True, help="JSON to write (must not exist)")
    parser.add_argument("--points", type=int, default=11)
    parser.add_argument("--iterations", type=int, default=15, help="their weight matching's alternations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--forms", nargs="+", default=["vanilla", "circuit_unmatched", "weight_matching",
                                                         "permutations_only"])
    parser.add_argument("--trainer-dir", help="learned form: a new folder for the Trainer's checkpoints")
    parser.add_argument("--learned-max-steps", type=int, default=-1,
                        help="learned form: optimizer steps (-1: their 10 epochs of the train blocks)")
    args = parser.parse_args()
    if os.path.exists(args.output):
        print(f"error: {args.output} exists; give a new file", file=sys.stderr)
        return 2
    if "learned" in args.forms and (not args.trainer_dir or os.path.exists(args.trainer_dir)):
        print("error: the learned form needs --trainer-dir, a new folder", file=sys.stderr)
        return 2
    from safetensors.torch import load_file

    data = {k: v.long() for k, v in load_file(args.blocks).items()}
    blocks = data["blocks"]
    if "learned" in args.forms and not {"train", "validation"} <= set(data):
        print(f"error: the learned form needs 'train' and 'validation' blocks in {args.blocks}", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(args.checkout))
    from enums import MatrixType                  # their package: importable only with --checkout on the path
    from merger import GPTMerger, GPTMergerWrapper
    from utils import project
    import transformers

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    anchor = transformers.GPT2LMHeadModel.from_pretrained(args.anchor, torch_dtype=torch.float32).eval()
    source = transformers.GPT2LMHeadModel.from_pretrained(args.source, torch_dtype=torch.float32).eval()
    alphas = [i / (args.points - 1) for i in range(args.points)]
    builders = {
        "vanilla": lambda: vanilla_curve(anchor, source, blocks, alphas, args.batch_size),
        "circuit_unmatched": lambda: merger_curve(GPTMerger, anchor, source, blocks, alphas, args.batch_size,
                                                  args.seed, iterations=0),
        "weight_matching": lambda: merger_curve(GPTMerger, anchor, source, blocks, alphas, args.batch_size,
                                                args.seed, iterations=args.iterations),
        "permutations_only": lambda: merger_curve(GPTMerger, anchor, source, blocks, alphas, args.batch_size,
                                                  args.seed, iterations=args.iterations, permutations_only=True),
        "learned": lambda: learned_curve({"GPTMerger": GPTMerger, "GPTMergerWrapper": GPTMergerWrapper,
                                          "project": project, "MatrixType": MatrixType},
                                         anchor, source, data, alphas, args),
    }
    forms = {}
    for name in args.forms:
        start, cpu = time.perf_counter(), time.process_time()
        rows, training = builders[name](), None
        if name == "learned":
            rows, training = rows
        forms[name] = {"alphas": alphas, "block_loss": rows, "seconds": time.perf_counter() - start,
                       "cpu_seconds": time.process_time() - cpu} | ({"training": training} if training else {})
        print(f"{name}: {forms[name]['seconds']:.1f} s", file=sys.stderr)
    result = {"anchor": args.anchor, "source": args.source, "forms": forms, "tokens_per_block": blocks.shape[1] - 1,
              "blocks": blocks.shape[0], "iterations": args.iterations, "seed": args.seed,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    with open(args.output, "x") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
