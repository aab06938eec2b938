"""A byte-level BPE tokenizer trained offline on a text split with the `tokenizers` library, as a transformers tokenizer.

The kind GPT-2 and SmolLM2 use: text is split as GPT-2 splits it (no prefix space) into its UTF-8 bytes, which are
merged by the learned BPE merges, so every string has a tokenisation (no unknown token). One special token,
`<|endoftext|>` (id 0), ends each document, and is the tokenizer's bos, eos and pad token. Training is deterministic:
the same texts and settings give the same tokenizer.json, whatever the number of threads (tests/pipeline/test_causal_lm.py).
"""
from __future__ import annotations

import hashlib

from symfusion.errors import SymfusionError

END_OF_TEXT = "<|endoftext|>"


def train_bpe(texts: list[str], vocab_size: int, min_frequency: int = 2):
    """A transformers fast tokenizer of at most `vocab_size` tokens (the 256 byte symbols and <|endoftext|> among
    them), trained on `texts`; merges need `min_frequency` occurrences."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not isinstance(vocab_size, int) or vocab_size < 258:
        raise SymfusionError(f"tokenizer.vocab_size={vocab_size!r}: a byte-level BPE needs at least 258 tokens "
                             "(256 bytes, <|endoftext|> and one merge)")
    if not texts:
        raise SymfusionError("the tokenizer's training split is empty; check the task's corpora")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                                   pad_token=END_OF_TEXT)


def tokenizer_digest(tokenizer) -> str:
    """sha256 of a fast tokenizer's whole definition (tokenizer.json: vocabulary, merges, normaliser, specials)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise SymfusionError(f"{type(tokenizer).__name__} is not a fast tokenizer; causal_lm tasks need tokenizer.json")
    return hashlib.sha256(backend.to_str().encode()).hexdigest()


def tokenizer_from_json(text: str):
    """The tokenizer `train_bpe` returned, from its tokenizer.json text (tokenizer_digest is unchanged)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(text), bos_token=END_OF_TEXT,
                                   eos_token=END_OF_TEXT, pad_token=END_OF_TEXT)
