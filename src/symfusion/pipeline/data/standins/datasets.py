"""Stand-in datasets: small local Parquet folders with each Hub dataset's files, columns, feature types,
ClassLabel names and split names; text from gensim's Lee corpus, labels random but valid."""
from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np

from symfusion.pipeline.data.text.corpora import gensim_test_file
from symfusion.pipeline.data.text.hub import (CONLL2003_TAGS, GOEMOTIONS_NAMES, HUB_TEXT_PRESETS, ONTONOTES_DOMAINS,
                                              ONTONOTES_TAGS)

ROWS = {"train": 48, "validation": 24, "test": 24}        # text rows (or sentences) per split
IMAGE_ROWS = {"train": 120, "test": 40}                     # CIFAR-10 has no validation split

# ---------------------------------------------------------------------------------------------- datasets
ONTONOTES_POS = ["XX", "``", "$", "''", ",", "-LRB-", "-RRB-", ".", ":", "ADD", "AFX", "CC", "CD", "DT", "EX", "FW",
                 "HYPH", "IN", "JJ", "JJR", "JJS", "LS", "MD", "NFP", "NN", "NNP", "NNPS", "NNS", "PDT", "POS", "PRP",
                 "PRP$", "RB", "RBR", "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT",
                 "WP", "WP$", "WRB"]                                                    # english_v4: 49 tags
CONLL2003_POS = ['"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR",
                 "JJS", "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$", "RB", "RBR",
                 "RBS", "RP", "SYM", "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB"]
CONLL2003_CHUNKS = ["O"] + [f"{p}-{t}" for t in ("ADJP", "ADVP", "CONJP", "INTJ", "LST", "NP", "PP", "PRT", "SBAR",
                                                 "UCP", "VP") for p in ("B", "I")]
DAILYDIALOG_ACTS = ["__dummy__", "inform", "question", "directive", "commissive"]
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# OntoNotes document ids are <genre>/<source>/<nn>/<name> (e.g. bc/cctv/00/cctv_0001); one source per genre here
ONTONOTES_SOURCES = {"bc": "cctv", "bn": "cnn", "mz": "sinorama", "nw": "wsj", "tc": "ch", "wb": "eng"}
ONTONOTES_DOCUMENTS = {"train": 3, "validation": 2, "test": 2}     # per genre; 8 sentences each

HUB_DATASETS = {   # Hub id -> (local folder name, what the folder holds)
    "dair-ai/emotion": "dair-ai__emotion",
    "cardiffnlp/tweet_eval": "cardiffnlp__tweet_eval",
    "google-research-datasets/go_emotions": "google-research-datasets__go_emotions",
    "li2017dailydialog/daily_dialog": "li2017dailydialog__daily_dialog",
    "ontonotes/conll2012_ontonotesv5": "ontonotes__conll2012_ontonotesv5",
    "eriktks/conll2003": "eriktks__conll2003",
    "nyu-mll/glue": "nyu-mll__glue",
    "uoft-cs/cifar10": "uoft-cs__cifar10",
}
TASKS = {   # conf/task name of the paper profile -> the Hub dataset it reads
    "emo_dair": "dair-ai/emotion", "emo_tweeteval": "cardiffnlp/tweet_eval",
    "emo_goemotions": "google-research-datasets/go_emotions", "emo_dailydialog": "li2017dailydialog/daily_dialog",
    **{f"onto_{d}": "ontonotes/conll2012_ontonotesv5" for d in ONTONOTES_DOMAINS},
    "conll2003": "eriktks/conll2003", "glue_cola": "nyu-mll/glue", "glue_stsb": "nyu-mll/glue",
    "cifar10": "uoft-cs/cifar10",
}


# ---------------------------------------------------------------------------------------------- local text

