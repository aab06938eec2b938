"""The profile's tracks: which end models each has, which pairs it merges, and what every end model is trained and scored on.

A track holds groups of end models: vision (the image task; its end models are seeds of a ViT trained from
scratch), lang (each pretrained encoder; its end models are the datasets it is fine-tuned on), decoder (the
causal_lm task; seeds of a decoder trained from scratch), decoder_ft (a pretrained decoder; the domains it is
fine-tuned on). A track with no groups is not built. The workflow (workflow/rules/tracks.smk) reads a profile's
tracks from here; the report's registry (report/registry.py) checks its entries against the kinds of input each
track has. Plain data and functions of the profile: no Snakemake, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Every track has these inputs (the shared rules train, evaluate_end_model, match, data) ...
COMMON_KINDS = ("end_models", "end_evals", "matched", "task_data")
# ... and these track-specific ones (each written by one of the track's rules)
RESULT_KINDS = {
    "vision": ("merged_evals", "barriers", "multimodel", "kway_evals"),
    "lang": ("merged_evals", "group_evals", "layer_sweeps", "multimodel", "barycenter_evals"),
    "decoder": ("merged_evals", "barriers", "mergekit_evals", "kway_evals"),
    "decoder_ft": ("merged_evals", "barriers", "mergekit_evals"),
}
TRACK_NAMES = tuple(RESULT_KINDS)


@dataclass(frozen=True)
class Track:
    """One track of a profile: its end models, its pairwise merges and what its end models are trained on."""

    name: str
    groups: tuple[str, ...]          # vision / decoder: the task; lang: the encoders; decoder_ft: the decoder
    models: tuple[str, ...]          # every end model (registry: models: all)
    merged: tuple[str, ...]          # the end models its merges fuse (models: merged)
    pairs: tuple[tuple[str, str], ...]   # (source, anchor) of every pairwise merge, the first pair first
    group: tuple[str, ...]           # the models of its group merge, anchor first (lang: the NER models)
    methods: tuple[str, ...]         # its fusion methods, in the order its merge rules write them
    matching: str | None             # the profile's matching of the track (registry: `profile`), if any
    threads: int                     # threads of an end model's training
    task_is_name: bool               # an end model's task is its name (lang, decoder_ft), else its group's
    model: str | None = None         # the model conf all its end models are built from (vision, decoder)
    seeds: dict = field(default_factory=dict)        # end model -> its training seed
    scored_on: dict = field(default_factory=dict)    # end model -> the tasks it is scored on (none given: its own)
    reads: tuple[str, ...] = ()      # the tasks whose data the track reads (none given: its groups')
    merge_options: dict | None = None   # method_options of its merges and statistics (None: the conf files')
    statistics_per_model: bool = True   # a merge computes each model's statistics on that model's own task
    heads_per_task: bool = False     # a merge scores each task with that task's own head (pairwise text merges)
    barrier: dict = field(default_factory=dict)   # points, examples of a loss path (tracks with barriers)
    more_pairs: dict | None = None   # the merges and loss paths of the pairs after the first: {matchings, methods}

    def task(self, group: str, name: str) -> str:
        """The task the end model `name` of `group` is trained on."""
        return name if self.task_is_name else group

    def model_of(self, group: str) -> str:
        """The model conf an end model of `group` starts from (lang, decoder_ft: the group itself)."""
        return self.model or group

    def eval_tasks(self, group: str, name: str) -> list[str]:
        """What an end model is scored on (by default its own task)."""
        return list(self.scored_on.get(name, (self.task(group, name),)))

    def pair_tasks(self, group: str, source: str, anchor: str) -> list[str]:
        """The tasks a pair's merges are scored on: the anchor's, then the source's when it differs."""
        return list(dict.fromkeys([self.task(group, anchor), self.task(group, source)]))

    def tasks(self, group: str) -> list[str]:
        """Every task whose data the track reads (by default the group's task)."""
        return list(self.reads or (group,))


