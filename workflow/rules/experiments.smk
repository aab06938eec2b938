# The experiment registry (conf/experiments.yaml): which tables and figures a profile builds (the report's
# targets and the default target, report.smk) and the input files of each, built from its declared inputs by
# the generic builders of INPUT_KINDS. Checked when the workflow is read: its schema, then every track,
# input kind, matching (with its label), fusion method, paper table and writer it names.

EXPERIMENTS_FILE = "conf/experiments.yaml"
REGISTRY = checked(read_yaml(EXPERIMENTS_FILE, "experiment registry"), "experiments.schema.yaml",
                   EXPERIMENTS_FILE)
WRITERS_DIR = "src/symfusion/pipeline/report"     # a registry entry's writer is a module there


def spec_matchings(track, spec):
    """The matchings an input declares (left out: none and the profile's matching of the track)."""
    return [TRACKS[track]["matching"] if m == "profile" else m for m in spec.get("matchings", ["none", "profile"])]


def spec_methods(track, spec):
    """The track's fusion methods, in its order, limited to those the input declares."""
    return [m for m in TRACKS[track]["methods"] if "methods" not in spec or m in spec["methods"]]


def spec_pairs(track, spec):
    pairs = TRACKS[track]["pairs"]
    return pairs[:1] if spec.get("pairs") == "first" else pairs


def spec_models(track, spec, default):
    """all: every end model; merged: those the merges fuse; first_pair: the first pair's anchor and source."""
    which = spec.get("models", default)
    if which == "first_pair":
        source, anchor = TRACKS[track]["pairs"][0]
        return [anchor, source]
    return TRACKS[track]["models" if which == "all" else "merged"]


# input kind -> (track, group, its spec) -> files, in the order the writers list them
INPUT_KINDS = {
    "end_models": lambda track, group, spec: [model_dir(track, group, n) for n in spec_models(track, spec, "all")],
    "end_evals": lambda track, group, spec: [end_eval(track, group, n) for n in spec_models(track, spec, "merged")],
    "matched": lambda track, group, spec: [matched_dir(track, group, s, a, m) for s, a in spec_pairs(track, spec)
                                           for m in spec_matchings(track, spec)],
    "merged_evals": lambda track, group, spec: [
        track_result(track, "merged_evals", f, group=group, source=s, anchor=a, matching=m)
        for s, a in spec_pairs(track, spec) for m in spec_matchings(track, spec) for f in spec_methods(track, spec)],
    "group_evals": lambda track, group, spec: [track_result(track, "group_evals", f, group=group, matching=m)
                                               for m in spec_matchings(track, spec) for f in spec_methods(track, spec)],
    "barriers": lambda track, group, spec: [track_result(track, "barriers", group=group, source=s, anchor=a, matching=m)
                                            for s, a in spec_pairs(track, spec) for m in spec_matchings(track, spec)],
    "mergekit_evals": lambda track, group, spec: [
        track_result(track, "mergekit_evals", group=group, source=s, anchor=a, matching=m)
        for s, a in spec_pairs(track, spec) for m in spec_matchings(track, spec)],
    "task_data": lambda track, group, spec: [data_file(t) for t in track_tasks(track, group)],
    "layer_sweeps": lambda track, group, spec: [track_result(track, "layer_sweeps", group=group)],
    "multimodel": lambda track, group, spec: [track_result(track, "multimodel", group=group)],
    "barycenter_evals": lambda track, group, spec: [track_result(track, "barycenter_evals", group=group)],
}
TRACK_KINDS = ("end_models", "end_evals", "matched", "task_data")   # every track has these (rules train,
                                                                    # evaluate_end_model, match, data)


