"""The red-team suite's tools: hostile changes to a model folder (index, shards, config, dtypes, non-finite values,
symlinks, paths), a hash snapshot of a tree, and the one assertion every refused case makes.

Every mutation takes a copy of a good save_pretrained folder (single file or sharded), changes it in one way
a careless or hostile user could, and returns nothing; MUTATIONS names them by class. `outcome` runs one
call and says how it ended; `assert_refused` checks what a refusal must leave: exit 2 (or SymfusionError),
exactly one `error:` line, no traceback, nothing outside the output changed, no output, no lock or temp.
`build_world` and COMMANDS give every writing entry point (each console script of pyproject.toml and its modes,
and align()) with good inputs and the outputs it writes: the class harnesses of issue 36 run them all.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import traceback
from contextlib import redirect_stderr
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from symfusion.pipeline import cli
from symfusion.errors import SymfusionError
from symfusion.pipeline.report.registry import KIND_FILES, experiment

INDEX = "model.safetensors.index.json"


# ---------------------------------------------------------------- snapshots

def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Relative path -> sha256 (files), 'dir', or 'link -> target' of everything under `root` (but `skip`)."""
    out = {}
    for path in sorted(Path(root).rglob("*")):
        if skip is not None and (path == skip or skip in path.parents):
            continue
        key = str(path.relative_to(root))
        if path.is_symlink():
            out[key] = f"link -> {os.readlink(path)}"
        elif path.is_dir():
            out[key] = "dir"
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def leftovers(output: Path) -> list[str]:
    """Locks, temps and displaced old results of `output` left in its folder (all begin with .NAME.)."""
    parent = Path(output).parent
    if not parent.is_dir():
        return []
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{Path(output).name}."))


# ---------------------------------------------------------------- running one call

def outcome(call) -> tuple[int | str, str]:
    """(exit code, or 'ok' / 'error' for an API call, or 'traceback'; stderr or the error's text) of call()."""
    stderr = io.StringIO()
    try:
        with redirect_stderr(stderr):
            call()
        return ("ok" if not stderr.getvalue().strip().startswith("error:") else 2), stderr.getvalue()
    except SystemExit as exit_info:
        return (exit_info.code if isinstance(exit_info.code, int) else 1), stderr.getvalue()
    except SymfusionError as error:
        return "error", f"error: {error}"
    except BaseException:           # noqa: BLE001 - any other exception is what the suite hunts for
        return "traceback", stderr.getvalue() + traceback.format_exc()


