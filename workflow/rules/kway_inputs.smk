# The k-way rules' inputs and command-line values (kway.smk; helper functions live apart from the rules, as
# snakemake --lint asks).

# the tracks whose k end models a k-way entry merges (kway.smk's wildcard constraint; kway_barycenter: vision only, as
# symfusion-multimodel's barycentric matching supports the encoder families only)
KWAY_TRACKS = "vision|decoder"


def track_models(track, group):
    """The track's end models of `group`, the first first (the anchor of anchor matching, the gauge of the others)."""
    return [model_dir(track, group, name) for name in TRACKS[track].models]


def kway_inputs(track, group, way, matching):
    """What a way's k moved models come from: the end model folders and matched folders (anchor), or the one folder
    of the barycentric matching or of align-many."""
    first, *rest = TRACKS[track].models
    if way == "anchor":
        return [model_dir(track, group, first)] + [source_dir(track, group, name, first, matching) for name in rest]
    pattern = rules.kway_barycenter.output.models if way == "barycenter" else rules.align_many.output[0]
    return [pattern.format(track=track, group=group, matching=matching)]


def kway_models(wildcards, input):
    """symfusion-kway's models=[..]: the k moved folders (align-many's model_i, multimodel's i) as a Hydra list."""
    k, given = len(TRACKS[wildcards.track].models), input.models
    folders = [given] if isinstance(given, str) else list(given)
    if wildcards.way == "anchor":
        return hydra_list(folders)
    inside = (lambda i: f"model_{i}") if wildcards.way == "universe" else str
    return hydra_list(f"{folders[0]}/{inside(i)}" for i in range(k))


def kway_data_task(wildcards):
    """A k-way matching that reads data (full_symmetry_learned) reads the first end model's task; others none."""
    if PRESETS.matching_reads_data(wildcards.matching):
        return task_of(wildcards.track, wildcards.group, TRACKS[wildcards.track].models[0])
    return "null"
