"""Sharded safetensors model folders read and written one layer at a time (memory-mapped), for models too big to load.

A 7B decoder pair (2 x 13.5 GB in bfloat16) and its matched copy do not fit in 24 GiB, so
folder matching never holds a whole model: tensors are read from the memory-mapped shards
(safetensors' safe_open) layer by layer, and every output shard is written in place as its
tensors become ready (ShardWriter: the header, offsets and file size are known before any
tensor is, because a symmetry changes no shape or dtype). The matched folder keeps the
source's shard files, its index (weight_map) and its key order, dtypes and config, so
transformers, mergekit or any safetensors reader loads it like the source.

A folder is read under the model's own tensor names (transformers renames some families' tensors
between files and model: ViT) and written back under the files' names. Each matched layer is checked
on its own, and the whole model when it is small (alignment/checks.py); the distances are the parameters'
(measures.SquaredDistances: every tensor, tied ones once, summed in the model's order).
"""
from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

import torch
from safetensors import SafetensorError, safe_open
from transformers.core_model_loading import revert_weight_conversion

from symfusion.arch import ModelLayout, check_finite, check_same_layout, layout_of, resolve_layers
from symfusion.families import check_compatible, family_spec
from symfusion.errors import SymfusionError, steps
from symfusion.io.folder import INDEX, first_line, model_file, weight_map
from symfusion.matching import MatchConfig, match_models, matching_config
from symfusion.matching.compose import StageClock
from symfusion.measures import SquaredDistances, compared_keys, distance_fields
from symfusion.alignment.checks import BlockCheck, check_whole_model, stored_in, tolerance_for
from symfusion.io.modelio import check_fits_config, copy_auxiliary_files, load_config, model_class, skeleton_of
from symfusion.symmetry import Transform, apply_transform

DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
NAMES = {name: dtype for dtype, name in DTYPES.items()}
# safetensors hands a tensor out in memory of its own that is not 64-byte aligned; MKL's results depend on the
# alignment of its inputs (on an AMD EPYC Zen 3 a folder's per-head rotations differed from the same weights' as a
# module by 1e-8, equal with MKL_CBWR=AUTO,STRICT), so a tensor read is copied into torch's aligned memory
ALIGNMENT = 64


def data_order(path: Path) -> list[str]:
    """The tensor names of a safetensors file in the order of their data offsets (read from its JSON header)."""
    with open(path, "rb") as handle:
        header = json.loads(handle.read(int.from_bytes(handle.read(8), "little")))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda key: header[key]["data_offsets"][0])


class ShardedFolder:
    """A save_pretrained folder's weights under the model's own tensor names: key -> shard, memory-mapped handles,
    reads of chosen keys.

    transformers renames some families' tensors between the files and the model (ViT's files keep
    `encoder.layer.0.attention.attention.query`, its model says `layers.0.attention.q_proj`): `weight_map`, `read`,
    `meta_state` and `shards` speak the model's names (what layouts and matching read), `files` and
    `file_keys` the files' (what a rewrite keeps). The index and every shard are checked when the folder is opened
    (symfusion.io.folder.weight_map: plain shard names inside the folder, each tensor where the index says), every
    tensor's shape and dtype against what config.json implies and every parameter it claims present
    (modelio.check_fits_config: a claim costs no memory), and every tensor read must be finite. `skeleton` is the
    model built on the meta device (no memory); `ties` its tied parameter names."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.config = load_config(self.path)
        self.files, self.index_metadata = weight_map(self.path)          # file key -> shard, as on disk
        self._handles = {}
        self.model_class = model_class(self.config, self.files)          # the class whose tensors the folder holds
        self.skeleton = skeleton_of(self.config, self.path, self.model_class)
        self.names = model_names(self.skeleton, self.files)               # file key -> model key
        self.file_keys = {model: file for file, model in self.names.items()}
        self.weight_map = {self.names[key]: shard for key, shard in self.files.items()}
        check_fits_config(self.config, {self.file_keys[k]: t for k, t in self.meta_state().items()}, self.path,
                          complete=True, model=self.skeleton)     # every claimed parameter is in the files
        self.order, self.ties = names_in_folder(self.skeleton, set(self.weight_map))

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
        for shard in dict.fromkeys(self.files.values()):
            keys = set(k for k, s in self.files.items() if s == shard)
            out[shard] = [self.names[k] for k in data_order(model_file(self.path, shard)) if k in keys]
        return out

    def meta_state(self) -> dict[str, torch.Tensor]:
        """Every tensor as a shape-and-dtype-only meta tensor (for layouts and shard headers)."""
        state = {}
        for key, shard in self.files.items():
            piece = self.handle(shard).get_slice(key)
            if piece.get_dtype() not in NAMES:
                raise SymfusionError(f"{self.path / shard} stores {key!r} as {piece.get_dtype()}, a dtype symfusion "
                                     "does not read; re-export the model")
            state[self.names[key]] = torch.empty(piece.get_shape(), dtype=NAMES[piece.get_dtype()], device="meta")
        return state

    def read(self, keys: Iterable[str], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The named tensors (copied out of the mapped shards), floating ones cast to `dtype` if given, each in
        memory aligned as torch allocates it (ALIGNMENT); each must be finite (the one check of arch.check_finite on
        every path into matching)."""
        out = {}
        for asked in keys:
            key = asked if asked in self.weight_map else self.ties.get(asked, asked)     # a tied name: its tensor
            try:
                tensor = self.handle(self.weight_map[key]).get_tensor(self.file_keys[key])
            except SafetensorError as error:
                raise SymfusionError(f"cannot read {key!r} from {self.path / self.weight_map[key]} "
                                     f"({first_line(error)}); re-export the model") from error
            check_finite({key: tensor}, f"model {self.path}")
            tensor = tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor
            out[asked] = tensor if tensor.data_ptr() % ALIGNMENT == 0 else tensor.clone()
        return out


