"""Text datasets from the Hugging Face Hub (paper profile) through `datasets.load_dataset`, and the paper's presets.

Parquet-backed datasets only (the `datasets` library no longer runs loading scripts): repositories
that still hold a script are read from their automatic Parquet export, `revision="refs/convert/parquet"`
with `data_dir=<config>`. Nothing here needs the network once the data sit in the Hugging Face cache
(then HF_HUB_OFFLINE=1 works), and `dataset` may be a local folder of Parquet files laid out as on the Hub (the
tests and the rehearsal profile's stand-ins do that: the same call, with the preset's other options unchanged).
Every preset names the commit it is read at (`revision`); the Parquet exports whose commit could not be
confirmed name their ref, which symfusion.pipeline.revisions pins to its commit on the first download (lock file).

`hub_text` returns the same raw examples as the offline loaders of `symfusion.pipeline.data.text`;
`HUB_TEXT_PRESETS` names the paper's datasets (see HUB_PRESET_NOTES and docs/data_card.md for why each).
"""
from __future__ import annotations

import inspect
import math

from pathlib import Path

from symfusion.pipeline.data.text.splits import KINDS, NER_TAGS, REGRESSION, TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, repair_bio
from symfusion.errors import SymfusionError
from symfusion.pipeline.revisions import pin_revision

DEFAULT_SPLIT_NAMES = {"train": "train", "validation": "validation", "test": "test"}

# The shared label space of the emotion presets: Ekman's six basic emotions plus neutral. Each source's
# labels are mapped onto it with the Ekman grouping published with GoEmotions (Demszky et al. 2020).
EMOTION_LABELS = ["neutral", "anger", "disgust", "fear", "joy", "sadness", "surprise"]
GOEMOTIONS_NAMES = [
    "admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion", "curiosity", "desire",
    "disappointment", "disapproval", "disgust", "embarrassment", "excitement", "fear", "gratitude", "grief", "joy",
    "love", "nervousness", "optimism", "pride", "realization", "relief", "remorse", "sadness", "surprise", "neutral",
]
_EKMAN_GROUPS = {
    "anger": ["anger", "annoyance", "disapproval"],
    "disgust": ["disgust"],
    "fear": ["fear", "nervousness"],
    "joy": ["joy", "amusement", "approval", "excitement", "gratitude", "love", "optimism", "relief", "pride",
            "admiration", "desire", "caring"],
    "sadness": ["sadness", "disappointment", "embarrassment", "grief", "remorse"],
    "surprise": ["surprise", "realization", "confusion", "curiosity"],
    "neutral": ["neutral"],
}
GOEMOTIONS_TO_EKMAN = {name: group for group, names in _EKMAN_GROUPS.items() for name in names}

# Tag names of the Hub datasets (used only where the Parquet files carry no ClassLabel names).
ONTONOTES_TAGS = ["O"] + [f"{p}-{t}" for t in ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "DATE", "TIME",
                                                 "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL", "EVENT",
                                                 "WORK_OF_ART", "LAW", "LANGUAGE") for p in ("B", "I")]
