"""Where each layer's Q, K, V, O and FFN tensors live in a state dict, per model family.

A layout is read from a Hugging Face config plus the model's state dict. It names, for
every transformer layer, the linear maps that a symmetry moves:

- query-like maps: rotated by R_qk and scaled by a_qk   (query; DeBERTa's pos_query_proj)
- key-like maps:   rotated by R_qk and scaled by 1/a_qk (key;   DeBERTa's pos_key_proj)
- value map:       rotated by R_vo and scaled by a_vo
- output map:      its input columns rotated by R_vo and scaled by 1/a_vo; bias untouched
- FFN input map:   its rows (neurons) permuted
- FFN output map:  its input columns permuted; bias untouched

DeBERTa's disentangled attention scores content->position as Q . K_pos^T and
position->content as K . Q_pos^T, so a separate pos_key_proj must move exactly like the
key side of QK (same rotation, scale 1/a) and pos_query_proj like the query side (scale a).
With share_att_key the positional projections reuse query_proj/key_proj and need nothing.

Decoders (llama, qwen2, qwen3, stablelm, gpt2) add four things to a layout:
- grouped-query attention: `group` query heads share one KV head (rows of a group's query
  heads are contiguous, so KV head j serves query heads j*group .. j*group + group - 1);
- RoPE: `rotary_dim` leading dims of each q/k head are rotated by position, in Hugging Face's
  rotate_half pairing: dim i and dim i + rotary_dim/2 form frequency plane i (not GGUF's or
  Meta's interleaved (2i, 2i+1): transformers' GGUF loader un-interleaves q/k on load);
- a gated FFN (SwiGLU): a `gate` map whose rows move with the input map's;
- per-head q/k norms (`qk_norm`, Qwen3's q_norm, StableLM's q_layernorm), which break the
  rotation symmetry of Q/K (matching refuses rotation there and names the module).
GPT-2 stores its maps as Conv1D (weight (in, out)) with Q, K, V fused in c_attn; its layout
names canonical (out, in) views of those tensors (`ModelLayout.canonical`), and
`ModelLayout.stored` puts moved views back into the stored tensors.

Keys follow the installed transformers' module names: models are always loaded through
their transformers class, so checkpoints written by older versions are renamed on load.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch

from symfusion.errors import SymfusionError
from symfusion.families import FAMILIES, FamilySpec, family_of


@dataclass(frozen=True)
class Projection:
    """One linear map y = x W^T + b: the state-dict keys of its weight and (optional) bias."""

    weight: str
    bias: str | None

    def keys(self) -> list[str]:
        return [self.weight] + ([self.bias] if self.bias else [])


@dataclass(frozen=True)
class AttentionLayout:
    query_like: tuple[Projection, ...]
    key_like: tuple[Projection, ...]
    value: Projection
    output: Projection
    group: int = 1                  # query heads per KV head (grouped-query attention); 1 = multi-head
    rotary_dim: int = 0             # leading dims of each q/k head under RoPE (planes i, i + rotary_dim/2)
    qk_norm: tuple[str, ...] = ()   # per-head q/k norm modules: Q/K admit no rotation then

    @property
    def qk_group(self) -> str:
        """The maps of a KV head's q/k coordinates that keep every logit: orthogonal, rope or none."""
        if self.qk_norm:
            return "none"
        return "rope" if self.rotary_dim else "orthogonal"

    def qk_keys(self) -> list[str]:
        return [k for p in self.query_like + self.key_like for k in p.keys()]

    def vo_keys(self) -> list[str]:
        # the output bias acts on the residual stream and is never moved
        return self.value.keys() + [self.output.weight]


@dataclass(frozen=True)
class FFNLayout:
    input: Projection   # weight (ffn, hidden): rows are neurons
    output: Projection  # weight (hidden, ffn): columns are neurons
    gate: Projection | None = None  # gated FFN (SwiGLU): weight (ffn, hidden), rows move with the input's

    def keys(self) -> list[str]:
        return self.input.keys() + (self.gate.keys() if self.gate else []) + [self.output.weight]


@dataclass(frozen=True)
class Stored:
    """Where a canonical (out, in) weight or (out,) bias is stored: rows start:stop of `key`, transposed for Conv1D."""

    key: str
    start: int
    stop: int
    transposed: bool


@dataclass(frozen=True)
class LayerLayout:
    attention: AttentionLayout
    ffn: FFNLayout


