"""Benchmark: seconds per matching stage and peak memory for roberta-base-sized and paper-ViT-sized pairs, and the
residual solve of one Llama-2-7B-sized layer.

The source is the anchor moved by a random symmetry (heads, rotation, rescaling, FFN permutation and a map of
the residual stream: a permutation for post-LN RoBERTa, an orthogonal map with new norm gains for the pre-LN
ViT) plus Gaussian noise, so the problem is realistic for fine-tuned end models. full_symmetry_learned reads
4 synthetic batches of 32 images. Every time is also given as a multiple of a float32 2048^3 GEMM on one
thread measured in the same run (machines of this kind differ up to 2x), and as a multiple of the paper's
`rotation` on the same pair in the same run (the issue-33 criterion). A planted pair is easy: the descent of
`full_symmetry` finds the planted map in a few inner steps. Two trained models (`--anchor DIR --source DIR`, e.g. the
mini's end models) add a case `folders` with the real problem's cost. Prints tables.
    python benchmarks/bench_matching.py [--repeats 3] [--noise 0.01] [--cases roberta-base vit-paper llama-2-7b-layer]
        [--anchor DIR --source DIR] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import transformers as tf

from symfusion.arch import check_same_layout, layout_of
from symfusion.io.modelio import load_model
from symfusion.matching import MatchData, match_models
from symfusion.matching.residual import residual_cross, solve_residual
from symfusion.measures import distance
from symfusion.stream import StreamLayout
from symfusion.stream import stream_layout
from symfusion.symmetry import apply_transform, random_residual, random_transform

CASES = {
    # 12 layers, 768 hidden, 12 heads, 3072 FFN (with its sequence head: the residual map needs a head)
    "roberta-base": lambda: tf.RobertaForSequenceClassification(tf.RobertaConfig(num_labels=3)),
    "vit-paper": lambda: tf.ViTForImageClassification(tf.ViTConfig(
        image_size=32, patch_size=4, hidden_size=384, num_hidden_layers=7, num_attention_heads=12,
        intermediate_size=1536, num_labels=10)),
}
VARIANTS = ("rotation", "rotation_no_rescale", "attn_only", "ffn_only", "rotation_heads", "full_symmetry",
            "full_symmetry_learned")


def calibration_seconds() -> float:
    """A float32 2048^3 GEMM on one thread (benchmarks/bench_pipeline.py's calibration)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(2048, 2048)
    a @ a
    start = time.perf_counter()
    a @ a
    seconds = time.perf_counter() - start
    torch.set_num_threads(threads)
    return seconds


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
    transform = random_transform(layout, seed=seed + 1, heads=True)
    stream = stream_layout(layout, anchor)
    transform.residual = random_residual(stream, "permutation" if stream.orthogonal_problem(layout.family) else "orthogonal",
                                         seed=seed + 3)
    source = apply_transform(anchor, layout, transform)
    gen = torch.Generator().manual_seed(seed + 2)
    source = {k: (v + noise * v.std() * torch.randn(v.shape, generator=gen)).contiguous() if v.is_floating_point() else v
              for k, v in source.items()}
    return source, anchor, layout


def folder_pair(anchor_dir: str, source_dir: str):
    """(source, anchor, layout, tied) of two trained models of one architecture, read from their folders."""
    model, anchor_model = load_model(source_dir), load_model(anchor_dir)
    source = {k: v.detach().clone() for k, v in model.state_dict().items()}
    anchor = {k: v.detach().clone() for k, v in anchor_model.state_dict().items()}
    layout = layout_of(model.config, source)
    check_same_layout(layout, layout_of(anchor_model.config, anchor))      # the library's own check, one error line
    return source, anchor, layout, bool(getattr(model.config, "tie_word_embeddings", False))


def synthetic_data(name: str) -> MatchData | None:
    """Random images and labels for the learned refinement of the vision case (none for text)."""
    model = CASES[name]()
    if not hasattr(model.config, "image_size"):
        return None
    gen = torch.Generator().manual_seed(0)
    c, s = model.config.num_channels, model.config.image_size
    return MatchData(model, [{"pixel_values": torch.randn(32, c, s, s, generator=gen),
                              "labels": torch.randint(0, model.config.num_labels, (32,), generator=gen)} for _ in range(4)])


def match_and_apply(source, anchor, layout, variant: str, data=None, tied=None) -> tuple[dict, dict]:
    """(seconds per stage plus apply and total, matched state) for one matching run."""
    start = time.perf_counter()
    result = match_models(source, anchor, layout, variant, data=data, tied=tied)
    apply_start = time.perf_counter()
    matched = apply_transform(source, layout, result.transform)
    end = time.perf_counter()
    return {**result.seconds, "apply": end - apply_start, "total": end - start}, matched


def time_variant(source, anchor, layout, variant: str, repeats: int, data=None, tied=None) -> dict:
    """Median seconds over `repeats` runs, then the peak memory of one more run.

    The memory sampler is a Python thread that wakes every 2 ms; on a 2-core machine it
    preempts one of the two BLAS threads and slows the large matrix products by ~30%, so
    timed runs go without it.
    """
    runs = [match_and_apply(source, anchor, layout, variant, data, tied)[0] for _ in range(repeats)]
    row = {key: statistics.median(run.get(key, 0.0) for run in runs) for key in runs[0]}
    row["best_total"] = min(run["total"] for run in runs)
    with PeakMemory() as memory:
        _, matched = match_and_apply(source, anchor, layout, variant, data, tied)
    row["peak"] = memory.peak
    row["dist_before"] = distance(source, anchor)["total"]
    row["dist_after"] = distance(matched, anchor)["total"]
    return row


def llama_layer_residual(calibration: float, hidden: int = 4096, ffn: int = 11008) -> None:
    """One Llama-2-7B-sized layer's share of a residual alternation (its cross product at d = 4096) and the
    residual solves at d = 4096, each timed once."""
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (hidden, hidden), "k": (hidden, hidden), "v": (hidden, hidden), "o": (hidden, hidden),
              "gate": (ffn, hidden), "up": (ffn, hidden), "down": (hidden, ffn)}
    axes = {"q": (1,), "k": (1,), "v": (1,), "o": (0,), "gate": (1,), "up": (1,), "down": (0,)}
    states = [{k: torch.randn(s, generator=gen) * hidden ** -0.5 for k, s in shapes.items()} for _ in range(2)]
    stream = StreamLayout(hidden=hidden, axes=tuple(axes.items()), norm="rmsnorm", folds=(), gains=(), nonlinear=(),
                          tied_final=False, read_out=True)
    rows = []
    start = time.perf_counter()
    m, g = residual_cross(states[0], states[1], stream)
    rows.append(("cross product of one layer (7 maps)", time.perf_counter() - start))
    for group in ("orthogonal", "orthogonal_centred", "signed_permutation"):
        start = time.perf_counter()
        solve_residual(m, group, g)
        rows.append((f"solve: {group}", time.perf_counter() - start))
    print("\n| Llama-2-7B layer shape (hidden 4096, FFN 11008) | seconds | x calibration |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / calibration:.0f}x |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise", type=float, default=0.01, help="noise std relative to each tensor's std")
    parser.add_argument("--cases", nargs="*", default=list(CASES) + ["llama-2-7b-layer"])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--anchor", help="a trained model's folder: with --source, the case `folders`")
    parser.add_argument("--source", help="a second trained model of the anchor's architecture")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if bool(args.anchor) != bool(args.source):
        parser.error("--anchor and --source go together")
    if args.threads:
        torch.set_num_threads(args.threads)
    calibration = calibration_seconds()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; stage seconds are medians of {args.repeats} "
          f"runs, best total is the fastest run (shared machines vary by +-20% from run to run); calibration GEMM "
          f"{calibration * 1000:.0f} ms ({2 * 2048 ** 3 / calibration / 1e9:.0f} GFLOP/s)\n")
    header = ("case", "variant", "qk s", "vo s", "rescale s", "heads s", "ffn s", "residual s", "refine s", "apply s",
              "total s", "best total s", "x calibration", "x rotation", "peak extra MB", "2 models MB", "peak/2models",
              "dist before", "dist after")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    cases = [(c, lambda c=c: (*make_pair(c, args.noise), None), synthetic_data(c)) for c in args.cases if c in CASES]
    if args.anchor:
        cases.append(("folders", lambda: folder_pair(args.anchor, args.source), None))
    for case, pair, data in cases:
        source, anchor, layout, tied = pair()
        model_mb = 2 * sum(v.numel() * v.element_size() for v in anchor.values()) / 2**20
        rotation = None
        for variant in args.variants:
            if variant.endswith("learned") and data is None:
                continue
            r = time_variant(source, anchor, layout, variant, args.repeats, data, tied)
            rotation = r["total"] if variant == "rotation" else rotation
            peak_mb = r["peak"] / 2**20
            cells = (case, variant, *(f"{r.get(k, 0):.3f}" for k in ("qk", "vo", "rescale", "heads", "ffn", "residual",
                                                                        "refine", "apply", "total", "best_total")),
                     f"{r['best_total'] / calibration:.3g}x", "-" if rotation is None else f"{r['total'] / rotation:.2f}x",
                     f"{peak_mb:.0f}", f"{model_mb:.0f}", f"{peak_mb / model_mb:.2f}",
                     f"{r['dist_before']:.1f}", f"{r['dist_after']:.1f}")
            print("| " + " | ".join(cells) + " |", flush=True)
    if "llama-2-7b-layer" in args.cases:
        llama_layer_residual(calibration)


if __name__ == "__main__":
    main()
