"""Optimal-transport fusion (Imfeld et al. 2024): align every source onto the anchor with OT maps, then average.

Three variants, as in the reference setup:
- ot_acts:     Sinkhorn (entropic reg 0.08) on standardized activations (zero mean, unit
               variance per neuron over the samples) of task inputs;
- ot_acts_emd: exact EMD on the same activation costs;
- ot_wts:      Sinkhorn (reg 0.06) on L2-normalised weight rows, no data.
Costs are squared Euclidean distances between the neurons' feature vectors (activations
over samples, or weight rows), divided by their maximum before the solver sees them.

Transport maps. For n anchor and n source neurons with uniform marginals, the plan T (n x n,
T[i, j] = mass from anchor neuron i to source neuron j, rows and columns summing to 1/n) is
used as the soft alignment P = n T (rows renormalised to sum exactly 1, which only matters
for an unconverged Sinkhorn). A source vector x is expressed in the anchor's basis as P x,
so a source linear map y = x W^T + b whose output and input axes are aligned by P_out and
P_in becomes W -> P_out W P_in^T, b -> P_out b. When T is a permutation plan, P is the
permutation and the aligned source computes exactly what it computed before.

What is aligned, for each source (models[0], the anchor, keeps its own basis):
1. The residual stream: ONE map (hidden x hidden) shared by every tensor that reads from or
   writes to it: embeddings, every LayerNorm, Q/K/V and FFN-input columns, attention-output
   and FFN-output rows and biases, pooler, classifier input columns. Which axes of the
   tensors outside the layers are residual axes is spelled out per family by key suffix in
   the family's residual_axes (arch.FAMILIES; never guessed from shapes; an unknown key is an error). A pooler's dense
   (H, H) is residual on both axes (exact under permutations, its activation is
   elementwise); classifier output rows (labels) are never moved. DeBERTa's relative
   embeddings (and their LayerNorm) are treated as residual too: they are read by the
   same-basis Q/K maps (share_att_key) or by pos_query/pos_key_proj, whose input columns
   are aligned with the residual map.
   Acts: the hidden states of all layers (embedding output included), stacked as samples.
   Wts: first the tensors whose other axes need no alignment (embeddings, patch projection,
   relative embeddings, classifier columns: "basis-free" rows); in later rounds also the rows
   [W | b] of every residual writer (attention output, FFN output) after their input
   columns were aligned with the previous round's head and FFN maps (option rounds, 2).
2. FFN neurons, per layer: one map, applied to the FFN-input rows and bias and FFN-output
   columns. Acts: post-activation values (the FFN-output map's input). Wts: incoming rows
   [W_in P_res^T | b_in], i.e. expressed in the anchor's residual basis first.
3. Attention, per layer and head: one map for Q and K jointly (the same transform on the
   rows of every query-like and key-like map, so scores are preserved under permutations)
   and one for V and O (V rows and bias, O columns). Acts: the head's d coordinates of Q and
   K outputs (stacked as samples), resp. of V outputs and O inputs. Wts: the concatenated
   normalised incoming rows of Q and K (DeBERTa's positional projections too), resp. of V.
   Heads stay in place: there is no transport across heads, only within each head.
The result is the plain average of the anchor and the aligned sources.

LayerNorm (and the attention softmax, GELU) are equivariant only under permutations, so
soft maps make the aligned sources, hence the fused model, approximate: that is inherent to
OT fusion. With an exact permutation plan (EMD on a planted permutation) fusion is exact.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from symfusion.arch import FAMILIES, ModelLayout, Projection, check_compatible, check_same_layout, layout_of
from symfusion.errors import SymfusionError
from symfusion.fusion.common import batches_of
from symfusion.fusion.simple import average_states
from symfusion.symmetry import rotate_bias, rotate_columns, rotate_rows

_EPS = 1e-12


@dataclass
class TransportMaps:
    """Soft alignments of one source onto the anchor (rows: anchor neurons, columns: source neurons)."""

    residual: torch.Tensor    # (hidden, hidden)
    ffn: list[torch.Tensor]   # per layer (ffn, ffn)
    qk: list[torch.Tensor]    # per layer (heads, d, d)
    vo: list[torch.Tensor]    # per layer (heads, d, d)


# ---------------------------------------------------------------- the three methods

@torch.no_grad()
def merge_acts(models: list, batches: list[dict] | None, reg: float = 0.08, **options) -> dict:
    """OT fusion with Sinkhorn maps (entropic reg `reg`) from standardized activations on `batches`."""
    _check_options(options, "ot_acts", ("reg",))
    return _merge_on_activations(models, batches, _check_reg(reg), "ot_acts")


@torch.no_grad()
def merge_acts_emd(models: list, batches: list[dict] | None, **options) -> dict:
    """OT fusion with exact EMD maps from standardized activations on `batches`."""
    _check_options(options, "ot_acts_emd", ())
    return _merge_on_activations(models, batches, None, "ot_acts_emd")


@torch.no_grad()
def merge_wts(models: list, batches: list[dict] | None = None, reg: float = 0.06, **options) -> dict:
    """OT fusion with Sinkhorn maps from L2-normalised weight rows (no data); option rounds=2."""
    _check_options(options, "ot_wts", ("reg", "rounds"))
    rounds = int(options.get("rounds", 2))
    if rounds < 1:
        raise SymfusionError(f"ot_wts: rounds={rounds} must be >= 1")
    reg = _check_reg(reg)
    layout, axes, states = _setup(models)
    anchor = _float64(states[0])
    maps = [_weight_maps(anchor, _float64(s), layout, axes, reg, rounds) for s in states[1:]]
    return _fuse(states, maps, layout, axes)


def _merge_on_activations(models: list, batches, reg: float | None, method: str) -> dict:
    if not batches:
        raise SymfusionError(f"fusion method {method!r} needs data batches (set fusion.num_batches > 0)")
    batches = batches_of(batches, 0)   # activations of every model on the same (the anchor's) inputs
    layout, axes, states = _setup(models)
    maps = _activation_maps(models, layout, batches, reg)
    return _fuse(states, maps, layout, axes)


def _check_options(options: dict, method: str, accepted: tuple[str, ...]) -> None:
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        known = ", ".join(accepted) or "none"
        raise SymfusionError(f"{method}: unknown option(s) {', '.join(unknown)}; accepted: {known}")


def _check_reg(reg) -> float:
    if not float(reg) > 0:
        raise SymfusionError(f"OT fusion: reg={reg} must be > 0 (use ot_acts_emd for exact transport)")
    return float(reg)


# ---------------------------------------------------------------- layouts and residual axes

def _setup(models: list):
    """Checks the models can be fused; returns the anchor's layout, residual axes and all state dicts."""
    if len(models) < 2:
        raise SymfusionError(f"fusion needs at least two models, got {len(models)}")
    anchor = models[0]
    for i, model in enumerate(models[1:], start=1):
        check_compatible(model.config, anchor.config, f"model {i}", "the anchor (model 0)")
    states = [m.state_dict() for m in models]
    layout = layout_of(anchor.config, states[0])
    layout.require_encoder("OT fusion")               # its transport maps know no KV groups, gates or RoPE planes
    for i, (model, state) in enumerate(zip(models[1:], states[1:]), start=1):
        check_same_layout(layout_of(model.config, state), layout)
        if set(state) != set(states[0]):
            extra = sorted(set(state) ^ set(states[0]))[0]
            raise SymfusionError(f"model {i} and the anchor have different tensors (e.g. {extra!r}); use one head type")
    return layout, residual_axes(layout, states[0]), states