def _prefix_shift(skeleton: torch.nn.Module, keys) -> Callable[[str], str]:
    """How the folder names the skeleton's tensors: as they are, without the base model's prefix (a bare model's
    folder read as a task model), or with it."""
    prefix = getattr(skeleton, "base_model_prefix", "") or ""
    names, keys = list(skeleton.state_dict()), set(keys)
    shifts = [lambda n: n, lambda n: n[len(prefix) + 1:] if n.startswith(prefix + ".") else n,
              lambda n: n if n.startswith(prefix + ".") else f"{prefix}.{n}"]
    return max(shifts, key=lambda shift: sum(shift(n) in keys for n in names))


def model_names(skeleton: torch.nn.Module, files: Mapping[str, str]) -> dict[str, str]:
    """File key -> the model's key for it: transformers' own renaming of the family on load (the inverse of what
    save_pretrained writes, read off the skeleton), in the folder's prefix convention; the identity elsewhere."""
    state = skeleton.state_dict()
    try:
        reverted = revert_weight_conversion(skeleton, dict(state))          # file key -> the model's tensor
    except Exception:  # noqa: BLE001 - a family without a conversion (or one this reader cannot invert): as stored
        reverted = {}
    ids = {id(tensor): key for key, tensor in state.items()}
    renamed = {file: ids[id(t)] for file, t in reverted.items() if id(t) in ids and file != ids[id(t)]}
    shift = _prefix_shift(skeleton, files)
    renamed = {shift(file): shift(model) for file, model in renamed.items()}
    return {key: renamed.get(key, key) for key in files}


def names_in_folder(skeleton: torch.nn.Module, keys: set[str]) -> tuple[list[str], dict[str, str]]:
    """(every tensor name of the model in its state-dict order, the folder's keys it lacks after them; tied names:
    a parameter name -> the name of the parameter it is), in the folder's naming."""
    shift = _prefix_shift(skeleton, keys)
    order = [shift(name) for name in skeleton.state_dict()]
    order += [k for k in keys if k not in set(order)]
    first, ties = {}, {}
    for name, parameter in skeleton.named_parameters(remove_duplicate=False):
        if id(parameter) in first:
            ties[shift(name)] = shift(first[id(parameter)])
        else:
            first[id(parameter)] = name
    return order, ties


class ShardWriter:
    """One safetensors file written tensor by tensor, in any order: header and offsets are fixed up front."""

    def __init__(self, path: Path, specs: Mapping[str, torch.Tensor], metadata: dict | None,
                 names: Mapping[str, str] | None = None):
        """specs: key -> a tensor of its shape and dtype; names: key -> its name in the file (default: the key)."""
        header, offset = {}, 0
        names = names or {}
        for key, spec in specs.items():                         # offsets in the given (source) order
            size = math.prod(spec.shape) * spec.element_size()
            header[names.get(key, key)] = {"dtype": DTYPES[spec.dtype], "shape": list(spec.shape),
                                           "data_offsets": [offset, offset + size]}
            offset += size
        if metadata:
            header = {"__metadata__": metadata, **header}
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)                           # the data starts 8-byte aligned
        self.path, self.specs, self.pending = path, dict(specs), set(specs)
        self.start = 8 + len(raw)
        self.offsets = {k: header[names.get(k, k)]["data_offsets"][0] for k in specs}
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


