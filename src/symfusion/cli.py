"""The Hydra entry points: symfusion-match (more stages plug in here as they land)."""
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


@hydra.main(version_base=None, config_path=CONF_DIR, config_name="match")
def match_main(cfg: DictConfig) -> None:
    match_command(cfg)


if __name__ == "__main__":
    match_main()
