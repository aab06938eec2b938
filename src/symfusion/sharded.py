"""Sharded safetensors model folders read and written one layer at a time (memory-mapped), for models too big to load.

A 7B decoder pair (2 x 13.5 GB in bfloat16) and its matched copy do not fit in 24 GiB, so
folder matching never holds a whole model: tensors are read from the memory-mapped shards
(safetensors' safe_open) layer by layer, and every output shard is written in place as its
tensors become ready (ShardWriter: the header, offsets and file size are known before any
tensor is, because a symmetry changes no shape or dtype). The matched folder keeps the
source's shard files, its index (weight_map) and its key order, dtypes and config, so
transformers, mergekit or any safetensors reader loads it like the source.

Each matched layer is checked on its own: the layer's block (its transformers module, built
from the config) with the source weights and with the matched weights, as they are stored
(dtype rounding included), is run on random hidden states; a whole-model logits check is
added when the model is small enough to load twice.
"""
from __future__ import annotations

import copy
import inspect
import json
import math
import shutil
from pathlib import Path
from typing import Iterable, Mapping

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers.core_model_loading import revert_weight_conversion

from symfusion.arch import ModelLayout, check_finite, check_same_layout, layout_of, resolve_layers
from symfusion.families import check_compatible, family_spec
from symfusion.errors import SymfusionError
from symfusion.folder import INDEX, SINGLE, first_line, model_file, weight_map
from symfusion.matching import MatchConfig, match_models, matching_config
from symfusion.measures import model_outputs, probe_inputs
from symfusion.modelio import check_fits_config, copy_auxiliary_files, load_config, model_class, skeleton
from symfusion.symmetry import Transform, apply_transform

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
NAMES = {name: dtype for dtype, name in DTYPES.items()}
# Folders whose float32 weights are below this many bytes also get a whole-model logits check.
WHOLE_MODEL_CHECK_BYTES = 2 * 2**30


def data_order(path: Path) -> list[str]:
    """The tensor names of a safetensors file in the order of their data offsets (read from its JSON header)."""
    with open(path, "rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda key: header[key]["data_offsets"][0])


class ShardedFolder:
    """A save_pretrained folder's weights: key -> shard, memory-mapped handles, reads of chosen keys.

    The index and every shard are checked when the folder is opened (symfusion.folder.weight_map: plain
    shard names inside the folder, each tensor where the index says), every tensor's shape and dtype
    against what config.json implies (check_fits_config), and every tensor read must be finite."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = load_config(self.path)
        self.weight_map, self.index_metadata = weight_map(self.path)
        self._handles = {}
        self.model_class = model_class(self.config, self.weight_map)   # the class whose tensors the folder holds
        check_fits_config(self.config, self.meta_state(), self.path)

    def handle(self, shard: str):
        if shard not in self._handles:
            path = model_file(self.path, shard, str(self.path / INDEX))
            try:
                self._handles[shard] = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError) as error:
                raise SymfusionError(f"{path} is not a readable safetensors file ({first_line(error)}); "
                                     "re-export the model") from error
        return self._handles[shard]

    def shards(self) -> dict[str, list[str]]:
        """Shard file -> its keys, in the order of their data in the file (so a rewrite keeps the layout)."""
        out: dict[str, list[str]] = {}
        for shard in dict.fromkeys(self.weight_map.values()):
            keys = set(k for k, s in self.weight_map.items() if s == shard)
            out[shard] = [k for k in data_order(model_file(self.path, shard)) if k in keys]
        return out

    def meta_state(self) -> dict[str, torch.Tensor]:
        """Every tensor as a shape-and-dtype-only meta tensor (for layouts and shard headers)."""
        state = {}
        for key, shard in self.weight_map.items():
            piece = self.handle(shard).get_slice(key)
            if piece.get_dtype() not in NAMES:
                raise SymfusionError(f"{self.path / shard} stores {key!r} as {piece.get_dtype()}, a dtype symfusion "
                                     "does not read; re-export the model")
            state[key] = torch.empty(piece.get_shape(), dtype=NAMES[piece.get_dtype()], device="meta")
        return state

    def read(self, keys: Iterable[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The named tensors (copied out of the mapped shards), floating ones cast to `dtype` if given; each must
        be finite (the one check of arch.check_finite on every path into matching)."""
        out = {}
        for key in keys:
            try:
                tensor = self.handle(self.weight_map[key]).get_tensor(key)
            except SafetensorError as error:
                raise SymfusionError(f"cannot read {key!r} from {self.path / self.weight_map[key]} "
                                     f"({first_line(error)}); re-export the model") from error
            check_finite({key: tensor}, f"model {self.path}")
            out[key] = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
        return out


class ShardWriter:
    """One safetensors file written tensor by tensor, in any order: header and offsets are fixed up front."""

    def __init__(self, path: Path, specs: Mapping[str, torch.Tensor], metadata: dict | None):
        header, offset = {}, 0
        for key, spec in specs.items():                         # offsets in the given (source) order
            size = math.prod(spec.shape) * spec.element_size()
            header[key] = {"dtype": DTYPES[spec.dtype], "shape": list(spec.shape), "data_offsets": [offset, offset + size]}
            offset += size
        if metadata:
            header = {"__metadata__": metadata, **header}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)                           # the data starts 8-byte aligned
        self.path, self.specs, self.pending = path, dict(specs), set(specs)
        self.start = 8 + len(raw)
        self.offsets = {k: header[k]["data_offsets"][0] for k in specs}
        self.file = open(path, "xb")        # a new file only: never over anything, whatever the shard's name
        self.file.write(len(raw).to_bytes(8, "little") + raw)
        self.file.truncate(self.start + offset)

    def write(self, key: str, tensor: torch.Tensor) -> None:
        spec = self.specs[key]
        if tuple(tensor.shape) != tuple(spec.shape):
            raise SymfusionError(f"{key!r} changed shape {tuple(spec.shape)} -> {tuple(tensor.shape)} while matching")
        data = tensor.detach().to(spec.dtype).contiguous().reshape(-1).view(torch.uint8).numpy()
        self.file.seek(self.start + self.offsets[key])
        self.file.write(data.data)
        self.pending.discard(key)

    def close(self) -> None:
        self.file.close()
        if self.pending:
            raise SymfusionError(f"{self.path.name}: {len(self.pending)} tensors were never written, e.g. {sorted(self.pending)[0]!r}")