def layer_prefix(layout: ModelLayout, index: int) -> str:
    """The state-dict prefix of layer `index` ("model.layers.3."), from its output map's key."""
    key = layout.layers[index].attention.output.weight
    marker = f".{index}."
    return key[: key.index(marker) + len(marker)]


def match_folders(
    source: str | Path, anchor: str | Path, output: str | Path, matching: MatchConfig | str = "rotation",
    layers=None, last_layers: int | None = None, max_relative_output_change: float = 1e-3,
    whole_model_check: bool | None = None, tmp: Path | None = None,
) -> tuple[Transform, dict]:
    """Match the source folder onto the anchor folder layer by layer, writing the matched folder into `tmp`
    (or `output` directly); returns (transform, report fields: the distances before and after by module type,
    each block's check, the whole model's when it is small). Memory: a few layers' tensors, never a model."""
    config_obj = matching_config(matching) if isinstance(matching, str) else matching
    clock = StageClock()        # where the time goes: load, solve, distances, check, write (match.json)
    with clock("load"):
        src, anc, src_meta, layout = open_pair(source, anchor)
    indices = resolve_layers(layout.num_layers, layers, last_layers)
    target = Path(tmp or output)
    tolerance = tolerance_for({t.dtype for t in src_meta.values() if t.is_floating_point()}, max_relative_output_change)
    with clock("write"):
        writers = open_writers(src, src_meta, target)
    shard_of = src.weight_map
    with clock("check"):
        checker = BlockCheck(src.config, skeleton=src.skeleton, read=src.read, keys=src.weight_map)
    transform, seconds, deviations, matching_seconds = Transform(), {}, {}, 0.0
    with clock("distances"):
        pairs = distance_pairs(src, anc, layout)
        before, after = SquaredDistances(pairs, layout), SquaredDistances(pairs, layout)
    done: set[str] = set()
    for i in steps(indices, "matching layers", "layer"):
        with clock("load"):
            keys = layer_keys(src, layout, i)
            s_layer = src.read(keys, torch.float32)
            a_all = anc.read([k for k in keys if k in anc.weight_map], torch.float32)
            a_layer = {k: a_all[k] for k in layout.stored_keys(layout.layer_keys(i))}
        start = time.perf_counter()
        result = match_models(s_layer, a_layer, layout, config_obj, layers=[i])
        for stage, value in result.seconds.items():
            seconds[stage] = seconds.get(stage, 0.0) + value
        moved = apply_transform(s_layer, layout, result.transform)
        matching_seconds += time.perf_counter() - start
        stored = {k: stored_in(moved[k], src_meta[k].dtype, k) for k in keys}   # what the matched folder holds
        del moved
        clock.seconds["solve"] += time.perf_counter() - start
        with clock("distances"):
            before.add(layout.canonical(s_layer), layout.canonical(a_all))
            after.add(layout.canonical(stored), layout.canonical(a_all))
        del a_layer, a_all                                                   # memory: one layer's tensors at a time
        with clock("check"):
            deviations[i] = checker.deviation(layer_prefix(layout, i), s_layer, stored)
        if not deviations[i] <= tolerance:                                 # NaN fails too
            _abort(writers)
            raise SymfusionError(
                f"layer {i}: the matched block changes the source block's output by {deviations[i]:.3g} relative "
                f"(> {tolerance:.3g}); not writing {output}. Report this as a bug"
            )
        with clock("write"):
            for key in keys:
                writers[shard_of[key]].write(key, stored[key])
        done.update(keys)
        transform.layers.update(result.transform.layers)
    with clock("write"):
        for shard, keys in src.shards().items():                     # everything else is copied as it is
            for key in (k for k in keys if k not in done):
                writers[shard].write(key, src.read([key])[key])
    with clock("distances"):
        unmoved_distances(src, anc, layout, [i for i in range(layout.num_layers) if i not in indices], before, after)
    with clock("write"):
        finish_folder(src, writers, target)
    report = {
        "family": layout.family, "layers": indices, "shards": sorted(writers),
        **distance_fields(before.distances(), after.distances()), "seconds": matching_seconds,
        "block_relative_output_change": {str(i): d for i, d in deviations.items()},
        "max_block_relative_output_change": max(deviations.values(), default=0.0),
        "tolerance": tolerance, "seconds_by_stage": clock.seconds, "solve_seconds_by_stage": seconds,
    }
    with clock("check"):
        check_whole_model(src, src_meta, target, output, tolerance, whole_model_check, report)
    report["seconds_by_stage"] = dict(clock.seconds)
    return transform, report


