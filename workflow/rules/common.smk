# Shared names: the profile's experiment lists, which model each end model is, and path helpers that
# format other rules' output patterns (rules.<name>.output), so that no path is typed twice.

VISION = SETTINGS["vision"]
LANG = SETTINGS["language"]

VISION_TASK = VISION["task"]
VISION_MODELS = [f"seed{seed}" for seed in VISION["seeds"]]
# every pair of end ViTs, the earlier seed's model as the anchor: 2 seeds give 1 pair, 3 seeds 3 pairs
VISION_PAIRS = [(b, a) for i, a in enumerate(VISION_MODELS) for b in VISION_MODELS[i + 1:]]
ANCHOR_ID, SOURCE_ID = VISION_PAIRS[0][1], VISION_PAIRS[0][0]      # the first pair (Table 3's timings)
FUSION_METHODS = VISION["fusion_methods"]

# Table 2 columns and Figure 3-5 bars: the matching variant behind each.
TABLE2_MATCHINGS = ["none", "rotation_no_rescale", "rotation"]
FIG3_MATCHINGS = ["none", "ffn_only", "attn_only", "rotation_no_rescale", "rotation"]
FIG4_MATCHINGS = ["none", "git_rebasin", "ot_ffn", "rotation_no_rescale", "rotation"]
FIG5_MATCHINGS = ["none", "attn_only", "ffn_only", "rotation"]
MERGED_VISION_MATCHINGS = sorted(set(TABLE2_MATCHINGS + FIG3_MATCHINGS))   # those merged (vision_evals)

LANG_MODELS = LANG["models"]
LANG_OOD = LANG["ner_ood"]
LANG_MATCHINGS = ["none", LANG["matching"]]
LANG_METHODS = LANG["fusion_methods"]


# ---------------------------------------------------------------- end models of the two tracks
# vision: group = the image task, name = seed<N> (trained from scratch);
# lang:   group = the pretrained encoder (conf/model), name = the dataset it is fine-tuned on.


def end_model_task(wildcards):
    return wildcards.group if wildcards.track == "vision" else wildcards.name


def end_model_model(wildcards):
    return VISION["model"] if wildcards.track == "vision" else wildcards.group


def end_model_seed(wildcards):
    return int(wildcards.name[len("seed"):]) if wildcards.track == "vision" else LANG["seed"]


def end_model_threads(wildcards):
    return (VISION if wildcards.track == "vision" else LANG)["train_threads"]


def end_model_eval_tasks(wildcards):
    """The tasks an end model is scored on: its own, and for a NER model the out-of-domain set too."""
    task = end_model_task(wildcards)
    return [task] + ([LANG_OOD] if wildcards.track == "lang" and task in LANG["ner"] else [])


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


def merged_pairs(track):
    """(source, anchor) of every pairwise merge of a track."""
    if track == "vision":
        return VISION_PAIRS
    return [pair for datasets in (LANG["emotion"], LANG["ner"]) for pair in lang_pairs(datasets)]


def unmoved(models, matching):
    """The models a merge fuses as they are (its anchor first): all of them when unmatched, else the anchor."""
    return list(models) if matching == "none" else list(models[:1])


def merges_of(track):
    """(models, matching) of every merge a track runs: each pair under each matching, and (language) the NER
    group under each matching."""
    matchings = MERGED_VISION_MATCHINGS if track == "vision" else LANG_MATCHINGS
    groups = [[a, s] for s, a in merged_pairs(track)] + ([LANG["ner"]] if track == "lang" else [])
    return [(models, m) for models in groups for m in matchings]


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


def statistics_option(wildcards, input):
    """symfusion-merge's statistics=[..] override for a rule's input.statistics (nothing when there are none)."""
    return f"'statistics=[{','.join(input.statistics)}]'" if input.statistics else ""


def end_eval(track, group, name):
    return rules.evaluate_end_model.output[0].format(track=track, group=group, name=name)


def merged_eval(task, source, anchor, matching, method):
    pattern = rules.merge_evaluate.output[FUSION_METHODS.index(method)]
    return pattern.format(task=task, source=source, anchor=anchor, matching=matching)


