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

    def qk_keys(self) -> list[str]:
        return [k for p in self.query_like + self.key_like for k in p.keys()]

    def vo_keys(self) -> list[str]:
        # the output bias acts on the residual stream and is never moved
        return self.value.keys() + [self.output.weight]


@dataclass(frozen=True)
class FFNLayout:
    input: Projection   # weight (ffn, hidden): rows are neurons
    output: Projection  # weight (hidden, ffn): columns are neurons

    def keys(self) -> list[str]:
        return self.input.keys() + [self.output.weight]


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

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def module_type(self, key: str) -> str:
        """Which part of the model a state-dict key belongs to: attention_qk, attention_vo, ffn or other."""
        return self._module_types().get(key, "other")

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
    """

    name: str
    modules: Mapping[str, str]
    residual_axes: Mapping[str, tuple[int, ...]]
    base_prefix: str
    config_fields: tuple[str, ...] = ()
    inputs: str = "tokens"
    stream: Mapping[str, str] = dataclasses.field(default_factory=dict)

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
)}

SUPPORTED_FAMILIES = tuple(FAMILIES)

# Config fields that must agree between models that are matched or merged (plus the family's own).
SHAPE_FIELDS = ("model_type", "hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size", "max_position_embeddings", "type_vocab_size", "image_size", "patch_size", "num_channels")


def family_of(config) -> str:
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise SymfusionError(
            f"unsupported model_type {model_type!r}; supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    return model_type


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
    suffix = names["layer"].format(i=0) + names["query"] + ".weight"
    prefixes = [k[: -len(suffix)] for k in state if k.endswith(suffix)]
    if len(prefixes) != 1:
        raise SymfusionError(
            f"cannot locate the {family} layers in the state dict (expected one key ending in {suffix!r}, "
            f"found {len(prefixes)}); is the transformers version >= 5?"
        )
    return prefixes[0]


def _projection(state: Mapping[str, torch.Tensor], name: str, required: bool = True) -> Projection | None:
    weight, bias = name + ".weight", name + ".bias"
    if weight not in state:
        if required:
            raise SymfusionError(f"state dict lacks {weight!r}; the checkpoint does not match its config")
        return None
    return Projection(weight, bias if bias in state else None)


def _layer_layout(state: Mapping[str, torch.Tensor], names: dict[str, str], prefix: str) -> LayerLayout:
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
    )
    ffn = FFNLayout(input=_projection(state, p("ffn_in")), output=_projection(state, p("ffn_out")))
    return LayerLayout(attention=attention, ffn=ffn)


def layout_of(config, state: Mapping[str, torch.Tensor]) -> ModelLayout:
    """Build the layout of a model from its config and state dict, checking every shape."""
    family = family_of(config)
    names = FAMILIES[family].modules
    prefix = _find_prefix(state, family)
    num_layers = config.num_hidden_layers
    layers = tuple(
        _layer_layout(state, names, prefix + names["layer"].format(i=i)) for i in range(num_layers)
    )
    num_heads = config.num_attention_heads
    attention_width = state[layers[0].attention.query_like[0].weight].shape[0]
    if attention_width % num_heads:
        raise SymfusionError(f"attention width {attention_width} is not divisible by {num_heads} heads")
    layout = ModelLayout(
        family=family,
        hidden_size=config.hidden_size,
        num_heads=num_heads,
        head_dim=attention_width // num_heads,
        ffn_size=state[layers[0].ffn.input.weight].shape[0],
        layers=layers,
    )
    _check_shapes(layout, state)
    return layout


def _check_shapes(layout: ModelLayout, state: Mapping[str, torch.Tensor]) -> None:
    width = layout.num_heads * layout.head_dim
    for i, layer in enumerate(layout.layers):
        att = layer.attention
        expected = {p.weight: (width, layout.hidden_size) for p in att.query_like + att.key_like + (att.value,)}
        expected[att.output.weight] = (layout.hidden_size, width)
        expected[layer.ffn.input.weight] = (layout.ffn_size, layout.hidden_size)
        expected[layer.ffn.output.weight] = (layout.hidden_size, layout.ffn_size)
        for key, shape in expected.items():
            if tuple(state[key].shape) != shape:
                raise SymfusionError(f"layer {i}: {key!r} has shape {tuple(state[key].shape)}, expected {shape}")


def check_same_layout(source: ModelLayout, anchor: ModelLayout) -> None:
    """Raise if two layouts differ (used when configs agree but checkpoints do not)."""
    for field in ("family", "hidden_size", "num_heads", "head_dim", "ffn_size", "num_layers"):
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