@dataclass(frozen=True)
class ModelLayout:
    family: str
    hidden_size: int
    num_heads: int
    head_dim: int
    ffn_size: int
    layers: tuple[LayerLayout, ...]
    num_kv_heads: int | None = None        # None: one KV head per query head
    rotary_dim: int = 0                    # see AttentionLayout
    stored: tuple[tuple[str, Stored], ...] = ()   # canonical key -> stored tensor (GPT-2's fused Conv1D)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def has_decoder_parts(self) -> bool:
        """Whether the layout uses what only decoders have: KV groups, RoPE, gates, Conv1D views."""
        return bool(self.num_kv_heads or self.rotary_dim or self.stored
                    or any(layer.ffn.gate for layer in self.layers))

    def require_encoder(self, what: str) -> None:
        """Raise for a decoder layout in code written for the paper's encoder layouts only."""
        if self.has_decoder_parts:
            raise SymfusionError(
                f"{what} supports the encoder families (bert, roberta, deberta-v2, vit), not {self.family}; "
                "align decoders pairwise with symfusion.align() or symfusion-match"
            )

    def canonical(self, state: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        """The state with every layer map as an (out, in) tensor under its layout key (views; `state` itself when
        the family stores them so)."""
        return canonical_view(state, self.stored)

    def stored_form(self, canonical: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Inverse of canonical(): the canonical views put back into the family's stored tensors."""
        if not self.stored:
            return dict(canonical)
        out = dict(canonical)
        parts: dict[str, list[tuple[int, str, Stored]]] = {}
        for key, where in self.stored:
            if key in canonical:
                parts.setdefault(where.key, []).append((where.start, key, where))
                out.pop(key)
        for stored_key, pieces in parts.items():
            pieces.sort()
            tensor = torch.cat([canonical[key] for _, key, _ in pieces])
            out[stored_key] = (tensor.t() if pieces[0][2].transposed and tensor.dim() == 2 else tensor).contiguous()
        return out

    def module_type(self, key: str) -> str:
        """Which part of the model a state-dict key belongs to: attention_qk, attention_vo, ffn or other."""
        return self._module_types().get(key, "other")

    def stored_keys(self, keys) -> list[str]:
        """The stored tensors that hold the given canonical keys (GPT-2's c_attn for its Q, K, V views)."""
        where = dict(self.stored)
        return list(dict.fromkeys(where[k].key if k in where else k for k in keys))

    def layer_keys(self, index: int) -> list[str]:
        """The canonical keys that a transform of layer `index` reads or writes."""
        layer = self.layers[index]
        return layer.attention.qk_keys() + layer.attention.vo_keys() + layer.ffn.keys()

    def _module_types(self) -> dict[str, str]:
        types: dict[str, str] = {}
        for layer in self.layers:
            types.update({k: "attention_qk" for k in layer.attention.qk_keys()})
            types.update({k: "attention_vo" for k in layer.attention.vo_keys()})
            types.update({k: "ffn" for k in layer.ffn.keys()})
        return types


FLOAT32_SQUARE_LIMIT = math.sqrt(torch.finfo(torch.float32).max)     # 1.8e19: a larger value's square is inf in float32


def check_finite(state: Mapping[str, torch.Tensor], name: str) -> None:
    """Raise naming the first tensor that holds NaN or inf, or a value whose square overflows float32 (|x| > 1.8e19:
    a norm gain of 1e30 is finite, but the model's own norms and every squared distance and Fisher weight of it are
    inf). One reduction per tensor (aminmax: NaN fails the comparison), no copy."""
    for key, tensor in state.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        low, high = torch.aminmax(tensor)
        if bool(low >= -FLOAT32_SQUARE_LIMIT) and bool(high <= FLOAT32_SQUARE_LIMIT):
            continue
        if not torch.isfinite(tensor).all():
            raise SymfusionError(f"{name} has non-finite values (NaN/inf) in {key!r}; retrain or re-export that model")
        raise SymfusionError(f"{name} has values too large for float32 arithmetic in {key!r} (up to "
                             f"{max(-float(low), float(high)):.3g}; above 1.8e19 a value's square overflows float32, so "
                             "the model's own norms and every distance of it are inf); retrain or re-export that model")


def find_prefix(state: Mapping[str, torch.Tensor], family: str) -> str:
    """The base-model prefix ('' for a bare model, 'bert.' under a task head, ...)."""
    names = FAMILIES[family].modules
    suffix = names["layer"].format(i=0) + names.get("qkv", names["query"]) + ".weight"
    prefixes = [k[: -len(suffix)] for k in state if k.endswith(suffix)]
    if len(prefixes) != 1:
        raise SymfusionError(
            f"cannot locate the {family} layers in the state dict (expected one key ending in {suffix!r}, "
            f"found {len(prefixes)}); is the transformers version >= 5?"
        )
    return prefixes[0]


def layer_module_names(config, state: Mapping[str, torch.Tensor], kinds: tuple[str, ...]) -> list[str]:
    """Full module names of the maps `kinds` (keys of the family's FamilySpec.modules, e.g. "query", "ffn_in")
    in every layer, as state-dict prefixes; a kind the family does not name is skipped."""
    family = family_of(config)
    names = FAMILIES[family].modules
    prefix = find_prefix(state, family)
    return [prefix + names["layer"].format(i=i) + names[kind]
            for i in range(config.num_hidden_layers) for kind in kinds if kind in names]


def _projection(state: Mapping[str, torch.Tensor], name: str, required: bool = True) -> Projection | None:
    weight, bias = name + ".weight", name + ".bias"
    if weight not in state:
        if required:
            raise SymfusionError(f"state dict lacks {weight!r}; the checkpoint does not match its config")
        return None
    return Projection(weight, bias if bias in state else None)


def _layer_layout(state: Mapping[str, torch.Tensor], names: dict[str, str], prefix: str, **attention) -> LayerLayout:
    p = lambda part: prefix + names[part]  # noqa: E731
    query_like = [_projection(state, p("query"))]
    key_like = [_projection(state, p("key"))]
    if "pos_query" in names:  # DeBERTa without share_att_key: only the types in pos_att_type exist
        pos_query = _projection(state, p("pos_query"), required=False)
        pos_key = _projection(state, p("pos_key"), required=False)
        query_like += [pos_query] if pos_query else []
        key_like += [pos_key] if pos_key else []
    attention = AttentionLayout(
        query_like=tuple(query_like),
        key_like=tuple(key_like),
        value=_projection(state, p("value")),
        output=_projection(state, p("output")),
        **attention,
    )
    gate = _projection(state, p("ffn_gate")) if "ffn_gate" in names else None
    ffn = FFNLayout(input=_projection(state, p("ffn_in")), output=_projection(state, p("ffn_out")), gate=gate)
    return LayerLayout(attention=attention, ffn=ffn)


def _conv1d_views(state: Mapping[str, torch.Tensor], names: Mapping[str, str], prefix: str, layers: int) -> tuple:
    """GPT-2: canonical (out, in) views of every layer's Conv1D maps, c_attn split into its Q, K, V thirds."""
    stored = []
    for i in range(layers):
        p = prefix + names["layer"].format(i=i)
        fused = p + names["qkv"]
        if fused + ".weight" not in state:
            raise SymfusionError(f"state dict lacks {fused + '.weight'!r}; the checkpoint does not match its config")
        width = state[fused + ".weight"].shape[1] // 3          # (hidden, 3 * hidden): [Q | K | V] columns
        for j, part in enumerate(("query", "key", "value")):
            for suffix in (".weight", ".bias"):
                if fused + suffix in state:
                    stored.append((p + names[part] + suffix, Stored(fused + suffix, j * width, (j + 1) * width, True)))
        for part in ("output", "ffn_in", "ffn_out"):
            key = p + names[part] + ".weight"
            if key not in state:
                raise SymfusionError(f"state dict lacks {key!r}; the checkpoint does not match its config")
            stored.append((key, Stored(key, 0, state[key].shape[1], True)))
    return tuple(stored)


def canonical_view(state: Mapping[str, torch.Tensor], stored: tuple[tuple[str, Stored], ...]) -> Mapping[str, torch.Tensor]:
    """`state` with each canonical key bound to its (out, in) view of a stored tensor; fused stored keys dropped."""
    if not stored:
        return state
    out = dict(state)
    for key, where in stored:
        if where.key in state:            # a partial state (one layer's tensors) has only some stored tensors
            tensor = state[where.key]
            tensor = tensor.t() if where.transposed and tensor.dim() == 2 else tensor
            out[key] = tensor[where.start:where.stop]
    for key in {where.key for _, where in stored} - {key for key, _ in stored}:
        out.pop(key, None)
    return out


def rotary_dim_of(config, head_dim: int) -> int:
    """How many leading dims of each q/k head RoPE rotates (head_dim * partial_rotary_factor)."""
    params = getattr(config, "rope_parameters", None) or {}
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None)) or 1.0
    dim = int(head_dim * factor)
    if dim % 2:
        raise SymfusionError(f"rotary dimension {dim} is odd; RoPE pairs dims (i, i + rotary_dim/2)")
    return dim


