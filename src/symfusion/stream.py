"""The residual stream of a model: which tensors read, write or live in it, and moving it by an orthogonal map.

Every tensor of a transformer that touches the residual stream h (hidden, d) has residual axes: the input
columns of the maps that read it (Q, K, V, FFN in/gate, DeBERTa's positional projections, pooler,
classifier, lm_head), the output rows and biases of the maps that write it (attention output, FFN output),
the last axis of every embedding table (word, position, token type, CLS token, patch projection's output
channels and bias) and every norm's gain and bias. A map R (d x d) moves the stream to h' = R h by
contracting every residual axis with R (new[i] = sum_j R[i, j] old[j]): readers W -> W R^T, writers
W -> R W, tables E -> E R^T, vectors v -> R v.

That is a symmetry when every norm commutes with R:
- a permutation P commutes with any norm once its gain and bias are permuted too (post-LN BERT included);
  a signed permutation D P also with RMSNorm (|R| moves the gain, R the bias);
- a general orthogonal R commutes with RMSNorm, and with LayerNorm when R 1 = +-1 (its mean-centring),
  only once each norm's gain is 1 (an elementwise gain does not commute with a rotation). Pre-norm families
  fold the gain g of each norm into the maps that read it (SliceGPT's computational invariance): W -> W
  diag(g), bias -> bias / g, g -> 1. Post-LN families (the norm output is the stream itself) cannot.
Folding, then unfolding with other gains t (W -> W diag(1/t), bias -> bias * t, gain -> t), is itself a
symmetry of a pre-norm model: matched models are unfolded with the gains, per coordinate, that bring them
closest to the anchor as stored (matching/residual.py, gauge_gains). A final norm read by a tied
lm_head does not fold (lm_head is the embedding table): there only (signed) permutations apply.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import torch

from symfusion.arch import ModelLayout, find_prefix
from symfusion.errors import SymfusionError
from symfusion.families import FAMILIES


@dataclass(frozen=True)
class NormFold:
    """One pre-norm: its gain and bias keys and the weight keys of the maps that read its output."""

    gain: str
    bias: str | None
    readers: tuple[str, ...]


@dataclass(frozen=True)
class StreamLayout:
    """Where the residual stream lives in one model's (canonical) state dict."""

    hidden: int
    axes: tuple[tuple[str, tuple[int, ...]], ...]   # canonical key -> its residual axes
    norm: str                                       # layernorm | rmsnorm
    folds: tuple[NormFold, ...]                     # the pre-norms that fold (none for post-LN families)
    gains: tuple[str, ...]                          # every norm gain key (folded or not)
    nonlinear: tuple[str, ...]                      # head keys whose output axis passes a nonlinearity
    tied_final: bool                                # a final norm read by a tied lm_head (not folded)
    read_out: bool                                  # a head reads the stream (a bare model outputs the stream)
    tied_copy: str | None = None                    # a tied lm_head listed beside its embeddings: moved, counted once

    @property
    def folded(self) -> frozenset[str]:
        return frozenset(f.gain for f in self.folds)

    def problem(self, family: str) -> str | None:
        """Why no map of the stream at all keeps this model's outputs (None when permutations do)."""
        if not self.read_out:
            return (f"this {family} model has no head: its output is the residual stream itself, which a map of the "
                    "stream moves; match the model with its head (e.g. ...ForSequenceClassification, ...ForCausalLM)")
        return None

    def orthogonal_problem(self, family: str) -> str | None:
        """Why no general orthogonal map of the stream is a symmetry of this model (None when one is)."""
        if self.problem(family):
            return self.problem(family)
        if not self.folds:
            return (f"a {family} model normalises the residual stream after each block (post-LN): only permutations "
                    "of the stream keep its function; use matching.residual=permutation")
        if self.tied_final:
            return ("its lm_head is tied to the input embeddings, so the final norm's gain cannot be folded: only "
                    "(signed) permutations of the stream keep the function with the tie; use matching.residual=permutation")
        if self.nonlinear:
            return (f"{self.nonlinear[0]} passes the stream through an elementwise nonlinearity: only permutations "
                    "keep its function; use matching.residual=permutation")
        return None


