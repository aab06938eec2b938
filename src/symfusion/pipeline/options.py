"""The options of every stage command, declared once: a frozen dataclass per command whose fields carry each option's type, check and help.

conf/<command>.yaml is Hydra's configuration (the groups it composes, the options' default values); the dataclass
here is the one declaration of what each option may be and means. From it: the checks of a command line (read(),
the first problem as one error line), --help's option list (help_lines()) and docs/commands.md's option tables
(markdown(); tests/pipeline/test_command_options.py compares the page with it). This module imports no stage
(nor torch): a refused command line costs no stage import.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar

from omegaconf import DictConfig, OmegaConf

from symfusion.pipeline.config import (Check, check_values, choice, integer, limits, listing, mapping, number, text,
                                       texts_of)

PATH, PATHS = text(), listing(text())
SPLIT = choice("train", "validation", "test")
PRECISION = choice("auto", "bf16", "fp32")
# The config groups a command composes (chosen by name: a conf file) and Hydra's own key: no option fields.
GROUPS = frozenset({"hydra", "task", "profile", "matching", "fusion", "model"})


def option(check: Check, help: str):
    """A field of a command's options: its check (pipeline/config.py) and its one-line help."""
    return field(metadata={"check": check, "help": help})


# The task group's settings a command line may set (task.KEY=...), checked for every command that reads a task.
TASK_SETTINGS = {
    "task.split_seed": integer(0), "task.eval_batch_size": integer(1), "task.fusion_batch_size": integer(1),
    "task.limit": limits(optional=True), "task.max_length": integer(1, optional=True),
    "task.block_size": integer(2, optional=True), "task.tokenizer.vocab_size": integer(258, optional=True),
    "task.tokenizer.min_frequency": integer(1, optional=True),
    "task.train.epochs": integer(1), "task.train.batch_size": integer(1), "task.train.lr": number(0, strict_low=True),
    "task.train.weight_decay": number(0), "task.train.warmup_ratio": number(0, 1),
}


@dataclass(frozen=True)
class DataOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.data"
    reads_task: ClassVar[bool] = True
    output: str = option(PATH, "FILE.json: the task's manifest (its fixed splits and their sizes)")


@dataclass(frozen=True)
class TrainOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.train"
    reads_task: ClassVar[bool] = True
    output: str = option(PATH, "DIR: the trained model folder")
    seed: int = option(integer(0), "the training seed (initialisation and data order)")
    threads: int | None = option(integer(1, optional=True), "torch CPU threads; null: torch's default")
    precision: str = option(PRECISION, "auto: training under bfloat16 autocast and TF32 on a GPU, validation in "
                                       "float32 | bf16 | fp32")


@dataclass(frozen=True)
class MatchOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.match"
    reads_task: ClassVar[bool] = False
    source: str = option(PATH, "save_pretrained folder of the model that is moved")
    anchor: str = option(PATH, "save_pretrained folder of the model that stays fixed")
    output: str = option(PATH, "DIR written atomically: matched model, match.json, transform.safetensors")
    layers: list[int] | None = option(listing(integer(0), optional=True),
                                      "explicit layer indices to match, e.g. [0,5]; null: all")
    last_layers: int | None = option(integer(0, optional=True), "or: match only the last K layers")
    max_relative_output_change: float = option(
        number(0, strict_low=True), "refuse a matched model whose outputs differ from the source's by more than this, "
        "relative to the largest output magnitude")
    data_task: str | None = option(text(optional=True), "the task whose statistic batches a matching that reads "
                                   "activations or the loss reads (matching.residual_solve=activations, "
                                   "matching.refine=loss)")
    data_batches: int = option(integer(1), "how many batches of the task's fusion_batch_size examples")
    data_split: str = option(choice("validation", "train"), "which split they come from (never test)")


