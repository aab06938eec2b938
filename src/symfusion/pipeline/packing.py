"""Padding-free linears: a padded batch's token-wise Q/K/V/O and FFN maps run on its real tokens only.

In a padded text batch (B, L, H) each layer's Q, K, V, O and FFN maps act on every token alone, so the
padding rows can leave their GEMMs: gather the real tokens (n, H), apply the map, scatter the rows back
with zeros at the padding (B, L, out). The model computes the same function on real tokens:

- a real token's rows go through the very same maps;
- attention gives padding keys weight exactly 0 (the mask adds the dtype's minimum, exp underflows to
  0), so whatever sits at padding positions never reaches a real token, and its gradient there is 0;
- the loss reads real tokens only (padding labels are ignored; a sequence head reads the first token),
  so the gradients are those of the padded batch, up to the summation order of the weight GEMMs;
- every other module (embeddings, dropout, LayerNorm, attention) still sees (B, L, .) tensors and draws
  the same dropout masks in the same order.

A batch whose positions are half padding spends about half the FLOPs of its linears (the bulk of an
encoder's work). Families whose layer maps also read something other than token states (DeBERTa's Q/K
maps project the relative position embeddings) say so with FamilySpec.padding_free = False and run padded.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from symfusion.arch import layer_module_names
from symfusion.families import MODEL_TYPES, family_spec

TOKEN_MAPS = ("qkv", "query", "key", "value", "output", "ffn_gate", "ffn_in", "ffn_out")


def token_maps(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The Q/K/V/O and FFN maps of every layer of `model`, or [] when its family cannot run padding-free."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in MODEL_TYPES or not family_spec(config).padding_free:
        return []
    modules = dict(model.named_modules())
    # canonical views that are no module (GPT-2's q/k/v inside the fused c_attn) are left out
    return [modules[name] for name in layer_module_names(config, model.state_dict(), TOKEN_MAPS) if name in modules]


@contextmanager
def padding_free(modules: list[torch.nn.Module], attention_mask: torch.Tensor | None):
    """Within the block, `modules` (token_maps of a model) run on the real tokens of a batch whose
    padding is attention_mask == 0 (B, L); a batch without padding runs unchanged."""
    if not modules or attention_mask is None or attention_mask.dim() != 2 or bool(attention_mask.all()):
        yield
        return
    mask = attention_mask.bool()
    index = mask.reshape(-1).nonzero().squeeze(1)          # (n,) real tokens among the B * L positions
    packed: set[int] = set()

    def pack(module, args):
        states, *rest = args
        if states.shape[:-1] != mask.shape:                # not this batch's token states: leave it alone
            return None
        packed.add(id(module))
        return (states.reshape(-1, states.shape[-1]).index_select(0, index), *rest)   # (n, in)

    def unpack(module, args, output):
        if id(module) not in packed:
            return None
        packed.discard(id(module))
        full = output.new_zeros(mask.numel(), output.shape[-1])                      # (B * L, out)
        return full.index_copy(0, index, output).view(*mask.shape, output.shape[-1])  # (B, L, out)

    handles = [h for m in modules for h in (m.register_forward_pre_hook(pack), m.register_forward_hook(unpack))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
