"""Benchmark: seconds per matching stage and peak memory for roberta-base-sized and paper-ViT-sized pairs.

The source is the anchor moved by a random symmetry (rotation, rescaling, permutation) plus
Gaussian noise, so the problem is realistic for fine-tuned end models. Prints a table.
    python benchmarks/bench_matching.py [--repeats 3] [--noise 0.01]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.matching import match_models
from symfusion.measures import distance
from symfusion.symmetry import apply_transform, random_transform

CASES = {
    "roberta-base": lambda: tf.RobertaModel(tf.RobertaConfig()),  # 12 layers, 768 hidden, 12 heads, 3072 FFN
    "vit-paper": lambda: tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=4, hidden_size=384, num_hidden_layers=7,
                                                  num_attention_heads=12, intermediate_size=1536, num_labels=10)),
}
VARIANTS = ("rotation", "rotation_no_rescale", "attn_only", "ffn_only")


def rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


class PeakMemory:
    """Samples the resident set size in a thread; .peak is the max above the start value."""

    def __enter__(self):
        self.start, self.peak, self._running = rss_bytes(), 0, True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while self._running:
            self.peak = max(self.peak, rss_bytes() - self.start)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._running = False
        self._thread.join()
        self.peak = max(self.peak, rss_bytes() - self.start)


def make_pair(name: str, noise: float, seed: int = 0):
    torch.manual_seed(seed)
    anchor = {k: v.detach().clone() for k, v in CASES[name]().state_dict().items()}
    model_config = CASES[name]().config
    layout = layout_of(model_config, anchor)
    source = apply_transform(anchor, layout, random_transform(layout, seed=seed + 1))
    gen = torch.Generator().manual_seed(seed + 2)
    source = {k: (v + noise * v.std() * torch.randn(v.shape, generator=gen)).contiguous() if v.is_floating_point() else v
              for k, v in source.items()}
    return source, anchor, layout


def match_and_apply(source, anchor, layout, variant: str) -> tuple[dict, dict]:
    """(seconds per stage plus apply and total, matched state) for one matching run."""
    start = time.perf_counter()
    result = match_models(source, anchor, layout, variant)
    apply_start = time.perf_counter()
    matched = apply_transform(source, layout, result.transform)
    end = time.perf_counter()
    return {**result.seconds, "apply": end - apply_start, "total": end - start}, matched


def time_variant(source, anchor, layout, variant: str, repeats: int) -> dict:
    """Median seconds over `repeats` runs, then the peak memory of one more run.

    The memory sampler is a Python thread that wakes every 2 ms; on a 2-core machine it
    preempts one of the two BLAS threads and slows the large matrix products by ~30%, so
    timed runs go without it.
    """
    runs = [match_and_apply(source, anchor, layout, variant)[0] for _ in range(repeats)]
    row = {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}
    row["best_total"] = min(run["total"] for run in runs)
    with PeakMemory() as memory:
        _, matched = match_and_apply(source, anchor, layout, variant)
    row["peak"] = memory.peak
    row["dist_before"] = distance(source, anchor)["total"]
    row["dist_after"] = distance(matched, anchor)["total"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.01, help="noise std relative to each tensor's std")
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; stage seconds are medians of {args.repeats} "
          f"runs, best total is the fastest run (shared machines vary by +-20% from run to run)\n")
    header = ("case", "variant", "qk s", "vo s", "rescale s", "ffn s", "apply s", "total s", "best total s",
              "peak extra MB", "2 models MB", "peak/2models", "dist before", "dist after")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for case in args.cases:
        source, anchor, layout = make_pair(case, args.noise)
        model_mb = 2 * sum(v.numel() * v.element_size() for v in anchor.values()) / 2**20
        for variant in VARIANTS:
            r = time_variant(source, anchor, layout, variant, args.repeats)
            peak_mb = r["peak"] / 2**20
            cells = (case, variant, f"{r.get('qk', 0):.3f}", f"{r.get('vo', 0):.3f}", f"{r.get('rescale', 0):.3f}",
                     f"{r.get('ffn', 0):.3f}", f"{r['apply']:.3f}", f"{r['total']:.3f}", f"{r['best_total']:.3f}", f"{peak_mb:.0f}",
                     f"{model_mb:.0f}", f"{peak_mb / model_mb:.2f}", f"{r['dist_before']:.1f}", f"{r['dist_after']:.1f}")
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