def assert_refused(code, text: str, world: Path, before: dict, output: Path, what: str = "") -> str:
    """A refusal: exit 2 or SymfusionError, one `error:` line, no traceback, nothing outside `output` changed
    (`before` = snapshot(world, output)), no output, no lock or temp left. Returns the line."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("usage: ")]
    assert code in (2, "error"), f"{what}: ended with {code}: {text[-1500:]}"
    assert len(lines) == 1 and lines[0].startswith("error:"), f"{what}: not one error line: {text[-1500:]}"
    assert "Traceback" not in text, what
    assert snapshot(world, output) == before, f"{what}: something outside the output changed"
    assert not os.path.lexists(output), f"{what}: wrote {output}"
    assert leftovers(output) == [], f"{what}: left {leftovers(output)}"
    return lines[0]


# ---------------------------------------------------------------- hostile changes to a model folder

def _index(folder: Path) -> dict:
    return json.loads((folder / INDEX).read_text())


def _set_index(folder: Path, index) -> None:
    (folder / INDEX).write_text(json.dumps(index))


def _shards(folder: Path) -> list[str]:
    if (folder / INDEX).exists():
        return sorted(set(_index(folder)["weight_map"].values()))
    return ["model.safetensors"]


def _rename_shard(folder: Path, old: str, new: str) -> None:
    index = _index(folder)
    index["weight_map"] = {k: (new if v == old else v) for k, v in index["weight_map"].items()}
    _set_index(folder, index)


def _edit_tensor(folder: Path, pick, change) -> None:
    """Apply change(tensor) -> tensor to the first tensor (in sorted order) whose name satisfies pick(name)."""
    for shard in _shards(folder):
        state = load_file(str(folder / shard))
        names = [k for k in sorted(state) if pick(k)]
        if names:
            state[names[0]] = change(state[names[0]].clone())
            save_file(state, str(folder / shard), metadata={"format": "pt"})
            return
    raise AssertionError("no tensor to change")


def _edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))


def _needs_index(mutation):
    mutation.needs_index = True
    return mutation


def traverse_index(folder, outside):
    """The index names ../victim/<shard>: a file outside the folder that a writer keeping shard names would create."""
    shard = _shards(folder)[0]
    victim = outside / "victim.safetensors"
    shutil.copy(folder / shard, victim)
    _rename_shard(folder, shard, f"../{outside.name}/victim.safetensors")


def absolute_index(folder, outside):
    shard = _shards(folder)[0]
    shutil.copy(folder / shard, outside / "absolute.safetensors")
    _rename_shard(folder, shard, str(outside / "absolute.safetensors"))


def subfolder_index(folder, outside):
    shard = _shards(folder)[0]
    (folder / "sub").mkdir()
    shutil.move(folder / shard, folder / "sub" / shard)
    _rename_shard(folder, shard, f"sub/{shard}")


def index_not_json(folder, outside):
    (folder / INDEX).write_text("{not json")


def index_list(folder, outside):
    _set_index(folder, {"weight_map": [["a", "b"]]})


def index_value_not_a_name(folder, outside):
    index = _index(folder)
    index["weight_map"][next(iter(index["weight_map"]))] = 7
    _set_index(folder, index)


def index_empty(folder, outside):
    _set_index(folder, {"metadata": {}, "weight_map": {}})


def tensor_in_wrong_shard(folder, outside):
    index = _index(folder)
    shards = sorted(set(index["weight_map"].values()))
    key = next(iter(index["weight_map"]))
    index["weight_map"][key] = next(s for s in shards if s != index["weight_map"][key])
    _set_index(folder, index)


def tensor_no_shard_holds(folder, outside):
    index = _index(folder)
    index["weight_map"]["model.layers.0.rogue.weight"] = _shards(folder)[0]
    _set_index(folder, index)


def unlisted_tensor(folder, outside):
    shard = _shards(folder)[0]
    state = load_file(str(folder / shard))
    state["rogue.weight"] = torch.zeros(3)
    save_file(state, str(folder / shard), metadata={"format": "pt"})


def shard_missing(folder, outside):
    (folder / _shards(folder)[-1]).unlink()


def shard_is_a_folder(folder, outside):
    shard = _shards(folder)[-1]
    (folder / shard).unlink()
    (folder / shard).mkdir()


def shard_named_like_an_output(folder, outside):
    shard = _shards(folder)[0]
    os.rename(folder / shard, folder / "transform.safetensors")
    _rename_shard(folder, shard, "transform.safetensors")


# only a writer that keeps the source's shard names beside its own files has to refuse it
shard_named_like_an_output.readers = ("align", "symfusion-match", "symfusion-multimodel")


def shard_not_safetensors_name(folder, outside):
    shard = _shards(folder)[0]
    os.rename(folder / shard, folder / "weights.bin")
    _rename_shard(folder, shard, "weights.bin")


def shard_link_outside(folder, outside):
    shard = _shards(folder)[0]
    shutil.move(folder / shard, outside / "linked.safetensors")
    os.symlink(outside / "linked.safetensors", folder / shard)


def index_link_outside(folder, outside):
    shutil.move(folder / INDEX, outside / "linked.index.json")
    os.symlink(outside / "linked.index.json", folder / INDEX)


for _m in (traverse_index, absolute_index, subfolder_index, index_not_json, index_list, index_value_not_a_name,
           index_empty, tensor_in_wrong_shard, tensor_no_shard_holds, shard_is_a_folder, shard_named_like_an_output,
           shard_not_safetensors_name, index_link_outside):
    _needs_index(_m)


def truncated_shard(folder, outside):
    path = folder / _shards(folder)[-1]
    path.write_bytes(path.read_bytes()[:120])


def empty_shard(folder, outside):
    (folder / _shards(folder)[-1]).write_bytes(b"")


def huge_header(folder, outside):
    path = folder / _shards(folder)[-1]
    data = path.read_bytes()
    path.write_bytes((2**40).to_bytes(8, "little") + data[8:])


def config_not_json(folder, outside):
    (folder / "config.json").write_text('{"model_type": ')


def config_link_outside(folder, outside):
    shutil.move(folder / "config.json", outside / "linked_config.json")
    os.symlink(outside / "linked_config.json", folder / "config.json")


def config_is_a_folder(folder, outside):
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()


def config_intermediate_size(folder, outside):
    config = json.loads((folder / "config.json").read_text())
    _edit_config(folder, intermediate_size=config.get("intermediate_size", config.get("n_inner") or 64) + 8)


def config_heads(folder, outside):
    config = json.loads((folder / "config.json").read_text())
    _edit_config(folder, num_attention_heads=2 * config.get("num_attention_heads", 2))


def config_unknown_model_type(folder, outside):
    _edit_config(folder, model_type="gpt9")


def config_bogus_architecture(folder, outside):
    _edit_config(folder, architectures=["NoSuchModelForAnything"])


def integer_weight(folder, outside):
    _edit_tensor(folder, lambda k: k.endswith("weight") and ("query" in k or "q_proj" in k),
                 lambda t: t.to(torch.int32))


def float64_weight(folder, outside):
    _edit_tensor(folder, lambda k: k.endswith("weight") and ("value" in k or "v_proj" in k),
                 lambda t: t.to(torch.float64))


def nan_in_a_layer(folder, outside):
    _edit_tensor(folder, lambda k: ".0." in k and k.endswith("weight") and "norm" not in k.lower(),
                 lambda t: t.index_fill_(0, torch.tensor([0]), float("nan")))


def inf_in_the_embedding(folder, outside):
    _edit_tensor(folder, lambda k: "embed" in k and k.endswith("weight"),
                 lambda t: t.index_fill_(0, torch.tensor([0]), float("inf")))


def minus_inf_in_a_norm(folder, outside):
    _edit_tensor(folder, lambda k: "norm" in k.lower() and k.endswith("weight"),
                 lambda t: t.index_fill_(0, torch.tensor([0]), float("-inf")))


def norm_gain_of_1e30(folder, outside):
    """Finite, but its square overflows float32: the model's own next norm and every distance of it are inf."""
    _edit_tensor(folder, lambda k: "norm" in k.lower() and k.endswith("weight"),
                 lambda t: t.index_fill_(0, torch.tensor([0]), 1e30))