@dataclass(frozen=True)
class MergeOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.merge"
    reads_task: ClassVar[bool] = True
    models: list[str] = option(listing(text(), 2), "model folders; the first is the anchor (sources matched onto it)")
    tasks: list[str] | None = option(listing(text(), 1, optional=True),
                                     "one task per model: each model's Fisher/Gram statistics on its own task")
    output: str | None = option(text(optional=True), "DIR: the merged model folder (one method: fusion=NAME)")
    methods: list[str] | None = option(listing(text(), 1, optional=True),
                                       "or several methods in one process, each merged model evaluated in place "
                                       "(presets/fusion/<name>.yaml each; no model folder written)")
    method_options: dict | None = option(mapping(optional=True), "per method, on top of its preset and declared "
                                         "defaults: {regmean: {alpha: 0.1, num_batches: 2}}")
    eval_dir: str | None = option(text(optional=True), "eval_dir/<method>.json: test metrics of each merged model")
    eval_tasks: list[str] | None = option(listing(text(), 1, optional=True), "tasks to evaluate on (default: task)")
    eval_heads: list[str] | None = option(listing(text(), 1, optional=True),
                                          "text: evaluate eval_tasks[i] with the task head of the folder eval_heads[i]")
    precision: str = option(PRECISION, "auto: statistic passes under bfloat16 autocast and TF32 on a GPU, scores in "
                                       "float32 | bf16 | fp32")
    statistics: list[str] | None = option(listing(text(), 1, optional=True),
                                          "FILEs of symfusion-statistics: statistics of models fused unmoved, read "
                                          "instead of computed (each file must fit one of the models)")
    client: str = option(choice("symfusion", "mergekit"), "who merges (with methods=[..]): symfusion | mergekit "
                         "(its mergekit-yaml CLI; methods=[simple] only, the `merge` extra)")


@dataclass(frozen=True)
class StatisticsOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.statistics"
    reads_task: ClassVar[bool] = True
    model_dir: str = option(PATH, "the model folder")
    methods: list[str] = option(listing(text(), 1), "presets/fusion/<name>.yaml each: methods with a per-model "
                                "statistic")
    method_options: dict | None = option(mapping(optional=True), "as symfusion-merge's: per method, on top of its "
                                         "preset and declared defaults")
    output: str = option(PATH, "FILE.safetensors")
    precision: str = option(PRECISION, "as the merges that read it: auto | bf16 | fp32")


@dataclass(frozen=True)
class EvaluateOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.evaluate"
    reads_task: ClassVar[bool] = True
    model_dir: str = option(PATH, "save_pretrained folder (end model or merged model)")
    output: str = option(PATH, "FILE.json: the metrics")
    split: str = option(SPLIT, "the split evaluated")
    head_from: str | None = option(text(optional=True), "text: evaluate with the task head of this model folder")
    precision: str = option(PRECISION, "auto, fp32: scores in float32 (no TF32 on a GPU) | bf16: bfloat16 autocast")
    tasks: list[str] | None = option(listing(text(), 1, optional=True), "or several tasks in one process ...")
    heads: list[str] | None = option(listing(text(), 1, optional=True), "... each with the head of heads[i]")


@dataclass(frozen=True)
class BarrierOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.barrier"
    reads_task: ClassVar[bool] = True
    anchor: str = option(PATH, "the model at alpha 0")
    source: str = option(PATH, "the model at alpha 1, usually a matched folder (symfusion-match's output)")
    output: str = option(PATH, "FILE.json: the loss along the path")
    points: int = option(integer(2), "points of the path, alphas 0 .. 1 evenly spaced")
    split: str = option(SPLIT, "the split evaluated")
    examples: int | None = option(integer(1, optional=True), "a seeded subset of N examples of the split; null: all")


@dataclass(frozen=True)
class LayersOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.layers"
    reads_task: ClassVar[bool] = False
    anchor: str = option(PATH, "fine-tuned model of the first task (kept fixed)")
    source: str = option(PATH, "fine-tuned model of the second task (moved onto the anchor)")
    output: str = option(PATH, "FILE.json: the sweep")
    tasks: list[str] = option(listing(text(), 2), "[anchor's task, source's task]")
    examples: int | None = option(integer(1, optional=True), "the first N test examples of each task; null: all")