CONLL2003_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
ONTONOTES_DOMAINS = ("bc", "bn", "mz", "nw", "tc", "wb")
# entity type -> CoNLL type (O + B/I-PER/LOC/ORG); unlisted types (NORP, MISC, DATE, ...) become O
ONTONOTES_TAG_MAP = {"PERSON": "PER", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC", "ORG": "ORG"}
CONLL2003_TAG_MAP = {"PER": "PER", "LOC": "LOC", "ORG": "ORG"}
GLUE_SPLITS = {"train": "train", "test": "validation"}   # GLUE test labels are hidden: validation is our test

# The commit each Hub dataset is read at (sources: docs/data_card.md, "Pinned revisions").
DAIR_EMOTION_REVISION = "cab853a1dbdf4c42c2b3ef2173804746df8825fe"
TWEET_EVAL_REVISION = "b3a375baf0f409c77e6bc7aa35102b7b3534f8be"
GO_EMOTIONS_REVISION = "add492243ff905527e67aeb8b80c082af02207c3"
GLUE_REVISION = "bcdcba79d07bc864c1c254ccfcedcce55bcc9a8c"
PARQUET_EXPORT = "refs/convert/parquet"   # a ref: pinned to its commit on first download (revisions.py, lock file)

HUB_TEXT_PRESETS: dict[str, dict] = {
    "emotion_dair": dict(
        dataset="dair-ai/emotion", config="split", revision=DAIR_EMOTION_REVISION, text_column="text", label_column="label",
        source_label_names=["sadness", "joy", "love", "anger", "fear", "surprise"],
        label_map={"sadness": "sadness", "joy": "joy", "love": "joy", "anger": "anger", "fear": "fear", "surprise": "surprise"},
        label_names=EMOTION_LABELS),
    "emotion_tweeteval": dict(
        dataset="cardiffnlp/tweet_eval", config="emotion", revision=TWEET_EVAL_REVISION, text_column="text", label_column="label",
        source_label_names=["anger", "joy", "optimism", "sadness"],
        label_map={"anger": "anger", "joy": "joy", "optimism": "joy", "sadness": "sadness"},
        label_names=EMOTION_LABELS),
    "emotion_goemotions": dict(
        dataset="google-research-datasets/go_emotions", config="simplified", revision=GO_EMOTIONS_REVISION,
        text_column="text", label_column="labels",
        source_label_names=GOEMOTIONS_NAMES, label_map=GOEMOTIONS_TO_EKMAN, label_names=EMOTION_LABELS),
    "emotion_dailydialog": dict(
        dataset="li2017dailydialog/daily_dialog", revision=PARQUET_EXPORT, data_dir="default",
        explode_column=["dialog", "emotion"], text_column="dialog", label_column="emotion",
        source_label_names=["no emotion", "anger", "disgust", "fear", "happiness", "sadness", "surprise"],
        label_map={"no emotion": "neutral", "anger": "anger", "disgust": "disgust", "fear": "fear", "happiness": "joy",
                   "sadness": "sadness", "surprise": "surprise"},
        label_names=EMOTION_LABELS),
    **{f"ontonotes_{domain}": dict(
        dataset="ontonotes/conll2012_ontonotesv5", revision=PARQUET_EXPORT, data_dir="english_v4",
        explode_column="sentences", tokens_column="words", tags_column="named_entities",
        source_label_names=ONTONOTES_TAGS, tag_map=ONTONOTES_TAG_MAP, domain_column="document_id", domain_value=domain)
       for domain in ONTONOTES_DOMAINS},
    "conll2003": dict(
        dataset="eriktks/conll2003", revision=PARQUET_EXPORT, data_dir="conll2003",
        tokens_column="tokens", tags_column="ner_tags", source_label_names=CONLL2003_TAGS, tag_map=CONLL2003_TAG_MAP),
    "glue_cola": dict(dataset="nyu-mll/glue", config="cola", revision=GLUE_REVISION, split_names=GLUE_SPLITS, text_column="sentence",
                      label_column="label", source_label_names=["unacceptable", "acceptable"]),
    "glue_sst2": dict(dataset="nyu-mll/glue", config="sst2", revision=GLUE_REVISION, split_names=GLUE_SPLITS, text_column="sentence",
                      label_column="label", source_label_names=["negative", "positive"]),
    "glue_stsb": dict(dataset="nyu-mll/glue", config="stsb", revision=GLUE_REVISION, split_names=GLUE_SPLITS, text_column="sentence1",
                      text_pair_column="sentence2", label_column="label", kind="regression"),
}

HUB_PRESET_NOTES: dict[str, str] = {
    "emotion_dair": "Twitter, 6 emotions (Saravia et al. 2018); love -> joy. The paper's 5 unified-corpus sets "
                    "(Bostan & Klinger 2018) are not on the Hub as Parquet and their splits are unpublished.",
    "emotion_tweeteval": "SemEval-2018 Task 1 tweets (TweetEval emotion), the successor of EmoInt (WASSA-2017, "
                         "one of the paper's in-domain sets); optimism -> joy.",
    "emotion_goemotions": "Reddit comments, 27 emotions + neutral; single-label comments only, Ekman grouping of its authors.",
    "emotion_dailydialog": "DailyDialog utterances (one of the paper's out-of-domain emotion sets), from the Parquet "
                           "export; ~80% of utterances are 'no emotion'.",
    **{f"ontonotes_{d}": f"OntoNotes 5 (CoNLL-2012 english_v4 split), documents of genre '{d}' (document_id prefix), "
                         "from the Parquet export; PERSON->PER, GPE/LOC/FAC->LOC, ORG->ORG, rest (NORP incl.) -> O."
       for d in ONTONOTES_DOMAINS},
    "conll2003": "CoNLL-2003 English (the paper's out-of-domain NER test), from the Parquet export; MISC -> O.",
    "glue_cola": "GLUE CoLA; GLUE test labels are hidden, so validation is our test and validation is carved from train.",
    "glue_sst2": "GLUE SST-2 (the paper's ablations); validation is our test.",
    "glue_stsb": "GLUE STS-B, scores 0-5; validation is our test.",
}


def _unwrap(feature):
    """The element feature of a list feature (datasets List / Sequence / [feature]); else the feature."""
    if isinstance(feature, list):
        return feature[0]
    return getattr(feature, "feature", feature) if type(feature).__name__ in ("List", "Sequence", "LargeList") else feature


def _class_names(feature) -> list[str] | None:
    for _ in range(4):
        if type(feature).__name__ == "ClassLabel":
            return list(feature.names)
        unwrapped = _unwrap(feature)
        if unwrapped is feature:
            return None
        feature = unwrapped
    return None


def _is_float(feature) -> bool:
    return type(feature).__name__ == "Value" and str(getattr(feature, "dtype", "")).startswith("float")


def _explode_features(features, explode_column) -> dict:
    """Column -> feature of the rows that `_explode` yields."""
    columns = dict(features)
    if explode_column is None:
        return columns
    if isinstance(explode_column, str):
        inner = _unwrap(features[explode_column])
        if isinstance(inner, dict):
            columns.update(inner)
        elif isinstance(features[explode_column], dict):   # Sequence(dict): a dict of lists
            columns.update({key: _unwrap(value) for key, value in features[explode_column].items()})
        return columns
    columns.update({column: _unwrap(features[column]) for column in explode_column})
    return columns


def _explode(row: dict, explode_column):
    if explode_column is None:
        yield row
    elif isinstance(explode_column, str):
        items = row[explode_column] or []
        if isinstance(items, dict):                       # dict of lists -> list of dicts
            items = [dict(zip(items, values)) for values in zip(*items.values())]
        for item in items:
            yield {**row, **item}
    else:
        lists = [row[column] or [] for column in explode_column]
        if len({len(values) for values in lists}) > 1:
            raise SymfusionError(f"columns {list(explode_column)} hold lists of different lengths in one row; they cannot be exploded together")
        for k in range(len(lists[0]) if lists else 0):
            yield {**row, **{column: values[k] for column, values in zip(explode_column, lists)}}


def _domain_matches(value, domain_value) -> bool:
    """Equal, or the first path segment of a document id like 'bc/cctv/00/cctv_0001'."""
    return value == domain_value or str(value).startswith(f"{domain_value}/")


def _one_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def is_local(dataset: str) -> bool:
    """A local folder (read as is: a revision means nothing there) rather than a Hub id."""
    return Path(dataset).is_dir()


def _load(dataset: str, config, revision, data_dir, hf_cache_dir):
    try:
        import datasets
    except ImportError as error:
        raise SymfusionError("the paper profile needs the `datasets` package: pip install datasets") from error
    try:
        loaded = datasets.load_dataset(dataset, config, data_dir=data_dir, revision=revision, cache_dir=hf_cache_dir)
    except Exception as error:  # the library raises many types (offline, missing config, bad id, scripts)
        where = f"{dataset!r}" + (f" config {config!r}" if config else "") + (f" revision {revision!r}" if revision else "")
        raise SymfusionError(
            f"cannot load {where} ({_one_line(error)}); check the id and config, unset HF_HUB_OFFLINE with Hub access "
            "for the paper profile, or download it into the Hugging Face cache first"
        ) from error
    if not isinstance(loaded, datasets.DatasetDict):
        raise SymfusionError(f"{dataset!r} did not load as named splits; give split_names for its splits")
    return loaded


def _tag_converter(names: list[str] | None, tag_map: dict | None, target: list[str], dataset: str):
    def target_tag(name: str) -> str:
        if name in ("O", "", None):
            return "O"
        prefix, _, kind = name.partition("-") if name[:2] in ("B-", "I-") else ("I", "-", name)   # IO scheme: bare type
        if tag_map is not None:
            kind = tag_map.get(kind)
            if kind is None:
                return "O"
        return f"{prefix}-{kind}"

    index = {name: i for i, name in enumerate(target)}

    def convert(values: list) -> list[int]:
        if values and isinstance(values[0], int) and not isinstance(values[0], bool):
            if names is None:
                raise SymfusionError(f"tags of {dataset!r} are ids without names; give source_label_names")
            values = [names[v] for v in values]
        tags = repair_bio([target_tag(v) for v in values])
        unknown = sorted({t for t in tags if t not in index})
        if unknown:
            raise SymfusionError(f"tags {unknown} of {dataset!r} are not in the label set {target}; give a tag_map")
        return [index[t] for t in tags]

    return convert


def _check_options(kind, tokens_column, tags_column, text_column, label_column, domain_column, domain_value,
                   split_names) -> tuple[bool, dict]:
    """(is a token task, our split -> the dataset's split) from hub_text's options, or a one-line error."""
    if kind is not None and kind not in KINDS:
        raise SymfusionError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    token_task = kind == TOKEN_CLASSIFICATION or tokens_column is not None or tags_column is not None
    if token_task and (tokens_column is None or tags_column is None):
        raise SymfusionError("token classification needs both tokens_column and tags_column")
    if not token_task and (text_column is None or label_column is None):
        raise SymfusionError("text tasks need text_column and label_column (token tasks: tokens_column and tags_column)")
    if (domain_column is None) != (domain_value is None):
        raise SymfusionError("give domain_column and domain_value together")
    mapping = dict(split_names or DEFAULT_SPLIT_NAMES)
    if "train" not in mapping or set(mapping) - set(DEFAULT_SPLIT_NAMES):
        raise SymfusionError(f"split_names must map train (and optionally validation, test) to the dataset's splits, got {mapping}")
    return token_task, mapping


def _resolve_splits(loaded, mapping: dict, explicit: bool, dataset: str) -> dict:
    """Our splits that the dataset has; with the default mapping a missing validation/test is carved later."""
    available = list(loaded.keys())
    for ours, theirs in list(mapping.items()):
        if theirs not in loaded:
            if not explicit and ours != "train":
                del mapping[ours]
                continue
            raise SymfusionError(f"{dataset!r} has no split {theirs!r} (for our {ours}); its splits are {available}")
    return mapping


def _resolve_columns(features, explode_column, wanted: list[str], domain_column, dataset: str) -> tuple[dict, list[str]]:
    """(column -> feature of the rows `_explode` yields, the dataset columns to read), checking every name."""
    columns = _explode_features(features, explode_column)
    exploded = [] if explode_column is None else [explode_column] if isinstance(explode_column, str) else list(explode_column)
    for column in exploded:
        if column not in features:
            raise SymfusionError(f"{dataset!r} has no column {column!r} to explode; columns are {list(features)}")
    missing = [c for c in wanted if c not in columns] + ([domain_column] if domain_column and domain_column not in features else [])
    if missing:
        raise SymfusionError(f"{dataset!r} has no column(s) {missing}; columns are {sorted(columns)}")
    needed = [c for c in dict.fromkeys(wanted + [domain_column] + exploded) if c in features]
    return columns, needed


def _label_sets(columns: dict, token_task: bool, kind, label_column, tags_column, tag_map, label_map, label_names,
                source_label_names, dataset: str):
    """(kind, the source's label names, our target label names, a tag converter for token tasks)."""
    if token_task:
        names = _class_names(columns[tags_column]) or source_label_names
        target = list(label_names or (NER_TAGS if tag_map is not None else names or []))
        if not target:
            raise SymfusionError(f"tags of {dataset!r} carry no names; give source_label_names or tag_map")
        return TOKEN_CLASSIFICATION, names, target, _tag_converter(names, tag_map, target, dataset)
    label_feature = columns[label_column]
    if kind is None:
        kind = REGRESSION if _is_float(label_feature) else TEXT_CLASSIFICATION
    names = _class_names(label_feature) or source_label_names
    if kind == REGRESSION:
        target = None
    elif label_map is not None:
        target = list(label_names or dict.fromkeys(v for v in label_map.values() if v is not None))
    else:
        target = list(label_names or names or [])
    return kind, names, target, None


def _sequence_label(value, kind: str, names, label_map, dataset: str, counts: dict):
    """The label of one text row (a float, a class name or an id), or None when the row is dropped."""
    if kind == REGRESSION:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            counts["dropped_unlabelled"] += 1
            return None
        return float(value)
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            counts["dropped_multi_label"] += 1
            return None
        value = value[0]
    if value is None or (isinstance(value, int) and value < 0):   # -1: hidden label (GLUE test)
        counts["dropped_unlabelled"] += 1
        return None
    if isinstance(value, int) and not isinstance(value, bool) and names is not None:
        if value >= len(names):
            raise SymfusionError(f"label id {value} of {dataset!r} is outside its {len(names)} label names")
        value = names[value]
    if label_map is not None:
        if value not in label_map:
            raise SymfusionError(f"label {value!r} of {dataset!r} is missing from label_map; map it (None drops it)")
        value = label_map[value]
        if value is None:
            counts["dropped_by_label_map"] += 1
            return None
    return value


def _convert_rows(rows: list[dict], split: str, explode_column, token_task: bool, kind: str, columns: dict,
                  names, label_map, convert_tags, domain_column, domain_value, dataset: str, counts: dict) -> list[dict]:
    """One split's rows as raw examples; group = the source row, so exploded elements of a row stay together."""
    tokens_column, tags_column = columns["tokens"], columns["tags"]
    text_column, text_pair_column, label_column = columns["text"], columns["text_pair"], columns["label"]
    examples = []
    for row_index, row in enumerate(rows):
        if domain_column is not None and not _domain_matches(row[domain_column], domain_value):
            counts["rows_outside_domain"] += 1
            continue
        for element in _explode(row, explode_column):
            group = f"{split}:{row_index}"
            if token_task:
                tokens, tags = list(element[tokens_column] or []), list(element[tags_column] or [])
                if not tokens:
                    counts["dropped_empty"] += 1
                    continue
                if len(tokens) != len(tags):
                    raise SymfusionError(f"{dataset!r} row {row_index} of {split!r} has {len(tokens)} tokens but {len(tags)} tags")
                examples.append({"tokens": [str(t) for t in tokens], "tags": convert_tags(tags), "group": group})
                continue
            text = element[text_column]
            if not isinstance(text, str) or not text.strip():
                counts["dropped_empty"] += 1
                continue
            example = {"text": text}
            if text_pair_column is not None:
                example["text_pair"] = str(element[text_pair_column] or "")
            label = _sequence_label(element[label_column], kind, names, label_map, dataset, counts)
            if label is None:
                continue
            example["label"] = label
            example["group"] = group
            examples.append(example)
    return examples


def _index_labels(splits: dict[str, list[dict]], target: list[str] | None, dataset: str) -> list[str]:
    """Class names -> ids in place; without a given label set the names are sorted, so the ids are stable."""
    if not target:
        string_labels = {e["label"] for s in splits.values() for e in s if isinstance(e["label"], str)}
        target = sorted(string_labels) if string_labels else [str(i) for i in range(1 + max(e["label"] for s in splits.values() for e in s))]
    index = {name: i for i, name in enumerate(target)}
    for examples in splits.values():
        for example in examples:
            label = example["label"]
            if isinstance(label, str):
                if label not in index:
                    raise SymfusionError(f"label {label!r} of {dataset!r} is not in label_names {target}")
                example["label"] = index[label]
            elif not 0 <= label < len(target):
                raise SymfusionError(f"label id {label} of {dataset!r} is outside label_names {target}")
    return target


def hub_text(dataset: str, config: str | None = None, split_names: dict | None = None, text_column: str | None = None,
             text_pair_column: str | None = None, label_column: str | None = None, tokens_column: str | None = None,
             tags_column: str | None = None, tag_map: dict | None = None, domain_column: str | None = None,
             domain_value=None, revision: str | None = None, *, data_dir: str | None = None, explode_column=None,
             label_map: dict | None = None, label_names: list[str] | None = None,
             source_label_names: list[str] | None = None, kind: str | None = None, hf_cache_dir: str | None = None) -> dict:
    """Raw examples of a Hub (or local Parquet) dataset, in the format of symfusion.pipeline.data.text's loaders.

    split_names: our split -> the dataset's split (missing validation / test are carved from train later).
    Text classification: text_column (+ text_pair_column), label_column; label_map maps source label names
    to label_names (None drops the example); a list-valued label keeps single-label rows only.
    Regression: a float label_column (or kind="regression"). Token classification: tokens_column,
    tags_column; tag_map maps entity types (PERSON -> PER, ...), unlisted types become O, and the labels are
    O + B/I of text.NER_TAGS. domain_column / domain_value keep rows whose value equals domain_value or
    starts with "domain_value/" (OntoNotes document ids); explode_column turns a list-of-records column
    (or several parallel list columns) into one example per element. Every split of the result comes from
    the dataset's own splits; groups (the source row) keep exploded elements of one row together.
    """
    token_task, mapping = _check_options(kind, tokens_column, tags_column, text_column, label_column, domain_column,
                                         domain_value, split_names)
    if not is_local(dataset):           # a ref is read at the commit the Hub lock file pins it to
        revision = pin_revision(dataset, revision, "dataset", "options.revision of the task (conf/task/<name>.yaml)")
    loaded = _load(dataset, config, revision, data_dir, hf_cache_dir)
    mapping = _resolve_splits(loaded, mapping, split_names is not None, dataset)
    wanted = [c for c in (text_column, text_pair_column, label_column, tokens_column, tags_column) if c is not None]
    features = loaded[mapping["train"]].features
    columns, needed = _resolve_columns(features, explode_column, wanted, domain_column, dataset)
    kind, names, target, convert_tags = _label_sets(columns, token_task, kind, label_column, tags_column, tag_map,
                                                    label_map, label_names, source_label_names, dataset)
    names_of = {"tokens": tokens_column, "tags": tags_column, "text": text_column, "text_pair": text_pair_column,
                "label": label_column}
    counts = {"dropped_unlabelled": 0, "dropped_multi_label": 0, "dropped_by_label_map": 0, "dropped_empty": 0,
              "rows_outside_domain": 0}
    splits = {ours: _convert_rows(loaded[theirs].select_columns(needed).to_list(), theirs, explode_column, token_task,
                                  kind, names_of, names, label_map, convert_tags, domain_column, domain_value, dataset,
                                  counts)
              for ours, theirs in mapping.items()}
    if kind == TEXT_CLASSIFICATION:
        target = _index_labels(splits, target, dataset)
    if not splits["train"]:
        where = f" with {domain_column} = {domain_value!r}" if domain_column else ""
        raise SymfusionError(f"no training examples in {dataset!r}{where}; check the domain and column options")
    info = {"dataset": dataset, "location": "local" if is_local(dataset) else "hub", "config": config,
            "revision": revision, "data_dir": data_dir,
            "split_names": mapping, **{k: v for k, v in counts.items() if v}}
    return {"kind": kind, "label_names": target if kind != REGRESSION else None, "splits": splits, "info": info}


def load_hub_preset(preset: str, **overrides) -> dict:
    """hub_text with the options of a named preset (overrides win, e.g. dataset=<local folder>)."""
    if preset not in HUB_TEXT_PRESETS:
        raise SymfusionError(f"unknown Hub text preset {preset!r}; choose one of {', '.join(HUB_TEXT_PRESETS)}")
    accepted = set(inspect.signature(hub_text).parameters)
    unknown = sorted(set(overrides) - accepted)
    if unknown:
        raise SymfusionError(f"hub presets take hub_text options; {unknown} is not one of {', '.join(sorted(accepted))}")
    options = {**HUB_TEXT_PRESETS[preset], **overrides}
    raw = hub_text(**options)
    raw["info"]["preset"] = preset
    return raw


__all__ = ["hub_text", "load_hub_preset", "HUB_TEXT_PRESETS", "HUB_PRESET_NOTES", "EMOTION_LABELS"]
