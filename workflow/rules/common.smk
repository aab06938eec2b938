# Shared names: the profile's tracks (which end models each has, which pairs it merges), the conf files the
# profile names (checked here, when the workflow is read), path helpers that format other rules' output
# patterns (rules.<name>.output) so that no path is typed twice, and how a value reaches a command line.

VISION = SETTINGS["vision"]
LANG = SETTINGS["language"]

VISION_TASK = VISION["task"]
VISION_MODELS = [f"seed{seed}" for seed in VISION["seeds"]]
# every pair of end ViTs, the earlier seed's model as the anchor: 2 seeds give 1 pair, 3 seeds 3 pairs
VISION_PAIRS = [(b, a) for i, a in enumerate(VISION_MODELS) for b in VISION_MODELS[i + 1:]]
FUSION_METHODS = VISION["fusion_methods"]

LANG_MODELS = LANG["models"]
LANG_OOD = LANG["ner_ood"]
LANG_MATCHINGS = ["none", LANG["matching"]]
LANG_METHODS = LANG["fusion_methods"]

DECODER = SETTINGS.get("decoder") or {}          # no section: no decoder track
FINETUNE = DECODER.get("finetune") or {}         # no subsection: no decoder_ft track
DECODER_MODELS = [f"seed{seed}" for seed in DECODER.get("seeds", [])]
DECODER_METHODS = DECODER.get("fusion_methods", [])   # both decoder tracks merge by these (one merge rule)


def lang_pairs(datasets):
    """Pairwise in-domain merges: (source, anchor) with the earlier dataset as anchor."""
    return [(b, a) for i, a in enumerate(datasets) for b in datasets[i + 1:]]


def seed_of(name):
    return int(name[len("seed"):])


def decoder_options(section):
    """Hydra value of a decoder merge's method_options: the statistic batches of Fisher and RegMean."""
    return hydra_value({"fisher": {"num_batches": section["fusion_batches"]},
                        "regmean": {"num_batches": section["fusion_batches"]}})


# ---------------------------------------------------------------- tracks
# A track: groups of end models (vision: the image task, its end models are seeds trained from scratch;
# lang: each pretrained encoder, its end models are the datasets it is fine-tuned on; decoder: the causal_lm task,
# its end models are seeds of a decoder trained from scratch; decoder_ft: the pretrained decoder, its end models the
# domains it is fine-tuned on). The registry's input builders (experiments.smk) and the shared rules (train,
# evaluate_end_model, statistics, match) read a track only through this table and TRACK_RULES; a track with no
# groups is not built. A new track adds its entry in both, and the rules that write its results.
#   task(group, name), model(group), seed(name), threads: how an end model is trained (rule train)
#   eval_tasks(group, name): what an end model is scored on; tasks(group): the tasks whose data the track reads
#   options(group, name): method_options of the merges whose anchor is `name` (and of its statistics)
TRACKS = {
    "vision": {
        "groups": [VISION_TASK],
        "models": VISION_MODELS,             # every end model (registry: models: all)
        "merged": VISION_MODELS,             # the end models its merges fuse (models: merged)
        "pairs": VISION_PAIRS,               # (source, anchor) of every pairwise merge, the first pair first
        "group": [],                         # the models of its group merge, anchor first (none)
        "methods": FUSION_METHODS,           # its fusion methods, in the order its merge rules write them
        "matching": None,                    # the profile's matching of the track (registry: `profile`)
        "task": lambda group, name: group,
        "model": lambda group: VISION["model"],
        "seed": seed_of,
        "threads": VISION["train_threads"],
        "eval_tasks": lambda group, name: [group],
        "tasks": lambda group: [group],
        "options": lambda group, name: "null",
    },
    "lang": {
        "groups": LANG_MODELS,
        "models": LANG["emotion"] + LANG["ner"] + LANG["glue"],
        "merged": LANG["emotion"] + LANG["ner"],
        "pairs": lang_pairs(LANG["emotion"]) + lang_pairs(LANG["ner"]),
        "group": LANG["ner"],
        "methods": LANG_METHODS,
        "matching": LANG["matching"],
        "task": lambda group, name: name,
        "model": lambda group: group,
        "seed": lambda name: LANG["seed"],
        "threads": LANG["train_threads"],
        "eval_tasks": lambda group, name: [name] + ([LANG_OOD] if name in LANG["ner"] else []),
        "tasks": lambda group: LANG["emotion"] + LANG["ner"] + [LANG_OOD] + LANG["glue"],
        "options": lambda group, name: method_options(group, name),
    },
    "decoder": {
        "groups": [DECODER["task"]] if DECODER else [],
        "models": DECODER_MODELS,
        "merged": DECODER_MODELS,
        "pairs": [(b, a) for i, a in enumerate(DECODER_MODELS) for b in DECODER_MODELS[i + 1:]],
        "group": [],
        "methods": DECODER_METHODS,
        "matching": None,
        "task": lambda group, name: group,
        "model": lambda group: DECODER["model"],
        "seed": seed_of,
        "threads": DECODER.get("train_threads", 1),
        "eval_tasks": lambda group, name: [group],
        "tasks": lambda group: [group],
        "options": lambda group, name: decoder_options(DECODER),
    },
    "decoder_ft": {
        "groups": [FINETUNE["model"]] if FINETUNE else [],
        "models": FINETUNE.get("domains", []),
        "merged": FINETUNE.get("domains", []),
        "pairs": lang_pairs(FINETUNE.get("domains", [])),
        "group": [],
        "methods": DECODER_METHODS,
        "matching": None,
        "task": lambda group, name: name,
        "model": lambda group: group,
        "seed": lambda name: FINETUNE["seed"],
        "threads": FINETUNE.get("train_threads", 1),
        "eval_tasks": lambda group, name: FINETUNE["domains"],      # every fine-tune is scored on every domain
        "tasks": lambda group: FINETUNE["domains"],
        "options": lambda group, name: decoder_options(FINETUNE),
    },
}
# The rule that writes each track-specific kind of input (registry `inputs`); its output patterns take the
# wildcards group, source, anchor and matching, and a merge rule writes one output per method of the track.
TRACK_RULES = {
    "vision": {"merged_evals": "merge_evaluate", "barriers": "barrier", "multimodel": "vision_multimodel"},
    "lang": {"merged_evals": "lang_merge_pair", "group_evals": "lang_merge_group", "layer_sweeps": "layer_sweep",
             "multimodel": "multimodel", "barycenter_evals": "multimodel_merge"},
    "decoder": {"merged_evals": "decoder_merge", "barriers": "decoder_barrier", "mergekit_evals": "decoder_mergekit"},
    "decoder_ft": {"merged_evals": "decoder_merge", "barriers": "decoder_barrier",
                   "mergekit_evals": "decoder_mergekit"},
}
DECODER_TRACKS = ("decoder", "decoder_ft")     # the wildcard `track` of the decoder rules (decoder.smk)


