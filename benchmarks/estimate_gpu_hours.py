"""GPU hours of the paper profile, per rule and in total: the paper's workload in FLOPs, at a stated A100 rate.

    python benchmarks/estimate_gpu_hours.py [REHEARSAL_RUN]     # e.g. results/rehearsal

The model is the usual one for transformers: a training step costs 6 N FLOPs per token and a forward
pass 2 N (N = the parameters outside the embeddings), over the paper's data (sizes from the dataset
cards, docs/data_card.md) and the pipeline's settings (conf/profile/paper.yaml: 20 epochs, 3 ViT seeds,
every merge, evaluation, barrier point and layer subset). FLOPs become hours at an A100's bf16 peak
(312 TFLOP/s) times the utilisation MFU (0.25 by default: short sequences, small batches); statistic
passes that take one example at a time (Fisher) get a quarter of that. Given a finished rehearsal run,
the script checks the FLOP model on its stand-ins: the FLOPs its fine-tunes did per CPU second against
this machine's float32 GEMM rate, i.e. the utilisation the same model predicts here.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

A100_BF16_PEAK = 312e12
MFU = 0.25

# Paper-scale models: parameters outside the embeddings, layers.
MODELS = {"roberta_base": {"params": 85e6, "layers": 12}, "deberta_v3_large": {"params": 304e6, "layers": 24}}
VIT = {"params": 12.4e6, "tokens": 65, "train": 50_000, "test": 10_000, "epochs": 200, "seeds": 3}

# Paper-profile text tasks: (train examples, test examples, mean tokens per example), from the dataset cards.
TASKS = {
    "emo_dair": (16_000, 2_000, 30), "emo_tweeteval": (3_257, 1_421, 35), "emo_goemotions": (36_300, 4_590, 22),
    "emo_dailydialog": (87_170, 7_740, 18),
    **{f"onto_{g}": (12_500, 1_580, 30) for g in ("bc", "bn", "mz", "nw", "tc", "wb")},   # english_v4 / 6 genres
    "conll2003": (14_041, 3_453, 20), "glue_cola": (8_551, 1_043, 12), "glue_stsb": (5_749, 1_500, 32),
}
EMOTION = ["emo_dair", "emo_tweeteval", "emo_goemotions", "emo_dailydialog"]
NER = [f"onto_{g}" for g in ("bc", "bn", "mz", "nw", "tc", "wb")]
EPOCHS, STAT_EXAMPLES, METHODS = 20, 1024, 3


def pairs(items: list[str]) -> int:
    return len(items) * (len(items) - 1) // 2


def workload() -> dict[str, float]:
    """FLOPs per rule of the paper profile."""
    flops: dict[str, float] = {}

    def add(rule: str, value: float) -> None:
        flops[rule] = flops.get(rule, 0.0) + value

    for model in MODELS.values():
        n = model["params"]
        for name, (train, test, length) in TASKS.items():
            if name == "conll2003":
                continue                                                   # evaluated, never trained on
            add("train (fine-tuning)", EPOCHS * (6 * n * train * length + 2 * n * test * length / 5))
        for name in EMOTION + NER + ["conll2003"]:
            train, test, length = TASKS[name]
            add("evaluate_end_model", 2 * n * test * length)
        for group in (EMOTION, NER):
            merges = 2 * pairs(group)                                      # unmatched and matched
            tokens = sum(TASKS[t][1] * TASKS[t][2] for t in group) / len(group)
            add("lang_merge_pair (evaluation)", merges * METHODS * 2 * (2 * n * tokens))
            add("lang_merge_pair (Fisher, RegMean)", merges * 2 * (6 * n + 2 * n) * STAT_EXAMPLES * 30)
        test, length = TASKS["conll2003"][1], TASKS["conll2003"][2]
        add("lang_merge_group", 2 * (METHODS * 2 * n * test * length + len(NER) * 8 * n * STAT_EXAMPLES * 30))
        cola, stsb = TASKS["glue_cola"], TASKS["glue_stsb"]
        subsets = 2 * model["layers"] + 1
        add("layer_sweep", subsets * 2 * n * (cola[1] * cola[2] + stsb[1] * stsb[2]))
    vit = VIT["params"] * VIT["tokens"]
    add("train (ViTs)", VIT["seeds"] * VIT["epochs"] * (6 * vit * VIT["train"] + 2 * vit * VIT["train"] / 10))
    vision_pairs = VIT["seeds"] * (VIT["seeds"] - 1) // 2
    add("merge_evaluate", vision_pairs * 5 * (6 * 2 * vit * VIT["test"] + 2 * 8 * vit * 1000 + 2 * 2 * vit * 200))
    add("barrier", vision_pairs * 4 * 11 * 2 * vit * VIT["test"])
    add("evaluate_end_model", VIT["seeds"] * 2 * vit * VIT["test"])
    return flops


# The paper's Table 3 (A100 80GB): fine-tuning seconds per dataset, Fisher and RegMean merge seconds per pair.
PAPER_SECONDS = {"roberta_base": {"finetune": 3071.49, "fisher": 69.57, "regmean": 36.44},
                 "deberta_v3_large": {"finetune": 12983.71, "fisher": 197.47, "regmean": 137.67}}


def paper_rate_hours() -> dict[str, float]:
    """Hours of the rules the paper timed, at the paper's own measured A100 times (conf/paper/table3.csv)."""
    trained = len([t for t in TASKS if t != "conll2003"])
    hours = {"train (fine-tuning)": sum(trained * m["finetune"] for m in PAPER_SECONDS.values()) / 3600}
    merges = 2 * (pairs(EMOTION) + pairs(NER))
    hours["lang_merge_pair (Fisher, RegMean)"] = sum(merges * (m["fisher"] + m["regmean"])
                                                     for m in PAPER_SECONDS.values()) / 3600
    return hours