def _qk_norm_modules(state: Mapping[str, torch.Tensor], spec: FamilySpec, prefix: str) -> tuple[str, ...]:
    """The per-head q/k norm modules present in layer 0 (full names), in the family's order."""
    layer = prefix + spec.modules["layer"].format(i=0)
    return tuple(layer + m for m in spec.qk_norm if any(k.startswith(layer + m + ".") for k in state))


def layout_of(config, state: Mapping[str, torch.Tensor]) -> ModelLayout:
    """Build the layout of a model from its config and state dict, checking every shape."""
    family = family_of(config)
    spec = FAMILIES[family]
    names = spec.modules
    prefix = find_prefix(state, family)
    num_layers = config.num_hidden_layers
    stored = _conv1d_views(state, names, prefix, num_layers) if spec.conv1d else ()
    state = canonical_view(state, stored)
    num_heads = config.num_attention_heads
    first = _layer_layout(state, names, prefix + names["layer"].format(i=0))
    attention_width = state[first.attention.query_like[0].weight].shape[0]
    if attention_width % num_heads:
        raise SymfusionError(f"attention width {attention_width} is not divisible by {num_heads} heads")
    head_dim = attention_width // num_heads
    kv_width = state[first.attention.key_like[0].weight].shape[0]
    if kv_width % head_dim or num_heads % (kv_width // head_dim):
        raise SymfusionError(f"key width {kv_width} is not a whole number of KV heads dividing {num_heads} query heads")
    kv_heads = kv_width // head_dim
    attention = dict(group=num_heads // kv_heads,
                     rotary_dim=rotary_dim_of(config, head_dim) if spec.rotary else 0,
                     qk_norm=_qk_norm_modules(state, spec, prefix))
    layers = tuple(
        _layer_layout(state, names, prefix + names["layer"].format(i=i), **attention) for i in range(num_layers)
    )
    layout = ModelLayout(
        family=family,
        hidden_size=config.hidden_size,
        num_heads=num_heads,
        head_dim=head_dim,
        ffn_size=state[layers[0].ffn.input.weight].shape[0],
        layers=layers,
        num_kv_heads=kv_heads if kv_heads != num_heads else None,
        rotary_dim=attention["rotary_dim"],
        stored=stored,
    )
    _check_shapes(layout, state)
    return layout


def _check_shapes(layout: ModelLayout, state: Mapping[str, torch.Tensor]) -> None:
    width, kv_width = layout.num_heads * layout.head_dim, layout.kv_heads * layout.head_dim
    for i, layer in enumerate(layout.layers):
        att = layer.attention
        expected = {p.weight: (width, layout.hidden_size) for p in att.query_like}
        expected.update({p.weight: (kv_width, layout.hidden_size) for p in att.key_like + (att.value,)})
        expected[att.output.weight] = (layout.hidden_size, width)
        expected[layer.ffn.input.weight] = (layout.ffn_size, layout.hidden_size)
        if layer.ffn.gate is not None:
            expected[layer.ffn.gate.weight] = (layout.ffn_size, layout.hidden_size)
        expected[layer.ffn.output.weight] = (layout.hidden_size, layout.ffn_size)
        for key, shape in expected.items():
            if tuple(state[key].shape) != shape:
                raise SymfusionError(f"layer {i}: {key!r} has shape {tuple(state[key].shape)}, expected {shape}")


def check_same_layout(source: ModelLayout, anchor: ModelLayout) -> None:
    """Raise if two layouts differ (used when configs agree but checkpoints do not)."""
    for field in ("family", "hidden_size", "num_heads", "head_dim", "ffn_size", "num_layers", "kv_heads", "rotary_dim"):
        a, b = getattr(source, field), getattr(anchor, field)
        if a != b:
            raise SymfusionError(f"source and anchor differ in {field} ({a} vs {b}); they cannot be matched")
    if source.layers != anchor.layers:
        raise SymfusionError("source and anchor name their layer tensors differently; they cannot be matched")


def resolve_layers(num_layers: int, layers=None, last_layers: int | None = None) -> list[int]:
    """The layer subset to match: all, explicit indices, or the last k layers."""
    if layers is not None and last_layers is not None:
        raise SymfusionError("give either layers=[...] or last_layers=K, not both")
    if last_layers is not None:
        if not 0 <= int(last_layers) <= num_layers:
            raise SymfusionError(f"last_layers={last_layers} is outside 0..{num_layers}")
        return list(range(num_layers - int(last_layers), num_layers))
    if layers is None:
        return list(range(num_layers))
    indices = sorted({int(i) for i in layers})
    bad = [i for i in indices if not 0 <= i < num_layers]
    if bad:
        raise SymfusionError(f"layer indices {bad} are outside 0..{num_layers - 1}")
    return indices

