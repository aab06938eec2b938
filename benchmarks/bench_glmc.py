"""Benchmark: Generalized LMC's own weight matching (data-free, and learned) beside symfusion's full_symmetry on the same GPT-2 pairs, scored alike.

    python benchmarks/bench_glmc.py --glmc-checkout /work/glmc --glmc-python /work/glmc-venv/bin/python \
        --models /work/glmc-models/seed0 /work/glmc-models/seed1 /work/glmc-models/seed2 --work /tmp/glmc-run \
        [--ours full_symmetry] [--ours-from earlier.json] [--theirs-learned [--learned-max-steps N]] [--output results.json]

The peer (Theus et al., "Generalized Linear Mode Connectivity for Transformers", github
antoniohonsell/Generalized-LMC-for-Transformers) runs in its own environment (benchmarks/glmc/setup_glmc.sh: a
checkout of its repository and a venv with transformers 4.50.1, einops, POT): for each pair, a subprocess runs
benchmarks/glmc/glmc_driver.py there, which calls its GPTMerger and returns each curve's per-block losses on our
test blocks (the lm_english test split of the mini profile, 128 blocks of 128 tokens, cut with the models' own
BPE). --theirs-learned adds their learned merger (the driver's "learned" form: their GPTMerger, its projections trained
by transformers' Trainer with the arguments and sampler their train_merger.py sets, on --task's train blocks, the
best checkpoint by the loss on its validation blocks, token frequencies of its train split; --learned-max-steps
scales their 10 epochs to what the CPU affords), which needs accelerate in their environment (setup_glmc.sh).
Ours runs here: unmatched (the raw folders) and each --ours matching (symfusion.align on the standard GPT-2 folders,
a standard GPT2LMHeadModel folder out), evaluated by the causal_lm task; --ours-from takes the --ours curves from
an earlier --output of the same pairs instead (its unmatched curve must equal the one recomputed here). Pairs: every later model onto
every earlier one (seed1 onto seed0, seed2 onto seed0, seed2 onto seed1). Every curve has 11 points, alpha = 1 the
anchor, and both of our barriers: max - min of the loss along the path (the paper's) and max above the straight
line between the end losses. Over pairs: mean and 95% t interval (report/spread.over_pairs), and the paired
difference ours - theirs. Printed as a markdown table; --output writes every number as JSON (a new file).
--work must be a new folder: it receives the blocks, the driver's curves and our matched folders.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

import symfusion
from symfusion.interpolation import barrier_height, barrier_range, loss_path
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.io.provenance import cpu_model
from symfusion.pipeline.config import load_group
from symfusion.pipeline.data.text.bpe import tokenizer_digest
from symfusion.pipeline.report.spread import over_pairs
from symfusion.pipeline.tasks import make_task

DRIVER = Path(__file__).resolve().parent / "glmc" / "glmc_driver.py"
THEIRS = ("vanilla", "circuit_unmatched", "weight_matching", "permutations_only")
LABELS = {"unmatched": "unmatched (ours, raw GPT-2)", "vanilla": "theirs: vanilla (raw GPT-2, their env)",
          "circuit_unmatched": "theirs: circuit form, unmatched", "weight_matching": "theirs: weight matching (data-free)",
          "permutations_only": "theirs: weight matching, permutations only",
          "learned": "theirs: learned merger (train_merger.py's training)"}


def curve(losses: list[float], alphas: list[float]) -> dict:
    return {"alphas": alphas, "loss": losses, "barrier": barrier_range(losses),
            "barrier_linear": barrier_height(alphas, losses)}


def token_frequencies(train: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in the train blocks (their compute_token_freqs.py counts the train split's
    tokens the same way, minlength the vocabulary): the mask their weight matching reads (ids never seen ignored)."""
    return torch.bincount(train.flatten(), minlength=vocab_size)


def driver_inputs(task, tokenizer, blocks: torch.Tensor, learned: bool) -> dict:
    """The tensors the driver reads: our test blocks, and for their learned merger our train and validation blocks
    and the train split's token frequencies."""
    if not learned:
        return {"blocks": blocks.contiguous()}
    train = task.blocks("train", tokenizer)
    return {"blocks": blocks.contiguous(), "train": train.contiguous(),
            "validation": task.blocks("validation", tokenizer).contiguous(),
            "token_freqs": token_frequencies(train, len(tokenizer))}