def all_pairs(models) -> tuple[tuple[str, str], ...]:
    """Every pair (source, anchor) of end models, the earlier one as the anchor: 2 give 1 pair, 3 give 3."""
    models = list(models)
    return tuple((b, a) for i, a in enumerate(models) for b in models[i + 1:])


def statistic_options(batches: int) -> dict:
    """method_options of a merge: the statistic batches of Fisher and RegMean."""
    return {"fisher": {"num_batches": batches}, "regmean": {"num_batches": batches}}


def tracks(settings: dict) -> dict[str, Track]:
    """The tracks of a profile (conf/profile/<name>.yaml, checked against its schema), in a fixed order."""
    vision, lang = settings["vision"], settings["language"]
    decoder = settings.get("decoder") or {}            # no section: no decoder track
    finetune = decoder.get("finetune") or {}           # no subsection: no decoder_ft track
    seeds = [f"seed{s}" for s in vision["seeds"]]
    decoder_seeds = [f"seed{s}" for s in decoder.get("seeds", [])]
    texts = lang["emotion"] + lang["ner"] + lang["glue"]
    domains = finetune.get("domains", [])
    decoder_barrier = {"points": decoder.get("barrier_points", 11), "examples": decoder.get("barrier_examples")}
    return {
        "vision": Track("vision", (vision["task"],), tuple(seeds), tuple(seeds), all_pairs(seeds), (),
                        tuple(vision["fusion_methods"]), None, vision["train_threads"], False, vision["model"],
                        {n: int(n[4:]) for n in seeds}, statistics_per_model=False,
                        more_pairs=more_pairs(vision),
                        barrier={"points": vision["barrier_points"], "examples": vision["barrier_examples"]}),
        "lang": Track("lang", tuple(lang["models"]), tuple(texts), tuple(lang["emotion"] + lang["ner"]),
                      all_pairs(lang["emotion"]) + all_pairs(lang["ner"]), tuple(lang["ner"]),
                      tuple(lang["fusion_methods"]), lang["matching"], lang["train_threads"], True, None,
                      {n: lang["seed"] for n in texts},
                      {n: (n, lang["ner_ood"]) for n in lang["ner"]},
                      tuple(lang["emotion"] + lang["ner"] + [lang["ner_ood"]] + lang["glue"]), heads_per_task=True),
        "decoder": Track("decoder", (decoder["task"],) if decoder else (), tuple(decoder_seeds), tuple(decoder_seeds),
                         all_pairs(decoder_seeds), (), tuple(decoder.get("fusion_methods", [])), None,
                         decoder.get("train_threads", 1), False, decoder.get("model"),
                         {n: int(n[4:]) for n in decoder_seeds},
                         merge_options=statistic_options(decoder["fusion_batches"]) if decoder else None,
                         barrier=decoder_barrier, more_pairs=more_pairs(decoder)),
        "decoder_ft": Track("decoder_ft", (finetune["model"],) if finetune else (), tuple(domains), tuple(domains),
                            all_pairs(domains), (), tuple(decoder.get("fusion_methods", [])), None,
                            finetune.get("train_threads", 1), True, None,
                            {n: finetune["seed"] for n in domains},
                            {n: tuple(domains) for n in domains}, tuple(domains),
                            merge_options=statistic_options(finetune["fusion_batches"]) if finetune else None,
                            barrier=decoder_barrier),
    }


def more_pairs(section: dict) -> dict | None:
    """A track's `more_pairs` (profile): the matchings whose merges and loss paths the pairs after the first get, and
    the fusion methods of those merges (default: all of the track's); None: every pair gets what the first gets."""
    chosen = section.get("more_pairs")
    if chosen is None:
        return None
    return {"matchings": tuple(chosen["matchings"]),
            "methods": tuple(m for m in section["fusion_methods"] if m in chosen.get("fusion_methods", [m]))}


