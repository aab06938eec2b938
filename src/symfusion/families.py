"""The model families symfusion knows: one FamilySpec entry per family (config.model_type), and the checks that
two configs are of one family and shape.

A family entry is data only (module names, residual axes, body/head boundary, flags), as mergekit's
per-architecture definitions; arch.py builds a model's layout from it. Adding a family is one entry here
(docs/architecture.md, "Where to add things").
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Mapping

from symfusion.errors import SymfusionError, note

_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layer|layers|h)\.(\d+)\.")     # a layer module's index in a tensor name


@dataclass(frozen=True)
class FamilySpec:
    """What one model family's architecture is (config.model_type): one entry per family, data only. How a family is
    matched where a matching preset leaves it open (whole heads, the learned refinement's settings) is a matching
    setting, kept apart: presets/families.yaml.

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
    padding_free:     the layer maps read token states only, so a padded batch may run them on its real
                      tokens alone (packing.py); False where a layer map also reads other inputs
    norm:             the normalisation of the residual stream: "layernorm" (mean-centred) or "rmsnorm"
    prenorm:          pre-norm families: each norm module in "layer" -> the layer maps (kinds of `modules`) that
                      read its output, in block order; {} for post-LN families (the norm output is the stream).
                      A listed norm a checkpoint lacks (StableLM's use_parallel_residual) hands its readers to
                      the layer's first norm. stream.py folds each norm's gain into its readers.
    final_norm:       pre-norm families: the norm after the last layer (a module name under the body prefix)
                      and the head maps that read it (keys outside the body, when present)
    nonlinear_heads:  head modules whose output passes an elementwise nonlinearity (a pooler's tanh): their
                      output axis may be permuted with the stream, never rotated
    positions_after_padding: learned position ids start after the padding index (RoBERTa: pad_token_id + 1), so a
                      sequence holds that many tokens fewer than max_position_embeddings
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
    padding_free: bool = True
    norm: str = "layernorm"
    prenorm: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    final_norm: tuple[str, tuple[str, ...]] | None = None
    nonlinear_heads: tuple[str, ...] = ("pooler.dense", "classifier.dense")
    positions_after_padding: bool = False

    def residual_axes_of(self, key: str) -> tuple[int, ...]:
        """The residual axes of a tensor outside the layers, from its key suffix; raises for an unknown key."""
        for suffix, axes in self.residual_axes.items():
            if key == suffix or key.endswith("." + suffix):
                return axes
        raise SymfusionError(
            f"the {self.name} family does not know the residual axes of {key!r}; "
            "add its key suffix to the family's residual_axes in symfusion/families.py"
        )

    def stream_position_of(self, key: str) -> str:
        """Where a residual tensor sits along the residual stream (see `stream`); raises for an unknown key."""
        path = "." + key + "."
        found = [f for f in self.stream if "." + f + "." in path]
        if not found:
            raise SymfusionError(
                f"the {self.name} family does not know where {key!r} sits in the residual stream; "
                "add its module to the family's stream in symfusion/families.py"
            )
        return self.stream[max(found, key=len)]

    def layer_count(self, keys) -> int:
        """How many layers a checkpoint's tensor names hold: the distinct indices i of its layer modules (the family's
        names, or its files' older ones: ViT's encoder.layer.{i})."""
        return len({m.group(1) for key in keys for m in [_LAYER_INDEX.search(key)] if m})

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
    "q_norm.weight": (), "k_norm.weight": (),  # Qwen3's per-head q/k norms (head_dim): not in the stream
    "q_layernorm.weight": (), "k_layernorm.weight": (),
}
_DECODER_FIELDS = ("num_key_value_heads", "head_dim")
_DECODER_PRENORM = {"input_layernorm": ("query", "key", "value"), "post_attention_layernorm": ("ffn_gate", "ffn_in")}
_DECODER_FINAL = ("norm", ("lm_head.weight", "score.weight"))

FAMILIES: dict[str, FamilySpec] = {spec.name: spec for spec in (
    FamilySpec(name="bert", modules=_ENCODER_MODULES, residual_axes=_TEXT_RESIDUAL, base_prefix="bert",
               stream=_TEXT_STREAM),
    FamilySpec(
        name="roberta", modules=_ENCODER_MODULES, base_prefix="roberta", stream=_TEXT_STREAM,
        positions_after_padding=True,
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
        prenorm={"layernorm_before": ("query", "key", "value"), "layernorm_after": ("ffn_in",)},
        final_norm=("layernorm", ("classifier.weight",)),
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
               residual_axes=_DECODER_RESIDUAL, config_fields=_DECODER_FIELDS, rotary=True,
               norm="rmsnorm", prenorm=_DECODER_PRENORM, final_norm=_DECODER_FINAL),
    # Qwen2: as Llama, with q/k/v biases (they move with their maps)
    FamilySpec(name="qwen2", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS, rotary=True,
               norm="rmsnorm", prenorm=_DECODER_PRENORM, final_norm=_DECODER_FINAL),
    # Qwen3: per-head RMSNorm on q and k (q_norm, k_norm) after the projections: no Q/K rotation
    FamilySpec(name="qwen3", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS, rotary=True,
               qk_norm=("self_attn.q_norm", "self_attn.k_norm"),
               norm="rmsnorm", prenorm=_DECODER_PRENORM, final_norm=_DECODER_FINAL),
    # StableLM: LayerNorm, partial rotary (partial_rotary_factor), optional q/k/v biases and per-head q/k LayerNorm
    FamilySpec(name="stablelm", modules=_DECODER_MODULES, base_prefix="model", residual_axes=_DECODER_RESIDUAL,
               config_fields=_DECODER_FIELDS + ("use_qkv_bias", "qk_layernorm", "use_parallel_residual"), rotary=True,
               qk_norm=("self_attn.q_layernorm", "self_attn.k_layernorm"),
               prenorm=_DECODER_PRENORM, final_norm=_DECODER_FINAL),
    # GPT-2: learned positions, LayerNorm, Conv1D maps (weight (in, out)) with Q, K, V fused in c_attn, biases
    FamilySpec(
        name="gpt2", base_prefix="transformer", conv1d=True,
        config_fields=("n_inner",),
        prenorm={"ln_1": ("query", "key", "value"), "ln_2": ("ffn_in",)}, final_norm=("ln_f", ("lm_head.weight", "score.weight")),
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


def token_limit(config) -> int | None:
    """How many tokens one sequence may hold: max_position_embeddings (GPT-2's n_positions), less RoBERTa's padding
    offset; None for a model that reads pixels. A probe or task longer than this would index past the position
    table (learned positions) or the model's stated range (RoPE)."""
    spec = family_spec(config)
    limit = getattr(config, "max_position_embeddings", None)
    if spec.inputs != "tokens" or not isinstance(limit, int):
        return None
    if spec.positions_after_padding:
        limit -= (getattr(config, "pad_token_id", None) or 0) + 1
    return max(limit, 1)


# ---------------------------------------------------------------- config fields beyond the weights

@dataclass(frozen=True)
class FieldRule:
    """What matching (`match`) and merging (`merge`: a merge, an interpolation path, an averaged body) do with two
    models whose configs differ in a field that is no shape: "refuse" (one error line) or "proceed" (one note
    line), and why (the rest of that line)."""

    match: str
    merge: str
    why: str


def _rule(decision: str, why: str, merge: str | None = None) -> FieldRule:
    return FieldRule(decision, merge or decision, why)


_ACTIVATION = "the nonlinearity between the maps: the weights of the two models compute different functions"
_EPS = ("a norm's epsilon only guards a division: each matched model keeps its own, a merge takes the anchor's "
        "(a change of the order of epsilon)")
_POSITIONS = "how positions enter attention: the q/k weights of the two models serve different position codes"
_WINDOW = "which tokens each layer attends to: the two models' attention is a different function of its weights"
# Every config field that may differ between two models of one family and shape, and the rule for it (the
# families' SHAPE_FIELDS and config_fields must agree; NEUTRAL_FIELDS change nothing the weights compute).
FUNCTION_FIELDS: dict[str, FieldRule] = {
    "hidden_act": _rule("refuse", _ACTIVATION), "activation_function": _rule("refuse", _ACTIVATION),
    "pooler_act": _rule("refuse", _ACTIVATION), "pooler_hidden_act": _rule("refuse", _ACTIVATION),
    "layer_norm_eps": _rule("proceed", _EPS), "layer_norm_epsilon": _rule("proceed", _EPS),
    "rms_norm_eps": _rule("proceed", _EPS),
    "rope_parameters": _rule("refuse", "RoPE's base, scaling and rotated share: " + _POSITIONS.split(": ")[1]),
    "position_biased_input": _rule("refuse", _POSITIONS), "norm_rel_ebd": _rule("refuse", _POSITIONS),
    "position_embedding_type": _rule("refuse", _POSITIONS),
    "sliding_window": _rule("refuse", _WINDOW), "use_sliding_window": _rule("refuse", _WINDOW),
    "max_window_layers": _rule("refuse", _WINDOW), "layer_types": _rule("refuse", _WINDOW),
    "is_decoder": _rule("refuse", _WINDOW), "add_cross_attention": _rule("refuse", "a decoder block with cross-"
                                                                          "attention has maps the other lacks"),
    "scale_attn_weights": _rule("refuse", "whether attention logits are scaled by 1/sqrt(head_dim)"),
    "scale_attn_by_inverse_layer_idx": _rule("refuse", "whether attention logits are scaled by 1/(layer + 1)"),
    "reorder_and_upcast_attn": _rule("proceed", "only the precision of GPT-2's attention scores (float32 upcast)"),
    "pretraining_tp": _rule("proceed", "only how Llama's maps are sliced in the matmuls (the same function)"),
    "attention_bias": _rule("refuse", "whether q/k/v/o have biases"), "mlp_bias": _rule("refuse", "whether the FFN "
                                                                                         "maps have biases"),
    "qkv_bias": _rule("refuse", "whether q/k/v have biases"),
    "pad_token_id": _rule("refuse", "where RoBERTa's positions start and which token ends a sequence for a "
                                    "decoder's classification head"),
    "tie_word_embeddings": _rule("proceed", "each matched model keeps its own tie of lm_head to the embeddings; a "
                                            "merge unties the tied ones (lm_head a copy of the embeddings, the same "
                                            "function; io/untie.py) and is untied"),
}
NEUTRAL_FIELDS = frozenset({
    "_name_or_path", "architectures", "transformers_version", "dtype", "output_attentions", "output_hidden_states",
    "return_dict", "use_cache", "is_encoder_decoder", "chunk_size_feed_forward", "initializer_range", "id2label",
    "label2id", "problem_type", "bos_token_id", "eos_token_id", "legacy", "encoder_stride", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "attention_dropout", "hidden_dropout", "classifier_dropout", "pooler_dropout",
    "attn_pdrop", "embd_pdrop", "resid_pdrop", "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
    "summary_type", "summary_use_proj", "pooler_output_size", "pooler_hidden_size", "head_dim", "n_embd", "n_head",
    "n_layer", "n_positions",
})   # dropout (off in evaluation), bookkeeping, heads no stage builds (GPT-2's summary), aliases of SHAPE_FIELDS


def differences(source_config, anchor_config, use: str = "match") -> list[str]:
    """The one-line notes of the FUNCTION_FIELDS two configs differ in whose rule for `use` (match, merge) is to
    proceed; a field whose rule is to refuse is one SymfusionError line."""
    notes = []
    for field, rule in FUNCTION_FIELDS.items():
        a, b = getattr(source_config, field, None), getattr(anchor_config, field, None)
        if a == b:
            continue
        if getattr(rule, use) == "refuse":
            raise SymfusionError(f"the models differ in {field} ({a!r} vs {b!r}): {rule.why}; they are not "
                                 f"{'matched' if use == 'match' else 'merged'}")
        notes.append(f"note: the models differ in {field} ({a!r} vs {b!r}): {rule.why}; proceeding")
    return notes


def check_compatible(source_config, anchor_config, source_name: str = "source", anchor_name: str = "anchor",
                     use: str = "match") -> list[str]:
    """Raise if two configs cannot be matched or merged (`use`; different family, shapes or a refused FUNCTION_FIELDS
    difference); the notes of the differences it proceeds with (errors.note has them printed too)."""
    spec = family_spec(source_config)
    family_of(anchor_config)
    for field in SHAPE_FIELDS + spec.config_fields:
        a, b = getattr(source_config, field, None), getattr(anchor_config, field, None)
        if a != b:
            raise SymfusionError(
                f"{source_name} and {anchor_name} have different {field} ({a!r} vs {b!r}); "
                "matching and merging need models of the same architecture"
            )
    notes = differences(source_config, anchor_config, use)
    for line in notes:
        note(line)
    return notes
