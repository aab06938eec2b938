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
    """The file that a track's rule for `kind` (TRACK_RULES) writes for these wildcards (and this method)."""
    outputs = getattr(rules, TRACK_RULES[track][kind]).output
    return outputs[TRACKS[track].methods.index(method) if method else 0].format(track=track, **wildcards)
