"""Benchmark: what the symmetry group can reach between two decoders, the learned refinement as an oracle (issue 54).

For each pair of end models (source:anchor) and each variant, the source is matched onto the anchor and the loss path
between them (11 points) is scored on the task's test blocks; the tables give both barriers (above the straight line,
Generalized LMC's; max - min, the paper's) per pair, their mean over the pairs with its 95% t interval, and the mean
of the per-pair ratios to the unmatched barrier ("none", always run) with its 95% t interval, as docs/decoders.md's
plateau tables do. A variant is
    none                              the source as trained
    PRESET                            a matching preset (full_symmetry, full_symmetry_untie, full_symmetry_learned, ...)
    PRESET:KEY=VALUE,...              with MatchConfig fields overridden (refine_steps=1000, refine_group=general,
                                      refine_lr=0.05, ...), and for a preset that reads data: batches=N (statistic
                                      batches, default symfusion-match's 200) of split=train|validation|test (default
                                      symfusion-match's train). split=test is the oracle: the refinement fits the very
                                      blocks the barrier is scored on (the task's test blocks in batches of its
                                      fusion_batch_size, cycled), so no map of its group that this optimiser finds from
                                      the data-free start gives a lower barrier on them: a bound, never a result.
A tied decoder matched with an untie preset is scored against its anchor untied (io/untie.py, the same function),
as symfusion-barrier does. Each (pair, variant) is cached as JSON under --out with its resolved matching config, so a
rerun computes only what is missing or changed. CPU seconds are the process's (run it with one thread).
    python benchmarks/bench_decoder_oracle.py --models /work/plateau-models/llama_mini --task lm_english_plateau \\
        --variants full_symmetry_untie full_symmetry_untie_learned:split=test,refine_steps=1000 \\
        --out benchmarks/out/decoder_oracle/llama_mini [--against full_symmetry_untie]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from pathlib import Path

import torch

import symfusion
import symfusion.pipeline.tasks.base as task_base
from symfusion.errors import SymfusionError
from symfusion.interpolation import loss_path
from symfusion.io.modelio import load_model
from symfusion.io.provenance import cpu_model
from symfusion.io.untie import is_tied, untied
from symfusion.matching import MatchConfig, matching_config
from symfusion.pipeline.config import load_group
from symfusion.pipeline.report.spread import over_pairs
from symfusion.pipeline.stages.match import Match
from symfusion.pipeline.tasks import make_task

PAIRS = ["seed1:seed0", "seed2:seed0", "seed2:seed1"]
KEYS = ("barrier_linear", "barrier")                       # above the straight line, max - min
TITLES = {"barrier_linear": "above the straight line", "barrier": "max - min"}


def parse_variant(variant: str) -> tuple[MatchConfig | None, str, int]:
    """(matching config, data split, data batches) of a variant; None for "none". Unknown fields, a split of no
    task's or data options on a preset that reads none end in SystemExit."""
    preset, _, rest = variant.partition(":")
    if preset == "none":
        if rest:
            raise SystemExit(f"variant {variant!r}: none takes no settings")
        return None, Match.data_split, Match.data_batches
    settings = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"variant {variant!r}: settings are KEY=VALUE, got {item!r}")
        settings[key] = value
    split = settings.pop("split", Match.data_split)
    batches = int(settings.pop("batches", Match.data_batches))
    if split not in ("train", "validation", "test"):
        raise SystemExit(f"variant {variant!r}: split={split} (train, validation or test)")
    try:
        base = matching_config(preset)
    except SymfusionError as error:
        raise SystemExit(f"variant {variant!r}: {error}") from None
    fields = {f.name: f for f in dataclasses.fields(base)}
    overrides = {}
    for key, value in settings.items():
        if key not in fields:
            raise SystemExit(f"variant {variant!r}: {key} is no matching setting")
        overrides[key] = value_of(value, getattr(base, key))
    try:
        config = dataclasses.replace(base, **overrides)
    except SymfusionError as error:
        raise SystemExit(f"variant {variant!r}: {error}") from None
    if not config.needs_data and (split != Match.data_split or batches != Match.data_batches):
        raise SystemExit(f"variant {variant!r}: {preset} reads no data; split= and batches= are for a learned preset")
    return config, split, batches


