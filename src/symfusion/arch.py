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

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import torch

from symfusion.errors import SymfusionError


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
    match_heads: bool = False              # whether matching permutes whole heads by default (decoders)
    stored: tuple[tuple[str, Stored], ...] = ()   # canonical key -> stored tensor (GPT-2's fused Conv1D)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def has_decoder_parts(self) -> bool:
        """Whether the layout uses what only decoders have: KV groups, RoPE, gates, head matching, Conv1D views."""
        return bool(self.num_kv_heads or self.rotary_dim or self.match_heads or self.stored
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


@dataclass(frozen=True)
class FamilySpec:
    """Everything symfusion knows about one model family (config.model_type): one entry per family.

    modules:          module names inside layer i, relative to the layer's prefix ("layer" holds {i})
    residual_axes:    axes of the tensors outside the layers that live in the residual stream, by key
                      suffix (matched on a module boundary; () = no residual axis, e.g. label rows);
                      OT fusion aligns them, and never guesses from shapes
    base_prefix:      the body/head boundary: keys under "<base_prefix>." are the pretrained body,
                      the rest is the task head (as transformers' base_model_prefix)
    config_fields:    config fields besides SHAPE_FIELDS that must agree between matched or merged models
    inputs:           what the model reads: "tokens" (input_ids, attention_mask) or "pixels"
    stream:           where each residual tensor other than the Q/K/V/O/FFN projections sits along the
                      residual stream, by module-name fragment (matched on module boundaries, the
                      longest match wins): "in", "mid", "out" inside a layer (its input; after the
                      attention block's residual add; after the FFN's), "embeddings" (before layer 0),
                      "head" (after the last layer), and for ViT the embedding parts "class_token",
                      "positions", "patches". OT fusion aligns each tensor with the map of its place.
    model_types:      the config.model_type values of this family (default: its name)
    rotary:           q/k heads carry RoPE in rotate_half pairing (i, i + rotary_dim/2); rotary_dim from
                      config.rope_parameters' partial_rotary_factor
    qk_norm:          module names (in "layer") of per-head q/k norms, when the checkpoint has them
    conv1d:           the layer maps are Conv1D (weight (in, out)), with Q, K, V fused in modules["qkv"]
    match_heads:      matching permutes whole heads (KV groups and query heads within a group) by default
    padding_free:     the layer maps read token states only, so a padded batch may run them on its real
                      tokens alone (packing.py); False where a layer map also reads other inputs
    """

    name: str
    modules: Mapping[str, str]
    residual_axes: Mapping[str, tuple[int, ...]]
    base_prefix: str
    config_fields: tuple[str, ...] = ()
    inputs: str = "tokens"
    stream: Mapping[str, str] = dataclasses.field(default_factory=dict)
    model_types: tuple[str, ...] = ()
    rotary: bool = False
    qk_norm: tuple[str, ...] = ()
    conv1d: bool = False
    match_heads: bool = False
    padding_free: bool = True

    def residual_axes_of(self, key: str) -> tuple[int, ...]:
        """The residual axes of a tensor outside the layers, from its key suffix; raises for an unknown key."""
        for suffix, axes in self.residual_axes.items():
            if key == suffix or key.endswith("." + suffix):
                return axes
        raise SymfusionError(
            f"the {self.name} family does not know the residual axes of {key!r}; "
            "add its key suffix to the family's residual_axes in symfusion/arch.py"
        )

    def stream_position_of(self, key: str) -> str:
        """Where a residual tensor sits along the residual stream (see `stream`); raises for an unknown key."""
        path = "." + key + "."
        found = [f for f in self.stream if "." + f + "." in path]
        if not found:
            raise SymfusionError(
                f"the {self.name} family does not know where {key!r} sits in the residual stream; "
                "add its module to the family's stream in symfusion/arch.py"
            )
        return self.stream[max(found, key=len)]

    def head_keys(self, keys) -> list[str]:
        """The task-head keys among `keys`: everything outside "<base_prefix>." (BERT's pooler is body)."""
        return [k for k in keys if not k.startswith(self.base_prefix + ".")]

    def body_keys(self, keys) -> list[str]:
        """The pretrained body's keys among `keys` (under "<base_prefix>.")."""
        return [k for k in keys if k.startswith(self.base_prefix + ".")]


_ENCODER_MODULES = {
    "layer": "encoder.layer.{i}.",
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "output": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}
_POOLER = {"pooler.dense.weight": (0, 1), "pooler.dense.bias": (0,)}   # (H, H): residual on both axes
_CLASSIFIER = {"classifier.weight": (1,), "classifier.bias": ()}       # label rows never move
# post-LN encoders: each block's LayerNorm follows its residual add
_TEXT_STREAM = {"embeddings": "embeddings", "attention.output.LayerNorm": "mid", "output.LayerNorm": "out",
                "pooler": "head", "classifier": "head"}
_TEXT_RESIDUAL = {
    "embeddings.word_embeddings.weight": (1,),        # (vocab, hidden)
    "embeddings.position_embeddings.weight": (1,),    # (positions, hidden)
    "embeddings.token_type_embeddings.weight": (1,),  # (types, hidden)
    "LayerNorm.weight": (0,),                         # embeddings, attention output, layer output
    "LayerNorm.bias": (0,),
    **_POOLER,
    **_CLASSIFIER,
}

_DECODER_MODULES = {
    "layer": "layers.{i}.",
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_in": "mlp.up_proj",
    "ffn_out": "mlp.down_proj",
}
_DECODER_RESIDUAL = {
    "embed_tokens.weight": (1,),              # (vocab, hidden)
    "input_layernorm.weight": (0,),
    "input_layernorm.bias": (0,),             # StableLM's LayerNorm
    "post_attention_layernorm.weight": (0,),
    "post_attention_layernorm.bias": (0,),
    "norm.weight": (0,),                      # final norm
    "norm.bias": (0,),
    "lm_head.weight": (1,),                   # (vocab, hidden)
    "score.weight": (1,),                     # sequence-classification head
}
_DECODER_FIELDS = ("num_key_value_heads", "head_dim")

FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in (
    FamilySpec(name="bert", modules=_ENCODER_MODULES, residual_axes=_TEXT_RESIDUAL, base_prefix="bert",
               stream=_TEXT_STREAM),
    FamilySpec(
        name="roberta", modules=_ENCODER_MODULES, base_prefix="roberta", stream=_TEXT_STREAM,
        residual_axes={
            **_TEXT_RESIDUAL,
            "classifier.dense.weight": (0, 1),        # sequence head: dense -> tanh -> out_proj
            "classifier.dense.bias": (0,),
            "classifier.out_proj.weight": (1,),
            "classifier.out_proj.bias": (),
        },
    ),
    FamilySpec(
        name="deberta-v2", base_prefix="deberta",
        modules={
            **_ENCODER_MODULES,
            "query": "attention.self.query_proj",
            "key": "attention.self.key_proj",
            "value": "attention.self.value_proj",
            "pos_query": "attention.self.pos_query_proj",
            "pos_key": "attention.self.pos_key_proj",
        },
        # relative embeddings (2 * buckets, hidden) are read by the Q/K maps (share_att_key) or pos_*_proj
        residual_axes={**_TEXT_RESIDUAL, "encoder.rel_embeddings.weight": (1,)},
        # the relative embeddings and their LayerNorm are read by every layer; OT fusion puts them in
        # the basis of the stream entering layer 0
        stream={**_TEXT_STREAM, "encoder.rel_embeddings": "embeddings", "encoder.LayerNorm": "embeddings"},
        config_fields=("relative_attention", "share_att_key", "pos_att_type", "position_buckets",
                       "max_relative_positions"),
        padding_free=False,       # with share_att_key the Q/K maps also project the relative embeddings
    ),
    FamilySpec(
        name="vit", base_prefix="vit", inputs="pixels",
        # pre-LN layers: layernorm_before reads a layer's input, layernorm_after the stream after attention
        stream={"embeddings.cls_token": "class_token", "embeddings.position_embeddings": "positions",
                "embeddings.patch_embeddings": "patches", "embeddings.mask_token": "patches",
                "layernorm_before": "in", "layernorm_after": "mid", "layernorm": "head", "pooler": "head",
                "classifier": "head"},
        modules={
            "layer": "layers.{i}.",
            "query": "attention.q_proj",
            "key": "attention.k_proj",
            "value": "attention.v_proj",
            "output": "attention.o_proj",
            "ffn_in": "mlp.fc1",
            "ffn_out": "mlp.fc2",
        },
        residual_axes={
            "embeddings.cls_token": (2,),                 # (1, 1, hidden)
            "embeddings.mask_token": (2,),                # (1, 1, hidden)
            "embeddings.position_embeddings": (2,),       # (1, patches + 1, hidden)
            "embeddings.patch_embeddings.projection.weight": (0,),  # (hidden, channels, p, p)
            "embeddings.patch_embeddings.projection.bias": (0,),
            "layernorm_before.weight": (0,),
            "layernorm_before.bias": (0,),
            "layernorm_after.weight": (0,),
            "layernorm_after.bias": (0,),
            "layernorm.weight": (0,),                     # final LayerNorm
            "layernorm.bias": (0,),
            **_POOLER,
            **_CLASSIFIER,
        },
    ),
    # Llama, Mistral, SmolLM: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases
    FamilySpec(name="llama", model_types=("llama", "mistral"), modules=_DECODER_MODULES, base_prefix="model",
               residual_axes=_DECODER_RESIDUAL, config_fields=_DECODER_FIELDS, rotary=True, match_heads=True),
    # Qwen2: as Llama, with q/k/v biases (they move with their maps)
    FamilySpec(name="qwen2", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS, rotary=True, match_heads=True),
    # Qwen3: per-head RMSNorm on q and k (q_norm, k_norm) after the projections: no Q/K rotation
    FamilySpec(name="qwen3", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS, rotary=True, match_heads=True,
               qk_norm=("self_attn.q_norm", "self_attn.k_norm")),
    # StableLM: LayerNorm, partial rotary (partial_rotary_factor), optional q/k/v biases and per-head q/k LayerNorm
    FamilySpec(name="stablelm", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS + ("use_qkv_bias", "qk_layernorm"), rotary=True, match_heads=True,
               qk_norm=("self_attn.q_layernorm", "self_attn.k_layernorm")),
    # GPT-2: learned positions, LayerNorm, Conv1D maps (weight (in, out)) with Q, K, V fused in c_attn, biases
    FamilySpec(
        name="gpt2", base_prefix="transformer", conv1d=True, match_heads=True, config_fields=("n_inner",),
        modules={
            "layer": "h.{i}.",
            "qkv": "attn.c_attn",            # stored (hidden, 3 * hidden): [Q | K | V] columns
            "query": "attn.c_attn.q",        # canonical views of c_attn (symfusion's names, not stored)
            "key": "attn.c_attn.k",
            "value": "attn.c_attn.v",
            "output": "attn.c_proj",
            "ffn_in": "mlp.c_fc",
            "ffn_out": "mlp.c_proj",
        },
        residual_axes={
            "wte.weight": (1,), "wpe.weight": (1,), "lm_head.weight": (1,), "score.weight": (1,),
            "ln_1.weight": (0,), "ln_1.bias": (0,), "ln_2.weight": (0,), "ln_2.bias": (0,),
            "ln_f.weight": (0,), "ln_f.bias": (0,),
        },
    ),
)}
MODEL_TYPES: dict[str, str] = {t: spec.name for spec in FAMILIES.values() for t in (spec.model_types or (spec.name,))}