def check_registry():
    """What the schema cannot see: every name an entry uses must exist, every matching it shows have a label."""
    for name, entry in REGISTRY.items():
        where = f"{EXPERIMENTS_FILE}: {name}"
        if not os.path.isfile(f"{WRITERS_DIR}/{entry['writer']}.py"):
            fail(f"{where}: writer {entry['writer']!r} is no module {WRITERS_DIR}/{entry['writer']}.py")
        if entry["paper"] is not None and not os.path.isfile(f"conf/paper/{entry['paper']}.csv"):
            fail(f"{where}: paper {entry['paper']!r} is no conf/paper/{entry['paper']}.csv")
        shown = set()
        for track, kinds in {entry["track"]: {}, **entry["inputs"]}.items():
            if track not in TRACKS:
                fail(f"{where}: unknown track {track!r}; tracks are {', '.join(TRACKS)}")
            for kind, spec in kinds.items():
                if kind not in TRACK_KINDS and kind not in TRACK_RULES[track]:
                    fail(f"{where}: the {track} track has no {kind}; it has "
                         + ", ".join(list(TRACK_KINDS) + list(TRACK_RULES[track])))
                for matching in spec.get("matchings", []):
                    if matching == "profile":
                        if TRACKS[track]["matching"] is None:
                            fail(f"{where}: the {track} track has no matching of the profile; name the matchings")
                        continue
                    shown.add(matching)
                    if not os.path.isfile(conf_file("matching", matching)):
                        fail(f"{where}: matching {matching!r} is no {conf_file('matching', matching)}; choose one of "
                             + ", ".join(conf_options("matching")))
                    if not str((read_yaml(conf_file("matching", matching), "matching") or {}).get("label") or "").strip():
                        fail(f"{where}: {conf_file('matching', matching)} has no label: (its name in tables and figures)")
                for method in spec.get("methods", []):
                    if not os.path.isfile(conf_file("fusion", method)):
                        fail(f"{where}: fusion method {method!r} is no {conf_file('fusion', method)}")
        for method in entry.get("methods", []):
            if not os.path.isfile(conf_file("fusion", method)):
                fail(f"{where}: methods: {method!r} is no {conf_file('fusion', method)}")
        named = list(entry.get("labels", {})) + list(entry.get("paper_columns", {})) + list(entry.get("effect", {}).values())
        for matching in named:
            if matching not in shown:
                fail(f"{where}: names matching {matching!r}, which none of its inputs declares")
    for name in SETTINGS["experiments_off"]:
        if name not in REGISTRY:
            fail(f"{PROFILE_FILE}: experiments_off: {name!r} is no entry of {EXPERIMENTS_FILE}; entries are "
                 + ", ".join(REGISTRY))


check_registry()

# The experiments this profile builds: not switched off, and of a track the profile has (registry order); those
# marked on_demand only when asked for by name (their target), never by the default target (report.md).
EXPERIMENTS = {name: entry for name, entry in REGISTRY.items()
               if name not in SETTINGS["experiments_off"] and TRACKS[entry["track"]]["groups"]}
DEFAULT_EXPERIMENTS = [name for name, entry in EXPERIMENTS.items() if not entry.get("on_demand")]


def merged_matchings(track, kind):
    """Every matching under which the built experiments need the track's merges of `kind` (merged_evals: the
    pairwise merges, group_evals: the group merge), in the order first declared."""
    found = [m for entry in EXPERIMENTS.values() for t, kinds in entry["inputs"].items() if t == track
             for k, spec in kinds.items() if k == kind for m in spec_matchings(track, spec)]
    return list(dict.fromkeys(found))


def experiment_inputs(name):
    """The input files of an experiment: per declared track, per group of it, each declared kind of input."""
    return [path for track, kinds in REGISTRY[name]["inputs"].items() for group in TRACKS[track]["groups"]
            for kind, spec in kinds.items() for path in INPUT_KINDS[kind](track, group, spec)]


def artefact_file(name):
    """Where an experiment's artefact lies: a table's CSV in results/<profile>/, a figure's PNG in figures/<profile>/."""
    return f"{RESULTS}/{name}.csv" if REGISTRY[name]["kind"] == "table" else f"{FIGURES}/{name}.png"


TABLE_NAMES = [n for n, entry in EXPERIMENTS.items() if entry["kind"] == "table"]
FIGURE_NAMES = [n for n, entry in EXPERIMENTS.items() if entry["kind"] == "figure"]
