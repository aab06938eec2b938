"""Benchmark: what moves the data-free whole-symmetry optimum (issue 33), measured over several end-model pairs.

Each variant matches every pair (source onto anchor), merges by Simple fusion and evaluates the merge on the
test split and the loss path (11 points); the table gives each variant's effect against full_symmetry's on the
simple merge's metric and on both barriers (the paper's max - min, Generalized LMC's max above the straight
line), averaged over the pairs, with 95% paired bootstrap intervals (pipeline/uncertainty.py: the same
resamples of the test examples for both variants; a barrier is recomputed on every resample), and each variant's
mean barrier over the pairs as a percentage of the unmatched models' (both definitions). Variants:
    none, rotation           no matching; the paper's matching
    full_symmetry            the default (matching/whole.py)
    full_symmetry_learned    the learned refinement on it, on the batches symfusion-match reads by default
                             (symfusion-match's Match declaration: data_batches of data_split, the source's own preprocessing)
    full_symmetry_synthetic  the library's data-free refinement (matching/synthetic.py: distilled on smooth noise)
    full_symmetry_synthetic:refine_group=general,refine_steps=600
                             the same with matching settings overridden (as the learned variant's below; its
                             inputs made for refine_steps steps)
    full_symmetry_learned:refine_gains_lr=1,refine_distill=0
                             the same with matching settings overridden (numbers, words); batches=N reads N batches,
                             join=K concatenates each K of them into one step's batch; average=F averages the
                             refinement's coordinates over its last F of steps (SWA); select=K keeps, of every
                             K-th iterate (and the last), the one with the least midpoint task loss on 16
                             validation batches (Generalized LMC's choice among checkpoints on held-out data);
                             biases=F learns the ViT's bias translations (VARIANT+biases) at F x lr, from 0;
                             scale=F learns the ViT's residual-stream scale (VARIANT+scale) at F x lr, from 1;
                             minimax=F is matching.refine_minimax=[0.5 - F, 0.5, 0.5 + F] (each step at the highest
                             of the three points on its batch instead of the midpoint), minimax_points=N N points
                             evenly from 0.5 - F to 0.5 + F (the ViT's default: 0.2, 3), minimax=off none (each
                             step at alpha drawn in refine_alphas: the midpoint);
                             ffn_acts=N re-chooses each FFN permutation on N batches' neuron outputs first;
                             split=test refines on the test split (an oracle: the floor of the group, not a result);
                             inputs=K (gauss, smooth, smoother, blur with width=N, pink) refines on noise images
                             instead, distilled only (how full_symmetry_synthetic's images were chosen; its
                             decoders' text: the library's, run as full_symmetry_synthetic)
    fan_in                   each map (no embedding table) / sqrt(its fan-in) in the objective
    glmc_weights             each tensor / sqrt(its size off the stream), Generalized LMC's weighting (its code)
    no_rescale               matching.rescale=false
    glmc_ffn                 FFN permutations on Generalized LMC's neuron cost (its code): the L1 distance between
                             unit-normalised neuron vectors [input row, bias, (gate row, bias,) output column]
    glmc_both                glmc_weights and glmc_ffn together
    circuits                 heads assigned on QK/OV circuit inner products <W_Q^T W_K, ..> + <W_O W_V, ..>
    identity_start           the descent started from R = I (the paper's matching's basis)
    multi_start              starts: weights, R = I, three jittered weights starts; least folded distance
    multi_start_no_rescale   both
    soft_1e-1, soft_1e-3     the regularised start with eps = 1e-1 / 1e-3 s_max (default 1e-2)
    embeddings_0.5           decoders: embeddings (tied lm_head) weighed by 0.5 in the objective
    mask_unseen              decoders: embedding rows of tokens absent from the train split left out (needs data)
    first_attention_2        the first layer's attention maps (Q/K/V/O, biases) times 2 in both models: x4 in the
                             objective (the first layer's attention carries most of the barrier: bench_barrier_parts.py)
    first_input_weights      the first layer's Q/K/V maps seen through their input: each model's readers times
                             S = Sigma^(1/2), Sigma the covariance of that model's normalised layer-0 input (positions,
                             class token, patch projection of unit-variance pixels: the weights only, data-free)
    first_input_acts         the same with Sigma measured on the matching's batches (its first 20; an oracle)
    learned_on:VARIANT       full_symmetry_learned's refinement from VARIANT's descent (a data-free variant above)
    anchor_gains             the source unfolded with the anchor's norm gains (where nonzero) instead of the gains
                             closest to the anchor as stored: the merge's folded form is then the average of the
                             two folded forms (the path in the folded gauge)
    VARIANT+biases           VARIANT, then the source's norm and value biases translated onto the anchor's (ViT; exact)
    VARIANT+scale            VARIANT, then the source's residual stream times the c > 0 that brings its writers
                             closest to the anchor's (least squares; every reader is a LayerNorm: exact up to eps)
    VARIANT+scale_norm       the same with c the ratio of the two models' writer norms (equal stream magnitudes)
The experiment hooks (circuits, starts, masks) live here, not in the library: they were measured, not kept.
Evaluations are cached as JSON under --out, so a rerun computes only what is missing (a learned variant's also
when the refinement's defaults changed since: families.py, the preset; a synthetic one's also when its own preset
or the way its inputs are made did: matching/synthetic.py's constants).
    python benchmarks/bench_whole_ablation.py --track vit --models DIR [--pairs seed1:seed0 ...] [--variants ...]
        [--split validation]   (score on the validation split instead, cached apart: to choose a setting)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch
import transformers.activations
from torch.func import functional_call

import symfusion
import symfusion.matching.compose as compose
import symfusion.matching.descent as descent
import symfusion.matching.learned as learned_module
import symfusion.matching.pairs as pairs_module
import symfusion.matching.starts as starts_module
import symfusion.matching.synthetic as synthetic
import symfusion.matching.whole as whole
import symfusion.pipeline.tasks.base as task_base
from symfusion.arch import layout_of
from symfusion.pipeline.config import load_group
from symfusion.pipeline.stages.match import Match
from symfusion.errors import SymfusionError
from symfusion.families import FAMILIES
from symfusion.fusion.ot_wts import unit_rows
from symfusion.interpolation import loss_path
from symfusion.matching import match_models, matching_config
from symfusion.matching.heads import match_heads, pair_crosses
from symfusion.matching.permutation import max_assignment
from symfusion.matching.residual import gauge_gains
from symfusion.io.modelio import load_model, load_tokenizer
from symfusion.pipeline.tasks import make_task
from symfusion.pipeline.report.spread import over_pairs
from symfusion.pipeline.uncertainty import interval, paired_effect, resamples
from symfusion.symmetry import LayerTransform, Transform, apply_transform

TRACKS = {"vit": ("fashion_mnist", 2000), "llama": ("lm_english", None)}
FULL = matching_config("full_symmetry")


@contextlib.contextmanager
def replaced(module, name: str, value):
    """module.name = value inside the block, restored after."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def circuit_heads(source, anchor, att, heads, kind="rotation"):
    """Multi-head attention: heads assigned on <C_s, C_a> of their QK circuits W_Q^T W_K and OV circuits W_O W_V
    (invariant to every within-head symmetry): <Q_s Q_a^T, K_s K_a^T> + <O_s^T O_a, V_s V_a^T> per pair."""
    c = pair_crosses(source, anchor, att, heads)
    if kind != "rotation" or c.group != 1 or att.qk_group == "rope":
        return match_heads(source, anchor, att, heads, kind)
    scores = (c.query[:, :, 0, 0] * c.key).sum((-1, -2)) + (c.value * c.output[:, :, 0, 0]).sum((-1, -2))
    perm = max_assignment(scores.T.double().contiguous().numpy())
    return None if torch.equal(perm, torch.arange(heads)) else perm