def _has_submodule(module: torch.nn.Module, name: str) -> bool:
    try:
        module.get_submodule(name)
        return True
    except AttributeError:
        return False


def _block_module(skeleton: torch.nn.Module, layer_prefix: str, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """A real float32 copy of the skeleton's layer module holding `weights` (keys under layer_prefix)."""
    path = layer_prefix.rstrip(".").split(".")
    # the folder's keys may carry a prefix that the skeleton lacks (a task model's body built as a bare model)
    found = next((".".join(path[i:]) for i in range(len(path)) if _has_submodule(skeleton, ".".join(path[i:]))), None)
    if found is None:
        raise SymfusionError(f"cannot find the module of {layer_prefix!r} in {type(skeleton).__name__}")
    block = copy.deepcopy(skeleton.get_submodule(found)).to_empty(device="cpu").float()
    local = {k[len(layer_prefix):]: v for k, v in weights.items() if k.startswith(layer_prefix)}   # cast on copy
    missing, _ = block.load_state_dict(local, strict=False)
    params = [m for m in missing if m in dict(block.named_parameters())]
    if params:
        raise SymfusionError(f"layer {layer_prefix!r} lacks {params[0]!r} in the checkpoint")
    return block.eval()


class BlockCheck:
    """Runs one layer's block with source and matched weights on the same random hidden states."""

    def __init__(self, config, seq_len: int = 16, seed: int = 0):
        cls = model_class(config)
        with torch.device("meta"):           # no memory: only the modules' structure is used
            self.skeleton = cls.from_config(config) if cls is transformers.AutoModel else cls(config)
        self.config = config
        gen = torch.Generator().manual_seed(seed)
        self.hidden = torch.randn(1, seq_len, config.hidden_size, generator=gen)
        rotary = next((m for name, m in self.skeleton.named_modules() if name.endswith("rotary_emb")), None)
        self.position_embeddings = None
        if rotary is not None:
            real = type(rotary)(config=config)
            positions = torch.arange(seq_len)[None]
            self.position_embeddings = real(self.hidden, positions)

    def output(self, layer_prefix: str, weights: Mapping[str, torch.Tensor], hidden: torch.Tensor | None = None) -> torch.Tensor:
        block = _block_module(self.skeleton, layer_prefix, weights)
        kwargs = {} if self.position_embeddings is None else {"position_embeddings": self.position_embeddings}
        with torch.no_grad():
            out = block(self.hidden if hidden is None else hidden, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def deviation(self, layer_prefix: str, source: Mapping, matched: Mapping, r: torch.Tensor | None = None) -> float:
        """max |block_matched(h) - block_source(h)| / max |block_source(h)|; with a residual map r, the matched block
        reads and writes the moved stream: max |block_matched(r h) - r block_source(h)| / max |block_source(h)|."""
        reference = self.output(layer_prefix, source)
        if r is None:
            return ((self.output(layer_prefix, matched) - reference).abs().max() / reference.abs().max()).item()
        r = r.to(self.hidden.dtype)
        moved = self.output(layer_prefix, matched, self.hidden @ r.T)                       # rows h -> (r h)^T
        return ((moved - reference @ r.T).abs().max() / reference.abs().max()).item()


# Files a matched folder holds beside the source's shards (api.py writes the last two): no shard may take their names.
WRITTEN_BESIDE_SHARDS = (INDEX, "config.json", "generation_config.json", "transform.safetensors", "match.json")


def check_shard_names(source: ShardedFolder) -> None:
    """Refuse (one line) a source whose shard names a matched folder needs for its own files."""
    taken = sorted(set(source.weight_map.values()) & set(WRITTEN_BESIDE_SHARDS))
    if taken:
        raise SymfusionError(f"{source.path} has a shard named {taken[0]}, a name the matched folder needs for its "
                             "own file; rename the shard (and its index entries)")


def check_writable_layout(source: ShardedFolder, anchor_meta: Mapping[str, torch.Tensor]) -> None:
    """Refuse (one line) a source whose shard names the matched folder needs for its own files, or whose body
    tensors differ in shape from the anchor's tensors of the same name (task heads may: other label counts)."""
    check_shard_names(source)
    spec = family_spec(source.config)
    meta = source.meta_state()
    heads = set(spec.head_keys(meta)) if spec.body_keys(meta) else set()          # a bare model is all body
    for key, tensor in meta.items():
        if key in anchor_meta and key not in heads and tuple(anchor_meta[key].shape) != tuple(tensor.shape):
            raise SymfusionError(f"source and anchor differ in {key!r} ({tuple(tensor.shape)} vs "
                                 f"{tuple(anchor_meta[key].shape)}); they are not models of one architecture")


def block_inputs(folder: ShardedFolder) -> list[str]:
    """The inputs a layer's block requires besides its hidden states (DeBERTa's attention_mask, relative positions),
    which BlockCheck does not give: [] when it runs on hidden states (and rotary position embeddings) alone."""
    name = family_spec(folder.config).modules["layer"].format(i=0).rstrip(".")
    layer = next(m for path, m in skeleton(folder.config, folder.model_class).named_modules()
                 if path == name or path.endswith("." + name))
    parameters = list(inspect.signature(layer.forward).parameters.values())[1:]
    return [p.name for p in parameters if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name != "position_embeddings"]


def renamed_tensors(folder: ShardedFolder) -> tuple[str, str] | None:
    """(a stored name, the module's name for it) when transformers renames the folder's tensors on load (ViT's
    attention.attention.query is attention.q_proj), else None."""
    model = skeleton(folder.config, folder.model_class)
    state = model.state_dict()
    names = {id(t): k for k, t in state.items()}
    renamed = [(s, names[id(t)]) for s, t in revert_weight_conversion(model, dict(state)).items()
               if names.get(id(t), s) != s and s in folder.weight_map]
    return renamed[0] if renamed else None


def _layer_prefix(layout: ModelLayout, index: int) -> str:
    """The state-dict prefix of layer `index` ("model.layers.3."), from its output map's key."""
    key = layout.layers[index].attention.output.weight
    marker = f".{index}."
    return key[: key.index(marker) + len(marker)]


def tolerance_for(dtypes: Iterable[torch.dtype], base: float) -> float:
    """The functional-check tolerance: `base`, or the rounding that storing moved weights in a dtype implies."""
    eps = max((torch.finfo(d).eps for d in dtypes if d.is_floating_point), default=0.0)
    return max(base, 4 * eps)


def match_folders(
    source: str | Path, anchor: str | Path, output: str | Path, matching: MatchConfig | str = "rotation",
    layers=None, last_layers: int | None = None, max_relative_output_change: float = 1e-3,
    whole_model_check: bool | None = None, tmp: Path | None = None,
) -> tuple[Transform, dict]:
    """Match the source folder onto the anchor folder layer by layer, writing the matched folder into `tmp`
    (or `output` directly); returns (transform, report). Memory: a few layers' tensors, never a model."""
    config_obj = matching_config(matching) if isinstance(matching, str) else matching
    src, anc, src_meta, layout = open_pair(source, anchor)
    indices = resolve_layers(layout.num_layers, layers, last_layers)
    target = Path(tmp or output)
    tolerance = tolerance_for({t.dtype for t in src_meta.values() if t.is_floating_point()}, max_relative_output_change)
    writers = open_writers(src, src_meta, target)
    shard_of = src.weight_map
    checker = BlockCheck(src.config)
    transform, seconds, deviations = Transform(), {}, {}
    squared = {"before": {}, "after": {}}
    done: set[str] = set()
    for i in indices:
        prefix = _layer_prefix(layout, i)
        keys = list(dict.fromkeys(layout.stored_keys(layout.layer_keys(i)) + [k for k in src_meta if k.startswith(prefix)]))
        s_layer, a_layer = src.read(keys, torch.float32), anc.read(layout.stored_keys(layout.layer_keys(i)), torch.float32)
        result = match_models(s_layer, a_layer, layout, config_obj, layers=[i])
        for stage, value in result.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
        moved = apply_transform(s_layer, layout, result.transform)
        stored = {k: moved[k].to(src_meta[k].dtype) for k in keys}          # what the matched folder holds
        del moved
        _accumulate(squared["before"], s_layer, a_layer, layout)
        _accumulate(squared["after"], stored, a_layer, layout)
        del a_layer                                                          # memory: one layer's tensors at a time
        deviations[i] = checker.deviation(prefix, s_layer, stored)
        if not deviations[i] <= tolerance:                                 # NaN fails too
            _abort(writers)
            raise SymfusionError(
                f"layer {i}: the matched block changes the source block's output by {deviations[i]:.3g} relative "
                f"(> {tolerance:.3g}); not writing {output}. Report this as a bug"
            )
        for key in keys:
            writers[shard_of[key]].write(key, stored[key])
        done.update(keys)
        transform.layers.update(result.transform.layers)
    anc_shapes = {k for k, t in anc.meta_state().items()         # a head of another size is compared with nothing
                  if k in src_meta and tuple(t.shape) == tuple(src_meta[k].shape)}
    for shard, keys in src.shards().items():                     # everything else is copied as it is
        for key in (k for k in keys if k not in done):
            tensor = src.read([key])[key]
            writers[shard].write(key, tensor)
            if tensor.is_floating_point() and key in anc_shapes:   # counts in both distances alike
                part = (tensor.double() - anc.read([key])[key].double()).pow(2).sum().item()
                for side in squared.values():
                    side["other"] = side.get("other", 0.0) + part
    finish_folder(src, writers, target)
    report = {
        "family": layout.family, "layers": indices, "shards": sorted(writers),
        "distance_before": math.sqrt(sum(squared["before"].values())),
        "distance_after": math.sqrt(sum(squared["after"].values())),
        "distance_before_by_module": {k: math.sqrt(v) for k, v in squared["before"].items()},
        "distance_after_by_module": {k: math.sqrt(v) for k, v in squared["after"].items()},
        "block_relative_output_change": {str(i): d for i, d in deviations.items()},
        "max_block_relative_output_change": max(deviations.values(), default=0.0),
        "tolerance": tolerance, "seconds_by_stage": seconds,
    }
    check_whole_model(src, src_meta, target, output, tolerance, whole_model_check, report)
    return transform, report


def open_pair(source: str | Path, anchor: str | Path) -> tuple[ShardedFolder, ShardedFolder, dict, ModelLayout]:
    """(source folder, anchor folder, the source's meta state, its layout): one architecture, writable alike."""
    src, anc = ShardedFolder(source), ShardedFolder(anchor)
    check_compatible(src.config, anc.config)
    needs = block_inputs(src)
    if needs:
        raise SymfusionError(f"folder matching checks each layer's block on hidden states alone, but a "
                             f"{src.config.model_type} layer also reads {needs[0]!r}; match it with symfusion-match, "
                             "or align() the loaded modules")
    renamed = renamed_tensors(src)
    if renamed:
        raise SymfusionError(f"{src.path} stores its tensors under other names than transformers' modules use "
                             f"({renamed[0]} for {renamed[1]}), which folder matching reads as stored; match it with "
                             "symfusion-match, or align() the loaded modules")
    src_meta, anc_meta = src.meta_state(), anc.meta_state()
    check_writable_layout(src, anc_meta)
    layout = layout_of(src.config, src_meta)
    check_same_layout(layout, layout_of(anc.config, anc_meta))
    return src, anc, src_meta, layout


def open_writers(src: ShardedFolder, src_meta: Mapping[str, torch.Tensor], target: Path) -> dict[str, ShardWriter]:
    """One ShardWriter per source shard in `target` (made if needed), with the source's keys, shapes and dtypes."""
    target.mkdir(parents=True, exist_ok=True)
    return {shard: ShardWriter(target / shard, {k: src_meta[k] for k in keys}, src.handle(shard).metadata())
            for shard, keys in src.shards().items()}


def finish_folder(src: ShardedFolder, writers: Mapping[str, ShardWriter], target: Path) -> None:
    """Close the shards; write the source's index, configs and tokenizer files beside them."""
    for writer in writers.values():
        writer.close()
    if src.index_metadata is not None:
        (target / INDEX).write_text(json.dumps({"metadata": src.index_metadata, "weight_map": src.weight_map}, indent=2) + "\n")
    for name in ("config.json", "generation_config.json"):
        if model_file(src.path, name, must_exist=False).is_file():
            shutil.copyfile(src.path / name, target / name)
    copy_auxiliary_files(src.path, target)


def check_whole_model(src: ShardedFolder, src_meta: Mapping, target: Path, output, tolerance: float,
                      whole_model_check: bool | None, report: dict) -> None:
    """The whole model's logits check of a written folder (by default when both fit in memory), into `report`."""
    if whole_model_check is None:
        whole_model_check = sum(math.prod(t.shape) * 4 for t in src_meta.values()) <= WHOLE_MODEL_CHECK_BYTES
    if whole_model_check:
        report["relative_output_change"] = whole_model_change(src.path, target)
        if not report["relative_output_change"] <= tolerance:       # NaN fails too
            raise SymfusionError(
                f"the matched model changes the source's logits by {report['relative_output_change']:.3g} relative "
                f"(> {tolerance:.3g}); not writing {output}. Report this as a bug"
            )


def _accumulate(squared: dict, state: Mapping, anchor: Mapping, layout: ModelLayout) -> None:
    """Add the squared distances of one layer's canonical tensors, by module type."""
    state, anchor = layout.canonical(state), layout.canonical(anchor)
    for key, tensor in anchor.items():
        diff = state[key].float() - tensor.float()                # one float32 temporary, summed in float64
        part = diff.square_().sum(dtype=torch.float64).item()
        squared[layout.module_type(key)] = squared.get(layout.module_type(key), 0.0) + part


def _abort(writers: Mapping[str, ShardWriter]) -> None:
    for writer in writers.values():
        writer.file.close()


def whole_model_change(source: Path, matched: Path, seq_len: int = 16) -> float:
    """max |out_matched - out_source| / max |out_source| on probe inputs (token ids or pixels), both folders loaded
    by transformers with the class whose tensors they hold: logits where the model has a head."""
    config = load_config(source)
    inputs = probe_inputs(config, batch_size=2, seq_len=seq_len)
    outputs = []
    for folder in (source, matched):
        cls = model_class(config, weight_map(folder)[0])        # with its head, whatever `architectures` says
        model = cls.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True, trust_remote_code=False)
        outputs.append(model_outputs(model, inputs))           # a bare model (no head): its hidden states
        del model
    return ((outputs[1] - outputs[0]).abs().max() / outputs[0].abs().max()).item()
