# Paths: other rules' output patterns (rules.<name>.output) formatted, so that no path is typed twice.


def data_file(task):
    return rules.data.output[0].format(task=task)


def model_dir(track, group, name):
    return rules.train.output[0].format(track=track, group=group, name=name)


def matched_dir(track, group, source, anchor, matching):
    return rules.match.output[0].format(track=track, group=group, source=source, anchor=anchor, matching=matching)


def source_dir(track, group, source, anchor, matching):
    """The source model as merged: the end model itself when unmatched, else its matched copy."""
    if matching == "none":
        return model_dir(track, group, source)
    return matched_dir(track, group, source, anchor, matching)


def statistics_file(track, group, name):
    return rules.statistics.output[0].format(track=track, group=group, name=name)


def end_eval(track, group, name):
    return rules.evaluate_end_model.output[0].format(track=track, group=group, name=name)


def track_result(track, kind, method=None, **wildcards):
    """The file written for these wildcards (and this method) by the track's rule for `kind`, which TRACK_RULES
    names (for a merge of a pair after the first, merge_rule does)."""
    if kind == "merged_evals" and "source" in wildcards:
        pair = (wildcards["source"], wildcards["anchor"])
        outputs, methods = getattr(rules, merge_rule(track, pair)).output, TRACKS_PY.pair_methods(TRACKS[track], pair)
    else:
        outputs, methods = getattr(rules, TRACK_RULES[track][kind]).output, TRACKS[track].methods
    return outputs[methods.index(method) if method else 0].format(track=track, **wildcards)