def vision_evals(matchings):
    """Every vision pair's merged evaluations for the given matchings and every fusion method."""
    return [merged_eval(VISION_TASK, s, a, m, f) for s, a in VISION_PAIRS for m in matchings for f in FUSION_METHODS]


def comma_joined(wildcards, input):
    """A rule's input files as one comma-separated string, for Hydra list overrides."""
    return ",".join(input)


def hydra_value(value):
    """A value as Hydra's override grammar writes it: dicts as {key:value,...}."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return str(value)


# ---------------------------------------------------------------- language track


def lang_pairs(datasets):
    """Pairwise in-domain merges: (source, anchor) with the earlier dataset as anchor."""
    return [(b, a) for i, a in enumerate(datasets) for b in datasets[i + 1:]]


def method_options(lmodel, dataset):
    """Hydra override of a language merge's method options: statistic batches of Fisher / RegMean, and
    RegMean's alpha per model and setting (language.regmean_alpha: "<model>/<setting>", then "<model>",
    then "default"; setting = ner or emotion)."""
    batches = LANG["fusion_batches"]
    options = {"fisher": {"num_batches": batches}, "regmean": {"num_batches": batches}}
    alphas = LANG.get("regmean_alpha") or {}
    setting = "ner" if dataset in LANG["ner"] else "emotion"
    alpha = alphas.get(f"{lmodel}/{setting}", alphas.get(lmodel, alphas.get("default")))
    if alpha is not None:
        options["regmean"]["alpha"] = alpha
    return f"'method_options={hydra_value(options)}'"


# ---------------------------------------------------------------- report inputs (called in report.smk)


def lang_pair_evals(lmodel):
    """Every pairwise language merge's eval JSON (emotion and NER pairs, unmatched and matched)."""
    return [rules.lang_merge_pair.output[LANG_METHODS.index(f)].format(lmodel=lmodel, source=s, anchor=a, matching=m)
            for datasets in (LANG["emotion"], LANG["ner"])
            for s, a in lang_pairs(datasets) for m in LANG_MATCHINGS for f in LANG_METHODS]


def table1_inputs():
    files = []
    for lmodel in LANG_MODELS:
        files += lang_pair_evals(lmodel)
        files += [rules.lang_merge_group.output[LANG_METHODS.index(f)].format(lmodel=lmodel, matching=m)
                  for m in LANG_MATCHINGS for f in LANG_METHODS]
        files += [end_eval("lang", lmodel, d) for d in LANG["emotion"] + LANG["ner"]]
    return files


def table3_inputs():
    """Timings: end models' train.json, matched folders' match.json, merged models' evals (merge seconds)."""
    files = [model_dir("vision", VISION_TASK, m) for m in (ANCHOR_ID, SOURCE_ID)]
    files += [matched_dir("vision", VISION_TASK, SOURCE_ID, ANCHOR_ID, "rotation")]
    files += [merged_eval(VISION_TASK, SOURCE_ID, ANCHOR_ID, "rotation", f) for f in FUSION_METHODS
              if f in ("simple", "fisher", "regmean")]
    for lmodel in LANG_MODELS:
        pairs = lang_pairs(LANG["emotion"]) + lang_pairs(LANG["ner"])
        files += [model_dir("lang", lmodel, d) for d in LANG["emotion"] + LANG["ner"] + LANG["glue"]]
        files += [source_dir("lang", lmodel, s, a, LANG_MATCHINGS[1]) for s, a in pairs]
        files += lang_pair_evals(lmodel)
    return files


def multimodel_inputs():
    """The end ViTs' multi-model report; per language model: its report, and the barycentre and anchor
    grouped simple merges' evals."""
    files = [rules.vision_multimodel.output[0].format(task=VISION_TASK)]
    for lmodel in LANG_MODELS:
        files += [rules.multimodel.output.report.format(lmodel=lmodel),
                  rules.multimodel_merge.output[0].format(lmodel=lmodel),
                  rules.lang_merge_group.output[LANG_METHODS.index("simple")].format(lmodel=lmodel,
                                                                                     matching=LANG_MATCHINGS[1])]
    return files
