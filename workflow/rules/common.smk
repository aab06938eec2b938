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
    ]


def comma_joined(wildcards, input):
    """A rule's input files as one comma-separated string, for Hydra list overrides."""
    return ",".join(input)