def corpus_sentences() -> list[str]:
    """Sentences of gensim's Lee background corpus (300 Australian news articles, read as latin-1)."""
    path = gensim_test_file("lee_background.cor")
    lines = [" ".join(line.decode("latin-1").split()) for line in path.read_bytes().splitlines() if line.strip()]
    sentences = [s for line in lines for s in re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", line)]
    return [s for s in sentences if 4 <= len(s.split()) <= 40]


def words_of(sentence: str) -> list[str]:
    """Whitespace words with trailing punctuation split off (CoNLL-style tokens)."""
    return [piece for word in sentence.split() for piece in re.findall(r"[\w'&$%-]+|[^\w\s]", word)]


def random_bio(rng: random.Random, length: int, types: list[str], rate: float = 0.2) -> list[str]:
    """A valid IOB2 tag sequence: entities of 1-3 tokens of random types, O elsewhere."""
    tags, i = [], 0
    while i < length:
        if rng.random() < rate:
            kind, span = rng.choice(types), rng.randint(1, 3)
            span = min(span, length - i)
            tags += [f"B-{kind}"] + [f"I-{kind}"] * (span - 1)
            i += span
        else:
            tags.append("O")
            i += 1
    return tags


def _entity_types(names: list[str]) -> list[str]:
    return sorted({name[2:] for name in names if name.startswith("B-")})


# ---------------------------------------------------------------------------------------------- writers

def _features(spec: dict):
    import datasets

    return datasets.Features(spec)


def _write_parquet(path: Path, rows: list[dict], features) -> None:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    columns = {name: [row[name] for row in rows] for name in features}
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))


def _write_card(folder: Path, hub_id: str, configs: list[tuple[str, list[str], bool]], note: str) -> None:
    """README.md with the Hub card's `configs:` block: (config name, its splits, default?) -> <config>/<split>-*."""
    lines = ["---", "configs:"]
    for name, splits, default in configs:
        lines += [f"- config_name: {name}", "  data_files:"]
        for split in splits:
            lines += [f"  - split: {split}", f"    path: {name}/{split}-*"]
        if default:
            lines.append("  default: true")
    lines += ["---", f"# Stand-in for {hub_id}", "", note, ""]
    (folder / "README.md").write_text("\n".join(lines))


class _Text:
    """Seeded draws of corpus sentences."""

    def __init__(self, sentences: list[str], seed: int):
        self.sentences, self.rng = sentences, random.Random(seed)

    def sentence(self) -> str:
        return self.rng.choice(self.sentences)


def write_dair_emotion(folder: Path, text: _Text) -> None:
    features = _features({"text": _value("string"), "label": _class_label(HUB_TEXT_PRESETS["emotion_dair"]["source_label_names"])})
    for split, n in ROWS.items():
        rows = [{"text": text.sentence().lower(), "label": text.rng.randrange(6)} for _ in range(n)]
        _write_parquet(folder / "split" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "dair-ai/emotion", [("split", list(ROWS), True)], "Config `split` only (the real repository also has `unsplit`).")


def write_tweet_eval(folder: Path, text: _Text) -> None:
    names = HUB_TEXT_PRESETS["emotion_tweeteval"]["source_label_names"]
    features = _features({"text": _value("string"), "label": _class_label(names)})
    for split, n in ROWS.items():
        rows = [{"text": text.sentence(), "label": text.rng.randrange(len(names))} for _ in range(n)]
        _write_parquet(folder / "emotion" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "cardiffnlp/tweet_eval", [("emotion", list(ROWS), False)],
                "Config `emotion` only (the real repository has one config per TweetEval task).")


def write_go_emotions(folder: Path, text: _Text) -> None:
    import datasets

    features = _features({"text": _value("string"), "labels": datasets.List(_class_label(GOEMOTIONS_NAMES)),
                          "id": _value("string")})
    for split, n in ROWS.items():
        rows = []
        for _ in range(n):
            count = 1 if text.rng.random() < 0.8 else text.rng.randint(2, 3)      # most comments carry one label
            labels = sorted(text.rng.sample(range(len(GOEMOTIONS_NAMES)), count))
            rows.append({"text": text.sentence(), "labels": labels,
                         "id": "".join(text.rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(7))})
        _write_parquet(folder / "simplified" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "google-research-datasets/go_emotions", [("simplified", list(ROWS), True)],
                "Config `simplified` only (the real repository also has `raw`).")