wildcard_constraints:
    track="|".join(TRACKS),


# ---------------------------------------------------------------- the conf files a profile names


# The matching and fusion groups are the library's presets (package data of symfusion); the others the pipeline's conf/.
PRESETS_DIR = "src/symfusion/presets"


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


check_conf_names(
    [("vision.task", "task", VISION_TASK), ("vision.model", "model", VISION["model"])]
    + [("vision.fusion_methods", "fusion", m) for m in FUSION_METHODS]
    + [("language.models", "model", m) for m in LANG_MODELS]
    + [(f"language.{key}", "task", t) for key in ("emotion", "ner", "glue") for t in LANG[key]]
    + [("language.ner_ood", "task", LANG_OOD), ("language.matching", "matching", LANG["matching"])]
    + [("language.fusion_methods", "fusion", m) for m in LANG_METHODS]
    + ([("decoder.task", "task", DECODER["task"]), ("decoder.model", "model", DECODER["model"])] if DECODER else [])
    + [("decoder.fusion_methods", "fusion", m) for m in DECODER_METHODS]
    + ([("decoder.finetune.model", "model", FINETUNE["model"])] if FINETUNE else [])
    + [("decoder.finetune.domains", "task", t) for t in FINETUNE.get("domains", [])]
)


# ---------------------------------------------------------------- end models of the tracks


def task_of(track, group, name):
    """The task an end model solves (TRACKS: vision's and decoder's group is their task, a language model's or a
    fine-tuned decoder's name its dataset)."""
    return TRACKS[track]["task"](group, name)


def end_model_task(wildcards):
    return task_of(wildcards.track, wildcards.group, wildcards.name)


def end_model_model(wildcards):
    return TRACKS[wildcards.track]["model"](wildcards.group)


def end_model_seed(wildcards):
    return TRACKS[wildcards.track]["seed"](wildcards.name)


def end_model_threads(wildcards):
    return TRACKS[wildcards.track]["threads"]


def matching_conf(name):
    """The matching preset <name>.yaml with its `defaults` bases merged in (as symfusion.presets.load_preset reads it)."""
    with open(conf_file("matching", name)) as handle:
        conf = yaml.safe_load(handle) or {}
    merged = {}
    for base in [d for d in conf.pop("defaults", []) if d != "_self_"]:
        merged.update(matching_conf(base))
    return {**merged, **conf}


def match_data_task(wildcards):
    """A matching that reads the models' activations or loss (MatchConfig.needs_data: residual_solve: activations,
    or refine: loss; tests/test_workflow.py ties the two) reads the source end model's own task; others none."""
    conf = matching_conf(wildcards.matching)
    if conf.get("residual_solve") == "activations" or conf.get("refine") == "loss":
        return task_of(wildcards.track, wildcards.group, wildcards.source)
    return "null"