def theirs(args, anchor: Path, source: Path, inputs: dict, work: Path) -> dict:
    """The peer's curves, from its driver in its environment: each point's mean loss over every predicted token."""
    save_file(inputs, str(work / "blocks.safetensors"))
    forms = [*args.theirs, *(["learned"] if args.theirs_learned else [])]
    command = [args.glmc_python, str(DRIVER), "--checkout", args.glmc_checkout, "--anchor", str(anchor), "--source",
               str(source), "--blocks", str(work / "blocks.safetensors"), "--output", str(work / "glmc.json"),
               "--points", str(args.points), "--iterations", str(args.iterations), "--forms", *forms,
               "--trainer-dir", str(work / "glmc_trainer"), "--learned-max-steps", str(args.learned_max_steps)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: Generalized LMC's driver failed on {source} onto {anchor}:\n{done.stderr[-3000:]}")
    result = json.loads((work / "glmc.json").read_text())
    tokens = result["tokens_per_block"] * result["blocks"]
    return {name: {**curve([math.fsum(row) / tokens for row in form["block_loss"]], form["alphas"]),
                   **{k: form[k] for k in ("seconds", "cpu_seconds", "training") if k in form}}
            for name, form in result["forms"].items()} | {
        "_versions": result["versions"]}


def ours(args, task, anchor: Path, source: Path, work: Path) -> dict:
    """Unmatched and each matching of ours: a standard GPT-2 folder written by symfusion.align, its loss path."""
    anchor_model = load_model(anchor)
    evaluate = lambda m: task.evaluate(m, "test", model_dir=str(anchor))             # noqa: E731
    anchor_state = {k: v.detach().clone() for k, v in anchor_model.state_dict().items()}
    records = {}
    for name in ["unmatched", *args.ours]:
        start = time.perf_counter()
        folder = source
        if name != "unmatched":
            folder = work / name
            data = task.statistic_batches(args.data_batches, anchor, split="train") if "learned" in name else None
            symfusion.align(str(source), str(anchor), name, output=str(folder), data=data)
        seconds = time.perf_counter() - start
        moved = {k: v.detach().clone() for k, v in load_model(folder).state_dict().items()}
        path = loss_path(load_model(anchor), anchor_state, moved, evaluate, args.points)
        losses = [p["loss"] for p in path["path"]]
        records[name] = {**curve(losses, [p["alpha"] for p in path["path"]]), "seconds": seconds}
    return records


def reused(args, task, anchor: Path, source: Path, earlier: dict, pair: str) -> dict:
    """Our curves of an earlier run (--ours-from): unmatched recomputed, and it must equal that run's own to 1e-9
    nats at every point (the same models and test blocks), or the run stops with one error line."""
    mine = ours(SimpleNamespace(**{**vars(args), "ours": []}), task, anchor, source, None)
    missing = [n for n in ["unmatched", *args.ours] if n not in earlier]
    if missing or max(abs(a - b) for a, b in zip(mine["unmatched"]["loss"], earlier["unmatched"]["loss"])) > 1e-9:
        raise SystemExit(f"error: --ours-from has no {', '.join(missing)} for {pair}" if missing else
                         f"error: --ours-from's unmatched curve of {pair} is not this one (other models or blocks)")
    return mine | {n: earlier[n] for n in args.ours}


def table(pairs: list[str], results: dict, kind: str) -> list[str]:
    """Rows per curve: the barrier per pair, mean [95% t] over pairs, and the mean of the per-pair ratios to ours
    unmatched [95% t], in %."""
    names = [n for n in results[pairs[0]] if not n.startswith("_")]
    lines = [f"| curve ({kind}) | " + " | ".join(pairs) + " | mean [95% t over pairs] | % of unmatched [95% t] |",
             "|---|" + "---|" * (len(pairs) + 2)]
    for name in names:
        spread = over_pairs({p: results[p][name][kind] for p in pairs})
        interval = f" [{spread['low']:.3f}, {spread['high']:.3f}]" if spread["low"] is not None else ""
        ratio = "n/a"
        if all(results[p]["unmatched"][kind] > 0 for p in pairs):
            share = over_pairs({p: 100 * results[p][name][kind] / results[p]["unmatched"][kind] for p in pairs})
            ratio = f"{share['mean']:.1f}%" + (f" [{share['low']:.1f}, {share['high']:.1f}]"
                                                if share["low"] is not None else "")
        lines.append(f"| {LABELS.get(name, 'ours: ' + name)} | " + " | ".join(f"{results[p][name][kind]:.3f}" for p in pairs)
                     + f" | {spread['mean']:.3f}{interval} | {ratio} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glmc-checkout", required=True, help="their repository's working tree (setup_glmc.sh)")
    parser.add_argument("--glmc-python", required=True, help="the Python of their environment (setup_glmc.sh)")
    parser.add_argument("--models", nargs="+", required=True, help="GPT-2 folders trained on --task (2 or more)")
    parser.add_argument("--work", required=True, help="a new folder for blocks, curves and matched folders")
    parser.add_argument("--task", default="lm_english")
    parser.add_argument("--ours", nargs="*", default=["full_symmetry"], help="symfusion matching presets")
    parser.add_argument("--theirs", nargs="+", default=list(THEIRS), choices=THEIRS)
    parser.add_argument("--points", type=int, default=11)
    parser.add_argument("--iterations", type=int, default=15, help="their weight matching's alternations")
    parser.add_argument("--ours-from", help="take the --ours curves from this earlier --output of the same pairs "
                        "(our unmatched curve is recomputed and must equal its own there)")
    parser.add_argument("--theirs-learned", action="store_true",
                        help="also their learned merger, trained on --task's train blocks (needs accelerate there)")
    parser.add_argument("--learned-max-steps", type=int, default=-1,
                        help="their learned merger's optimizer steps of 32 blocks (-1: their 10 epochs)")
    parser.add_argument("--data-batches", type=int, default=200, help="train batches of our learned variants")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", help="JSON of every number (a new file)")
    args = parser.parse_args()
    models = [Path(m) for m in args.models]
    for path, what in ((Path(args.glmc_checkout) / "merger.py", "--glmc-checkout has no merger.py"),
                       (Path(args.glmc_python), "--glmc-python does not exist"), *((m / "config.json", f"{m} is no "
                                                                                    "model folder") for m in models)):
        if not path.exists():
            print(f"error: {what}", file=sys.stderr)
            return 2
    if args.ours_from and not Path(args.ours_from).is_file():
        print(f"error: --ours-from {args.ours_from} is no file", file=sys.stderr)
        return 2
    if len(models) < 2 or Path(args.work).exists() or (args.output and Path(args.output).exists()):
        print("error: give 2 or more --models, a new --work folder and a new --output file", file=sys.stderr)
        return 2
    earlier = json.loads(Path(args.ours_from).read_text())["results"] if args.ours_from else None
    digests = {tokenizer_digest(load_tokenizer(m)) for m in models}
    if len(digests) != 1:
        print("error: the models carry different tokenizers; train them on one task", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    task = make_task(args.task, load_group("profile", "mini"))
    tokenizer = load_tokenizer(models[0])
    blocks = task.blocks("test", tokenizer)
    inputs = driver_inputs(task, tokenizer, blocks, args.theirs_learned)
    results, pairs = {}, []
    for j in range(1, len(models)):
        for i in range(j):
            pair = f"{models[j].name}:{models[i].name}"
            work = Path(args.work) / pair.replace(":", "-onto-")
            work.mkdir(parents=True)
            start = time.perf_counter()
            if earlier is None:
                mine = ours(args, task, models[i], models[j], work)
            else:
                mine = reused(args, task, models[i], models[j], earlier.get(pair, {}), pair)
            results[pair] = {**mine, **theirs(args, models[i], models[j], inputs, work)}
            pairs.append(pair)
            print(f"{pair}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    differences = {}
    for kind in ("barrier", "barrier_linear"):
        for name in args.ours:
            for peer in ("weight_matching", "vanilla", "learned"):
                if peer in results[pairs[0]]:
                    differences[f"{name} - {peer} ({kind})"] = over_pairs(
                        {p: results[p][name][kind] - results[p][peer][kind] for p in pairs})
    agreement = max(abs(a - b) for p in pairs for a, b in zip(results[p]["unmatched"]["loss"],
                                                            results[p].get("vanilla", results[p]["unmatched"])["loss"]))
    header = (f"{cpu_model() or 'unknown CPU'}, {args.threads} thread(s); {len(blocks)} test blocks of {blocks.shape[1]} tokens; "
              f"{args.points} points; their versions {results[pairs[0]]['_versions']}")
    print(f"# Beside Generalized LMC ({header})\n")
    for kind in ("barrier_linear", "barrier"):
        print("\n".join(table(pairs, results, kind)) + "\n")
    print("| paired difference over pairs | mean | 95% t |\n|---|---|---|")
    for name, spread in differences.items():
        low = "n/a" if spread["low"] is None else f"[{spread['low']:+.3f}, {spread['high']:+.3f}]"
        print(f"| {name} | {spread['mean']:+.3f} | {low} |")
    print(f"\nlargest |our unmatched - their vanilla| loss over every point: {agreement:.2e} nats")
    print("seconds per pair: " + "; ".join(f"{n} " + "/".join(f"{results[p][n]['seconds']:.1f}" for p in pairs)
                                          for n in results[pairs[0]] if not n.startswith("_")))
    for p in pairs:
        if "learned" in results[p]:
            run = results[p]["learned"]["training"]
            best = "none (no evaluation)" if run["best_eval_loss"] is None else f"{run['best_eval_loss']:.4f}"
            print(f"their learned merger on {p}: {run['steps']} of {run['max_steps']} steps of 32 of {run['train_blocks']} "
                  f"train blocks, best validation loss {best} ({run['best_checkpoint']}), training "
                  f"{run['train_cpu_seconds']:.0f} CPU s, the whole form {results[p]['learned']['cpu_seconds']:.0f} CPU s")
    if args.output:
        with open(args.output, "x") as handle:
            json.dump({"cpu": cpu_model() or 'unknown CPU', "threads": args.threads, "pairs": pairs, "results": results,
                       "differences": differences, "unmatched_vs_vanilla": agreement}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