def write_daily_dialog(folder: Path, text: _Text) -> None:
    """The Parquet export layout (refs/convert/parquet): default/<split>/0000.parquet."""
    import datasets

    emotions = HUB_TEXT_PRESETS["emotion_dailydialog"]["source_label_names"]
    features = _features({"dialog": datasets.List(_value("string")), "act": datasets.List(_class_label(DAILYDIALOG_ACTS)),
                          "emotion": datasets.List(_class_label(emotions))})
    for split, n in ROWS.items():
        rows, utterances = [], 0
        while utterances < n:
            turns = text.rng.randint(2, 6)
            rows.append({"dialog": [text.sentence() for _ in range(turns)],
                         "act": [text.rng.randint(1, 4) for _ in range(turns)],          # 0 (__dummy__) never occurs
                         "emotion": [0 if text.rng.random() < 0.5 else text.rng.randrange(7) for _ in range(turns)]})
            utterances += turns
        _write_parquet(folder / "default" / split / "0000.parquet", rows, features)


def _ontonotes_sentence(text: _Text, part_id: int) -> dict:
    rng, words = text.rng, words_of(text.sentence())
    n = len(words)
    pos = [rng.randrange(len(ONTONOTES_POS)) for _ in range(n)]
    verb = rng.randrange(n)
    lemmas = [words[i].lower() if i == verb else None for i in range(n)]
    frames = ["B-V" if i == verb else "O" for i in range(n)]
    tree = "(TOP (S " + " ".join(f"({ONTONOTES_POS[p]} {w})" for p, w in zip(pos, words)) + "))"
    start = rng.randrange(n)
    return {"part_id": part_id, "words": words, "pos_tags": pos, "parse_tree": tree, "predicate_lemmas": lemmas,
            "predicate_framenet_ids": ["01" if i == verb else None for i in range(n)],
            "word_senses": [1.0 if i == verb else None for i in range(n)], "speaker": "-",
            "named_entities": [ONTONOTES_TAGS.index(t) for t in random_bio(rng, n, _entity_types(ONTONOTES_TAGS))],
            "srl_frames": [{"verb": words[verb], "frames": frames}],
            "coref_spans": [[rng.randrange(5), start, min(n - 1, start + rng.randint(0, 2))]]}


def write_ontonotes(folder: Path, text: _Text) -> None:
    """The Parquet export layout: english_v4/<split>/0000.parquet; documents of every genre, 8 sentences each."""
    import datasets

    sentence = {"part_id": _value("int32"), "words": datasets.List(_value("string")),
                "pos_tags": datasets.List(_class_label(ONTONOTES_POS)), "parse_tree": _value("string"),
                "predicate_lemmas": datasets.List(_value("string")),
                "predicate_framenet_ids": datasets.List(_value("string")),
                "word_senses": datasets.List(_value("float32")), "speaker": _value("string"),
                "named_entities": datasets.List(_class_label(ONTONOTES_TAGS)),
                "srl_frames": datasets.List({"verb": _value("string"), "frames": datasets.List(_value("string"))}),
                "coref_spans": datasets.List(datasets.List(_value("int32"), length=3))}
    features = _features({"document_id": _value("string"), "sentences": datasets.List(sentence)})
    number = 0
    for split, documents in ONTONOTES_DOCUMENTS.items():
        rows = []
        for genre in ONTONOTES_DOMAINS:
            source = ONTONOTES_SOURCES[genre]
            for _ in range(documents):
                rows.append({"document_id": f"{genre}/{source}/00/{source}_{number:04d}",
                             "sentences": [_ontonotes_sentence(text, k) for k in range(8)]})
                number += 1
        _write_parquet(folder / "english_v4" / split / "0000.parquet", rows, features)


