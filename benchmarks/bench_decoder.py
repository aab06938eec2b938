"""Benchmark: decoder matching at true 7B layer shapes (per-stage seconds per layer) and peak memory on sharded folders.

    python benchmarks/bench_decoder.py solves [--cases llama2-7b llama3-8b] [--pairs finetune unrelated]
    python benchmarks/bench_decoder.py memory --case llama2-7b --layers 4 --workdir /tmp/bench7b [--reuse]

solves: one layer's tensors at full size (Llama-2-7B: hidden 4096, 32 heads, FFN 11008; Llama-3-8B: 8 KV
heads, FFN 14336), float32. The anchor layer is random (std 0.02); the source is the anchor moved by a
random symmetry plus noise of 0.1 x each tensor's std ("finetune", where the FFN's row argmax is already a
permutation) or an independent random layer ("unrelated", where the assignment solver runs). Each stage is
timed once (heads, QK, VO, rescale, FFN cross products, FFN assignment, apply), then extrapolated by the
layer count. Machines differ and this one is shared, so every time is also given as a ratio to a float32
4096^3 GEMM (numpy's BLAS, the one the FFN products use) measured in the same run, before and after.

memory: writes an anchor and a source folder at 7B layer shapes with --layers layers, bfloat16, in shards of
at most 1 GiB (index + config, as save_pretrained writes them), then aligns them with symfusion.align() in a
child process whose peak resident memory (anonymous, and total including mapped shard pages) is sampled.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import transformers as tf

from symfusion.arch import layout_of
from symfusion.matching import match_models
from symfusion.matching.permutation import ffn_cross, max_assignment
from symfusion.measures import distance
from symfusion.alignment.sharded import INDEX, ShardWriter
from symfusion.symmetry import apply_transform, random_transform

CASES = {
    "llama2-7b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, intermediate_size=11008,
                      num_hidden_layers=32, vocab_size=32000),
    "llama3-8b": dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                      num_hidden_layers=32, vocab_size=128256),
}


def calibration_gemm() -> float:
    """Seconds of one float32 4096^3 GEMM in numpy (best of 2)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4096, 4096), dtype=np.float32), rng.standard_normal((4096, 4096), dtype=np.float32)
    best = math.inf
    for _ in range(2):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return best


def config_of(case: str, layers: int | None = None) -> tf.LlamaConfig:
    kwargs = dict(CASES[case])
    if layers is not None:
        kwargs["num_hidden_layers"] = layers
    return tf.LlamaConfig(tie_word_embeddings=False, architectures=["LlamaForCausalLM"], **kwargs)


def layer_specs(config) -> dict[str, torch.Tensor]:
    """Every tensor of the model as a meta tensor (names and shapes as transformers saves them)."""
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(config)
    return {k: v for k, v in model.state_dict().items()}


