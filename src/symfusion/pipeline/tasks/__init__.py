"""Task objects: the one definition of task kinds, and the task configs of conf/task/ sized by a profile.

    task = make_task(load_task("rt_d0"), profile)      # or make_task(cfg.task, cfg.profile) in a stage
    task.splits(); task.statistic_batches(8, model_dir); task.evaluate(model, "test", model_dir)
    task.manifest(); task.train(output, model_cfg, seed); task.copy_head(model, head_dir)

A new task kind is one Task subclass listing its `kinds`, added to TASK_CLASSES.
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from symfusion.pipeline.config import load_group, profile_sources
from symfusion.errors import SymfusionError
from symfusion.pipeline.tasks.base import Task
from symfusion.pipeline.tasks.causal_lm import CausalLMTask
from symfusion.pipeline.tasks.image import ImageTask
from symfusion.pipeline.tasks.text import TextTask

TASK_CLASSES: tuple[type[Task], ...] = (ImageTask, TextTask, CausalLMTask)
KIND_CLASSES: dict[str, type[Task]] = {kind: cls for cls in TASK_CLASSES for kind in cls.kinds}
TASK_KINDS = tuple(KIND_CLASSES)


def load_task(name: str) -> DictConfig:
    """conf/task/<name>.yaml with its `defaults` bases merged in (for stages that use several tasks)."""
    return load_group("task", name)


def sized_task(task: DictConfig, profile=None) -> DictConfig:
    """A task as the profile runs it: where its data come from (profile.sources: the stand-ins' manifest of the
    rehearsal profile), and its size: the task_patch of the profile section its kind reads (Task.profile_section:
    language, vision, decoder), and for text tasks also language.source_patch[source]. The smoke profile shrinks
    every text task this way."""
    profile = profile or {}
    patches = [profile_sources(profile).get("tasks", {}).get(task.get("name")) or {}]
    cls = KIND_CLASSES.get(task.get("kind"), ImageTask)
    section = profile.get(cls.profile_section) or {}
    patches += [section.get("task_patch") or {}]
    if cls is TextTask:
        patches += [(section.get("source_patch") or {}).get(task.source) or {}]
    patches = [p for p in patches if p]
    # patches may add keys (a local `dataset` option): merge into a plain copy, not Hydra's struct config
    return OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(task, resolve=True)), *patches) if patches else task


def profile_model(model: DictConfig, profile=None) -> DictConfig:
    """A model config as the profile runs it: its base model from profile.sources when the profile has one."""
    patch = profile_sources(profile or {}).get("models", {}).get(model.get("name"))
    return OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(model, resolve=True)), patch) if patch else model


def make_task(task: DictConfig | str, profile=None) -> Task:
    """The task object of a task config (or of conf/task/<name>.yaml), sized by `profile`."""
    cfg = load_task(task) if isinstance(task, str) else task
    kind = cfg.get("kind")
    if kind not in KIND_CLASSES:
        raise SymfusionError(f"task {cfg.get('name')}: kind {kind!r} is not one of {', '.join(TASK_KINDS)}")
    cfg = sized_task(cfg, profile)
    return KIND_CLASSES[kind](cfg)


__all__ = ["Task", "ImageTask", "TextTask", "CausalLMTask", "TASK_KINDS", "load_task", "sized_task", "make_task",
           "profile_model"]