def stream_layout(layout: ModelLayout, state: Mapping[str, torch.Tensor], tied: bool | None = None) -> StreamLayout:
    """The stream layout of a model from its layout and state (shape-only meta tensors do); `tied`: whether an
    lm_head is tied to the input embeddings (config.tie_word_embeddings; None: read from the state, see
    tied_head; a state holding another head of the final norm, a classifier's score, has no lm_head to tie).
    Raises naming a tensor whose place in the stream its family does not know."""
    spec = FAMILIES[layout.family]
    prefix = find_prefix(state, layout.family)        # on the stored keys (GPT-2's fused c_attn)
    lm_head = bool(spec.final_norm) and "lm_head.weight" in spec.final_norm[1]
    classifier = lm_head and any(h in state for h in spec.final_norm[1] if h != "lm_head.weight")
    tied = lm_head and not classifier and (tied_head(state, prefix, spec) if tied is None else tied)
    state = layout.canonical(state)
    axes: dict[str, tuple[int, ...]] = {}
    head_side: set[str] = set()                    # layer-map biases on the head or neuron side: no residual axis
    for layer in layout.layers:
        att, ffn = layer.attention, layer.ffn
        readers = att.query_like + att.key_like + (att.value, ffn.input) + ((ffn.gate,) if ffn.gate else ())
        for proj in readers:
            axes[proj.weight] = (1,)               # (out, hidden): input columns
            head_side.update([proj.bias] if proj.bias else [])
        for proj in (att.output, ffn.output):
            axes[proj.weight] = (0,)               # (hidden, in): output rows
            if proj.bias:
                axes[proj.bias] = (0,)
    layer_maps = set(axes) | head_side
    for key, tensor in state.items():
        if key in layer_maps or not tensor.is_floating_point():
            continue
        found = spec.residual_axes_of(key)
        if found:
            axes[key] = found
    # a norm's gain: a 1-d `.weight` living in the stream (LayerNorm, RMSNorm)
    gains = tuple(k for k, a in axes.items() if k.endswith(".weight") and state[k].dim() == 1 and a == (0,))
    folds = _folds(layout, state, spec, prefix, tied)
    nonlinear = tuple(k for k in axes if len(axes[k]) > 1 and any(f".{m}." in "." + k for m in spec.nonlinear_heads))
    final = spec.final_norm
    tied_final = bool(final and tied and f"{prefix}{final[0]}.weight" in state)
    heads = [k for k in axes if prefix and not k.startswith(prefix)]         # a bare model (prefix "") has none
    return StreamLayout(hidden=layout.hidden_size, axes=tuple(axes.items()), norm=spec.norm, folds=folds,
                        gains=gains, nonlinear=nonlinear, tied_final=tied_final, read_out=bool(heads) or tied_final,
                        tied_copy="lm_head.weight" if tied and "lm_head.weight" in state else None)


def tied_head(state: Mapping[str, torch.Tensor], prefix: str, spec) -> bool:
    """Whether a model with a body under `prefix` reads its final norm with an lm_head tied to its embeddings: the
    state has no head map of the final norm (a tied lm_head is not saved), or an lm_head sharing storage with, or
    equal to, an embedding table (a copied state dict of a tied model: treated as tied, which is always safe)."""
    if not prefix or not spec.final_norm:
        return False
    heads = [h for h in spec.final_norm[1] if h in state]
    if not heads:
        return True
    head = state.get("lm_head.weight")
    if head is None or head.device.type == "meta":
        return False
    return any(k != "lm_head.weight" and t.shape == head.shape and (t.data_ptr() == head.data_ptr() or torch.equal(t, head))
               for k, t in state.items())


def _folds(layout: ModelLayout, state: Mapping, spec, prefix: str, tied: bool) -> tuple[NormFold, ...]:
    """The pre-norms of a pre-norm family, each with the weight keys that read it."""
    if not spec.prenorm:
        return ()
    kinds = {}
    for i, layer in enumerate(layout.layers):
        att, ffn = layer.attention, layer.ffn
        kinds[i] = {"query": [p.weight for p in att.query_like], "key": [p.weight for p in att.key_like],
                    "value": [att.value.weight], "ffn_in": [ffn.input.weight],
                    "ffn_gate": [ffn.gate.weight] if ffn.gate else []}
    folds = []
    for i in range(layout.num_layers):
        layer_prefix = prefix + spec.modules["layer"].format(i=i)
        present = [n for n in spec.prenorm if f"{layer_prefix}{n}.weight" in state]
        if not present:
            raise SymfusionError(f"layer {i} has none of the norms {', '.join(spec.prenorm)}; the checkpoint does "
                                 "not match its family")
        readers: dict[str, list[str]] = {n: [] for n in present}
        for norm, reads in spec.prenorm.items():     # a missing norm's readers read the layer's first norm
            owner = norm if norm in readers else present[0]
            readers[owner] += [key for kind in reads for key in kinds[i][kind]]
        for norm in present:
            gain = f"{layer_prefix}{norm}.weight"
            folds.append(NormFold(gain, _bias_of(gain, state), tuple(readers[norm])))
    if spec.final_norm:
        name, heads = spec.final_norm
        gain = f"{prefix}{name}.weight"
        readers = tuple(h for h in heads if h in state)
        if gain in state and readers and not tied:
            folds.append(NormFold(gain, _bias_of(gain, state), readers))
    return tuple(folds)