def random_layer(specs: dict, prefix: str, gen: torch.Generator, dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Random tensors for the keys under `prefix` (norm weights near 1, matrices std 0.02)."""
    out = {}
    for key, spec in specs.items():
        if key.startswith(prefix):
            base = torch.ones(spec.shape) if spec.dim() == 1 else torch.zeros(spec.shape)
            out[key] = (base + 0.02 * torch.randn(spec.shape, generator=gen)).to(dtype)
    return out


def drifted(state: dict, gen: torch.Generator, noise: float) -> dict:
    """Each tensor plus Gaussian noise of `noise` x its std (a fine-tune's drift)."""
    return {k: v + noise * v.float().std() * torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in state.items()}


# ---------------------------------------------------------------- per-layer solves at full size

def solve_one_layer(case: str, pair: str, noise: float = 0.1) -> dict:
    config = config_of(case, layers=1)
    specs = {k: v for k, v in layer_specs(config).items() if ".layers.0." in k}
    gen = torch.Generator().manual_seed(0)
    anchor = random_layer(specs, "model.layers.0.", gen)
    layout = layout_of(config, anchor)
    if pair == "finetune":
        source = drifted(apply_transform(anchor, layout, random_transform(layout, seed=1)), gen, noise)
    else:
        source = random_layer(specs, "model.layers.0.", gen)
    row = {"case": case, "pair": pair}
    result = match_models(source, anchor, layout, "attn_only")                  # heads, qk, vo, rescale
    row.update({k: result.seconds.get(k, 0.0) for k in ("heads", "qk", "vo", "rescale")})
    ffn = layout.layers[0].ffn
    start = time.perf_counter()
    cross = ffn_cross(source, anchor, ffn)
    row["ffn cross"] = time.perf_counter() - start
    row["greedy is a permutation"] = bool(np.unique(cross.argmax(axis=1)).size == cross.shape[0])
    start = time.perf_counter()
    perm = max_assignment(cross)
    row["ffn assignment"] = time.perf_counter() - start
    del cross
    transform = result.transform
    transform.layers[0].ffn_perm = perm
    start = time.perf_counter()
    matched = apply_transform(source, layout, transform)
    row["apply"] = time.perf_counter() - start
    row["dist before"] = distance(source, anchor)["total"]
    row["dist after"] = distance(matched, anchor)["total"]
    return row


def solves(args) -> None:
    stages = ("heads", "qk", "vo", "rescale", "ffn cross", "ffn assignment", "apply")
    cal_start = calibration_gemm()
    rows = [solve_one_layer(case, pair) for case in args.cases for pair in args.pairs]
    cal_end = calibration_gemm()
    cal = (cal_start + cal_end) / 2
    print(f"torch {torch.__version__}, numpy {np.__version__}, {torch.get_num_threads()} torch threads; calibration "
          f"float32 4096^3 GEMM: {cal_start:.3f} s before, {cal_end:.3f} s after ({2 * 4096**3 / cal / 1e9:.0f} GFLOP/s); "
          "x cal = seconds / calibration seconds\n")
    header = ["case", "pair", "stage", "s / layer", "x cal", "layers", "extrapolated s", "extrapolated x cal"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        layers = CASES[row["case"]]["num_hidden_layers"]
        for stage in stages + ("total",):
            s = sum(row[k] for k in stages) if stage == "total" else row[stage]
            print(f"| {row['case']} | {row['pair']} | {stage} | {s:.2f} | {s / cal:.2f} | {layers} | {s * layers:.0f} | "
                  f"{s * layers / cal:.0f} |")
    print()
    for row in rows:
        print(f"{row['case']} {row['pair']}: FFN row argmax is a permutation: {row['greedy is a permutation']}; "
              f"layer distance {row['dist before']:.2f} -> {row['dist after']:.2f}")


# ---------------------------------------------------------------- peak memory on real sharded folders

SHARD_BYTES = 2**30


def write_pair(case: str, layers: int, workdir: Path, noise: float = 0.1) -> tuple[Path, Path]:
    """Anchor and source folders (bfloat16, <= 1 GiB shards, index, config), written layer by layer."""
    config = config_of(case, layers)
    specs = {k: v.to(torch.bfloat16) for k, v in layer_specs(config).items()}
    layout = layout_of(config, specs)
    shards, size, current = {}, 0, 0
    for key, spec in specs.items():                      # consecutive keys, <= SHARD_BYTES per shard
        nbytes = spec.numel() * 2
        if size and size + nbytes > SHARD_BYTES:
            current, size = current + 1, 0
        shards[key], size = current, size + nbytes
    count = current + 1
    names = {i: f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)}
    folders = {"anchor": workdir / "anchor", "source": workdir / "source"}
    writers = {}
    for role, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        config.save_pretrained(str(folder))
        writers[role] = {i: ShardWriter(folder / names[i], {k: specs[k] for k in specs if shards[k] == i}, {"format": "pt"})
                         for i in range(count)}
        weight_map = {k: names[shards[k]] for k in specs}
        total = sum(v.numel() * 2 for v in specs.values())
        (folder / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    gen = torch.Generator().manual_seed(0)
    planted = random_transform(layout, seed=1)
    prefixes = [f"model.layers.{i}." for i in range(layers)] + [""]
    for i, prefix in enumerate(prefixes):
        keys = [k for k in specs if (k.startswith(prefix) if prefix else ".layers." not in k)]
        anchor = random_layer({k: specs[k] for k in keys}, prefix, gen)
        source = apply_transform(anchor, layout, planted.restrict([i])) if prefix else anchor
        source = drifted(source, gen, noise)
        for role, state in (("anchor", anchor), ("source", source)):
            for key in keys:
                writers[role][shards[key]].write(key, state[key].to(torch.bfloat16))
    for role in writers:
        for writer in writers[role].values():
            writer.close()
    return folders["source"], folders["anchor"]


def sample_memory(pid: int, peaks: dict, running: threading.Event) -> None:
    """Peak VmRSS and RssAnon (kB) of a process, sampled every 20 ms."""
    while running.is_set():
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        except (FileNotFoundError, ProcessLookupError):
            return
        for name in ("VmRSS", "RssAnon"):
            if name in fields:
                peaks[name] = max(peaks.get(name, 0), int(fields[name].split()[0]))
        time.sleep(0.02)


def memory(args) -> None:
    workdir = Path(args.workdir)
    cal_start = calibration_gemm()
    start = time.perf_counter()
    if args.reuse and (workdir / "source" / INDEX).is_file() and (workdir / "anchor" / INDEX).is_file():
        source, anchor = workdir / "source", workdir / "anchor"          # written by an earlier run
    else:
        source, anchor = write_pair(args.case, args.layers, workdir)
    written = time.perf_counter() - start
    output = workdir / "matched"
    code = ("import json, sys, symfusion; _, r = symfusion.align(sys.argv[1], sys.argv[2], matching=sys.argv[4], "
            "output=sys.argv[3], in_memory=False); r.pop('transform'); print(json.dumps(r))")
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code, str(source), str(anchor), str(output), args.matching],
                             stdout=subprocess.PIPE, text=True)
    peaks, running = {}, threading.Event()
    running.set()
    sampler = threading.Thread(target=sample_memory, args=(child.pid, peaks, running), daemon=True)
    sampler.start()
    out, _ = child.communicate()
    running.clear()
    seconds = time.perf_counter() - start
    if child.returncode:
        raise SystemExit(f"align failed with exit code {child.returncode}")
    report = json.loads(out.strip().splitlines()[-1])
    cal_end = calibration_gemm()
    folder_gb = sum(p.stat().st_size for p in source.glob("*.safetensors")) / 1e9
    shards = len(list(source.glob("*.safetensors")))
    full = config_of(args.case)
    full_gb = sum(v.numel() for v in layer_specs(full).values()) * 2 / 1e9
    print(f"calibration float32 4096^3 GEMM: {cal_start:.3f} s before, {cal_end:.3f} s after; folders written in {written:.0f} s")
    header = ["case", "layers", "shards", "matching", "one model GB", "two models GB", "peak anon GB", "peak RSS GB",
              "peak anon / two models", "align s", "block check max rel", "dist before", "dist after",
              f"full {args.case}: two models GB", "peak anon / full pair"]
    cells = [args.case, args.layers, shards, args.matching, f"{folder_gb:.2f}", f"{2 * folder_gb:.2f}",
             f"{peaks.get('RssAnon', 0) / 1e6:.2f}", f"{peaks.get('VmRSS', 0) / 1e6:.2f}",
             f"{peaks.get('RssAnon', 0) / 1e6 / (2 * folder_gb):.2f}", f"{seconds:.0f}",
             f"{report['max_block_relative_output_change']:.2e}", f"{report['distance_before']:.1f}",
             f"{report['distance_after']:.1f}", f"{2 * full_gb:.1f}", f"{peaks.get('RssAnon', 0) / 1e6 / (2 * full_gb):.3f}"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    print("| " + " | ".join(str(c) for c in cells) + " |")
    print("seconds by stage:", {k: round(v, 1) for k, v in report["seconds_by_stage"].items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("solves")
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--pairs", nargs="*", default=["finetune", "unrelated"])
    p = sub.add_parser("memory")
    p.add_argument("--case", default="llama2-7b", choices=list(CASES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--matching", default="rotation")
    p.add_argument("--workdir", required=True)
    p.add_argument("--reuse", action="store_true", help="reuse the folders an earlier run wrote in --workdir")
    args = parser.parse_args()
    solves(args) if args.command == "solves" else memory(args)


if __name__ == "__main__":
    main()
