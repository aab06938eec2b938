"""Transport maps from activations (the reference's acts fusion): each neuron's standardized outputs on the same inputs.

For every map (q, k, v, o, fc1, fc2 of each layer, and the stream entering layer 0) a neuron's
feature vector is its output over the samples: the kept tokens (option tokens) of every example.
Each model's activations are standardized per neuron, x~ = (x - mean) / (std + 1e-9) with the
unbiased std, as the reference's transform_acts (acts.std: true), and the cost between a source
neuron i and an anchor neuron j is ||y~_i - x~_j|| (transport.py normalises it by its maximum).
Only running sums are kept, so with S the centred sums over N samples and s = sqrt(S / (N - 1)):

    ||y~_i - x~_j||^2 = Syy_i / (sy_i + e)^2 + Sxx_j / (sx_j + e)^2 - 2 Syx_ij / ((sy_i + e)(sx_j + e))

Where activations are taken (module outputs, as the reference's get_activations hooks them):
q, k, v: the projections' outputs; o: the attention output projection's output, before the
residual add; fc1: the FFN input projection's output, before the non-linearity (the reference
hooks intermediate.dense); fc2: the FFN output projection's output, before the residual add.
The stream entering layer 0: text models' embedding output; ViT: the patch embedding's output,
every patch (it has no CLS token, and the reference windows only full sequences), while ViT's
class token and position table are matched on their own values (the class token's entries, the
table's columns), as the reference's hf_vit_fusion does.

Tokens kept: "all" (text: the non-padded tokens), "only_cls" (the first token), or "window_<k>"
(ViT only: the CLS token plus the centred k x k block of the patch grid, offset floor((g - k) / 2)
on a g x g grid; on the reference's 8 x 8 grid window_6 is rows and columns 1-6, its WINDOW_6
mask; the reference applies no window on other grids). The last layer's o, fc1 and fc2 maps use
`last_tokens` (the reference uses the CLS token only there).
"""
from __future__ import annotations

import re
from collections import defaultdict

import torch

from symfusion.arch import ModelLayout, Projection
from symfusion.families import FAMILIES
from symfusion.errors import SymfusionError
from symfusion.fusion.ot_align import TransportMaps, keys_at
from symfusion.fusion.ot_wts import vit_value_maps
from symfusion.fusion.transport import alignment, normalized

_EPS = 1e-9   # the reference's standardization epsilon
TOKEN_RULE = re.compile(r"all|only_cls|window_[1-9][0-9]*")


class _CrossMoments:
    """Running sums over paired samples of one map's source (y) and anchor (x) activations."""

    def __init__(self):
        self.count = 0
        self.sums: tuple[torch.Tensor, ...] | None = None

    def update(self, y: torch.Tensor, x: torch.Tensor) -> None:
        """y (samples, m) and x (samples, n): the same inputs through the source and the anchor."""
        y, x = y.double(), x.double()
        parts = (y.sum(0), x.sum(0), y.square().sum(0), x.square().sum(0), y.T @ x)   # ..., (m, n)
        self.sums = parts if self.sums is None else tuple(s + p for s, p in zip(self.sums, parts))
        self.count += y.shape[0]

    def cost(self, cost: str) -> torch.Tensor:
        """Distances between standardized activation vectors, (m, n), max-normalised."""
        n = self.count
        if n < 2:
            raise SymfusionError(f"OT fusion needs at least 2 activation samples per map, got {n}; give more data")
        sy, sx, syy, sxx, syx = self.sums
        cyy, cxx = syy - sy.square() / n, sxx - sx.square() / n             # centred sums (m), (n)
        cyx = syx - torch.outer(sy, sx) / n                                 # (m, n)
        dy = cyy.clamp_min(0).div(n - 1).sqrt() + _EPS                      # std + eps
        dx = cxx.clamp_min(0).div(n - 1).sqrt() + _EPS
        squared = (cyy / dy.square())[:, None] + (cxx / dx.square())[None, :] - 2 * cyx / torch.outer(dy, dx)
        squared = squared.clamp_min(0)
        return normalized(squared if cost == "sqeuclidean" else squared.sqrt())


def activation_maps(models: list, layout: ModelLayout, batches: list[dict], reg: float | None, cost: str,
                    tokens: str, last_tokens: str) -> list[TransportMaps]:
    """One set of maps per source (models[1:]), from activation moments over all batches."""
    check_tokens(layout, tokens)
    check_tokens(layout, last_tokens)
    moments = [defaultdict(_CrossMoments) for _ in models[1:]]
    for batch in batches:
        anchor = record_activations(models[0], layout, batch, tokens, last_tokens)
        for source, stats in zip(models[1:], moments):
            for name, acts in record_activations(source, layout, batch, tokens, last_tokens).items():
                stats[name].update(acts, anchor[name])
    anchor_state, layers = models[0].state_dict(), range(layout.num_layers)
    maps = []
    for source, stats in zip(models[1:], moments):
        plans = {name: alignment(moment.cost(cost), reg) for name, moment in stats.items()}
        if FAMILIES[layout.family].inputs == "pixels":
            embeddings = {"patches": plans["patches"],
                          **vit_value_maps(source.state_dict(), anchor_state, layout, reg, cost, unit=False)}
        else:
            embeddings = {"stream": plans["stream"]}
        maps.append(TransportMaps(embeddings, *([plans[f"{kind}.{i}"] for i in layers]
                                                for kind in ("q", "k", "v", "o", "fc1", "fc2"))))
    return maps


