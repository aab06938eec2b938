"""Untying a decoder's output embeddings from its input embeddings: the same class and function, lm_head its own copy.

A tied decoder reads its final norm with the embedding table E itself (logits = E diag(g) n(h)). Untied, the
lm_head W starts as a copy of E: the same function, now a standard untied model of the same class
(config.tie_word_embeddings=false, lm_head.weight saved), which transformers and mergekit load as any other. Its
final norm then folds into W alone, so every orthogonal map of the residual stream keeps its function
(stream.py), where the tie allows only signed permutations: matching.untie=true aligns a tied source so
(alignment/loaded.py), and a merge or a path between a tied and an untied model unties the tied one
(pipeline/stages/common.py, load_models).
"""
from __future__ import annotations

import copy

import torch

from symfusion.errors import SymfusionError, note


def is_tied(model: torch.nn.Module) -> bool:
    """Whether the module's output embeddings are its input embeddings (one parameter)."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    weight = getattr(head, "weight", None)
    return weight is not None and weight is getattr(embeddings, "weight", None)


def untied(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a tied `model` whose output embeddings are their own parameter, equal to the input embeddings, and
    whose config says tie_word_embeddings=false (the model itself is left as it is); an untied model as it is."""
    if not is_tied(model):
        return model
    out = copy.deepcopy(model)
    head = out.get_output_embeddings()
    head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=head.weight.requires_grad)
    out.config.tie_word_embeddings = False
    text = getattr(out.config, "get_text_config", None)       # composite configs keep the flag on their text part
    if text is not None and text() is not out.config:
        text().tie_word_embeddings = False
    return out


def untie_pair(source: torch.nn.Module, anchor: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(source, anchor) for matching.untie=true: untie_all of the two."""
    source, anchor = untie_all([source, anchor], ["source", "anchor"])
    return source, anchor


def untie_all(models: list[torch.nn.Module], roles: list[str]) -> list[torch.nn.Module]:
    """The models for matching.untie=true: each tied one untied (a copy); one error line for a model without output
    embeddings (nothing to untie, named by its role), one note where none is tied (matched as they are, as without
    the option)."""
    for role, model in zip(roles, models):
        if getattr(model.get_output_embeddings(), "weight", None) is None:
            raise SymfusionError(f"matching.untie=true unties a decoder's lm_head from its input embeddings: the {role} "
                                 f"({type(model).__name__}) has no lm_head; match it without matching.untie")
    if not any(is_tied(model) for model in models):
        note("note: matching.untie=true: no model ties its lm_head to its input embeddings, so there is nothing "
             "to untie; matched as they are (the residual map is any orthogonal map already)")
        return list(models)
    return [untied(model) for model in models]
