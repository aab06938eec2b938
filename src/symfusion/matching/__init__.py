"""Parameter matching: rotation (Procrustes), rescaling (quartic), permutation (Hungarian), heads, the residual stream, baselines."""
from symfusion.matching.compose import MatchResult
from symfusion.matching.config import MatchConfig, matching_config
from symfusion.matching.models import match_many, match_models
from symfusion.matching.whole import MatchData

__all__ = ["MatchConfig", "MatchData", "MatchResult", "match_many", "match_models", "matching_config"]
