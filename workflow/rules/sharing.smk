# Shared statistics: the Fisher / Gram statistics of an end model that several merges fuse unmoved are computed once
# (rule statistics, merge.smk) and read by each of those merges (profile key share_statistics).


def unmoved(models, matching):
    """The models a merge fuses as they are (its anchor first): all of them when unmatched, else the anchor."""
    return list(models) if matching == "none" else list(models[:1])


def merges_of(track):
    """(models, matching) of every merge a track runs: each pair under each matching the registry's pairwise
    merges need, and the track's group under each matching its group merges need (experiments.smk)."""
    pairs = [([a, s], m) for s, a in TRACKS[track].pairs for m in merged_matchings(track, "merged_evals", (s, a))]
    group = TRACKS[track].group
    return pairs + [(group, m) for m in merged_matchings(track, "group_evals") if group]


def shares_statistics(track, name):
    """Whether several merges fuse this end model unmoved (counted over merges_of with the rules' own
    `unmoved`): then its Fisher / Gram statistics are computed once, by the statistics rule."""
    return sum(name in unmoved(models, m) for models, m in merges_of(track)) > 1


def unmoved_statistics(track, group, names):
    """The statistics files of the models among `names` (fused unmoved) that share theirs (none when the
    profile sets share_statistics: false)."""
    if not SETTINGS["share_statistics"]:
        return []
    return [statistics_file(track, group, n) for n in names if shares_statistics(track, n)]
