"""match_models(): the one entry point of matching: the block solves, or with matching.residual the whole group."""
from __future__ import annotations

from typing import Mapping

import torch

from symfusion.arch import ModelLayout, check_same_layout
from symfusion.errors import SymfusionError
from symfusion.matching.compose import MatchConfig, MatchResult, match_blocks, matching_config
from symfusion.matching.whole import MatchData, match_whole


def match_models(
    source: Mapping[str, torch.Tensor],
    anchor: Mapping[str, torch.Tensor],
    layout: ModelLayout,
    config: MatchConfig | str = "rotation",
    layers=None,
    last_layers: int | None = None,
    anchor_layout: ModelLayout | None = None,
    data: MatchData | None = None,
    tied: bool | None = None,
) -> MatchResult:
    """Find the transform moving `source` onto `anchor` (both state dicts of one layout).

    config: a MatchConfig or the name of a matching preset (presets/matching/). With config.residual (full_symmetry) the
    residual stream is matched too (matching/whole.py): then every layer is matched, `data` feeds
    residual_solve=activations and refine=loss, and `tied` says whether an lm_head is tied to the embeddings
    (None: read from the state, where a tied lm_head shares the embeddings' storage or is absent); config.untie
    needs tied=False (states already untied: align() unties modules and folders)."""
    config = matching_config(config) if isinstance(config, str) else config
    if anchor_layout is not None:
        check_same_layout(layout, anchor_layout)
    if config.residual == "none":
        return match_blocks(source, anchor, layout, config, layers=layers, last_layers=last_layers)
    if layers is not None or last_layers is not None:
        raise SymfusionError(f"matching.residual={config.residual} moves the residual stream of every layer: it matches "
                             "the whole model (drop layers= / last_layers=, or use a variant without matching.residual)")
    if config.untie and tied is not False:        # untying makes new modules: align() does it (io/untie.py)
        raise SymfusionError("matching.untie=true unties models, not state dicts: align() the modules or folders, or "
                             "untie the states first (lm_head a copy of the embeddings) and pass tied=False")
    return match_whole(source, anchor, layout, config, data=data, tied=tied)


def match_many(sources: list, anchor: Mapping, layout: ModelLayout, config="rotation", **kwargs) -> list[MatchResult]:
    """k > 2 models: match every source onto the one anchor independently."""
    return [match_models(s, anchor, layout, config, **kwargs) for s in sources]
