# The experiment registry (conf/experiments.yaml): which tables and figures a profile builds (the report's
# targets and the default target, report.smk) and the input files of each, built from its declared inputs by
# the generic builders of INPUT_KINDS. Checked when the workflow is read: its schema, then every track,
# input kind, matching (with its label), fusion method, paper table and writer it names.

EXPERIMENTS_FILE = "conf/experiments.yaml"
REGISTRY = checked(read_yaml(EXPERIMENTS_FILE, "experiment registry"), "experiments.schema.yaml",
                   EXPERIMENTS_FILE)
WRITERS_DIR = "src/symfusion/pipeline/report"     # a registry entry's writer is a module there


spec_matchings, spec_methods, spec_pairs = TRACKS_PY.spec_matchings, TRACKS_PY.spec_methods, TRACKS_PY.spec_pairs
spec_models = TRACKS_PY.spec_models
pair_matchings, pair_methods = TRACKS_PY.pair_matchings, TRACKS_PY.pair_methods


def each_spec(builder):
    """An input kind's builder on the track's Track."""
    return lambda track, group, spec: builder(TRACKS[track], group, spec)


# input kind -> (track, group, its spec) -> files, in the order the writers list them
INPUT_KINDS = {
    "end_models": each_spec(lambda t, group, spec: [model_dir(t.name, group, n) for n in spec_models(t, spec, "all")]),
    "end_evals": each_spec(lambda t, group, spec: [end_eval(t.name, group, n) for n in spec_models(t, spec, "merged")]),
    "matched": each_spec(lambda t, group, spec: [matched_dir(t.name, group, s, a, m) for s, a in spec_pairs(t, spec)
                                                 for m in spec_matchings(t, spec)]),
    "merged_evals": each_spec(lambda t, group, spec: [
        track_result(t.name, "merged_evals", f, group=group, source=s, anchor=a, matching=m)
        for (s, a), m in pair_matchings(t, spec, "merged_evals") for f in spec_methods(t, spec)
        if f in pair_methods(t, (s, a))]),
    "group_evals": each_spec(lambda t, group, spec: [track_result(t.name, "group_evals", f, group=group, matching=m)
                                                     for m in spec_matchings(t, spec) for f in spec_methods(t, spec)]),
    "barriers": each_spec(lambda t, group, spec: [
        track_result(t.name, "barriers", group=group, source=s, anchor=a, matching=m)
        for (s, a), m in pair_matchings(t, spec, "barriers")]),
    "mergekit_evals": each_spec(lambda t, group, spec: [
        track_result(t.name, "mergekit_evals", group=group, source=s, anchor=a, matching=m)
        for (s, a), m in pair_matchings(t, spec, "mergekit_evals")]),
    "task_data": each_spec(lambda t, group, spec: [data_file(task) for task in t.tasks(group)]),
    "layer_sweeps": each_spec(lambda t, group, spec: [track_result(t.name, "layer_sweeps", group=group)]),
    "multimodel": each_spec(lambda t, group, spec: [track_result(t.name, "multimodel", group=group)]),
    "barycenter_evals": each_spec(lambda t, group, spec: [track_result(t.name, "barycenter_evals", group=group)]),
    "kway_evals": each_spec(lambda t, group, spec: [rules.kway_ends.output[0].format(track=t.name, group=group)] + [
        track_result(t.name, "kway_evals", group=group, way=way, matching=m) for way, ms in spec.items() for m in ms]),
}
# kway_evals (kway.smk): the ways of moving the k end models into one basis, each with its matchings
KWAY_WAYS = ("anchor", "barycenter", "universe")


def check_registry():
    """What the schema cannot see: every name an entry uses must exist, every matching it shows have a label."""
    for name, entry in REGISTRY.items():
        where = f"{EXPERIMENTS_FILE}: {name}"
        if not os.path.isfile(f"{WRITERS_DIR}/{entry['writer']}.py"):
            fail(f"{where}: writer {entry['writer']!r} is no module {WRITERS_DIR}/{entry['writer']}.py")
        if entry["paper"] is not None and not os.path.isfile(f"conf/paper/{entry['paper']}.csv"):
            fail(f"{where}: paper {entry['paper']!r} is no conf/paper/{entry['paper']}.csv")
        for problem in TRACKS_PY.entry_problems(name, entry):
            fail(f"{EXPERIMENTS_FILE}: {problem}")
        shown = set()
        for track, kinds in entry["inputs"].items():
            for spec in kinds.values():
                for matching in spec.get("matchings", []) + [m for way in KWAY_WAYS for m in spec.get(way, [])]:
                    if matching == "profile":
                        if TRACKS[track].matching is None:
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
               if name not in SETTINGS["experiments_off"] and TRACKS[entry["track"]].groups}
DEFAULT_EXPERIMENTS = [name for name, entry in EXPERIMENTS.items() if not entry.get("on_demand")]


def merged_matchings(track, kind, pair=None):
    """Every matching under which the built experiments need the track's merges of `kind` (merged_evals: the
    pairwise merges, of `pair` when given; group_evals: the group merge), in the order first declared."""
    found = [m for entry in EXPERIMENTS.values() for t, kinds in entry["inputs"].items() if t == track
             for k, spec in kinds.items() if k == kind
             for p, m in (pair_matchings(TRACKS[track], spec, kind) if pair is not None
                          else [(None, m) for m in spec_matchings(TRACKS[track], spec)])
             if pair is None or p == tuple(pair)]
    return list(dict.fromkeys(found))


def experiment_inputs(name):
    """The input files of an experiment: per declared track, per group of it, each declared kind of input."""
    return [path for track, kinds in REGISTRY[name]["inputs"].items() for group in TRACKS[track].groups
            for kind, spec in kinds.items() for path in INPUT_KINDS[kind](track, group, spec)]


def artefact_file(name):
    """Where an experiment's artefact lies: a table's CSV in results/<profile>/, a figure's PNG in figures/<profile>/."""
    return f"{RESULTS}/{name}.csv" if REGISTRY[name]["kind"] == "table" else f"{FIGURES}/{name}.png"


TABLE_NAMES = [n for n, entry in EXPERIMENTS.items() if entry["kind"] == "table"]
FIGURE_NAMES = [n for n, entry in EXPERIMENTS.items() if entry["kind"] == "figure"]
