# Merging's helpers (merge.smk's rules read them): each pair's statistic tasks and scoring heads, which rule
# merges a pair of a track, and that rule's wildcard constraints and outputs.


def merge_statistic_tasks(w):
    """Each model's own task, anchor first (the data of its Fisher / Gram statistics), or null: one shared task."""
    track = TRACKS[w.track]
    return hydra_list([track.task(w.group, w.anchor), track.task(w.group, w.source)]) \
        if track.statistics_per_model else "null"


def merge_heads(w):
    """The model folders whose task heads score the pair's tasks (pairwise text merges: each task's own fine-tune),
    or none: the merged model's own head."""
    return [model_dir(w.track, w.group, name) for name in (w.anchor, w.source)] if TRACKS[w.track].heads_per_task else []


# merge rule -> the tracks it merges (tracks that share a rule share their fusion methods, one output per method)
MERGE_RULES = {"merge_evaluate": ("vision",), "lang_merge_pair": ("lang",), "decoder_merge": DECODER_TRACKS}


def limited(tracks):
    """Whether the pairs after the first merge by fewer methods (a track's more_pairs in the profile)."""
    return any(TRACKS[t].more_pairs and TRACKS[t].more_pairs["methods"] != TRACKS[t].methods for t in tracks)


def first_sources(tracks):
    """A regex of the first pair's source in each of these tracks (each track's other pairs have other sources)."""
    return "|".join(re.escape(TRACKS[t].pairs[0][0]) for t in tracks if TRACKS[t].pairs) or "(?!)"


def merge_constraints(tracks, more=False):
    """The wildcard constraints of a merge rule: its tracks; when the pairs after the first merge by fewer methods,
    the first pair's source (the rule itself) or any other (its `_more` rule)."""
    constraints = {"track": "|".join(tracks)}
    if limited(tracks):
        first = first_sources(tracks)
        constraints["source"] = f"(?!(?:{first})-onto-)[A-Za-z0-9_]+" if more else first
    return constraints


def merge_outputs(tracks, more=False):
    """A merge rule's outputs: one evaluation per fusion method of its tracks (of the first pair, or the more_pairs
    methods of the others)."""
    track = TRACKS[tracks[0]]
    methods = track.more_pairs["methods"] if more else track.methods
    return [f"{RESULTS}/{{track}}/{{group}}/eval/{{source}}-onto-{{anchor}}/{{matching}}/{method}.json"
            for method in methods]


def merge_rule(track, pair):
    """The rule that merges a pair of a track (for the pairs after the first, its `_more` rule when they merge by
    fewer methods)."""
    name = next(rule for rule, tracks in MERGE_RULES.items() if track in tracks)
    return f"{name}_more" if limited(MERGE_RULES[name]) and tuple(pair) != TRACKS[track].pairs[0] else name
