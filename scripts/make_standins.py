#!/usr/bin/env python
"""Write the rehearsal profile's stand-ins: tiny models and small local Parquet datasets of the paper profile's Hub sources.

    python scripts/make_standins.py [DIR] [--seed 0]      # DIR defaults to .cache/symfusion/standins

DIR gets models/<conf model name>/ (save_pretrained folders, safetensors, with tokenizers),
datasets/<hub org>__<hub name>/ (Parquet laid out as on the Hub) and manifest.json, the one mapping a
profile consumes: "models": {conf model name: {"base_model": folder}} and "tasks": {conf task name:
{"options": {"dataset": folder}}}. Deterministic for a seed and library versions; a folder that is up to
date is left alone; DIR must be new, empty or made by this script. No network. See symfusion.pipeline.data.standins and
docs/data_card.md ("Stand-ins").
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")               # never reach the Hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from symfusion.errors import SymfusionError  # noqa: E402
from symfusion.pipeline.data.standins import DEFAULT_OUTPUT, build_standins  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", nargs="?", default=DEFAULT_OUTPUT, help=f"output folder (default {DEFAULT_OUTPUT})")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import datasets
    import torch

    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    start = time.perf_counter()
    try:
        manifest = build_standins(args.output, seed=args.seed)
    except SymfusionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"stand-ins: {len(manifest['models'])} models, {len(manifest['tasks'])} tasks, {len(manifest['files'])} files "
          f"in {args.output} ({time.perf_counter() - start:.1f} s); manifest: {os.path.join(args.output, 'manifest.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