def _bias_of(gain: str, state: Mapping) -> str | None:
    bias = gain[: -len("weight")] + "bias"
    return bias if bias in state else None


# ---------------------------------------------------------------- preconditions of the whole symmetry

def comparable(source: Mapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The anchor's tensors that have a counterpart of the same shape in the source, or none: task heads of other
    sizes (other label counts) are each model's own, moved with the stream but compared with nothing."""
    return {k: v for k, v in anchor.items() if k not in source or tuple(source[k].shape) == tuple(v.shape)}


GAIN_RESOLUTION = torch.finfo(torch.float32).eps     # 2^-23: a gain this far below its bias is lost in its rounding


def constant_coordinates(gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Where a norm outputs its bias alone, to float32 rounding: |g| <= 2^-23 |b| with b != 0 (a zero gain where the
    bias is not zero, or one so small that folding it, b -> b / g, would make one folded entry 1e7 or more times the
    gain's size, beyond what the float64 descent resolves beside the others: a gain of 1e-30 made every inner loop
    run to its cap, 200 s on a two-layer ViT)."""
    g, b = gain.double(), bias.double()
    return (g.abs() <= GAIN_RESOLUTION * b.abs()) & (b != 0)


def unfoldable(state: Mapping[str, torch.Tensor], stream: StreamLayout) -> list[str]:
    """The pre-norms of a (canonical) state that cannot be folded: a coordinate that outputs its bias, a constant
    (constant_coordinates: a zero gain, or one below float32 rounding of a non-zero bias). Only (signed)
    permutations of the stream keep such a model's function, and those need no folding: the descent leaves these
    norms unfolded."""
    return [f.gain for f in stream.folds if f.bias and f.gain in state and f.bias in state
            and bool(constant_coordinates(state[f.gain], state[f.bias]).any())]


def foldable(stream: StreamLayout, kind: str, states) -> tuple[StreamLayout, str]:
    """(the stream layout, the matching.residual choice) a descent may use on these (canonical) states: a norm with a
    zero gain where its bias is not zero (in any of them) cannot be folded, so no rotation keeps the model's function
    (kind orthogonal: one error line) and permutations, which need no fold, leave it unfolded (auto: permutation)."""
    bad = sorted({gain for state in states for gain in unfoldable(state, stream)})
    if not bad:
        return stream, kind
    if kind == "orthogonal":
        raise SymfusionError(f"matching.residual=orthogonal is not exact for this model: {bad[0]} is zero (or below "
                             "float32 rounding) where its bias is not (that coordinate outputs a constant, which no "
                             "rotation keeps); use matching.residual=permutation")
    return dataclasses.replace(stream, folds=tuple(f for f in stream.folds if f.gain not in bad)), "permutation"


# ---------------------------------------------------------------- the action

def fold_norms(state: Mapping[str, torch.Tensor], folds: tuple[NormFold, ...]) -> dict[str, torch.Tensor]:
    """Each norm's gain g folded into its readers: W -> W diag(g), bias -> bias / g, g -> 1 (a symmetry). A zero gain
    folds too (its coordinate reaches no reader), where the bias is zero as well (unfoldable says where not). Readers
    the state lacks are skipped (a tied anchor folder's lm_head)."""
    out = dict(state)
    for fold in folds:
        g = out[fold.gain]
        for key in fold.readers:
            if key in out:
                out[key] = out[key] * g.to(out[key].dtype)[None, :]          # (out, hidden) columns
        if fold.bias:
            b = out[fold.bias]
            if bool(constant_coordinates(g, b).any()):
                raise SymfusionError(f"{fold.gain} is zero (or below float32 rounding) where {fold.bias} is not: that "
                                     "coordinate of the norm outputs a constant, which no rotation of the stream "
                                     "keeps; use matching.residual=permutation")
            out[fold.bias] = torch.where(g == 0, torch.zeros_like(b), b / torch.where(g == 0, torch.ones_like(g), g))
        out[fold.gain] = torch.ones_like(g)
    return out


def unfold_norms(state: Mapping[str, torch.Tensor], folds: tuple[NormFold, ...],
                 gains: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse fold with the gains t given per norm: W -> W diag(1/t), bias -> bias * t, gain -> t. A zero t is
    exact only where every reader's column is zero (the coordinate reaches no reader); anywhere else it is a bug."""
    out = dict(state)
    for fold in folds:
        t = gains[fold.gain].to(out[fold.gain].dtype)
        zero = t == 0
        if bool(zero.any()) and any(bool(out[k][:, zero].any()) for k in fold.readers if k in out):
            raise SymfusionError(f"{fold.gain} would be unfolded with a zero gain where its readers read the stream; "
                                 "report this as a bug")
        safe = torch.where(zero, torch.ones_like(t), t)
        for key in fold.readers:
            if key in out:
                out[key] = out[key] / safe.to(out[key].dtype)[None, :]
        if fold.bias:
            out[fold.bias] = out[fold.bias] * t
        out[fold.gain] = t.clone()
    return out


def rotate_stream(state: Mapping[str, torch.Tensor], stream: StreamLayout, r: torch.Tensor,
                  skip: frozenset[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Every residual axis contracted with r (d x d): h -> r h. Norm gains move by |r| (exact when r is a signed
    permutation; folded gains, all ones, stay). Keys in `skip` stay."""
    out = dict(state)
    folded = stream.folded
    signed = signed_permutation(r)
    for key, axes in stream.axes:
        if key in skip or key not in out:
            continue
        if key in stream.gains:
            if key not in folded:
                out[key] = contract(out[key], r.abs(), axes, None if signed is None else (signed[0], None))
            continue
        out[key] = contract(out[key], r, axes, signed)
    return out


def contract(tensor: torch.Tensor, r: torch.Tensor, axes: tuple[int, ...],
             signed: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
    """new[.., i, ..] = sum_j r[i, j] old[.., j, ..] along each axis in `axes`; with `signed` = (perm, signs) of a
    signed permutation r (signed_permutation), the same by indexing: new[i] = signs[i] old[perm[i]]."""
    r = r.to(tensor.dtype) if tensor.is_floating_point() else r
    for axis in axes:
        if signed is None:
            tensor = torch.movedim(torch.tensordot(r, tensor, dims=([1], [axis])), 0, axis)
            continue
        perm, signs = signed
        tensor = tensor.index_select(axis, perm)
        if signs is not None:
            shape = [1] * tensor.dim()
            shape[axis] = -1
            tensor = tensor * signs.to(tensor.dtype).reshape(shape)
    return tensor


def signed_permutation(r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(perm, signs) with r[i, perm[i]] = signs[i] the only nonzero entry of row i, when r is a signed permutation."""
    if not is_signed_permutation(r):
        return None
    perm = r.abs().argmax(dim=1)
    return perm, r[torch.arange(r.shape[0]), perm]


def move_stream(state: Mapping[str, torch.Tensor], stream: StreamLayout, r: torch.Tensor,
                gains: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole residual symmetry: fold every pre-norm, move the stream by r, unfold with `gains` (per folded
    norm, the gains the moved model's norms take; typically the anchor's)."""
    return unfold_norms(rotate_stream(fold_norms(state, stream.folds), stream, r), stream.folds, gains)


def is_signed_permutation(r: torch.Tensor) -> bool:
    """Whether r has exactly one nonzero entry, +1 or -1, per row and column."""
    a = r.abs()
    return bool(((a == 0) | (a == 1)).all() and (a.sum(0) == 1).all() and (a.sum(1) == 1).all())


# ---------------------------------------------------------------- LayerNorm's constraint: r 1 = +-1

def centred_basis(hidden: int) -> torch.Tensor:
    """An orthonormal basis of the complement of the all-ones vector, (hidden, hidden - 1) float64 (Helmert's);
    a copy of one computed once per size."""
    return _helmert(hidden).clone()


@lru_cache(maxsize=4)
def _helmert(hidden: int) -> torch.Tensor:
    basis = torch.zeros(hidden, hidden - 1, dtype=torch.float64)
    for k in range(1, hidden):                    # column k-1: (1, ..., 1, -k, 0, ...) / sqrt(k (k + 1))
        basis[:k, k - 1] = 1.0
        basis[k, k - 1] = -float(k)
        basis[:, k - 1] /= (k * (k + 1)) ** 0.5
    return basis


def centred_map(q: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    """The orthogonal map acting as q (hidden-1 x hidden-1) on the complement of 1 and as `sign` on 1."""
    hidden = q.shape[0] + 1
    basis, ones = centred_basis(hidden), torch.full((hidden,), hidden ** -0.5, dtype=torch.float64)
    return sign * torch.outer(ones, ones) + basis @ q.to(torch.float64) @ basis.T
