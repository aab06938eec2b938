"""Driver run in Generalized LMC's environment: their data-free weight matching on two GPT-2 folders, and its curves' per-block losses.

    VENV/bin/python benchmarks/glmc/glmc_driver.py --checkout DIR --anchor DIR --source DIR \
        --blocks blocks.safetensors --output curves.json [--points 11] [--iterations 15] [--seed 0]

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

Each point is scored on the given blocks as symfusion scores a causal LM (lm_models.evaluate_causal_lm): the summed
next-token cross-entropy of each block (tokens 1..L-1 from those before them), in float64 sums. The blocks come
from bench_glmc.py (our test split, cut with our tokenizer). Written: JSON {forms: {name: {alphas, block_loss
(points x blocks), seconds}}, tokens_per_block, versions}. The output must not exist; nothing else is written.
This file is our own code; it runs only inside their environment and is not imported by symfusion.
"""
from __future__ import annotations

import argparse
import copy
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
    args = parser.parse_args()
    if os.path.exists(args.output):
        print(f"error: {args.output} exists; give a new file", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(args.checkout))
    from merger import GPTMerger                  # their package: importable only with --checkout on the path
    import transformers
    from safetensors.torch import load_file

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    blocks = load_file(args.blocks)["blocks"].long()
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
    }
    forms = {}
    for name in args.forms:
        start = time.perf_counter()
        rows = builders[name]()
        forms[name] = {"alphas": alphas, "block_loss": rows, "seconds": time.perf_counter() - start}
        print(f"{name}: {forms[name]['seconds']:.1f} s", file=sys.stderr)
    result = {"anchor": args.anchor, "source": args.source, "forms": forms, "tokens_per_block": blocks.shape[1] - 1,
              "blocks": blocks.shape[0], "iterations": args.iterations, "seed": args.seed,
              "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    with open(args.output, "x") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