def circuit_head_solve(moved, fa, att, heads, r, source):
    """descent.head_solve with the circuit assignment (and no certificate)."""
    return circuit_heads(moved, fa, att, heads), None


def neuron_vectors(state, ffn) -> torch.Tensor:
    """Each FFN neuron's weights as one unit vector, (ffn, features) float64: its input row and bias, its gate row
    and bias (gated FFNs), its output column."""
    parts = [state[ffn.input.weight]] + ([state[ffn.input.bias][:, None]] if ffn.input.bias else [])
    if ffn.gate is not None:
        parts += [state[ffn.gate.weight]] + ([state[ffn.gate.bias][:, None]] if ffn.gate.bias else [])
    parts.append(state[ffn.output.weight].T)
    return unit_rows(torch.cat([p.double() for p in parts], dim=1))               # (ffn, features)


def glmc_ffn_solve(moved, fa, ffn, r, source):
    """descent.ffn_solve on Generalized LMC's cost (weight_matching.py: cdist p=1 of L2-normalised neuron vectors,
    an exact assignment): the permutation minimising the summed L1 distances, with no certificate."""
    cost = torch.cdist(neuron_vectors(fa, ffn), neuron_vectors(moved, ffn), p=1)   # (anchor, source)
    return max_assignment(-cost), None


