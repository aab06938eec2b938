# The profile's tracks (src/symfusion/pipeline/tracks.py: plain Python the report's registry shares, loaded here by
# its path so that the workflow does not need the package installed), the rule that writes each track-specific kind
# of input, the conf files the profile names (checked when the workflow is read), and the end models' parameters.

TRACKS_PY = plain_module("src/symfusion/pipeline/tracks.py")
TRACKS = TRACKS_PY.tracks(SETTINGS)
VISION = SETTINGS["vision"]
LANG = SETTINGS["language"]
DECODER = SETTINGS.get("decoder") or {}          # no section: no decoder track
DECODER_TRACKS = ("decoder", "decoder_ft")     # the wildcard `track` of the decoder rules (decoder.smk)

# The rule that writes each track-specific kind of input (registry `inputs`; tracks.RESULT_KINDS names the kinds);
# its output patterns take the wildcards group, source, anchor and matching, and a merge rule writes one output per
# method of the track.
TRACK_RULES = {
    "vision": {"merged_evals": "merge_evaluate", "barriers": "barrier", "multimodel": "vision_multimodel",
               "kway_evals": "kway_score"},
    "lang": {"merged_evals": "lang_merge_pair", "group_evals": "lang_merge_group", "layer_sweeps": "layer_sweep",
             "multimodel": "multimodel", "barycenter_evals": "multimodel_merge"},
    "decoder": {"merged_evals": "decoder_merge", "barriers": "barrier", "mergekit_evals": "decoder_mergekit",
                "kway_evals": "kway_score"},
    "decoder_ft": {"merged_evals": "decoder_merge", "barriers": "barrier",
                   "mergekit_evals": "decoder_mergekit"},
}
if {t: set(k) for t, k in TRACK_RULES.items()} != {t: set(k) for t, k in TRACKS_PY.RESULT_KINDS.items()}:
    fail("workflow/rules/tracks.smk: TRACK_RULES must name a rule for every kind of tracks.RESULT_KINDS")


wildcard_constraints:
    track="|".join(TRACKS),


# The matching and fusion groups are the library's presets (package data of symfusion); the others the pipeline's conf/.
# What a preset's name means (its `defaults:` bases merged, whether a matching reads data) the library's catalogue
# answers: src/symfusion/presets/catalog.py, plain Python loaded by its path like tracks.py.
PRESETS = plain_module("src/symfusion/presets/catalog.py")
PRESETS_DIR = os.path.relpath(PRESETS.PRESETS_DIR)


def conf_dir(group):
    return f"{PRESETS_DIR}/{group}" if group in ("matching", "fusion") else f"conf/{group}"


def conf_file(group, name):
    """The yaml of option `name` of config group `group`, where symfusion's Hydra composition finds it."""
    return f"{conf_dir(group)}/{name}.yaml"


def conf_options(group):
    return sorted(p[:-5] for p in os.listdir(conf_dir(group)) if p.endswith(".yaml"))


def check_conf_names(named):
    """Every (profile key, conf group, name) must be a <group>/<name>.yaml (conf_file): a typo fails here, not inside a
    job (for a language matching: not after the fine-tunings have run)."""
    for key, group, name in named:
        if not os.path.isfile(conf_file(group, name)):
            fail(f"{PROFILE_FILE}: {key}: {name!r} is no {conf_file(group, name)}; choose one of "
                 + ", ".join(conf_options(group)))


FINETUNE = DECODER.get("finetune") or {}
check_conf_names(
    [("vision.task", "task", VISION["task"]), ("vision.model", "model", VISION["model"])]
    + [("vision.fusion_methods", "fusion", m) for m in VISION["fusion_methods"]]
    + [("language.models", "model", m) for m in LANG["models"]]
    + [(f"language.{key}", "task", t) for key in ("emotion", "ner", "glue") for t in LANG[key]]
    + [("language.ner_ood", "task", LANG["ner_ood"]), ("language.matching", "matching", LANG["matching"])]
    + [("language.fusion_methods", "fusion", m) for m in LANG["fusion_methods"]]
    + ([("decoder.task", "task", DECODER["task"]), ("decoder.model", "model", DECODER["model"])] if DECODER else [])
    + [("decoder.fusion_methods", "fusion", m) for m in DECODER.get("fusion_methods", [])]
    + ([("decoder.finetune.model", "model", FINETUNE["model"])] if FINETUNE else [])
    + [("decoder.finetune.domains", "task", t) for t in FINETUNE.get("domains", [])]
)


def task_of(track, group, name):
    """The task an end model solves (vision's and decoder's group is their task, a language model's or a fine-tuned
    decoder's name its dataset)."""
    return TRACKS[track].task(group, name)


def end_model_task(wildcards):
    return task_of(wildcards.track, wildcards.group, wildcards.name)


def end_model_model(wildcards):
    return TRACKS[wildcards.track].model_of(wildcards.group)


def end_model_seed(wildcards):
    return TRACKS[wildcards.track].seeds[wildcards.name]


def end_model_threads(wildcards):
    return TRACKS[wildcards.track].threads


def barrier_examples(wildcards):
    """The track's examples per point of a loss path (null: all), as the barrier and k-way stages take them."""
    return TRACKS[wildcards.track].barrier["examples"] or "null"


def end_model_eval_tasks(wildcards):
    """The tasks an end model is scored on: its own (a NER model: the out-of-domain set too; a fine-tuned decoder:
    every domain)."""
    return TRACKS[wildcards.track].eval_tasks(wildcards.group, wildcards.name)


def merge_options(track, group, anchor):
    """Hydra value of the method_options of the merges whose anchor is `anchor` (and of its statistics)."""
    options = TRACKS_PY.merge_options(TRACKS[track], SETTINGS, group, anchor)
    return "null" if options is None else hydra_value(options)


def match_data_task(wildcards):
    """A matching that reads the models' activations or loss (the library's answer: catalog.matching_reads_data, which
    MatchConfig.needs_data asks too) reads the source end model's own task; others none."""
    if PRESETS.matching_reads_data(wildcards.matching):
        return task_of(wildcards.track, wildcards.group, wildcards.source)
    return "null"