def end_model_eval_tasks(wildcards):
    """The tasks an end model is scored on: its own (a NER model: the out-of-domain set too; a fine-tuned decoder:
    every domain)."""
    return TRACKS[wildcards.track]["eval_tasks"](wildcards.group, wildcards.name)


def track_tasks(track, group):
    """The tasks whose data a track reads (registry input `task_data`: their data manifests)."""
    return TRACKS[track]["tasks"](group)


# ---------------------------------------------------------------- paths (formatted rule outputs)


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
    return outputs[TRACKS[track]["methods"].index(method) if method else 0].format(track=track, **wildcards)


# ---------------------------------------------------------------- shared statistics


def unmoved(models, matching):
    """The models a merge fuses as they are (its anchor first): all of them when unmatched, else the anchor."""
    return list(models) if matching == "none" else list(models[:1])


def merges_of(track):
    """(models, matching) of every merge a track runs: each pair under each matching the registry's pairwise
    merges need, and the track's group under each matching its group merges need (experiments.smk)."""
    pairs = [([a, s], m) for s, a in TRACKS[track]["pairs"] for m in merged_matchings(track, "merged_evals")]
    group = TRACKS[track]["group"]
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


# ---------------------------------------------------------------- values on a command line
# Every value on a rule's command line goes through the shell as one word (`{params.x:q}`, `{log:q}`;
# tests/test_workflow.py checks that no rule's shell interpolates anything unquoted), and every path reaches
# Hydra as a quoted string, so that a space, comma, bracket, quote or ${ in a path arrives intact.


PLAIN_PATH = re.compile(r"(?=.*/)[A-Za-z0-9_./][A-Za-z0-9_./-]*")    # with a slash: Hydra reads it as a string
PLAIN_NAME = re.compile(r"[a-z][a-z0-9_]*")


def hydra_quote(value):
    """A string as a Hydra override value that Hydra and OmegaConf give back unchanged: as it is when it is a
    plain path or name (readable logs), else single-quoted with its quotes, backslashes and ${ escaped."""
    text = str(value)
    if PLAIN_PATH.fullmatch(text) or (PLAIN_NAME.fullmatch(text) and text not in ("null", "true", "false", "nan", "inf")):
        return text
    text = re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", text)     # OmegaConf: a literal ${
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{text}'"


def hydra_list(values):
    """A list override value, each item quoted: [a,b] -> ['a','b']."""
    return "[" + ",".join(hydra_quote(v) for v in values) + "]"


def hydra_value(value):
    """A value as Hydra's override grammar writes it: dicts as {key:value,...}."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def quoted_input(name=None):
    """A params function: the rule's input `name` (a key or a position; all of its inputs when None) as a quoted
    Hydra value, a list when the input is a list."""
    def value(wildcards, input):
        chosen = input if name is None else input[name] if isinstance(name, int) else getattr(input, name)
        return hydra_quote(chosen) if isinstance(chosen, str) else hydra_list(chosen)
    return value


def quoted_output(wildcards, output):
    """A params function: the rule's first output as a quoted Hydra value."""
    return hydra_quote(output[0])


def quoted_dirname(wildcards, output):
    """A params function: the folder of the rule's first output (eval_dir=) as a quoted Hydra value."""
    return hydra_quote(os.path.dirname(output[0]))


def statistics_option(wildcards, input):
    """symfusion-merge's statistics=[..] for a rule's input.statistics (null when there are none)."""
    return hydra_list(input.statistics) if input.statistics else "null"


# ---------------------------------------------------------------- language track


def method_options(lmodel, dataset):
    """Hydra value of a language merge's method_options: statistic batches of Fisher / RegMean, and RegMean's
    alpha per model and setting (language.regmean_alpha: "<model>/<setting>", then "<model>", then "default";
    setting = ner or emotion)."""
    batches = LANG["fusion_batches"]
    options = {"fisher": {"num_batches": batches}, "regmean": {"num_batches": batches}}
    alphas = LANG.get("regmean_alpha") or {}
    setting = "ner" if dataset in LANG["ner"] else "emotion"
    alpha = alphas.get(f"{lmodel}/{setting}", alphas.get(lmodel, alphas.get("default")))
    if alpha is not None:
        options["regmean"]["alpha"] = alpha
    return hydra_value(options)


# The decoder tracks (workflow/rules/decoder.smk).
def decoder_merge_tasks(w):
    """The tasks a pair's merges are scored on: every task either end model is scored on (decoder: its task;
    decoder_ft: every domain)."""
    tracks = TRACKS[w.track]
    return list(dict.fromkeys(tracks["eval_tasks"](w.group, w.anchor) + tracks["eval_tasks"](w.group, w.source)))


def decoder_pair_tasks(w):
    """Each model's own task, anchor first: the data of its Fisher / Gram statistics."""
    return [task_of(w.track, w.group, name) for name in (w.anchor, w.source)]