def gflops_here() -> float:
    """float32 GEMM rate of this machine, one thread (the calibration of benchmarks/bench_pipeline.py)."""
    torch.set_num_threads(1)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    start = time.perf_counter()
    for _ in range(3):
        a @ b
    return 3 * 2 * 2048 ** 3 / (time.perf_counter() - start) / 1e9


def rehearsal_check(run: Path, rate: float) -> str:
    """The FLOP model on the rehearsal's fine-tunes: predicted FLOPs per CPU second vs the GEMM rate."""
    rows = []
    for path in sorted(run.glob("lang/*/models/*/train.json")):
        data = json.loads(path.read_text())
        per_second = data.get("train_examples_per_second")
        if not per_second:
            continue
        rows.append((path.parts[-4], data["num_parameters"], per_second))
    if not rows:
        return "no rehearsal fine-tunes found"
    # stand-ins: tiny vocabularies, so every parameter counts; ~20 tokens per stand-in example
    achieved = [6 * params * 20 * speed for _, params, speed in rows]
    mean = sum(achieved) / len(achieved) / 1e9
    return (f"rehearsal fine-tunes ({len(rows)}): {mean:.2f} GFLOP/s by the 6 N per token model, "
            f"{mean / rate:.1%} of this machine's {rate:.1f} GFLOP/s GEMM (tiny models: overheads dominate)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, help="a finished rehearsal run (results/rehearsal)")
    parser.add_argument("--mfu", type=float, default=MFU, help="assumed A100 utilisation (default 0.25)")
    args = parser.parse_args(argv)
    rate = args.mfu * A100_BF16_PEAK
    flops, measured = workload(), paper_rate_hours()
    print(f"| rule | PFLOP | A100 hours at {args.mfu:.0%} of the bf16 peak | A100 hours at the paper's Table 3 times |")
    print("|---|---|---|---|")
    total, total_paper = 0.0, 0.0
    for rule, value in sorted(flops.items(), key=lambda kv: -kv[1]):
        effective = rate / 4 if "Fisher" in rule else rate
        hours = value / effective / 3600
        paper = measured.get(rule)
        total += hours
        total_paper += paper if paper is not None else hours
        print(f"| {rule} | {value / 1e15:.1f} | {hours:.1f} | {f'{paper:.1f}' if paper is not None else '-'} |")
    print(f"| total | {sum(flops.values()) / 1e15:.1f} | {total:.1f} | {total_paper:.1f} (the rest at {args.mfu:.0%}) |")
    if args.run is not None:
        print("\n" + rehearsal_check(args.run, gflops_here()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