def write_conll2003(folder: Path, text: _Text) -> None:
    """The Parquet export layout: conll2003/<split>/0000.parquet."""
    import datasets

    features = _features({"id": _value("string"), "tokens": datasets.List(_value("string")),
                          "pos_tags": datasets.List(_class_label(CONLL2003_POS)),
                          "chunk_tags": datasets.List(_class_label(CONLL2003_CHUNKS)),
                          "ner_tags": datasets.List(_class_label(CONLL2003_TAGS))})
    for split, n in ROWS.items():
        rows = []
        for i in range(n):
            tokens, rng = words_of(text.sentence()), text.rng
            rows.append({"id": str(i), "tokens": tokens, "pos_tags": [rng.randrange(len(CONLL2003_POS)) for _ in tokens],
                         "chunk_tags": [rng.randrange(len(CONLL2003_CHUNKS)) for _ in tokens],
                         "ner_tags": [CONLL2003_TAGS.index(t) for t in random_bio(rng, len(tokens), _entity_types(CONLL2003_TAGS))]})
        _write_parquet(folder / "conll2003" / split / "0000.parquet", rows, features)


def write_glue(folder: Path, text: _Text) -> None:
    """Configs cola and stsb; GLUE's test labels are hidden (-1)."""
    cola = _features({"sentence": _value("string"), "label": _class_label(["unacceptable", "acceptable"]),
                      "idx": _value("int32")})
    stsb = _features({"sentence1": _value("string"), "sentence2": _value("string"), "label": _value("float32"),
                      "idx": _value("int32")})
    for split, n in ROWS.items():
        hidden = split == "test"
        _write_parquet(folder / "cola" / f"{split}-00000-of-00001.parquet",
                       [{"sentence": text.sentence(), "label": -1 if hidden else text.rng.randrange(2), "idx": i}
                        for i in range(n)], cola)
        _write_parquet(folder / "stsb" / f"{split}-00000-of-00001.parquet",
                       [{"sentence1": text.sentence(), "sentence2": text.sentence(),
                         "label": -1.0 if hidden else round(text.rng.uniform(0, 5), 2), "idx": i} for i in range(n)], stsb)
    _write_card(folder, "nyu-mll/glue", [("cola", list(ROWS), False), ("stsb", list(ROWS), False)],
                "Configs `cola` and `stsb` only (the real repository has one config per GLUE task).")


def write_cifar10(folder: Path, seed: int) -> None:
    import datasets
    from PIL import Image

    features = _features({"img": datasets.Image(), "label": _class_label(CIFAR10_NAMES)})
    rng = np.random.default_rng(seed)
    for split, n in IMAGE_ROWS.items():
        pixels = rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
        rows = [{"img": Image.fromarray(image), "label": int(label)}
                for image, label in zip(pixels, rng.integers(0, 10, n))]
        _write_parquet(folder / "plain_text" / f"{split}-00000-of-00001.parquet", rows, features)
    _write_card(folder, "uoft-cs/cifar10", [("plain_text", list(IMAGE_ROWS), True)], "32x32 RGB noise, random labels.")


def _value(dtype: str):
    import datasets

    return datasets.Value(dtype)


def _class_label(names: list[str]):
    import datasets

    return datasets.ClassLabel(names=list(names))


DATASET_WRITERS = {
    "dair-ai/emotion": write_dair_emotion, "cardiffnlp/tweet_eval": write_tweet_eval,
    "google-research-datasets/go_emotions": write_go_emotions, "li2017dailydialog/daily_dialog": write_daily_dialog,
    "ontonotes/conll2012_ontonotesv5": write_ontonotes, "eriktks/conll2003": write_conll2003, "nyu-mll/glue": write_glue,
}