SUPPORTED_FAMILIES = tuple(FAMILIES)

# Config fields that must agree between models that are matched or merged (plus the family's own).
SHAPE_FIELDS = ("model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "max_position_embeddings", "type_vocab_size", "image_size", "patch_size", "num_channels")


def family_of(config) -> str:
    """The family name of a config (llama for model_type mistral); raises naming the supported families."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        raise SymfusionError(
            f"unsupported model_type {model_type!r}; supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    return MODEL_TYPES[model_type]


def family_spec(config) -> FamilySpec:
    """The FamilySpec of a config (raises naming the supported families)."""
    return FAMILIES[family_of(config)]


def check_compatible(source_config, anchor_config, source_name: str = "source", anchor_name: str = "anchor") -> None:
    """Raise if two configs cannot be matched or merged (different family or shapes)."""
    spec = family_spec(source_config)
    family_of(anchor_config)
    for field in SHAPE_FIELDS + spec.config_fields:
        a, b = getattr(source_config, field, None), getattr(anchor_config, field, None)
        if a != b:
            raise SymfusionError(
                f"{source_name} and {anchor_name} have different {field} ({a!r} vs {b!r}); "
                "matching and merging need models of the same architecture"
            )


def check_finite(state: Mapping[str, torch.Tensor], name: str) -> None:
    """Raise naming the first tensor that holds NaN or inf."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise SymfusionError(f"{name} has non-finite values (NaN/inf) in {key!r}; retrain or re-export that model")


def _find_prefix(state: Mapping[str, torch.Tensor], family: str) -> str:
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
    prefix = _find_prefix(state, family)
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
    prefix = _find_prefix(state, family)
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
        match_heads=spec.match_heads,
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