@dataclass(frozen=True)
class MultimodelOptions:
    stage: ClassVar[str] = "symfusion.pipeline.stages.multimodel"
    reads_task: ClassVar[bool] = False
    models: list[str] = option(listing(text(), 2), "k >= 2 model folders of one architecture; the first is the anchor")
    output: str = option(PATH, "FILE.json: the distances")
    output_models: str | None = option(text(optional=True), "also write the models matched by matching.multi "
                                       "(anchor or barycenter) to DIR/0, DIR/1, ... (for merging)")


@dataclass(frozen=True)
class ReportOptions:
    stage: ClassVar[str] = "symfusion.pipeline.report.artefacts"
    reads_task: ClassVar[bool] = False
    artefact: str = option(PATH, "an entry of conf/experiments.yaml (e.g. table2, fig3_ablation), or report")
    inputs: list[str] = option(listing(text(), 1), "the result files it reads")
    output: str = option(PATH, "a table: X.csv, a figure: X.png, the report: report.md")


# Every stage command (symfusion-<name>, conf/<name>.yaml) and its options.
OPTIONS = {"data": DataOptions, "train": TrainOptions, "match": MatchOptions, "merge": MergeOptions,
           "statistics": StatisticsOptions, "evaluate": EvaluateOptions, "barrier": BarrierOptions,
           "layers": LayersOptions, "multimodel": MultimodelOptions, "report": ReportOptions}


def checks(name: str) -> dict[str, Check]:
    """KEY -> Check of symfusion-<name>'s options (declaration order), then the task's settings if it reads one."""
    declared = OPTIONS[name]
    found = {f.name: f.metadata["check"] for f in dataclasses.fields(declared)}
    return {**found, **TASK_SETTINGS} if declared.reads_task else found


def texts(name: str) -> frozenset[str]:
    """The options of symfusion-<name> whose values are paths or names (read as the text written)."""
    return texts_of(checks(name))


def read(name: str, cfg: DictConfig):
    """symfusion-<name>'s options of a composed configuration, each checked by its declaration (the first problem
    as one SymfusionError line), as its frozen dataclass."""
    declared = OPTIONS[name]
    check_values(cfg, checks(name))
    names = [f.name for f in dataclasses.fields(declared)]
    undeclared = sorted(set(cfg) - GROUPS - set(names))
    if undeclared:       # conf/<name>.yaml and the declaration disagree: the project's mistake, not the user's
        raise TypeError(f"conf/{name}.yaml has options {undeclared} that {declared.__name__} does not declare")
    values = {key: cfg.get(key) for key in names}
    return declared(**{key: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for key, v in values.items()})


def help_lines(name: str, cfg: DictConfig) -> list[str]:
    """--help's option list: KEY=DEFAULT (the composed configuration's value), what it must be, what it means."""
    lines = []
    for f in dataclasses.fields(OPTIONS[name]):
        value = cfg.get(f.name)
        shown = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        check = f.metadata["check"]
        must = check.describe + (", optional" if check.optional else ", required" if shown is None else "")
        lines.append(f"  {f.name}={'null' if shown is None else shown}  ({must}): {f.metadata['help']}")
    return lines


def markdown() -> str:
    """docs/commands.md's option tables: one per command, a row per option (its check and help)."""
    parts = []
    for name, declared in OPTIONS.items():
        rows = [f"#### `symfusion-{name}`", "", "| option | must be | what it is |", "|---|---|---|"]
        for f in dataclasses.fields(declared):
            check = f.metadata["check"]
            must = check.describe + (" (optional)" if check.optional else "")
            rows.append(f"| `{f.name}` | {must} | {f.metadata['help'].replace('|', '&#124;')} |")
        if declared.reads_task:
            rows.append("| `task.*` | the task's settings (`TASK_SETTINGS`) | the task's sizes, batches and "
                        "training settings, over the task's conf/task yaml |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":        # python -m symfusion.pipeline.options: the tables docs/commands.md holds
    print(markdown(), end="")