def regmean_alpha(lang: dict, encoder: str, dataset: str):
    """RegMean's alpha for a language merge (language.regmean_alpha: "<model>/<setting>", then "<model>", then
    "default"; setting = ner or emotion), or None for the conf file's."""
    alphas = lang.get("regmean_alpha") or {}
    setting = "ner" if dataset in lang["ner"] else "emotion"
    return alphas.get(f"{encoder}/{setting}", alphas.get(encoder, alphas.get("default")))


def merge_options(track: Track, settings: dict, group: str, anchor: str) -> dict | None:
    """method_options of the merges whose anchor is `anchor` (and of the anchor's statistics): None for the conf
    files' own (vision), the statistic batches (decoders), and for language merges RegMean's alpha too."""
    if track.name != "lang":
        return track.merge_options
    lang = settings["language"]
    options = statistic_options(lang["fusion_batches"])
    alpha = regmean_alpha(lang, group, anchor)
    if alpha is not None:
        options["regmean"]["alpha"] = alpha
    return options


# ---------------------------------------------------------------- a registry entry's input specs
# An experiment's input of one kind is a spec: {matchings, methods, pairs: all | first, models: all | merged |
# first_pair} (conf/experiments.yaml).


def spec_matchings(track: Track, spec: dict) -> list[str]:
    """The matchings a spec declares (left out: none and the profile's matching of the track)."""
    return [track.matching if m == "profile" else m for m in spec.get("matchings", ["none", "profile"])]


def spec_methods(track: Track, spec: dict) -> list[str]:
    """The track's fusion methods, in its order, limited to those the spec declares."""
    return [m for m in track.methods if "methods" not in spec or m in spec["methods"]]


def spec_pairs(track: Track, spec: dict) -> list[tuple[str, str]]:
    """first: the track's first pair only; all (default): every pair."""
    return list(track.pairs[:1] if spec.get("pairs") == "first" else track.pairs)


# the kinds of input that a track's `more_pairs` limits beyond the first pair (merges and loss paths; matching, cheap
# and read by the distances, runs for every pair)
LIMITED_KINDS = ("merged_evals", "barriers", "mergekit_evals")


def pair_matchings(track: Track, spec: dict, kind: str) -> list[tuple[tuple[str, str], str]]:
    """(pair, matching) of every result a spec of `kind` names: its pairs x its matchings, where a track's
    `more_pairs` leaves the pairs after the first only the matchings it names."""
    found = []
    for i, pair in enumerate(spec_pairs(track, spec)):
        for matching in spec_matchings(track, spec):
            limited = track.more_pairs is not None and kind in LIMITED_KINDS and pair != track.pairs[0]
            if not limited or matching in track.more_pairs["matchings"]:
                found.append((pair, matching))
    return found


def pair_methods(track: Track, pair: tuple[str, str]) -> tuple[str, ...]:
    """The fusion methods of a pair's merges: all of the track's for the first pair (and for every pair without
    `more_pairs`), else those `more_pairs` names."""
    if track.more_pairs is None or tuple(pair) == track.pairs[0]:
        return track.methods
    return track.more_pairs["methods"]


def spec_models(track: Track, spec: dict, default: str) -> list[str]:
    """all: every end model; merged: those the merges fuse; first_pair: the first pair's anchor and source."""
    which = spec.get("models", default)
    if which == "first_pair":
        source, anchor = track.pairs[0]
        return [anchor, source]
    return list(track.models if which == "all" else track.merged)


def entry_problems(name: str, entry: dict) -> list[str]:
    """What a registry entry names that no track has: an unknown track, or an input kind the track lacks."""
    problems = []
    for track, kinds in {entry["track"]: {}, **entry["inputs"]}.items():
        if track not in RESULT_KINDS:
            problems.append(f"{name}: unknown track {track!r}; tracks are {', '.join(TRACK_NAMES)}")
            continue
        for kind in kinds:
            if kind not in COMMON_KINDS and kind not in RESULT_KINDS[track]:
                problems.append(f"{name}: the {track} track has no {kind}; it has "
                                + ", ".join(COMMON_KINDS + RESULT_KINDS[track]))
    return problems