def value_of(text: str, like):
    """A setting's value as the type of its default (None defaults: a number where it reads as one, else the word)."""
    if isinstance(like, bool) or text in ("true", "false"):
        return text == "true"
    if isinstance(like, int):
        return int(text)
    if isinstance(like, float):
        return float(text)
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


@contextlib.contextmanager
def readable_test_split():
    """The task's statistic batches may come from its test split inside the block (the oracle's data)."""
    old = task_base.STATISTICS_SPLITS
    task_base.STATISTICS_SPLITS = old + ("test",)
    try:
        yield
    finally:
        task_base.STATISTICS_SPLITS = old


def data_of(task, source_dir: str, split: str, batches: int) -> list[dict]:
    """`batches` statistic batches of `split` as symfusion-match reads them (the source's tokenizer, seeded order);
    a split smaller than that gives all its blocks (the refinement cycles them)."""
    with readable_test_split() if split == "test" else contextlib.nullcontext():
        return task.statistic_batches(batches, source_dir, split)


def scored_path(source, anchor, config: MatchConfig | None, data, evaluate) -> tuple[dict, dict]:
    """(the loss path between the anchor and the matched source, the match report without its transform, with the
    match's CPU seconds): a tied anchor is untied where the matched source is (the same function)."""
    report, matched, cpu = {}, source, time.process_time()
    if config is not None:
        matched, report = symfusion.align(source, anchor, matching=config, data=data)
        report.pop("transform", None)
    report["match_cpu_seconds"] = time.process_time() - cpu
    if is_tied(anchor) and not is_tied(matched):
        anchor = untied(anchor)
    anchor_state = {k: v.detach().clone() for k, v in anchor.state_dict().items()}
    moved = {k: v.detach().clone() for k, v in matched.state_dict().items()}
    return loss_path(matched, anchor_state, moved, evaluate), report