def residual_axes(layout: ModelLayout, state: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """For every floating tensor, the axes that live in the residual stream (checked to be hidden-sized)."""
    axes = _layer_axes(layout)
    for key, tensor in state.items():
        if key in axes or not tensor.is_floating_point():
            continue
        axes[key] = FAMILIES[layout.family].residual_axes_of(key)
    for key, key_axes in axes.items():
        for axis in key_axes:
            if state[key].shape[axis] != layout.hidden_size:
                raise SymfusionError(
                    f"{key!r} has size {state[key].shape[axis]} on its residual axis {axis}, expected hidden size "
                    f"{layout.hidden_size}; OT fusion does not support this {layout.family} variant"
                )
    return axes


def _layer_axes(layout: ModelLayout) -> dict[str, tuple[int, ...]]:
    """Q/K/V and FFN-input columns read the residual stream; attention- and FFN-output rows write it."""
    axes: dict[str, tuple[int, ...]] = {}
    for layer in layout.layers:
        att, ffn = layer.attention, layer.ffn
        for proj in att.query_like + att.key_like + (att.value, ffn.input):
            axes[proj.weight] = (1,)
            if proj.bias:
                axes[proj.bias] = ()
        for proj in (att.output, ffn.output):
            axes[proj.weight] = (0,)
            if proj.bias:
                axes[proj.bias] = (0,)
    return axes


# ---------------------------------------------------------------- aligning and averaging

def _fuse(states: list[dict], maps: list[TransportMaps], layout: ModelLayout, axes: dict) -> dict:
    aligned = [align_state(s, layout, axes, m) for s, m in zip(states[1:], maps)]
    return average_states([states[0]] + aligned)


def align_state(state: Mapping, layout: ModelLayout, axes: dict, maps: TransportMaps) -> dict:
    """The source state dict expressed in the anchor's bases (float64; integer buffers untouched)."""
    out = _float64(state)
    for key, key_axes in axes.items():
        for axis in key_axes:
            out[key] = _along(out[key], maps.residual, axis)
    for i, layer in enumerate(layout.layers):
        att, ffn = layer.attention, layer.ffn
        for proj in att.query_like + att.key_like:
            _move_head_rows(out, proj, maps.qk[i])
        _move_head_rows(out, att.value, maps.vo[i])
        out[att.output.weight] = rotate_columns(out[att.output.weight], maps.vo[i].transpose(1, 2))
        p = maps.ffn[i]
        out[ffn.input.weight] = p @ out[ffn.input.weight]
        if ffn.input.bias:
            out[ffn.input.bias] = p @ out[ffn.input.bias]
        out[ffn.output.weight] = out[ffn.output.weight] @ p.T
    return out


def _along(tensor: torch.Tensor, p: torch.Tensor, axis: int) -> torch.Tensor:
    """Apply x -> P x along one axis of a tensor."""
    moved = torch.movedim(tensor, axis, -1)                    # (..., n)
    return torch.movedim(moved @ p.T, -1, axis)


def _move_head_rows(out: dict, proj: Projection, p: torch.Tensor) -> None:
    """W^h -> P^h W^h, b^h -> P^h b^h per head (symmetry's R^T W^h with R = P^T)."""
    r = p.transpose(1, 2)
    out[proj.weight] = rotate_rows(out[proj.weight], r)
    if proj.bias:
        out[proj.bias] = rotate_bias(out[proj.bias], r)


def _float64(state: Mapping) -> dict:
    return {k: v.double() if v.is_floating_point() else v for k, v in state.items()}


# ---------------------------------------------------------------- optimal transport

def transport_maps(cost: torch.Tensor, reg: float | None) -> torch.Tensor:
    """Soft alignments P = n T, one per group: cost (G, n, m) -> (G, n, m); reg None means exact EMD."""
    return torch.stack([_transport_map(c.numpy(), reg) for c in cost.detach().double()])


def _transport_map(cost: np.ndarray, reg: float | None) -> torch.Tensor:
    import ot  # POT imports scikit-learn (~1.5 s): only merges that use OT pay for it

    n, m = cost.shape
    top = cost.max()
    cost = cost / top if top > 0 else cost
    a, b = np.full(n, 1.0 / n), np.full(m, 1.0 / m)
    if reg is None:
        plan = ot.emd(a, b, cost, numItermax=10_000_000)
    else:
        plan = ot.sinkhorn(a, b, cost, reg, warn=False)   # POT's 1000 iterations; rows renormalised below
    rows = plan.sum(axis=1, keepdims=True)
    if not (np.isfinite(plan).all() and (rows > 0).all()):
        raise SymfusionError(f"Sinkhorn failed (reg={reg} is too small for this cost); increase fusion.reg")
    return torch.from_numpy(plan / rows)


def _squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cost between feature rows: a (G, n, f), b (G, m, f) -> (G, n, m)."""
    return torch.cdist(a, b).square()


def _maps_from_costs(costs: dict[str, torch.Tensor], layout: ModelLayout, reg: float | None,
                     residual: torch.Tensor | None = None) -> TransportMaps:
    """Maps from costs named 'residual' (unless the residual map is given), 'ffn.i', 'qk.i', 'vo.i'."""
    plan = lambda name: transport_maps(costs[name], reg)  # noqa: E731
    layers = range(layout.num_layers)
    return TransportMaps(
        residual=plan("residual")[0] if residual is None else residual,
        ffn=[plan(f"ffn.{i}")[0] for i in layers],
        qk=[plan(f"qk.{i}") for i in layers],
        vo=[plan(f"vo.{i}") for i in layers],
    )


# ---------------------------------------------------------------- maps from activations

class _CrossMoments:
    """Running sums over paired samples of anchor (x) and source (y) activations, per group."""

    def __init__(self):
        self.count = 0
        self.sums: tuple[torch.Tensor, ...] | None = None

    def update(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x, y: (samples, groups, width), the same inputs through anchor and source."""
        x, y = x.double(), y.double()
        parts = (x.sum(0), y.sum(0), x.square().sum(0), y.square().sum(0), torch.einsum("sgi,sgj->gij", x, y))
        self.sums = parts if self.sums is None else tuple(s + p for s, p in zip(self.sums, parts))
        self.count += x.shape[0]

    def cost(self) -> torch.Tensor:
        """Mean squared distance between standardized activation vectors, (groups, width, width)."""
        sx, sy, sxx, syy, sxy = (s / max(self.count, 1) for s in self.sums)
        var_x, var_y = sxx - sx.square(), syy - sy.square()                 # (G, n)
        inv_x, inv_y = _inverse_std(var_x), _inverse_std(var_y)
        corr = (sxy - sx[:, :, None] * sy[:, None, :]) * inv_x[:, :, None] * inv_y[:, None, :]
        norm_x, norm_y = var_x * inv_x.square(), var_y * inv_y.square()   # 1, or 0 for a constant neuron
        return (norm_x[:, :, None] + norm_y[:, None, :] - 2 * corr).clamp_min(0)


def _inverse_std(var: torch.Tensor) -> torch.Tensor:
    std = var.clamp_min(0).sqrt()
    return torch.where(std > 1e-8, 1.0 / std.clamp_min(1e-8), torch.zeros_like(std))


def _activation_maps(models: list, layout: ModelLayout, batches: list[dict], reg: float | None) -> list[TransportMaps]:
    """One set of maps per source, from activation moments accumulated over all batches."""
    moments = [defaultdict(_CrossMoments) for _ in models[1:]]
    for batch in batches:
        anchor_acts = record_activations(models[0], layout, batch)
        for source, stats in zip(models[1:], moments):
            for name, acts in record_activations(source, layout, batch).items():
                stats[name].update(anchor_acts[name], acts)
    return [_maps_from_costs({n: m.cost() for n, m in stats.items()}, layout, reg) for stats in moments]


def record_activations(model: torch.nn.Module, layout: ModelLayout, batch: dict) -> dict[str, torch.Tensor]:
    """One forward pass; per name ('residual', 'ffn.i', 'qk.i', 'vo.i') samples as (samples, groups, width)."""
    captured: dict[str, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(layout.layers):
        att = layer.attention
        watched = {f"q{i}": att.query_like[0], f"k{i}": att.key_like[0], f"v{i}": att.value}
        for name, proj in watched.items():
            hooks.append(_module(model, proj).register_forward_hook(_keep_output(captured, name)))
        hooks.append(_module(model, att.output).register_forward_pre_hook(_keep_input(captured, f"o{i}")))
        hooks.append(_module(model, layer.ffn.output).register_forward_pre_hook(_keep_input(captured, f"f{i}")))
    training = model.training
    try:
        model.eval()
        out = model(**_model_inputs(model, batch), output_hidden_states=True)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    tokens = _token_selector(batch)
    heads, d = layout.num_heads, layout.head_dim
    acts = {"residual": torch.cat([tokens(h) for h in out.hidden_states]).unsqueeze(1)}  # (tokens*(L+1), 1, H)
    for i in range(layout.num_layers):
        acts[f"ffn.{i}"] = tokens(captured[f"f{i}"]).unsqueeze(1)                          # (tokens, 1, ffn)
        qk = torch.cat([tokens(captured[f"q{i}"]), tokens(captured[f"k{i}"])])            # (2 tokens, heads*d)
        vo = torch.cat([tokens(captured[f"v{i}"]), tokens(captured[f"o{i}"])])
        acts[f"qk.{i}"], acts[f"vo.{i}"] = qk.view(-1, heads, d), vo.view(-1, heads, d)  # (2 tokens, heads, d)
    return acts


def _module(model: torch.nn.Module, proj: Projection) -> torch.nn.Module:
    return model.get_submodule(proj.weight.rsplit(".", 1)[0])


def _keep_output(store: dict, name: str):
    # first call only: DeBERTa's shared Q/K projections also run on the relative embeddings later
    def hook(module, args, output):
        store.setdefault(name, output.detach())
    return hook


def _keep_input(store: dict, name: str):
    def hook(module, args):
        store.setdefault(name, args[0].detach())
    return hook


def _model_inputs(model: torch.nn.Module, batch: dict) -> dict:
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in batch.items() if k != "labels" and isinstance(v, torch.Tensor)}


def _token_selector(batch: dict):
    """(batch, seq, width) -> (tokens, width): only non-padded tokens when there is an attention mask."""
    mask = batch.get("attention_mask")
    if mask is None:
        return lambda t: t.reshape(-1, t.shape[-1])
    keep = mask.bool()
    return lambda t: t[keep.to(t.device)]


# ---------------------------------------------------------------- maps from weights

def _weight_maps(anchor: dict, source: dict, layout: ModelLayout, axes: dict, reg: float, rounds: int) -> TransportMaps:
    """Residual map from basis-free rows, then layer maps; later rounds add the aligned writer rows."""
    base_a, base_s = _basis_free_rows(anchor, layout, axes), _basis_free_rows(source, layout, axes)
    residual = transport_maps(_squared_distances(base_a[None], base_s[None]), reg)[0]
    maps = _layer_maps_from_weights(anchor, source, layout, residual, reg)
    for _ in range(rounds - 1):
        feats_a = torch.cat([base_a, _writer_rows(anchor, layout)], dim=1)
        feats_s = torch.cat([base_s, _writer_rows(source, layout, maps)], dim=1)
        residual = transport_maps(_squared_distances(feats_a[None], feats_s[None]), reg)[0]
        maps = _layer_maps_from_weights(anchor, source, layout, residual, reg)
    return maps


def _unit_rows(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [W | b], L2-normalised: (n, ...) -> (n, f)."""
    rows = weight.flatten(1)
    if bias is not None:
        rows = torch.cat([rows, bias[:, None]], dim=1)
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(_EPS)


def _basis_free_rows(state: dict, layout: ModelLayout, axes: dict) -> torch.Tensor:
    """(hidden, f): per residual neuron, its slice of every tensor outside the layers whose other axes
    need no alignment (embeddings, patch projection, classifier columns), each slice normalised."""
    inside = _layer_axes(layout)
    blocks = []
    for key, key_axes in axes.items():
        if key in inside or len(key_axes) != 1 or state[key].dim() < 2:
            continue
        rows = torch.movedim(state[key], key_axes[0], 0).flatten(1)      # (hidden, rest)
        if rows.shape[1] >= 2:                                           # a lone entry would only give a sign
            blocks.append(_unit_rows(rows))
    return torch.cat(blocks, dim=1)


def _writer_rows(state: dict, layout: ModelLayout, maps: TransportMaps | None = None) -> torch.Tensor:
    """(hidden, f): rows [W | b] of every attention- and FFN-output map, input columns aligned by `maps`."""
    blocks = []
    for i, layer in enumerate(layout.layers):
        out, fc2 = layer.attention.output, layer.ffn.output
        w_out, w_fc2 = state[out.weight], state[fc2.weight]
        if maps is not None:
            w_out = rotate_columns(w_out, maps.vo[i].transpose(1, 2))    # O^h -> O^h P^h^T
            w_fc2 = w_fc2 @ maps.ffn[i].T
        blocks += [_unit_rows(w_out, _bias(state, out)), _unit_rows(w_fc2, _bias(state, fc2))]
    return torch.cat(blocks, dim=1)


def _layer_maps_from_weights(anchor: dict, source: dict, layout: ModelLayout, residual: torch.Tensor,
                             reg: float) -> TransportMaps:
    """FFN and per-head maps from incoming rows, the source's input columns first put in the anchor's basis."""
    costs = {}
    for i, layer in enumerate(layout.layers):
        att, ffn = layer.attention, layer.ffn
        fc1_a = _unit_rows(anchor[ffn.input.weight], _bias(anchor, ffn.input))
        fc1_s = _unit_rows(source[ffn.input.weight] @ residual.T, _bias(source, ffn.input))
        costs[f"ffn.{i}"] = _squared_distances(fc1_a[None], fc1_s[None])                 # (1, ffn, ffn)
        qk = att.query_like + att.key_like
        costs[f"qk.{i}"] = _squared_distances(_head_rows(anchor, qk, layout), _head_rows(source, qk, layout, residual))
        costs[f"vo.{i}"] = _squared_distances(_head_rows(anchor, (att.value,), layout),
                                              _head_rows(source, (att.value,), layout, residual))
    return _maps_from_costs(costs, layout, reg, residual)


def _head_rows(state: dict, projs, layout: ModelLayout, residual: torch.Tensor | None = None) -> torch.Tensor:
    """(heads, d, f): per head coordinate, the concatenated normalised rows [W | b] of `projs`."""
    blocks = []
    for proj in projs:
        weight = state[proj.weight] if residual is None else state[proj.weight] @ residual.T
        blocks.append(_unit_rows(weight, _bias(state, proj)))                        # (heads*d, hidden+1)
    return torch.cat(blocks, dim=1).view(layout.num_heads, layout.head_dim, -1)


def _bias(state: dict, proj: Projection) -> torch.Tensor | None:
    return state[proj.bias] if proj.bias else None