def check_tokens(layout: ModelLayout, tokens: str) -> None:
    if not TOKEN_RULE.fullmatch(tokens):
        raise SymfusionError(f"OT fusion: tokens={tokens!r}; use all, only_cls or window_<k>")
    if tokens.startswith("window_") and FAMILIES[layout.family].inputs != "pixels":
        raise SymfusionError(f"OT fusion: tokens={tokens} needs a patch grid (ViT); "
                             f"{layout.family} models take all or only_cls")


def record_activations(model: torch.nn.Module, layout: ModelLayout, batch: dict, tokens: str,
                       last_tokens: str) -> dict[str, torch.Tensor]:
    """One forward pass; per map name ('stream' or 'patches', 'q.i', ..., 'fc2.i') its samples (samples, width)."""
    captured: dict[str, torch.Tensor] = {}
    watched = {}
    for i, layer in enumerate(layout.layers):
        att, ffn = layer.attention, layer.ffn
        watched.update({f"q.{i}": att.query_like[0], f"k.{i}": att.key_like[0], f"v.{i}": att.value,
                        f"o.{i}": att.output, f"fc1.{i}": ffn.input, f"fc2.{i}": ffn.output})
    hooks = [_module(model, proj).register_forward_hook(_keep_output(captured, name)) for name, proj in watched.items()]
    pixels = FAMILIES[layout.family].inputs == "pixels"
    if pixels:
        (key,) = keys_at(model.state_dict(), layout, "patches", suffix="projection.weight")
        patches = model.get_submodule(key[: -len(".projection.weight")])
        hooks.append(patches.register_forward_hook(_keep_output(captured, "patches")))
    training = model.training
    try:
        model.eval()
        out = model(**_model_inputs(model, batch), output_hidden_states=not pixels)
    finally:
        model.train(training)
        for hook in hooks:
            hook.remove()
    keep = _token_selector(model, batch, pixels)
    last = layout.num_layers - 1
    acts = {"patches": keep(captured["patches"], "all")} if pixels else {"stream": keep(out.hidden_states[0], tokens)}
    for name in watched:
        kind, index = name.split(".")
        chosen = last_tokens if int(index) == last and kind in ("o", "fc1", "fc2") else tokens
        acts[name] = keep(captured[name], chosen)
    return acts


def _token_selector(model: torch.nn.Module, batch: dict, pixels: bool):
    """keep(t, tokens): (batch, seq, width) -> (samples, width), the tokens kept from every example."""
    mask = batch.get("attention_mask")
    grid = _patch_grid(model.config) if pixels else None

    def keep(t: torch.Tensor, tokens: str) -> torch.Tensor:
        if tokens == "only_cls":
            return t[:, 0]
        if tokens == "all":
            if mask is not None:
                return t[mask.bool().to(t.device)]
            return t.reshape(-1, t.shape[-1])
        if t.shape[1] != grid * grid + 1:
            raise SymfusionError(f"ViT activations have {t.shape[1]} tokens, expected {grid * grid + 1} "
                                 "(CLS + the patch grid of image_size / patch_size)")
        return t[:, window_positions(grid, int(tokens.split("_")[1])).to(t.device)].reshape(-1, t.shape[-1])

    return keep


def window_positions(grid: int, size: int) -> torch.Tensor:
    """Sequence positions of the CLS token (0) and the centred size x size patches of a grid x grid grid."""
    size = min(size, grid)
    start = (grid - size) // 2
    rows = torch.arange(start, start + size)
    patches = (rows[:, None] * grid + rows[None, :]).reshape(-1) + 1      # row-major patches after the CLS
    return torch.cat([torch.zeros(1, dtype=torch.long), patches])


def _patch_grid(config) -> int:
    image, patch = config.image_size, config.patch_size
    image = image if isinstance(image, int) else image[0]
    patch = patch if isinstance(patch, int) else patch[0]
    return image // patch


def _module(model: torch.nn.Module, proj: Projection) -> torch.nn.Module:
    return model.get_submodule(proj.weight.rsplit(".", 1)[0])


def _keep_output(store: dict, name: str):
    # first call only: DeBERTa's shared Q/K projections also run on the relative embeddings later
    def hook(module, args, output):
        store.setdefault(name, (output[0] if isinstance(output, tuple) else output).detach())
    return hook


def _model_inputs(model: torch.nn.Module, batch: dict) -> dict:
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in batch.items() if k != "labels" and isinstance(v, torch.Tensor)}
