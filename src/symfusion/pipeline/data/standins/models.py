"""Stand-in models: tiny random RoBERTa / DeBERTa-v3 models of the real classes and config flags, with tokenizers
of the real kinds trained offline (byte-level BPE; SentencePiece unigram)."""
from __future__ import annotations

import io
import json
from pathlib import Path

from symfusion.errors import SymfusionError


# ---------------------------------------------------------------------------------------------- models
# FacebookAI/roberta-base config.json (docs/data_card.md): flags kept, sizes scaled (real: 768, 12, 12, 3072, 50265).
ROBERTA_CONFIG = dict(architectures=["RobertaForMaskedLM"], attention_probs_dropout_prob=0.1, bos_token_id=0,
                      eos_token_id=2, hidden_act="gelu", hidden_dropout_prob=0.1, initializer_range=0.02,
                      layer_norm_eps=1e-05, max_position_embeddings=514, model_type="roberta", pad_token_id=1,
                      type_vocab_size=1)
ROBERTA_SIZE = dict(hidden_size=48, num_hidden_layers=4, num_attention_heads=12, intermediate_size=192)
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]         # ids 0-3; <mask> is the last id, as in roberta-base
# microsoft/DeBERTa experiments/language_model/rtd_large.json, the DeBERTa-v3-large discriminator (docs/data_card.md):
# every flag kept, sizes scaled (real: 1024 hidden, 24 layers, 16 heads of 64, 4096, vocab 128000 pieces + 100).
DEBERTA_CONFIG = dict(model_type="deberta-v2", attention_probs_dropout_prob=0.1, hidden_act="gelu",
                      hidden_dropout_prob=0.1, initializer_range=0.02, max_position_embeddings=512,
                      relative_attention=True, position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True,
                      pos_att_type="p2c|c2p", layer_norm_eps=1e-7, max_relative_positions=-1,
                      position_biased_input=False, type_vocab_size=0)
DEBERTA_SIZE = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=16, attention_head_size=4,
                    intermediate_size=256)
DEBERTA_EXTRA_VOCAB = 100      # DeBERTa-v3: 128,000 SentencePiece pieces, vocab_size 128,100 ([MASK] is id 128,000)
DEBERTA_TOKENIZER_CONFIG = {"do_lower_case": False, "vocab_type": "spm"}
TOKENIZER_VOCAB = 1000         # pieces / BPE tokens before the special tokens are added

MODELS = {   # conf/model name -> the Hub spec it stands in for
    "roberta_base": "hub:FacebookAI/roberta-base",
    "deberta_v3_large": "hub:microsoft/deberta-v3-large",
}


# ---------------------------------------------------------------------------------------------- tokenizers and models

def train_bpe(sentences: list[str], folder: Path):
    """A byte-level BPE (RoBERTa's kind) on the sentences: vocab.json, merges.txt, tokenizer.json, tokenizer_config.json."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(sentences, vocab_size=TOKENIZER_VOCAB, min_frequency=2, special_tokens=ROBERTA_SPECIALS,
                            show_progress=False)
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    merges = [tuple(line.split(" ")) for line in (folder / "merges.txt").read_text().splitlines()[1:] if line]
    tokenizer = transformers.RobertaTokenizer(vocab=vocab, merges=merges)      # adds <mask> as the last id
    tokenizer.save_pretrained(str(folder))
    return tokenizer


def train_spm(sentences: list[str], folder: Path) -> int:
    """A SentencePiece unigram model (DeBERTa-v3's kind: [PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3) as spm.model; its size."""
    try:
        import sentencepiece
    except ImportError as error:
        raise SymfusionError("the DeBERTa-v3 stand-in needs sentencepiece: pip install sentencepiece protobuf") from error
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=TOKENIZER_VOCAB, model_type="unigram",
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]",
        unk_piece="[UNK]", character_coverage=1.0, num_threads=1, minloglevel=2)
    (folder / "spm.model").write_bytes(model.getvalue())
    (folder / "tokenizer_config.json").write_text(json.dumps(DEBERTA_TOKENIZER_CONFIG) + "\n")
    return TOKENIZER_VOCAB


def write_roberta(folder: Path, sentences: list[str], seed: int) -> None:
    import torch
    import transformers

    folder.mkdir(parents=True)
    tokenizer = train_bpe(sentences, folder)
    config = transformers.RobertaConfig(vocab_size=len(tokenizer), **ROBERTA_SIZE,
                                        **{k: v for k, v in ROBERTA_CONFIG.items() if k != "model_type"})
    torch.manual_seed(seed)
    transformers.RobertaForMaskedLM(config).save_pretrained(str(folder))


def write_deberta(folder: Path, sentences: list[str], seed: int) -> None:
    import torch
    import transformers

    folder.mkdir(parents=True)
    pieces = train_spm(sentences, folder)
    config = {**DEBERTA_CONFIG, **DEBERTA_SIZE, "vocab_size": pieces + DEBERTA_EXTRA_VOCAB}
    torch.manual_seed(seed)
    model = transformers.DebertaV2Model(transformers.DebertaV2Config(**{k: v for k, v in config.items() if k != "model_type"}))
    model.save_pretrained(str(folder))
    # the real config.json: the flags above, no `architectures` (rtd_large.json's discriminator has none)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