def run(models: Path, task, pair: str, variant: str, out: Path) -> dict:
    """One (pair, variant): cached under out/pair/variant.json with the config it was made with."""
    config, split, batches = parse_variant(variant)
    made_with = {"task": task.name, "split": split, "batches": batches,
                 "config": None if config is None else config.as_report()}
    path = out / pair.replace(":", "-onto-") / f"{variant.replace('/', '_')}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("made_with") == made_with:
            return cached
    src_name, anc_name = pair.split(":")
    source_dir, anchor_dir = str(models / src_name), str(models / anc_name)
    source, anchor = load_model(source_dir), load_model(anchor_dir)
    data = data_of(task, source_dir, split, batches) if config is not None and config.needs_data else None
    cpu = time.process_time()
    result, report = scored_path(source, anchor, config, data,
                                 lambda m: task.evaluate(m, "test", model_dir=source_dir))
    residual = report.get("residual") or {}
    record = {"variant": variant, "pair": pair, "made_with": made_with, "cpu_seconds": time.process_time() - cpu,
              "match_cpu_seconds": report["match_cpu_seconds"], "data_batches": None if data is None else len(data),
              "folded_distance": residual.get("folded_distance"),
              "folded_distance_refined": residual.get("folded_distance_refined"), "refine": residual.get("refine"),
              "barrier": result["barrier"], "barrier_linear": result["barrier_linear"],
              "path": [{"alpha": p["alpha"], "loss": p["loss"]} for p in result["path"]]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    return record


def spread_cell(values: dict, digits: int = 3, scale: float = 1.0, sign: str = "", unit: str = "") -> str:
    """The mean over the pairs with its 95% t interval (the mean alone for one pair)."""
    s = over_pairs(values)
    cell = lambda x: f"{scale * x:{sign}.{digits}f}"
    return cell(s["mean"]) + unit + ("" if s["low"] is None else f" [{cell(s['low'])}, {cell(s['high'])}]")


def tables(records: dict, pairs: list[str], against: str | None) -> str:
    """Markdown: per barrier definition, each variant's per-pair values, mean [95% t], % of unmatched [95% t]; then
    each variant minus `against` per pair and over the pairs; then the refinement's own midpoint losses and costs."""
    lines = []
    for key in KEYS:
        lines += ["", f"| {TITLES[key]} | " + " | ".join(pairs) + " | mean [95% t] | % of unmatched [95% t] |",
                  "|---|" + "---|" * (len(pairs) + 2)]
        for variant, rows in records.items():
            values = {p: rows[p][key] for p in pairs}
            ratios = {p: rows[p][key] / records["none"][p][key] for p in pairs}
            lines.append(f"| {variant} | " + " | ".join(f"{values[p]:.3f}" for p in pairs) +
                         f" | {spread_cell(values)} | {spread_cell(ratios, 1, 100.0, unit='%')} |")
    if against is not None:
        lines += ["", f"| minus {against} (above the line; max - min) | " + " | ".join(pairs) +
                  " | mean [95% t] | max - min, mean [95% t] |", "|---|" + "---|" * (len(pairs) + 2)]
        for variant, rows in records.items():
            if variant == against:
                continue
            diffs = {key: {p: rows[p][key] - records[against][p][key] for p in pairs} for key in KEYS}
            lines.append(f"| {variant} | " + " | ".join(f"{diffs['barrier_linear'][p]:+.3f}" for p in pairs) +
                         f" | {spread_cell(diffs['barrier_linear'], sign='+')} | "
                         f"{spread_cell(diffs['barrier'], sign='+')} |")
    lines += ["", "| variant | midpoint test loss per pair | refinement's midpoint loss on its first batches, before -> "
              "after (kept) | data batches | folded distance (descent -> refined) | CPU s per pair: match, all |", "|---|---|---|---|---|---|"]
    for variant, rows in records.items():
        mid = " / ".join(f"{next(q['loss'] for q in rows[p]['path'] if abs(q['alpha'] - 0.5) < 1e-9):.3f}"
                         for p in pairs)
        refine = " / ".join(f"{rows[p]['refine']['midpoint_loss_before']:.3f} -> "
                            f"{rows[p]['refine']['midpoint_loss_after']:.3f} ({rows[p]['refine']['kept']})"
                            for p in pairs) if all(rows[p].get("refine") for p in pairs) else ""
        batches = " / ".join(str(rows[p]["data_batches"]) for p in pairs) if rows[pairs[0]]["data_batches"] else ""
        distance = " / ".join(f"{rows[p]['folded_distance']:.1f}" + (f" -> {rows[p]['folded_distance_refined']:.1f}"
                              if rows[p].get("folded_distance_refined") is not None else "") for p in pairs) \
            if all(rows[p].get("folded_distance") is not None for p in pairs) else ""
        cpu = " / ".join(f"{rows[p]['match_cpu_seconds']:.0f}, {rows[p]['cpu_seconds']:.0f}" for p in pairs)
        lines.append(f"| {variant} | {mid} | {refine} | {batches} | {distance} | {cpu} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True, help="the folder holding the end models seed0, seed1, ...")
    parser.add_argument("--task", default="lm_english_plateau", help="a causal_lm task (its test blocks score the paths)")
    parser.add_argument("--pairs", nargs="*", default=PAIRS, help="source:anchor")
    parser.add_argument("--variants", nargs="*", default=["full_symmetry_untie",
                                                          "full_symmetry_untie_learned:split=test,refine_steps=1000"])
    parser.add_argument("--against", default=None, help="a variant the others are paired with (differences over pairs)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/decoder_oracle"))
    args = parser.parse_args()
    variants = ["none"] + [v for v in args.variants if v != "none"]
    if args.against is not None and args.against not in variants:
        raise SystemExit(f"--against {args.against}: not among the variants")
    for variant in variants:
        parse_variant(variant)                                       # every mistake before the first computation
    torch.set_num_threads(1)
    task = make_task(args.task, load_group("profile", "mini"))
    records = {}
    for variant in variants:
        records[variant] = {}
        for pair in args.pairs:
            r = run(args.models, task, pair, variant, args.out)
            records[variant][pair] = r
            print(f"{pair} {variant}: barrier {r['barrier_linear']:.4f} above the line, {r['barrier']:.4f} max - min "
                  f"({r['cpu_seconds']:.0f} CPU s)", flush=True)
    print(f"\n{args.models} ({', '.join(args.pairs)}), task {args.task}, its test blocks; {cpu_model() or 'unknown CPU'}, "
          f"{torch.get_num_threads()} thread")
    print(tables(records, args.pairs, args.against))


if __name__ == "__main__":
    main()
