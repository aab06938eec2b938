# Shared names of the vision track: which models exist, which pair is matched, what each artefact needs.

VISION = SETTINGS["vision"]
VISION_TASK = VISION["task"]
ANCHOR_ID = f"seed{VISION['seeds'][0]}"
SOURCE_ID = f"seed{VISION['seeds'][1]}"
VISION_PAIR = f"{SOURCE_ID}-onto-{ANCHOR_ID}"
FUSION_METHODS = VISION["fusion_methods"]

# Table 2 columns and Figure 3 bars: the matching variant behind each.
TABLE2_MATCHINGS = ["none", "rotation_no_rescale", "rotation"]
FIG3_MATCHINGS = ["none", "ffn_only", "attn_only", "rotation_no_rescale", "rotation"]
FIG4_MATCHINGS = ["none", "git_rebasin", "ot_ffn", "rotation_no_rescale", "rotation"]
FIG5_MATCHINGS = ["none", "attn_only", "ffn_only", "rotation"]


def model_dir(task, model_id):
    return f"{RESULTS}/models/{task}/{model_id}"


def merged_eval(task, pair, matching, method):
    return f"{RESULTS}/eval/{task}/{pair}/{matching}/{method}.json"


def vision_evals(matchings):
    return [merged_eval(VISION_TASK, VISION_PAIR, m, f) for m in matchings for f in FUSION_METHODS]


def vision_targets():
    return [
        f"{RESULTS}/table2.csv",
        f"{FIGURES}/fig3_ablation.png",
        f"{FIGURES}/fig4_distance.png",
        f"{FIGURES}/fig5_barrier.png",
        f"{RESULTS}/multimodel.csv",
    ]


def comma_joined(wildcards, input):
    """A rule's input files as one comma-separated string, for Hydra list overrides."""
    return ",".join(input)


# ---------------------------------------------------------------- language track
LANG = SETTINGS.get("language") or {}
LANG_RESULTS = f"{RESULTS}/lang"
LANG_MODELS = LANG.get("models", [])
LANG_OOD = LANG.get("ner_ood", "")
LANG_MATCHINGS = ["none", LANG.get("matching", "attn_only_no_rescale")]
LANG_METHODS = LANG.get("fusion_methods", ["simple"])


def lang_model_dir(lmodel, dataset):
    return f"{LANG_RESULTS}/{lmodel}/models/{dataset}"


def lang_source_dir(lmodel, source, anchor, matching):
    """The source model as merged: the fine-tuned folder itself when unmatched, else its matched copy."""
    if matching == "none":
        return lang_model_dir(lmodel, source)
    return f"{LANG_RESULTS}/{lmodel}/matched/{source}-onto-{anchor}/{matching}"


def hydra_value(value):
    """A value as Hydra's override grammar writes it: dicts as {key:value,...}."""
    if isinstance(value, dict):
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    return str(value)


def method_options(lmodel, dataset):
    """Hydra override of a language merge's method options: statistic batches of Fisher / RegMean, and
    RegMean's alpha per model and setting (language.regmean_alpha: "<model>/<setting>", then "<model>",
    then "default"; setting = ner or emotion)."""
    batches = LANG["fusion_batches"]
    options = {"fisher": {"num_batches": batches}, "regmean": {"num_batches": batches}}
    alphas = LANG.get("regmean_alpha") or {}
    setting = "ner" if dataset in LANG.get("ner", []) else "emotion"
    alpha = alphas.get(f"{lmodel}/{setting}", alphas.get(lmodel, alphas.get("default")))
    if alpha is not None:
        options["regmean"]["alpha"] = alpha
    return f"'method_options={hydra_value(options)}'"


def lang_pairs(datasets):
    """Pairwise in-domain merges: (source, anchor) with the earlier dataset as anchor."""
    return [(b, a) for i, a in enumerate(datasets) for b in datasets[i + 1:]]


def lang_pair_evals(lmodel, datasets):
    return [f"{LANG_RESULTS}/{lmodel}/eval/{s}-onto-{a}/{m}/{f}.json"
            for s, a in lang_pairs(datasets) for m in LANG_MATCHINGS for f in LANG_METHODS]


def table1_inputs():
    files = []
    for lmodel in LANG_MODELS:
        files += lang_pair_evals(lmodel, LANG["emotion"]) + lang_pair_evals(lmodel, LANG["ner"])
        files += [f"{LANG_RESULTS}/{lmodel}/eval_group/ner/{m}/{f}.json"
                  for m in LANG_MATCHINGS for f in LANG_METHODS]
        files += [f"{LANG_RESULTS}/{lmodel}/eval/end/{d}.json" for d in LANG["emotion"] + LANG["ner"]]
    return files


def table3_inputs():
    """Timings: end models' train.json, matched folders' match.json, merged models' evals (merge seconds)."""
    files = [f"{RESULTS}/models/{VISION_TASK}/{m}" for m in (ANCHOR_ID, SOURCE_ID)]
    files += [f"{RESULTS}/matched/{VISION_TASK}/{VISION_PAIR}/rotation"]
    files += [merged_eval(VISION_TASK, VISION_PAIR, "rotation", f) for f in FUSION_METHODS if f in ("simple", "fisher", "regmean")]
    for lmodel in LANG_MODELS:
        datasets = LANG["emotion"] + LANG["ner"] + LANG["glue"]
        files += [lang_model_dir(lmodel, d) for d in datasets]
        files += [lang_source_dir(lmodel, s, a, LANG_MATCHINGS[1]) for s, a in lang_pairs(LANG["emotion"]) + lang_pairs(LANG["ner"])]
        files += [f for f in lang_pair_evals(lmodel, LANG["emotion"]) + lang_pair_evals(lmodel, LANG["ner"])]
    return files


def multimodel_inputs():
    """The end ViTs' multi-model report; per language model: its report, and the barycentre and anchor
    grouped simple merges' evals."""
    files = [f"{RESULTS}/multimodel/{VISION_TASK}.json"]
    for lmodel in LANG_MODELS:
        files += [f"{LANG_RESULTS}/{lmodel}/multimodel.json", f"{LANG_RESULTS}/{lmodel}/eval_barycenter/ner/simple.json",
                  f"{LANG_RESULTS}/{lmodel}/eval_group/ner/{LANG_MATCHINGS[1]}/simple.json"]
    return files


def language_targets():
    if not LANG_MODELS:
        return []
    return [f"{RESULTS}/table1.csv", f"{RESULTS}/table3.csv", f"{FIGURES}/fig6_layers.png"]