def tokenizer_link_outside(folder, outside):
    (outside / "secret.txt").write_text("not the model's")
    os.symlink(outside / "secret.txt", folder / "tokenizer.json")


def pickle_only(folder, outside):
    for shard in _shards(folder):
        (folder / shard).unlink()
    (folder / INDEX).unlink(missing_ok=True)
    (folder / "pytorch_model.bin").write_bytes(b"pickle")


# mutation class -> its mutations; every one must be refused (the accepted variants are in test_redteam_*)
MUTATIONS = {
    "index": [traverse_index, absolute_index, subfolder_index, index_not_json, index_list, index_value_not_a_name,
              index_empty, tensor_in_wrong_shard, tensor_no_shard_holds, shard_is_a_folder, shard_named_like_an_output,
              shard_not_safetensors_name, shard_missing],
    "shards": [truncated_shard, empty_shard, huge_header, unlisted_tensor],
    "config": [config_not_json, config_is_a_folder, config_intermediate_size, config_unknown_model_type],
    "dtype": [integer_weight],
    "non-finite": [nan_in_a_layer, inf_in_the_embedding, minus_inf_in_a_norm, norm_gain_of_1e30],
    "symlinks": [shard_link_outside, index_link_outside, config_link_outside, tokenizer_link_outside],
    "pickles": [pickle_only],
}
# changes a correct tool accepts, with a correct result
ACCEPTED = [float64_weight, config_bogus_architecture]


def applicable(mutation, folder: Path) -> bool:
    """Whether `mutation` makes sense for the folder (index mutations need a sharded folder)."""
    return not getattr(mutation, "needs_index", False) or (folder / INDEX).exists()


# ---------------------------------------------------------------- every writing entry point, with good inputs

def build_world(root: Path) -> Path:
    """Good inputs for every writing command (COMMANDS): ViT pairs for the digits task, BERT and sharded Llama pairs,
    evaluation and barrier results for symfusion-report. Returns `root`."""
    import transformers as tf
    from test_report_figures import barrier_result
    from test_vision_stages import merged_evaluation_files
    from tiny_decoders import tiny_decoder
    from tiny_models import randomize, tiny_model

    vit = tf.ViTConfig(image_size=8, patch_size=4, num_channels=1, num_labels=10, hidden_size=16,
                       num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)
    for seed in (0, 1):
        randomize(tf.ViTForImageClassification(vit), seed).save_pretrained(str(root / f"vit_{'ab'[seed]}"))
        tiny_model("bert", seed=seed + 1).save_pretrained(str(root / f"bert_{'ab'[seed]}"))
        tiny_decoder("llama", seed=seed, num_key_value_heads=2).save_pretrained(str(root / f"llama_{'ab'[seed]}"),
                                                                                max_shard_size="40KB")
    (root / "evals").mkdir()
    merged_evaluation_files(root / "evals", {m: 0.5 + 0.02 * i for i, m in
                                             enumerate(experiment("table2").matchings("merged_evals"))})
    for seed, (matching, bump) in enumerate((("none", 1.0), ("rotation", 0.2), ("attn_only", 0.9))):
        barrier_result(root, matching, root / "matched" / matching, bump=bump, seed=seed)
    return root


