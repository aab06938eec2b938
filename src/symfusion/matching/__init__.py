"""Parameter matching: rotation (Procrustes), rescaling (quartic), permutation (Hungarian), baselines."""
from symfusion.matching.compose import (
    MatchConfig,
    MatchResult,
    match_many,
    match_models,
    matching_config,
)

__all__ = ["MatchConfig", "MatchResult", "match_many", "match_models", "matching_config"]