def layer_keys(folder: ShardedFolder, layout: ModelLayout, i: int) -> list[str]:
    """Every stored tensor of layer i: its maps (a fused GPT-2 c_attn once), norms and biases."""
    prefix = layer_prefix(layout, i)
    return list(dict.fromkeys(layout.stored_keys(layout.layer_keys(i)) + [k for k in folder.weight_map
                                                                           if k.startswith(prefix)]))


def distance_pairs(src: ShardedFolder, anc: ShardedFolder, layout: ModelLayout) -> dict[str, tuple[str, str]]:
    """The tensors a distance between two folders compares (measures.compared_keys: tied tensors once), under
    their canonical names, in the source model's state-dict order (so the sums equal those of two nn.Modules)."""
    metas = []
    for folder in (src, anc):
        meta = folder.meta_state()
        spare = torch.empty(0, device="meta")
        metas.append(layout.canonical({k: meta.get(k, spare) for k in folder.order}))
    stored = [layout.canonical(folder.meta_state()) for folder in (src, anc)]
    return compared_keys(list(metas[0]), stored[0], stored[1], src.ties, anc.ties)


def unmoved_distances(src: ShardedFolder, anc: ShardedFolder, layout: ModelLayout, unmatched: list[int],
                      *sides: SquaredDistances) -> None:
    """Add the tensors a block matching leaves as they are (unmatched layers, everything outside the layers) to each
    side's distances: the same part before and after."""
    for i in unmatched:
        keys = layer_keys(src, layout, i)
        s, a = layout.canonical(src.read(keys)), layout.canonical(anc.read([k for k in keys if k in anc.weight_map]))
        for side in sides:
            side.add(s, a)
    pairs = sides[0].pairs
    for key, (s, a) in pairs.items():
        if key not in sides[0].parts and s in src.weight_map | src.ties and a in anc.weight_map | anc.ties:
            source, anchor = src.read([s]), anc.read([a])
            for side in sides:
                side.add(source, anchor)


def open_pair(source: str | Path, anchor: str | Path) -> tuple[ShardedFolder, ShardedFolder, dict, ModelLayout]:
    """(source folder, anchor folder, the source's meta state, its layout): one architecture, writable alike."""
    src, anc = ShardedFolder(source), ShardedFolder(anchor)
    check_compatible(src.config, anc.config)
    src_meta, anc_meta = src.meta_state(), anc.meta_state()
    check_writable_layout(src, anc_meta)
    layout = layout_of(src.config, src_meta)
    check_same_layout(layout, layout_of(anc.config, anc_meta))
    return src, anc, src_meta, layout


def open_writers(src: ShardedFolder, src_meta: Mapping[str, torch.Tensor], target: Path) -> dict[str, ShardWriter]:
    """One ShardWriter per source shard in `target` (made if needed), with the source's keys, shapes and dtypes."""
    target.mkdir(parents=True, exist_ok=True)
    return {shard: ShardWriter(target / shard, {k: src_meta[k] for k in keys}, src.handle(shard).metadata(),
                               src.file_keys)
            for shard, keys in src.shards().items()}


def finish_folder(src: ShardedFolder, writers: Mapping[str, ShardWriter], target: Path) -> None:
    """Close the shards; write the source's index, configs and tokenizer files beside them."""
    for writer in writers.values():
        writer.close()
    if src.index_metadata is not None:
        (target / INDEX).write_text(json.dumps({"metadata": src.index_metadata, "weight_map": src.files}, indent=2) + "\n")
    for name in ("config.json", "generation_config.json"):
        if model_file(src.path, name, must_exist=False).is_file():
            shutil.copyfile(src.path / name, target / name)
    copy_auxiliary_files(src.path, target)


def _abort(writers: Mapping[str, ShardWriter]) -> None:
    for writer in writers.values():
        writer.file.close()