def extra_starts(kinds: tuple):
    """whole.starts with the weights start and/or R = I and jittered weights starts (cross product + 0.3 x its
    mean magnitude of seeded noise), all run and the least folded distance chosen."""
    original = whole.starts

    def starts(pair, group, config, source, anchor, stream, data):
        found = list(original(pair, group, config, source, anchor, stream, data)) if "weights" in kinds else []
        m, g = starts_module.untouched_cross(pair)
        if "identity" in kinds:
            found.append(("identity", torch.eye(stream.hidden, dtype=torch.float64), True))
        for seed in (k for k in kinds if isinstance(k, int)):
            noise = torch.randn(m.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            found.append((f"jitter {seed}", *starts_module.first_map(m + 0.3 * m.abs().mean() * noise, g, group)))
        return found
    return starts


def fan_in_pair(layout):
    """StatePair with every map (a tensor of 2+ dims that is no embedding table) times 1 / sqrt(its fan-in) in
    both models (a scalar per tensor commutes with every symmetry). Not Generalized LMC's weighting: readers all
    get 1 / sqrt(d) and tables none; glmc_pair is theirs."""
    original, spec = pairs_module.StatePair.__init__, FAMILIES[layout.family]
    prefixes = [pairs_module.layer_prefix(layout, i) for i in range(layout.num_layers)]

    def table(key: str) -> bool:
        if any(key.startswith(p) for p in prefixes):
            return False
        try:
            return spec.stream_position_of(key) in ("embeddings", "class_token", "positions")
        except SymfusionError:               # keys the family places nowhere (task heads) are maps
            return False

    def init(self, fs, fa, layout, stream):
        weighed = [{k: v * math.prod(v.shape[1:]) ** -0.5 if v.is_floating_point() and v.dim() > 1 and not table(k)
                    else v for k, v in state.items()} for state in (fs, fa)]
        original(self, *weighed, layout, stream)
    return init


def glmc_pair():
    """StatePair with every tensor that meets the residual stream divided, in both models, by the square root of
    its size off the stream (numel / d per residual axis), as Generalized LMC's official code weighs R's objective
    (weight_matching.py: readers by sqrt(fan-out), writers by sqrt(fan-in), token and position tables by sqrt(rows));
    a bias off the stream takes its map's factor, so each neuron and head keeps its shape. A scalar per tensor
    commutes with every symmetry."""
    original = pairs_module.StatePair.__init__

    def init(self, fs, fa, layout, stream):
        axes, d = dict(stream.axes), stream.hidden
        factors = {k: (v.numel() / d ** len(axes[k])) ** -0.5 for k, v in fa.items()
                   if k in axes and v.is_floating_point()}
        for k, v in fa.items():
            if k not in factors and k.endswith(".bias") and k[:-5] + ".weight" in factors:
                factors[k] = factors[k[:-5] + ".weight"]
        weighed = [{k: v * factors[k] if k in factors else v for k, v in state.items()} for state in (fs, fa)]
        original(self, *weighed, layout, stream)
    return init


def embedding_rows(scale: torch.Tensor):
    """StatePair with the embedding table (and a tied lm_head) rows multiplied by `scale` in both models."""
    original = pairs_module.StatePair.__init__

    def init(self, fs, fa, layout, stream):
        fs, fa = dict(fs), dict(fa)
        for state in (fs, fa):
            for key in [k for k in state if k.endswith("embed_tokens.weight") or k == "lm_head.weight"]:
                state[key] = state[key] * scale.to(state[key].dtype)[: state[key].shape[0], None]
        original(self, fs, fa, layout, stream)
    return init


def first_attention_pair(factor: float):
    """StatePair with the first layer's attention tensors times `factor` in both models (a scalar per tensor commutes
    with every symmetry, so only the objective's weighting changes)."""
    original = pairs_module.StatePair.__init__

    def init(self, fs, fa, layout, stream):
        att = layout.layers[0].attention
        keys = set(att.qk_keys() + att.vo_keys() + att.output.keys())
        weighed = [{k: v * factor if k in keys else v for k, v in state.items()} for state in (fs, fa)]
        original(self, *weighed, layout, stream)
    return init


EMBEDDINGS = ("vit.embeddings.patch_embeddings.projection.weight", "vit.embeddings.patch_embeddings.projection.bias",
              "vit.embeddings.position_embeddings", "vit.embeddings.cls_token")


def input_covariance_from_weights(state) -> torch.Tensor:
    """The covariance of the first layer's normalised input x_hat = centred x / its rms (d x d, trace d) from the
    embeddings alone: x_t = P patch_t + b + pos_t with unit-variance, zero-mean pixels; x_0 = cls + pos_0."""
    p, b, pos, cls = (state[k].double() for k in EMBEDDINGS)
    p = p.reshape(p.shape[0], -1)                                              # (d, channels * patch^2)
    means = torch.cat([cls.reshape(1, -1) + pos[0, :1], b[None] + pos[0, 1:]])  # (tokens, d)
    second = means.T @ means / len(means) + p @ p.T * (len(means) - 1) / len(means)
    return normalised(second)


def normalised(second: torch.Tensor) -> torch.Tensor:
    """A second moment centred over the hidden axis and scaled to trace d (LayerNorm without its gain)."""
    d = second.shape[0]
    c = torch.eye(d, dtype=torch.float64) - 1.0 / d
    sigma = c @ second @ c
    return sigma * d / sigma.trace()


@torch.no_grad()
def input_covariance_from_data(model, batches) -> torch.Tensor:
    """The first layer's normalised input covariance measured on `batches` (mean of x_hat x_hat^T over tokens)."""
    total, count = 0, 0
    for batch in batches:
        x = model.vit.embeddings(batch["pixel_values"]).double().flatten(0, 1)     # (images * tokens, d)
        x = x - x.mean(1, keepdim=True)
        x = x / x.pow(2).mean(1, keepdim=True).sqrt()                              # LayerNorm without its gain
        total, count = total + x.T @ x, count + len(x)
    return normalised(total / count)


def first_input_pair(sigmas: tuple[torch.Tensor, torch.Tensor] | None):
    """StatePair with the first layer's Q/K/V maps times S = Sigma^(1/2) of their own model's input, in both models
    (sigmas: (source's, anchor's); None: from each model's embeddings). Only the objective changes: the transform
    found is applied to the models as they are."""
    original = pairs_module.StatePair.__init__

    def init(self, fs, fa, layout, stream):
        att = layout.layers[0].attention
        keys = [p.weight for p in att.query_like + att.key_like + (att.value,)]
        weighed = []
        for state, sigma in zip((fs, fa), sigmas or (None, None)):
            sigma = input_covariance_from_weights(state) if sigma is None else sigma
            values, vectors = torch.linalg.eigh(sigma)
            root = vectors @ torch.diag(values.clamp(min=0).sqrt()) @ vectors.T
            weighed.append({k: (v.double() @ root).to(v.dtype) if k in keys else v for k, v in state.items()})
        original(self, *weighed, layout, stream)
    return init


def averaging_adam(steps: int, fraction: float):
    """torch.optim.Adam that, over the last `fraction` of `steps` steps, averages its parameters and leaves the
    average in them after the last step (stochastic weight averaging of the refinement's coordinates: every
    coordinate maps to an exact symmetry, so the average is one too)."""
    first = steps - max(1, round(fraction * steps))

    class Averaging(torch.optim.Adam):
        def step(self, closure=None):
            out = super().step(closure)
            self.count = getattr(self, "count", 0) + 1
            params = [p for group in self.param_groups for p in group["params"]]
            if self.count > first:
                n = self.count - first
                self.sums = [p.detach().clone() for p in params] if n == 1 else \
                    [s + p.detach() for s, p in zip(self.sums, params)]
                if self.count == steps:
                    with torch.no_grad():
                        for p, total in zip(params, self.sums):
                            p.copy_(total / n)
            return out
    return Averaging


def selecting_adam(steps: int, every: int, held_out: list[dict], recorded: dict):
    """torch.optim.Adam that keeps, of the refinement's iterates at every `every`-th step, the one whose midpoint
    task loss on `held_out` batches is least (Generalized LMC's choice among validation checkpoints), and leaves it
    in the parameters after the last step. `recorded` holds the path and the (R, layers, gains) of its latest loss
    call, made from the parameters before the step it precedes (selected_path records them)."""

    class Selecting(torch.optim.Adam):
        def step(self, closure=None):
            self.count = getattr(self, "count", 0) + 1
            params = [p for group in self.param_groups for p in group["params"]]
            if self.count % every == 0 or self.count == steps:    # the iterate after count - 1 steps
                path, args = recorded["path"], recorded["args"]
                with torch.no_grad():
                    loss = math.fsum(path.output(path.params(*args, 0.5), b).loss.item() for b in held_out) / len(held_out)
                self.losses = getattr(self, "losses", []) + [(self.count - 1, loss)]
                if loss <= min(value for _, value in self.losses):               # ties: the later iterate
                    self.best = (self.count - 1, loss, [p.detach().clone() for p in params])
            if self.count < steps:
                return super().step(closure)
            index, loss, best = self.best
            recorded["chosen"] = (index, loss, self.losses)
            with torch.no_grad():
                for p, value in zip(params, best):
                    p.copy_(value)
            return None
    return Selecting


def selected_path(recorded: dict):
    """learned._Path whose loss calls record the path and their (R, layers, gains) in `recorded`."""

    class Recording(learned_module._Path):
        def loss(self, r, layers, gains, alpha, batch, moved=None):
            recorded["path"], recorded["args"] = self, (r, layers, gains)
            return super().loss(r, layers, gains, alpha, batch, moved)
    return Recording


def anchor_gauge(moved, anchor, folds):
    """residual.gauge_gains with the anchor's own gains wherever they are nonzero: a norm whose gain and readers both
    average then has the average of the two folded maps as its merge."""
    closest = gauge_gains(moved, anchor, folds)
    return {k: torch.where(anchor[k].double() != 0, anchor[k].double(), g) for k, g in closest.items()}


def bias_translations(state: dict) -> list[tuple[str, list[str]]]:
    """(bias, its readers) of every exact bias translation of a ViT: a norm's bias b -> b + d with each reader's bias
    c -> c - W d (W (y + d) + c - W d), and a value bias with the attention output's (softmax rows sum to 1:
    O (sum a v + d) + c - O d)."""
    out = []
    for p in dict.fromkeys(m.group(1) for k in state if (m := re.match(r"(vit\.layers\.\d+\.)", k))):
        out += [(f"{p}layernorm_before.bias", [f"{p}attention.{n}_proj" for n in ("q", "k", "v")]),
                (f"{p}layernorm_after.bias", [f"{p}mlp.fc1"]),
                (f"{p}attention.v_proj.bias", [f"{p}attention.o_proj"])]
    return out + [("vit.layernorm.bias", ["classifier"])]


def translated(state: dict, translations: list, deltas: list) -> dict:
    """state with each translation (bias, readers) moved by its delta d: the same function."""
    out = dict(state)
    for (bias, readers), d in zip(translations, deltas):
        out[bias] = out[bias] + d.to(out[bias].dtype)
        for r in readers:
            out[f"{r}.bias"] = out[f"{r}.bias"] - out[f"{r}.weight"] @ d.to(out[f"{r}.weight"].dtype)
    return out


def anchor_biases(moved: dict, anchor: dict) -> dict:
    """The source's translatable biases set to the anchor's, one after the other (a norm's translation moves the
    value bias it feeds): the merge's affine part is then the average of the two models' (no cross term
    (W_a - W_s)(b_a - b_s) / 4)."""
    out = {k: v.clone() for k, v in moved.items()}
    for t in bias_translations(out):
        out = translated(out, [t], [anchor[t[0]].double() - out[t[0]].double()])
    return out


def stream_writers(state: dict) -> list[str]:
    """The tensors that write a pre-LN ViT's residual stream: the embeddings (patch projection, class token,
    positions) and each layer's attention output and FFN output, weights and biases. Every reader of the stream is
    a LayerNorm (each layer's two, the final one), and LN(c x) = LN(x) for c > 0 up to its eps, so scaling all of
    them by one c keeps the function."""
    layers = dict.fromkeys(m.group(1) for k in state if (m := re.match(r"(vit\.layers\.\d+\.)", k)))
    return (["vit.embeddings.cls_token", "vit.embeddings.position_embeddings",
             "vit.embeddings.patch_embeddings.projection.weight", "vit.embeddings.patch_embeddings.projection.bias"]
            + [f"{p}{m}.{t}" for p in layers for m in ("attention.o_proj", "mlp.fc2") for t in ("weight", "bias")])


def scaled_stream(state: dict, c) -> dict:
    """state with its residual stream times c (a positive scalar, a float or a 0-dim tensor): the same function."""
    out = dict(state)
    for k in stream_writers(state):
        out[k] = out[k] * (c.to(out[k].dtype) if torch.is_tensor(c) else c)
    return out


def stream_scale(moved: dict, anchor: dict, kind: str) -> float:
    """The scale c of the moved source's stream: `fit`, argmin_c sum ||W_a - c W_s||^2 over the writers
    (<W_a, W_s> / ||W_s||^2); `norm`, ||W_a|| / ||W_s|| (the two streams' writers equally large)."""
    writers = stream_writers(moved)
    a = torch.cat([anchor[k].double().flatten() for k in writers])
    s = torch.cat([moved[k].double().flatten() for k in writers])
    return float(a @ s / (s @ s)) if kind == "fit" else float(a.norm() / s.norm())


def scaling_path(recorded: dict):
    """learned._Path whose source, as stored after unfolding, has its stream times exp(u), u learned from 0 (created
    on the first call, kept in `recorded`; scaling_adam adds it to the refinement's parameters)."""

    class Scaling(learned_module._Path):
        def moved(self, r, layers, gains):
            if "log_scale" not in recorded:
                recorded["log_scale"] = torch.zeros((), dtype=torch.float64, requires_grad=True)
            return scaled_stream(super().moved(r, layers, gains), torch.exp(recorded["log_scale"]))
    return Scaling


def scaling_adam(recorded: dict, factor: float):
    """torch.optim.Adam with the stream's log-scale as one more group, at `factor` times the refinement's rate."""

    class Scaling(torch.optim.Adam):
        def __init__(self, groups, lr):
            super().__init__(list(groups) + [{"params": [recorded["log_scale"]], "lr": lr * factor}], lr=lr)
    return Scaling


def translating_path(recorded: dict):
    """learned._Path whose source, as stored after unfolding, is moved by learned bias translations (from 0; created
    on the first call, kept in `recorded`), which translating_adam adds to the refinement's parameters."""

    class Translating(learned_module._Path):
        def moved(self, r, layers, gains):
            if "deltas" not in recorded:
                recorded["translations"] = bias_translations(self.fs)
                recorded["deltas"] = [torch.zeros_like(self.fs[b], dtype=torch.float64, requires_grad=True)
                                      for b, _ in recorded["translations"]]
            return translated(super().moved(r, layers, gains), recorded["translations"], recorded["deltas"])
    return Translating


def translating_adam(recorded: dict, factor: float):
    """torch.optim.Adam with the bias translations as one more group, at `factor` times the refinement's rate."""

    class Translating(torch.optim.Adam):
        def __init__(self, groups, lr):
            super().__init__(list(groups) + [{"params": recorded["deltas"], "lr": lr * factor}], lr=lr)
    return Translating


def ffn_activations(model, params: dict, layout, batches: list[dict]) -> list[torch.Tensor]:
    """Each layer's FFN neuron outputs (the input projection through the model's activation), (tokens, ffn)."""
    names = [layout.layers[i].ffn.input.weight.rsplit(".", 1)[0] for i in range(layout.num_layers)]
    act = transformers.activations.ACT2FN[model.config.hidden_act]
    seen = {n: [] for n in names}
    hooks = [model.get_submodule(n).register_forward_hook(lambda m, i, o, n=n: seen[n].append(act(o).flatten(0, -2)))
             for n in names]
    try:
        with torch.no_grad():
            for batch in batches:
                functional_call(model, params, args=(), kwargs={k: v for k, v in batch.items() if k != "labels"})
    finally:
        for h in hooks:
            h.remove()
    return [torch.cat(seen[n]).double() for n in names]


def correlated_ffn(count: int, recorded: dict):
    """learned.refine_by_loss (as whole.py calls it) after each layer's FFN permutation is re-chosen on the first
    `count` batches: the assignment maximising the summed correlation of the anchor's and the moved source's neuron
    outputs (activation matching, Ainsworth et al.'s), composed with the descent's."""
    refine = learned_module.refine_by_loss

    def refine_after(fs, fa, anchor, layout, stream, r, blocks, model, batches, settings):
        path = learned_module._Path(model, layout, stream, fs, anchor)
        moved = path.moved(r, blocks.layers, gauge_gains(path.moved(r, blocks.layers, None), layout.canonical(anchor),
                                                         stream.folds))
        floats = lambda state: {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
        moved = layout.stored_form(moved) if layout.stored else moved
        ends = [ffn_activations(model.eval(), floats(x), layout, batches[:count]) for x in (dict(anchor), moved)]
        layers, moves = {}, []
        for i, (ya, ys) in enumerate(zip(*ends)):
            za, zs = ((y - y.mean(0)) / (y.std(0) + 1e-12) for y in (ya, ys))
            q = max_assignment(za.T @ zs / za.shape[0])                           # (ffn,): anchor neuron <- moved
            t = blocks.layers.get(i, LayerTransform())
            p = t.ffn_perm if t.ffn_perm is not None else torch.arange(q.numel())
            layers[i] = dataclasses.replace(t, ffn_perm=p[q])
            moves.append(int((q != torch.arange(q.numel())).sum()))
        recorded["moved_neurons"] = moves
        return refine(fs, fa, anchor, layout, stream, r, Transform(layers, blocks.residual), model, batches,
                      settings)
    return refine_after


def unseen_tokens(task, model_dir: str) -> torch.Tensor:
    tokenizer = load_tokenizer(model_dir)
    counts = torch.bincount(task.blocks("train", tokenizer).flatten(), minlength=len(tokenizer))
    return counts == 0


def descent_variant(variant: str, layout, task, model_dir, modules, source_dir) -> tuple:
    """(data-free matching config, patches) of a variant of the data-free descent."""
    config, patches = FULL, []
    if variant == "fan_in":
        patches = [(pairs_module.StatePair, "__init__", fan_in_pair(layout))]
    elif variant == "glmc_weights":
        patches = [(pairs_module.StatePair, "__init__", glmc_pair())]
    elif variant == "no_rescale":
        config = dataclasses.replace(FULL, rescale=False)
    elif variant == "multi_start_no_rescale":
        config = dataclasses.replace(FULL, rescale=False)
        patches = [(whole, "starts", extra_starts(("weights", "identity", 1, 2, 3)))]
    elif variant == "glmc_ffn":
        patches = [(descent, "ffn_solve", glmc_ffn_solve)]
    elif variant == "glmc_both":
        patches = [(pairs_module.StatePair, "__init__", glmc_pair()), (descent, "ffn_solve", glmc_ffn_solve)]
    elif variant == "circuits":
        patches = [(compose, "match_heads", circuit_heads), (descent, "head_solve", circuit_head_solve)]
    elif variant == "identity_start":
        patches = [(whole, "starts", extra_starts(("identity",)))]
    elif variant == "multi_start":
        patches = [(whole, "starts", extra_starts(("weights", "identity", 1, 2, 3)))]
    elif variant.startswith("soft_"):
        patches = [(starts_module, "SOFT", float(variant[5:]))]
    elif variant.startswith("embeddings_"):
        scale = torch.full((len(load_tokenizer(model_dir)),), float(variant[11:]), dtype=torch.float64)
        patches = [(pairs_module.StatePair, "__init__", embedding_rows(scale))]
    elif variant == "mask_unseen":
        scale = (~unseen_tokens(task, model_dir)).double()
        patches = [(pairs_module.StatePair, "__init__", embedding_rows(scale))]
    elif variant.startswith("first_attention_"):
        patches = [(pairs_module.StatePair, "__init__", first_attention_pair(float(variant[16:])))]
    elif variant == "first_input_weights":
        patches = [(pairs_module.StatePair, "__init__", first_input_pair(None))]
    elif variant == "first_input_acts":
        batches = task.statistic_batches(20, source_dir, Match.data_split)
        sigmas = tuple(input_covariance_from_data(m.eval(), batches) for m in modules)
        patches = [(pairs_module.StatePair, "__init__", first_input_pair(sigmas))]
    elif variant == "anchor_gains":
        patches = [(whole, "gauge_gains", anchor_gauge)]
    elif variant != "full_symmetry":
        raise SystemExit(f"unknown variant {variant}")
    return config, patches


def noise_batches(batches: list[dict], kind: str, width: int = 5) -> list[dict]:
    """Batches shaped like `batches` whose images are noise in the models' normalised input space (each channel
    mean 0, variance 1, as the task's preprocessing makes its inputs) and whose labels are random (the
    refinement is then distilled only: each step's target is the end models' predictions on the noise).
    gauss: every pixel N(0, 1); smooth / smoother / blur: N(0, 1) blurred twice by a 5 x 5 / 9 x 9 / width x width
    box; pink: N(0, 1) with its spectrum's amplitude divided by the frequency |f| (natural images' 1 / f); each
    standardised per image."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for batch in batches:
        x = torch.randn(batch["pixel_values"].shape, generator=generator)   # (batch, channels, height, width)
        if kind in ("smooth", "smoother", "blur"):
            c, k = x.shape[1], {"smooth": 5, "smoother": 9}.get(kind, width)
            box = torch.full((c, 1, k, k), 1 / k ** 2)
            for _ in range(2):
                x = torch.nn.functional.conv2d(x, box, padding=k // 2, groups=c)
        elif kind == "pink":                                          # amplitude 1 / |f|, natural images' spectrum
            fy = torch.fft.fftfreq(x.shape[2])[:, None]
            fx = torch.fft.rfftfreq(x.shape[3])[None, :]
            f = (fy ** 2 + fx ** 2).sqrt().clamp_min(1 / max(x.shape[2:]))
            x = torch.fft.irfft2(torch.fft.rfft2(x) / f, s=x.shape[2:])
        elif kind != "gauss":
            raise SystemExit(f"inputs={kind}: gauss, smooth, smoother, blur or pink")
        x = (x - x.mean((2, 3), keepdim=True)) / x.std((2, 3), keepdim=True)
        out.append({"pixel_values": x, "labels": torch.randint(0, 10, batch["labels"].shape, generator=generator)})
    return out


def learned_variant(variant: str) -> tuple[str, dict] | None:
    """(the descent's variant, the refinement's settings) of a learned variant, None for a data-free one:
    full_symmetry_learned[:KEY=VALUE,...] refines full_symmetry's descent, learned_on:VARIANT refines VARIANT's."""
    if variant.startswith("learned_on:"):
        return variant.split(":", 1)[1], {}
    if variant.split(":")[0] != "full_symmetry_learned":
        return None
    return "full_symmetry", variant_settings(variant)


def variant_settings(variant: str) -> dict:
    """The KEY=VALUE settings after a variant's colon (numbers, words), {} without one."""
    settings = dict(item.split("=") for item in variant.split(":")[1].split(",")) if ":" in variant else {}
    return {k: int(v) if v.isdigit() else v if v.isalpha() else float(v) for k, v in settings.items()}


def match(variant: str, source, anchor, layout, tied, task, model_dir, modules, source_dir):
    """The matched source's state for one variant (and the match's residual info); modules: the two loaded models
    (source, anchor), which the learned variants align through the one matching path on the batches
    symfusion-match reads by default (its Match declaration)."""
    if variant.endswith("+biases"):
        moved, info = match(variant[:-len("+biases")], source, anchor, layout, tied, task, model_dir, modules, source_dir)
        return anchor_biases(moved, anchor), info
    for suffix, kind in (("+scale", "fit"), ("+scale_norm", "norm")):
        if variant.endswith(suffix):
            moved, info = match(variant[:-len(suffix)], source, anchor, layout, tied, task, model_dir, modules,
                                source_dir)
            c = stream_scale(moved, anchor, kind)
            print(f"stream scale ({kind}): {c:.4f}", flush=True)
            return scaled_stream(moved, c), info
    if variant == "none":
        return source, {}
    if variant == "rotation":
        return apply_transform(source, layout, match_models(source, anchor, layout, "rotation").transform), {}
    if variant.split(":")[0] == "full_symmetry_synthetic":             # the library's data-free refinement
        config = dataclasses.replace(matching_config("full_symmetry_synthetic"), **variant_settings(variant))
        matched, report = symfusion.align(*modules, matching=config)
        return matched.state_dict(), report["residual"]
    learned = learned_variant(variant)
    config, patches = descent_variant(variant if learned is None else learned[0], layout, task, model_dir, modules,
                                      source_dir)
    with contextlib.ExitStack() as stack:
        for module, name, value in patches:
            stack.enter_context(replaced(module, name, value))
        if learned is None:
            result = match_models(source, anchor, layout, config, tied=tied)
            return apply_transform(source, layout, result.transform), result.residual
        settings = learned[1]                                         # learned_variant's own dict: popped below
        joined = settings.pop("join", 1)                              # batches concatenated into one step's
        averaged = settings.pop("average", 0.0)                       # the last fraction of steps averaged
        select = settings.pop("select", 0)                            # every select-th iterate a checkpoint
        translate = settings.pop("biases", 0)                         # bias translations learned at this x lr
        scale = settings.pop("scale", 0)                              # the stream's scale learned at this x lr
        inputs = settings.pop("inputs", None)                         # gauss / smooth / ...: data-free noise
        if "minimax" in settings:                                     # steps at the highest of three path points
            spread, n = settings.pop("minimax"), settings.pop("minimax_points", 3)
            settings["refine_minimax"] = () if spread == "off" else \
                tuple(round(0.5 - spread + 2 * spread * i / (n - 1), 10) for i in range(n))
        correlate = settings.pop("ffn_acts", 0)                        # FFN re-matched on this many batches' outputs
        split = settings.pop("split", Match.data_split)       # test: an oracle (the split that scores it)
        if split == "test":
            stack.enter_context(replaced(task_base, "STATISTICS_SPLITS", task_base.STATISTICS_SPLITS + ("test",)))
        batches = task.statistic_batches(settings.pop("batches", Match.data_batches) * joined, source_dir,
                                         split)
        if joined > 1:
            batches = [{k: torch.cat([b[k] for b in batches[i:i + joined]]) for k in batches[i]}
                       for i in range(0, len(batches), joined)]
        if inputs:                                                    # no data: noise inputs, distilled only
            batches = noise_batches(batches, inputs, settings.pop("width", 5))
            settings.setdefault("refine_distill", 1.0)
        refined = dataclasses.replace(matching_config("full_symmetry_learned"), rescale=config.rescale, **settings)
        if averaged:
            stack.enter_context(replaced(learned_module.torch.optim, "Adam",
                                         averaging_adam(refined.refine_steps, averaged)))
        recorded = {}
        if select:
            held_out = task.statistic_batches(learned_module.CHECK_BATCHES, source_dir, "validation")
            stack.enter_context(replaced(learned_module.torch.optim, "Adam",
                                         selecting_adam(refined.refine_steps, select, held_out, recorded)))
            stack.enter_context(replaced(learned_module, "_Path", selected_path(recorded)))
        if correlate:
            stack.enter_context(replaced(whole, "refine_by_loss", correlated_ffn(correlate, recorded)))
        if translate:
            stack.enter_context(replaced(learned_module, "_Path", translating_path(recorded)))
            stack.enter_context(replaced(learned_module.torch.optim, "Adam", translating_adam(recorded, translate)))
        if scale:
            stack.enter_context(replaced(learned_module, "_Path", scaling_path(recorded)))
            stack.enter_context(replaced(learned_module.torch.optim, "Adam", scaling_adam(recorded, scale)))
        matched, report = symfusion.align(*modules, matching=refined, data=batches)
        if scale:
            kept = report["residual"]["refine"]["kept"] == "refined"
            c = math.exp(recorded["log_scale"].item())
            print(f"stream scale {'kept' if kept else 'not kept'}: {c:.4f}", flush=True)
            state = {k: v.detach() for k, v in matched.state_dict().items()}
            return (scaled_stream(state, c) if kept else state), report["residual"]
        if correlate:
            print(f"FFN neurons moved by activation matching per layer: {recorded['moved_neurons']}", flush=True)
        if translate:
            kept = report["residual"]["refine"]["kept"] == "refined"
            print(f"bias translations {'kept' if kept else 'not kept'}: largest "
                  f"{max(d.abs().max().item() for d in recorded['deltas']):.4f}", flush=True)
            if kept:
                with torch.no_grad():
                    state = translated({k: v.detach() for k, v in matched.state_dict().items()},
                                       recorded["translations"], recorded["deltas"])
                return state, report["residual"]
        if select:
            print(f"checkpoint chosen: after {recorded['chosen'][0]} steps, held-out midpoint loss "
                  f"{recorded['chosen'][1]:.4f}; all: {[(k, round(v, 4)) for k, v in recorded['chosen'][2]]}", flush=True)
        return matched.state_dict(), report["residual"]


def refine_defaults() -> str:
    """What a learned variant's result rests on beside its name: the preset's and every family's refinement
    defaults (a cached learned result made under other defaults is made again)."""
    return repr((matching_config("full_symmetry_learned"), sorted((n, f.refine) for n, f in FAMILIES.items())))


def run(track: str, models: Path, pair: str, variant: str, out: Path, split: str = "test") -> dict:
    path = out / (track if split == "test" else f"{track}-{split}") / pair.replace(":", "-onto-") / f"{variant}.json"
    base = variant.split("+")[0]                                                                     # VARIANT+biases
    defaults = refine_defaults() if learned_variant(base) is not None else None
    if base.startswith("full_symmetry_synthetic"):                  # its own preset and how its inputs are made
        defaults = refine_defaults() + repr([matching_config("full_symmetry_synthetic")] + [
            getattr(synthetic, k) for k in ("BLUR", "IMAGES", "SEQUENCES", "TEXT_LENGTH", "CALL")])
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("refine_defaults") == defaults:
            return cached
    task_name, examples = TRACKS[track]
    src_name, anc_name = pair.split(":")
    model, anchor_model = load_model(str(models / src_name)), load_model(str(models / anc_name))
    source = {k: v.detach().clone() for k, v in model.state_dict().items()}
    anchor = {k: v.detach().clone() for k, v in anchor_model.state_dict().items()}
    layout = layout_of(model.config, anchor)
    task = make_task(task_name, load_group("profile", "mini"))
    model_dir = str(models / anc_name)
    start = time.perf_counter()
    moved, info = match(variant, source, anchor, layout, bool(getattr(model.config, "tie_word_embeddings", False)),
                        task, model_dir, (model, anchor_model), str(models / src_name))
    seconds = time.perf_counter() - start
    model.load_state_dict({k: 0.5 * (v + moved[k]) if v.is_floating_point() else v for k, v in anchor.items()})
    merged = task.evaluate(model.eval(), split, model_dir=model_dir)
    path_result = loss_path(model, anchor, moved, lambda m: task.evaluate(m, split, model_dir=model_dir,
                                                                         examples=examples))
    record = {"variant": variant, "pair": pair, "refine_defaults": defaults, "seconds": seconds,
              "folded_distance": info.get("folded_distance"), "chosen": info.get("chosen"),
              "converged": info.get("converged"), "simple": merged,
              "barrier": path_result["barrier"], "barrier_linear": path_result["barrier_linear"],
              "path": [{"alpha": p["alpha"], "loss": p["loss"], "per_example": p["per_example"]} for p in path_result["path"]]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return record


def barriers(record: dict, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both barriers of a loss path on each resample of its test examples (rows of index)."""
    points = record["path"]
    losses = np.stack([np.asarray(p["per_example"]["loss"], float) for p in points])          # (11, n)
    if "tokens" in points[0]["per_example"]:                                                   # token-weighted
        tokens = np.asarray(points[0]["per_example"]["tokens"], float)
        means = np.stack([row[index].sum(1) / tokens[index].sum(1) for row in losses])
    else:
        means = np.stack([row[index].mean(1) for row in losses])                              # (11, B)
    alphas = np.array([p["alpha"] for p in points])[:, None]
    line = alphas * means[-1:] + (1 - alphas) * means[:1]
    return means.max(0) - means.min(0), (means - line).max(0)


def effect(records: list[tuple[dict, dict]], metric: str, scale: float) -> dict:
    """The mean over pairs of (variant - baseline) on the simple metric and both barriers, with intervals."""
    simple = paired_effect(metric, [(a["simple"]["per_example"], b["simple"]["per_example"], "simple")
                                    for a, b in records], scale=scale)
    total = np.zeros((2, 1000))
    point = np.zeros(2)
    for a, b in records:
        n = len(a["path"][0]["per_example"]["loss"])
        index, everything = resamples(n, "barrier"), np.arange(n)[None, :]
        total += np.stack(barriers(a, index)) - np.stack(barriers(b, index))
        point += np.concatenate(barriers(a, everything)) - np.concatenate(barriers(b, everything))
    total, point = total / len(records), point / len(records)
    return {"simple": simple, "barrier": (point[0], *interval(total[0])), "barrier_linear": (point[1], *interval(total[1]))}


def t_interval(spread: dict, digits: int) -> str:
    """[low, high] of a t interval over pairs (report/spread.py), or '1 pair'."""
    if spread["low"] is None:
        return "1 pair"
    return f"[{spread['low']:+.{digits}f}, {spread['high']:+.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--track", choices=list(TRACKS), required=True)
    parser.add_argument("--models", type=Path, required=True, help="folder holding the end models seed0, seed1, ...")
    parser.add_argument("--pairs", nargs="*", default=["seed1:seed0", "seed2:seed0", "seed2:seed1"], help="source:anchor")
    parser.add_argument("--variants", nargs="*", default=["none", "rotation", "full_symmetry", "fan_in", "glmc_weights",
                                                           "glmc_ffn", "circuits",
                                                           "identity_start", "multi_start"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/out/ablation"))
    parser.add_argument("--split", default="test", choices=["test", "validation"],
                        help="the split the merges and paths are scored on (validation: to choose a setting)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for variant in args.variants:
        for pair in args.pairs:
            r = run(args.track, args.models, pair, variant, args.out, args.split)
            print(f"{args.track} {pair} {variant}: {r['seconds']:.1f} s, simple "
                  f"{r['simple'].get('accuracy', r['simple']['loss']):.4f}, barrier {r['barrier']:.4f} / "
                  f"{r['barrier_linear']:.4f}", flush=True)
    metric, scale = ("accuracy", 100.0) if args.track == "vit" else ("loss", 1.0)
    base = {p: run(args.track, args.models, p, "full_symmetry", args.out, args.split) for p in args.pairs}
    none = {p: run(args.track, args.models, p, "none", args.out, args.split) for p in args.pairs}
    print(f"\nEffects vs full_symmetry: the mean over pairs with its 95% paired bootstrap interval over the test examples,"
          f" then the 95% t interval over the {len(args.pairs)} pairs (what another pair of end models may give)."
          f"\n\n| variant | simple ({metric}) per pair | barrier (max-min) per pair | % of unmatched (max-min, above "
          f"line) | simple vs full_symmetry | over pairs | barrier vs full_symmetry | over pairs | "
          f"above-line barrier vs full_symmetry |\n|" + "---|" * 9)
    for variant in args.variants:
        records = [run(args.track, args.models, p, variant, args.out, args.split) for p in args.pairs]
        values = " / ".join(f"{r['simple'][metric] * scale:.2f}" for r in records)
        paths = " / ".join(f"{r['barrier']:.3f}" for r in records)
        ratios = [100 * sum(r[k] for r in records) / sum(none[p][k] for p in args.pairs)      # of the means over pairs
                  for k in ("barrier", "barrier_linear")]
        cells = [variant, values, paths, "{:.1f}%, {:.1f}%".format(*ratios)]
        if variant == "full_symmetry":
            cells += [""] * 5
        else:
            e = effect([(r, base[p]) for r, p in zip(records, args.pairs)], metric, scale)
            s = e["simple"]
            pairs_simple = over_pairs({p: (r["simple"][metric] - base[p]["simple"][metric]) * scale
                                       for r, p in zip(records, args.pairs)})
            pairs_barrier = over_pairs({p: r["barrier"] - base[p]["barrier"] for r, p in zip(records, args.pairs)})
            cells += [f"{s['effect']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}]", t_interval(pairs_simple, 2),
                      "{:+.3f} [{:+.3f}, {:+.3f}]".format(*e["barrier"]), t_interval(pairs_barrier, 3),
                      "{:+.3f} [{:+.3f}, {:+.3f}]".format(*e["barrier_linear"])]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
