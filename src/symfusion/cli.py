"""The Hydra entry points of the stages: symfusion-data, -train, -match, -merge, -evaluate, -barrier, -layers, -multimodel, -report."""
from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from symfusion.errors import SymfusionError


def conf_dir() -> str:
    """The project's conf/ folder: beside the package in a checkout (editable install)."""
    here = Path(__file__).resolve()
    for candidate in (here.parent / "conf", here.parents[2] / "conf"):
        if (candidate / "match.yaml").is_file():
            return str(candidate)
    raise SystemExit("error: cannot find symfusion's conf/ folder; install the checkout with `pip install -e .`")


CONF_DIR = conf_dir()


def report_errors(command):
    """Run a stage; bad input ends with one line on stderr and exit code 2, not a traceback."""
    def wrapper(cfg: DictConfig):
        try:
            return command(cfg)
        except SymfusionError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
    wrapper.__name__ = command.__name__
    wrapper.__doc__ = command.__doc__
    return wrapper


def _container(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _task(cfg: DictConfig, name: str | None = None):
    """The stage's task (cfg.task, or conf/task/<name>.yaml) sized by the profile (smoke shrinks text tasks)."""
    from symfusion.tasks import load_task, sized_task

    return sized_task(load_task(name) if name else cfg.task, cfg.get("profile"))


@report_errors
def match_command(cfg: DictConfig) -> None:
    """symfusion-match source=DIR anchor=DIR output=DIR matching=NAME [layers=[..] | last_layers=K]"""
    from symfusion.match import run_match
    from symfusion.matching import MatchConfig, matching_config

    name = cfg.matching.name
    matching = MatchConfig(attention=cfg.matching.attention, rescale=bool(cfg.matching.rescale), ffn=cfg.matching.ffn,
                           joint=bool(cfg.matching.get("joint", False)))
    if matching_config(name) != matching:
        print(f"note: matching={name} overridden to {matching}", file=sys.stderr)
    report = run_match(
        source=cfg.source, anchor=cfg.anchor, output=cfg.output, matching=matching, matching_name=name,
        layers=_container(cfg.layers), last_layers=cfg.last_layers, seed=cfg.seed,
        probe_batch=cfg.probe.batch_size, probe_len=cfg.probe.seq_len,
        max_relative_output_change=cfg.max_relative_output_change,
        resolved_config=OmegaConf.to_container(cfg, resolve=True),
    )
    print(
        f"matched {report['source']} onto {report['anchor']} ({name}): distance "
        f"{report['distance_before']:.4f} -> {report['distance_after']:.4f}, "
        f"max output change {report['max_output_change']:.2e}, {report['seconds']:.2f}s -> {report['output']}"
    )


@report_errors
def data_command(cfg: DictConfig) -> None:
    """symfusion-data task=NAME output=FILE.json"""
    from symfusion.modelio import write_json_atomic
    from symfusion.provenance import provenance
    from symfusion.tasks import data_manifest

    if not cfg.output:
        raise SymfusionError("output=FILE.json is required")
    manifest = data_manifest(_task(cfg))
    manifest["provenance"] = provenance(OmegaConf.to_container(cfg, resolve=True))
    write_json_atomic(manifest, cfg.output)
    sizes = ", ".join(f"{k} {v['size']}" for k, v in manifest["splits"].items())
    print(f"data {cfg.task.name}: {sizes} -> {cfg.output}")


@report_errors
def train_command(cfg: DictConfig) -> None:
    """symfusion-train task=NAME model=NAME seed=S output=DIR [threads=N]: a ViT from scratch or a text fine-tune"""
    import torch

    from symfusion.tasks import is_text, task_splits

    if not cfg.output:
        raise SymfusionError("output=DIR is required")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    task = _task(cfg)
    train, resolved = task.train, OmegaConf.to_container(cfg, resolve=True)
    common = dict(seed=int(cfg.seed), epochs=int(train.epochs), batch_size=int(train.batch_size), lr=float(train.lr),
                  weight_decay=float(train.weight_decay), warmup_ratio=float(train.warmup_ratio),
                  eval_batch_size=int(task.eval_batch_size), resolved_config=resolved)
    if is_text(task):
        from symfusion.basemodels import resolve_base_model
        from symfusion.train_text import finetune_text_model

        if not cfg.model.get("base_model"):
            raise SymfusionError(f"model={cfg.model.name} is not a pretrained encoder; text tasks need e.g. model=minilm")
        report = finetune_text_model(cfg.output, str(resolve_base_model(cfg.model.base_model)), task_splits(task),
                                     max_length=int(task.max_length), metric=task.metric, **common)
        score = report["validation_score"]
    else:
        from symfusion.train import train_image_classifier

        if cfg.model.get("base_model"):
            raise SymfusionError(f"model={cfg.model.name} is a text encoder; image tasks need a ViT config (vit_*)")
        report = train_image_classifier(cfg.output, task_splits(task), _container(cfg.model),
                                        augmentation=bool(train.get("augment", False)), **common)
        score = report["validation_accuracy"]
    print(f"trained {cfg.model.name} on {task.name} (seed {cfg.seed}): validation score {score:.4f} "
          f"(epoch {report['best_epoch']}), {report['seconds']:.0f}s -> {cfg.output}")


@report_errors
def merge_command(cfg: DictConfig) -> None:
    """symfusion-merge task=NAME fusion=METHOD models=[ANCHOR,SOURCE,...] output=DIR [tasks=[T_ANCHOR,T_SOURCE,...]]
    or, several methods merged and evaluated in one process (no model folder written):
    symfusion-merge task=NAME models=[..] methods=[M1,M2] eval_dir=DIR [eval_tasks=[..] eval_heads=[..]]"""
    tasks = [_task(cfg, name) for name in _container(cfg.tasks)] if cfg.get("tasks") else None
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if cfg.get("methods"):
        return merge_evaluate_command(cfg, tasks, resolved)
    from symfusion.merge import run_merge

    report = run_merge(_container(cfg.models), _container(cfg.fusion), _task(cfg), cfg.output, resolved, tasks=tasks)
    print(f"merged {len(report['models'])} models with {report['method']} "
          f"(matching {report['matching']}) in {report['seconds']:.2f}s -> {cfg.output}")


def merge_evaluate_command(cfg: DictConfig, tasks: list | None, resolved: dict) -> None:
    from symfusion.merge import fusion_config, run_merge_evaluate

    if cfg.get("output"):
        raise SymfusionError("give output=DIR (one method, model folder) or methods=[..] eval_dir=DIR, not both")
    options = _container(cfg.get("method_options")) or {}
    fusions = [fusion_config(name, CONF_DIR, options.get(name)) for name in _container(cfg.methods)]
    eval_tasks = [_task(cfg, name) for name in _container(cfg.eval_tasks)] if cfg.get("eval_tasks") else [_task(cfg)]
    heads = _container(cfg.get("eval_heads"))
    reports = run_merge_evaluate(_container(cfg.models), fusions, _task(cfg), cfg.eval_dir, eval_tasks, heads,
                                 resolved, tasks=tasks)
    for report in reports:
        summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
        print(f"merged with {report['method']} (matching {report['matching']}) in {report['merge_seconds']:.2f}s, "
              f"evaluated: {summary} -> {cfg.eval_dir}/{report['method']}.json")


@report_errors
def evaluate_command(cfg: DictConfig) -> None:
    """symfusion-evaluate task=NAME model_dir=DIR output=FILE.json [split=test] [head_from=DIR]
    or, several tasks in one process: tasks=[T1,T2] heads=[DIR1,DIR2] (each task with its model's head)"""
    from symfusion.evaluate import run_evaluate

    resolved = OmegaConf.to_container(cfg, resolve=True)
    if cfg.get("tasks"):
        tasks = [_task(cfg, name) for name in _container(cfg.tasks)]
        heads = _container(cfg.get("heads")) or [None] * len(tasks)
    else:
        tasks, heads = [_task(cfg)], [cfg.get("head_from")]
    report = run_evaluate(cfg.model_dir, tasks, cfg.output, cfg.split, resolved, heads=heads)
    summary = "; ".join(f"{r['task']}: {r['metrics']}" for r in report["results"])
    print(f"evaluated {cfg.model_dir}/{cfg.split}: {summary} -> {cfg.output}")


@report_errors
def barrier_command(cfg: DictConfig) -> None:
    """symfusion-barrier task=NAME anchor=DIR source=DIR output=FILE.json [points=11]"""
    from symfusion.barrier import run_barrier

    report = run_barrier(cfg.anchor, cfg.source, cfg.task, cfg.output, int(cfg.points), cfg.split,
                         OmegaConf.to_container(cfg, resolve=True), examples=cfg.get("examples"))
    print(f"barrier {report['matching']}: {report['barrier']:.4f} -> {cfg.output}")


@report_errors
def layers_command(cfg: DictConfig) -> None:
    """symfusion-layers anchor=DIR source=DIR tasks=[T_ANCHOR,T_SOURCE] output=FILE.json [matching=NAME] [examples=N]"""
    from symfusion.layers import run_layer_sweep

    if not cfg.get("tasks"):
        raise SymfusionError("tasks=[ANCHOR_TASK,SOURCE_TASK] is required")
    tasks = [_task(cfg, name) for name in _container(cfg.tasks)]
    report = run_layer_sweep(cfg.anchor, cfg.source, tasks, cfg.matching.name, cfg.output,
                             int(cfg.examples) if cfg.examples else None, OmegaConf.to_container(cfg, resolve=True))
    print(f"layer sweep: {len(report['rows'])} evaluations in {report['seconds']:.0f}s -> {cfg.output}")


@report_errors
def multimodel_command(cfg: DictConfig) -> None:
    """symfusion-multimodel models=[ANCHOR,M1,...] output=FILE.json [matching=NAME] [output_models=DIR matching.multi=anchor|barycenter]"""
    from symfusion.multimodel import run_multimodel

    report = run_multimodel(_container(cfg.models) or [], cfg.output, cfg.matching.name,
                            OmegaConf.to_container(cfg, resolve=True), output_models_dir=cfg.output_models,
                            multi=cfg.matching.get("multi", "anchor"))
    anchor, bary = report["methods"]["anchor"], report["methods"]["barycenter"]
    print(f"{report['k']} models: sum of pairwise distances {report['sum_pairwise_distance_before']:.3f} -> "
          f"{anchor['sum_pairwise_distance']:.3f} (anchor) / {bary['sum_pairwise_distance']:.3f} (barycenter) "
          f"-> {cfg.output}")


@report_errors
def report_command(cfg: DictConfig) -> None:
    """symfusion-report artefact=NAME inputs=[FILES] output=PATH"""
    from symfusion.report.artefacts import run_report

    rows = run_report(cfg.artefact, _container(cfg.inputs) or [], cfg.output)
    print(f"{cfg.artefact}: {len(rows)} rows -> {cfg.output}")


def hydra_entry(config_name: str, command):
    """A console-script main() running `command` under Hydra with conf/<config_name>.yaml."""
    @hydra.main(version_base=None, config_path=CONF_DIR, config_name=config_name)
    def main(cfg: DictConfig) -> None:
        command(cfg)
    return main


data_main = hydra_entry("data", data_command)
train_main = hydra_entry("train", train_command)
match_main = hydra_entry("match", match_command)
merge_main = hydra_entry("merge", merge_command)
evaluate_main = hydra_entry("evaluate", evaluate_command)
barrier_main = hydra_entry("barrier", barrier_command)
layers_main = hydra_entry("layers", layers_command)
multimodel_main = hydra_entry("multimodel", multimodel_command)
report_main = hydra_entry("report", report_command)

if __name__ == "__main__":
    match_main()