def _report(name: str, suffix: str):
    def command(world: Path, out: Path):
        inputs = sorted(str(p) for p in (world / ("evals" if name == "table2" else "barrier")).glob("*.json"))
        output = out / f"{name}{suffix}"
        return (lambda: cli.report_main([f"artefact={name}", f"inputs=[{','.join(inputs)}]", f"output={output}"]),
                [output.with_suffix(s) for s in KIND_FILES["table" if suffix == ".csv" else "figure"]])
    return command


def _exit(code: int):
    """A console script's main() that returns its exit code, as the script runs it."""
    raise SystemExit(code)


def _cli(main: str, outputs: list[str], *args: str):
    """A command of symfusion.pipeline.cli: `args` with {world} and {out} filled in, writing `outputs` (relative to out)."""
    def command(world: Path, out: Path):
        argv = [a.format(world=world, out=out) for a in args]
        return (lambda: getattr(cli, main)(argv)), [out / o for o in outputs]
    return command


DIGITS = ("task=digits", "task.limit={{train: 128, validation: 64, test: 64}}")   # (braces doubled: format)
# Entry point -> command(world, out) -> (a call, the outputs it writes); one entry per [project.scripts] writer and
# per mode of a command that writes other outputs (symfusion-merge eval_dir, symfusion-report's kinds), and align().
COMMANDS = {
    "symfusion-data": _cli("data_main", ["data.json"], *DIGITS, "output={out}/data.json"),
    "symfusion-train": _cli("train_main", ["model"], *DIGITS, "model=vit_smoke", "task.train.epochs=1",
                            "task.train.batch_size=32", "output={out}/model"),
    "symfusion-match": _cli("match_main", ["matched"], "source={world}/bert_b", "anchor={world}/bert_a",
                            "output={out}/matched"),
    "symfusion-merge": _cli("merge_main", ["merged"], *DIGITS, "fusion=fisher", "fusion.num_batches=1",
                            "models=[{world}/vit_a,{world}/vit_b]", "output={out}/merged"),
    "symfusion-merge eval_dir": _cli("merge_main", ["evals/simple.json", "evals/fisher.json"], *DIGITS,
                                     "methods=[simple,fisher]", "method_options={{fisher: {{num_batches: 1}}}}",
                                     "models=[{world}/vit_a,{world}/vit_b]", "eval_dir={out}/evals"),
    "symfusion-statistics": _cli("statistics_main", ["stats.safetensors"], *DIGITS, "model_dir={world}/vit_a",
                                 "methods=[fisher]", "method_options={{fisher: {{num_batches: 1}}}}",
                                 "output={out}/stats.safetensors"),
    "symfusion-evaluate": _cli("evaluate_main", ["eval.json"], *DIGITS, "model_dir={world}/vit_a",
                               "output={out}/eval.json"),
    "symfusion-barrier": _cli("barrier_main", ["barrier.json"], *DIGITS, "anchor={world}/vit_a", "source={world}/vit_b",
                              "points=2", "examples=8", "output={out}/barrier.json"),
    "symfusion-layers": _cli("layers_main", ["layers.json"], "anchor={world}/vit_a", "source={world}/vit_b",
                             "tasks=[digits,digits]", "examples=8", "output={out}/layers.json"),
    "symfusion-multimodel": _cli("multimodel_main", ["multi", "multi.json"], "models=[{world}/bert_a,{world}/bert_b]",
                                 "output={out}/multi.json", "output_models={out}/multi"),
    "symfusion-report table": _report("table2", ".csv"),
    "symfusion-report figure": _report("fig5_barrier", ".png"),
    "symfusion-align-many": _cli("align_many_main", ["many"], "models=[{world}/vit_a,{world}/vit_b]",
                                 "output={out}/many"),
    "symfusion-kway": _cli("kway_main", ["kway.json"], *DIGITS, "ends=[{world}/vit_a,{world}/vit_b]",
                           "models=[{world}/vit_a,{world}/vit_b]", "grid=2", "examples=8", "output={out}/kway.json"),
    "align": lambda world, out: ((lambda: __import__("symfusion").align(str(world / "llama_b"), str(world / "llama_a"),
                                                                        output=out / "aligned")), [out / "aligned"]),
}
NON_WRITERS = {"symfusion-compare": "reads two runs' CSVs and prints their differences",
               "symfusion-worker": "serves jobs on a socket (tests/redteam/test_redteam_bookkeeping.py: its folder's checks)"}


def console_scripts() -> dict[str, str]:
    """[project.scripts] of pyproject.toml: script name -> its entry point."""
    import tomllib
    return tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
