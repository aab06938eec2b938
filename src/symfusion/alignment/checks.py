"""Checks that a matched model folder computes its source's function: each layer's block on its own, the whole model when it is small.

A symmetry must not change what the model computes. Folder matching never holds a whole model, so each
matched layer is checked on its own: the layer's transformers module, built from the config on the meta
device and run on the source's or the matched weights as they are stored (dtype rounding included; no copy of the
module or of the weights: torch.func.functional_call), runs on
the same random hidden states with the inputs its parent module hands it (rotary position embeddings for
RoPE decoders; the attention mask, relative positions and relative embeddings for DeBERTa-v2, computed by the
encoder's own code from the folder's relative-embedding weights). A whole-model check on probe inputs
(measures.probe_inputs, as for nn.Modules) is added when the model is small enough to load twice.
"""
from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch

from symfusion.errors import SymfusionError
from symfusion.io.folder import weight_map
from symfusion.io.modelio import load_config, model_class, skeleton_of
from symfusion.measures import model_outputs, probe_inputs

# Folders whose float32 weights are below this many bytes also get a whole-model check.
WHOLE_MODEL_CHECK_BYTES = 2 * 2**30


def tolerance_for(dtypes: Iterable[torch.dtype], base: float) -> float:
    """The functional-check tolerance: `base`, or the rounding that storing moved weights in a dtype implies."""
    eps = max((torch.finfo(d).eps for d in dtypes if d.is_floating_point), default=0.0)
    return max(base, 4 * eps)


def stored_in(tensor: torch.Tensor, dtype: torch.dtype, key: str) -> torch.Tensor:
    """`tensor` rounded to `dtype` (the dtype its folder stores it in); a finite value beyond that dtype's range
    (float16: |x| <= 65504) is one error line naming the range, never an inf written or a failed check called a bug."""
    out = tensor.to(dtype)
    if tensor.is_floating_point() and dtype.is_floating_point and dtype != tensor.dtype \
            and not bool(torch.isfinite(out).all()) and bool(torch.isfinite(tensor).all()):
        name = str(dtype).removeprefix("torch.")
        raise SymfusionError(f"the matched weights of {key!r} reach {float(tensor.abs().max()):.4g}, beyond {name}'s "
                             f"range (|x| <= {torch.finfo(dtype).max:.6g}) that the source model stores them in; match a "
                             "float32 copy of the source")
    return out


def _has_submodule(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _module_path(skeleton: torch.nn.Module, layer_prefix: str) -> str:
    """The skeleton's module name of a layer given by its state-dict prefix (the folder's keys may carry a prefix
    that the skeleton lacks: a task model's body built as a bare model)."""
    path = layer_prefix.rstrip(".").split(".")
    found = next((".".join(path[i:]) for i in range(len(path)) if _has_submodule(skeleton, ".".join(path[i:]))), None)
    if found is None:
        raise SymfusionError(f"cannot find the module of {layer_prefix!r} in {type(skeleton).__name__}")
    return found


def _real_copy(module: torch.nn.Module, prefix: str, weights: Mapping[str, torch.Tensor], what: str) -> torch.nn.Module:
    """A real float32 copy of a meta module holding `weights` (keys under prefix): every parameter is written, a
    missing one refused."""
    real = copy.deepcopy(module).to_empty(device="cpu").float()
    local = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}   # cast on copy
    missing, _ = real.load_state_dict(local, strict=False)
    params = [m for m in missing if m in dict(real.named_parameters())]
    if params:
        raise SymfusionError(f"{what} {prefix!r} lacks {params[0]!r} in the checkpoint")
    return real.eval()


def _relative_attention_inputs(skeleton, layer_path: str, layer_prefix: str, hidden: torch.Tensor,
                               read: Callable[[list[str]], dict], keys) -> dict:
    """DeBERTa-v2's layer inputs besides the hidden states, as its encoder computes them: the extended attention
    mask, the relative positions and the (normalised) relative embeddings, read from the folder."""
    encoder = skeleton.get_submodule(layer_path.rsplit(".", 2)[0])    # "deberta.encoder" of "deberta.encoder.layer.3"
    prefix = layer_prefix.rstrip(".").rsplit(".", 2)[0] + "."          # its keys' prefix in the folder
    own = copy.copy(encoder)                                          # its own modules, without the layers
    own._modules = {name: m for name, m in encoder._modules.items() if not isinstance(m, torch.nn.ModuleList)}
    wanted = [k for k in keys if k.startswith(prefix) and not k[len(prefix):].startswith(("layer.", "layers."))]
    real = _real_copy(own, prefix, read(wanted), "the encoder") if wanted else own
    mask = torch.ones(hidden.shape[:2], dtype=torch.long)
    with torch.no_grad():
        return {"attention_mask": real.get_attention_mask(mask), "relative_pos": real.get_rel_pos(hidden),
                "rel_embeddings": real.get_rel_embedding()}


def check_outputs_finite(outputs: torch.Tensor, what: str, inputs: str = "probe inputs", detail: str = "") -> None:
    """Refuse (one line) a source whose own outputs are NaN or inf though its weights passed arch.check_finite (a norm
    gain of 1.7e19 overflows the next norm's variance in float32): no match can be checked against its function."""
    if not bool(torch.isfinite(outputs).all()):
        raise SymfusionError(f"{what} computes non-finite outputs (NaN/inf) on {inputs} though its weights are finite"
                             f"{detail}: it overflows in its own forward pass; retrain or re-export that model")


