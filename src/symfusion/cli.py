"""The Hydra entry points of the stages: symfusion-data, -train, -match, -merge, -evaluate, -barrier, -report."""
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


@report_errors
def match_command(cfg: DictConfig) -> None:
    """symfusion-match source=DIR anchor=DIR output=DIR matching=NAME [layers=[..] | last_layers=K]"""
    from symfusion.match import run_match
    from symfusion.matching import MatchConfig, matching_config

    name = cfg.matching.name
    matching = MatchConfig(attention=cfg.matching.attention, rescale=bool(cfg.matching.rescale), ffn=cfg.matching.ffn)
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
    manifest = data_manifest(cfg.task)
    manifest["provenance"] = provenance(OmegaConf.to_container(cfg, resolve=True))
    write_json_atomic(manifest, cfg.output)
    sizes = ", ".join(f"{k} {v['size']}" for k, v in manifest["splits"].items())
    print(f"data {cfg.task.name}: {sizes} -> {cfg.output}")


@report_errors
def train_command(cfg: DictConfig) -> None:
    """symfusion-train task=NAME model=NAME seed=S output=DIR [threads=N]"""
    import torch

    from symfusion.tasks import task_splits
    from symfusion.train import train_image_classifier

    if not cfg.output:
        raise SymfusionError("output=DIR is required")
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    train = cfg.task.train
    report = train_image_classifier(
        output_dir=cfg.output, splits=task_splits(cfg.task), model_cfg=_container(cfg.model), seed=int(cfg.seed),
        epochs=int(train.epochs), batch_size=int(train.batch_size), lr=float(train.lr),
        weight_decay=float(train.weight_decay), warmup_ratio=float(train.warmup_ratio),
        eval_batch_size=int(cfg.task.eval_batch_size), augmentation=bool(train.get("augment", False)),
        resolved_config=OmegaConf.to_container(cfg, resolve=True),
    )
    print(f"trained {cfg.model.name} on {cfg.task.name} (seed {cfg.seed}): validation accuracy "
          f"{report['validation_accuracy']:.4f} (epoch {report['best_epoch']}), {report['seconds']:.0f}s -> {cfg.output}")


@report_errors
def merge_command(cfg: DictConfig) -> None:
    """symfusion-merge task=NAME fusion=METHOD models=[ANCHOR,SOURCE,...] output=DIR"""
    from symfusion.merge import run_merge

    report = run_merge(_container(cfg.models), _container(cfg.fusion), cfg.task, cfg.output,
                       OmegaConf.to_container(cfg, resolve=True))
    print(f"merged {len(report['models'])} models with {report['method']} "
          f"(matching {report['matching']}) in {report['seconds']:.2f}s -> {cfg.output}")


@report_errors
def evaluate_command(cfg: DictConfig) -> None:
    """symfusion-evaluate task=NAME model_dir=DIR output=FILE.json [split=test]"""
    from symfusion.evaluate import run_evaluate

    report = run_evaluate(cfg.model_dir, cfg.task, cfg.output, cfg.split, OmegaConf.to_container(cfg, resolve=True))
    print(f"evaluated {cfg.model_dir} on {cfg.task.name}/{cfg.split}: {report['metrics']} -> {cfg.output}")


@report_errors
def barrier_command(cfg: DictConfig) -> None:
    """symfusion-barrier task=NAME anchor=DIR source=DIR output=FILE.json [points=11]"""
    from symfusion.barrier import run_barrier

    report = run_barrier(cfg.anchor, cfg.source, cfg.task, cfg.output, int(cfg.points), cfg.split,
                         OmegaConf.to_container(cfg, resolve=True))
    print(f"barrier {report['matching']}: {report['barrier']:.4f} -> {cfg.output}")


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
report_main = hydra_entry("report", report_command)

if __name__ == "__main__":
    match_main()