class BlockCheck:
    """Runs one layer's block with source and matched weights on the same random hidden states.

    read(keys) -> tensors of the source folder (model names), keys: its tensor names: where a layer reads more
    than the hidden states from outside the layers (DeBERTa-v2's relative embeddings), they are read once."""

    def __init__(self, config, seq_len: int = 16, seed: int = 0, skeleton: torch.nn.Module | None = None,
                 read: Callable[[list[str]], dict] | None = None, keys=()):
        skeleton = skeleton if skeleton is not None else skeleton_of(config)
        skeleton.eval()                      # the meta model only describes; its blocks run without dropout
        self.skeleton, self.config, self.read, self.keys = skeleton, config, read, list(keys)
        gen = torch.Generator().manual_seed(seed)
        self.hidden = torch.randn(1, seq_len, config.hidden_size, generator=gen)
        rotary = next((m for name, m in self.skeleton.named_modules() if name.endswith("rotary_emb")), None)
        self.kwargs = {}
        if rotary is not None:
            real = type(rotary)(config=config)
            positions = torch.arange(seq_len)[None]
            self.kwargs["position_embeddings"] = real(self.hidden, positions)
        self._relative = None

    def _inputs(self, layer_path: str, layer_prefix: str) -> dict:
        encoder = self.skeleton.get_submodule(layer_path.rsplit(".", 2)[0]) if layer_path.count(".") >= 2 else None
        if encoder is None or not hasattr(encoder, "get_rel_embedding"):
            return self.kwargs
        if self._relative is None:
            if self.read is None:
                raise SymfusionError("checking a DeBERTa-v2 layer needs the folder's relative embeddings")
            self._relative = _relative_attention_inputs(self.skeleton, layer_path, layer_prefix, self.hidden,
                                                        self.read, self.keys)
        return {**self.kwargs, **self._relative}

    def output(self, layer_prefix: str, weights: Mapping[str, torch.Tensor], hidden: torch.Tensor | None = None,
               r: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output; with a residual map r, the block of the moved model: relative embeddings (rows in
        the residual stream, normalised by a post-LN norm that a permutation commutes with) moved by r as well.
        The layer's meta module runs on `weights` (keys under layer_prefix) as float32 contiguous tensors, as a real
        float32 copy of the module holding them would: every parameter must be given, a missing one is refused."""
        path = _module_path(self.skeleton, layer_prefix)
        block = self.skeleton.get_submodule(path)
        local = {k[len(layer_prefix):]: v.to(torch.float32 if v.is_floating_point() else v.dtype,
                                             memory_format=torch.contiguous_format)
                 for k, v in weights.items() if k.startswith(layer_prefix)}
        missing = [name for name, _ in block.named_parameters() if name not in local]
        if missing:
            raise SymfusionError(f"layer {layer_prefix!r} lacks {missing[0]!r} in the checkpoint")
        kwargs = self._inputs(path, layer_prefix)
        if r is not None and kwargs.get("rel_embeddings") is not None:
            kwargs = {**kwargs, "rel_embeddings": kwargs["rel_embeddings"] @ r.T}
        with torch.no_grad():
            out = torch.func.functional_call(block, local, (self.hidden if hidden is None else hidden,), kwargs)
        return out[0] if isinstance(out, tuple) else out

    def deviation(self, layer_prefix: str, source: Mapping, matched: Mapping, r: torch.Tensor | None = None) -> float:
        """max |block_matched(h) - block_source(h)| / max |block_source(h)|; with a residual map r, the matched block
        reads and writes the moved stream: max |block_matched(r h) - r block_source(h)| / max |block_source(h)|."""
        reference = self.output(layer_prefix, source)
        check_outputs_finite(reference, f"{layer_prefix.rstrip('.')}: the source's block", "random hidden states")
        if r is None:
            return ((self.output(layer_prefix, matched) - reference).abs().max() / reference.abs().max()).item()
        r = r.to(self.hidden.dtype)
        moved = self.output(layer_prefix, matched, self.hidden @ r.T, r)      # rows h -> (r h)^T
        return ((moved - reference @ r.T).abs().max() / reference.abs().max()).item()


def check_whole_model(src, src_meta: Mapping, target: Path, output, tolerance: float,
                      whole_model_check: bool | None, report: dict) -> None:
    """The whole model's check of a folder written from the source folder `src` (a ShardedFolder), by default when
    both fit in memory, into `report`."""
    if whole_model_check is None:
        whole_model_check = sum(math.prod(t.shape) * 4 for t in src_meta.values()) <= WHOLE_MODEL_CHECK_BYTES
    if whole_model_check:
        report["relative_output_change"] = whole_model_change(src.path, target)
        if not report["relative_output_change"] <= tolerance:       # NaN fails too
            raise SymfusionError(
                f"the matched model changes the source's outputs by {report['relative_output_change']:.3g} relative "
                f"(> {tolerance:.3g}); not writing {output}. Report this as a bug"
            )


def whole_model_change(source: Path, matched: Path) -> float:
    """max |f_matched(x) - f_source(x)| / max |f_source(x)| on probe inputs (measures.probe_inputs, as align() checks
    two nn.Modules), both folders loaded by transformers with the class whose tensors they hold (modelio.model_class:
    logits where the model has a head, whatever its config's `architectures` says)."""
    config = load_config(source)
    inputs = probe_inputs(config)
    outputs = []
    for folder in (source, matched):
        cls = model_class(config, weight_map(folder)[0])
        model = cls.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True, trust_remote_code=False)
        outputs.append(model_outputs(model, inputs))
        del model
        check_outputs_finite(outputs[0], f"the source model {source}")
    return ((outputs[1] - outputs[0]).abs().max() / outputs[0].abs().max()).item()
