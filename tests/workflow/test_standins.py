"""The rehearsal stand-ins: built offline and deterministically, loaded through the paper profile's own code paths."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets                   # the pipeline extra's: a failed import fails the file, never skips it
import pytest
import torch
import transformers
from omegaconf import OmegaConf

from symfusion.pipeline.config import load_group
from symfusion.pipeline.basemodels import resolve_base
from symfusion.pipeline.data import load_image_splits
from symfusion.pipeline.data.text import NER_TAGS, load_text_splits
from symfusion.pipeline.data.text.hub import EMOTION_LABELS, HUB_TEXT_PRESETS
from symfusion.errors import SymfusionError
from symfusion.io.modelio import load_model
from symfusion.pipeline.data.standins import MARKER, MODELS, TASKS, build_standins, load_manifest, random_bio

ROOT = Path(__file__).resolve().parents[2]
PAPER = OmegaConf.load(ROOT / "conf" / "profile" / "paper.yaml")


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    """The stand-ins written by the script itself (a subprocess, as the workflow would run it)."""
    output = tmp_path_factory.mktemp("standins") / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_standins.py"), str(output)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return output


@pytest.fixture(scope="module")
def manifest(standins):
    return load_manifest(standins)


def _task(name: str):
    """conf/task/<name>.yaml with its bases merged in (the library's one rule, through load_group)."""
    return load_group("task", name)


# ---------------------------------------------------------------------------------------------- the folder

@pytest.mark.slow
def test_manifest_covers_the_paper_profile_exactly(manifest, standins):
    language = PAPER.language
    paper_tasks = {PAPER.vision.task, *language.emotion, *language.ner, language.ner_ood, *language.glue}
    assert set(manifest["tasks"]) == paper_tasks == set(TASKS)
    assert set(manifest["models"]) == set(language.models) == set(MODELS)
    for entry in [*manifest["models"].values(), *(t["options"] for t in manifest["tasks"].values())]:
        path = Path(entry.get("base_model") or entry.get("dataset"))
        assert path.is_absolute() and path.is_dir() and standins.resolve() in path.parents
    assert (ROOT / "conf" / "model" / f"{manifest['vision_model']}.yaml").is_file()
    assert not [p for p in standins.rglob("*") if p.suffix in (".bin", ".h5", ".pt", ".pkl", ".pickle")]


@pytest.mark.slow
def test_rebuild_is_a_no_op_and_another_folder_is_byte_identical(standins, manifest, tmp_path):
    stamps = {p: p.stat().st_mtime_ns for p in standins.rglob("*") if p.is_file()}
    assert build_standins(standins) == manifest                            # up to date: left alone
    assert stamps == {p: p.stat().st_mtime_ns for p in standins.rglob("*") if p.is_file()}
    again = build_standins(tmp_path / "again")
    assert again["files"] == manifest["files"] and again["fingerprint"] == manifest["fingerprint"]
    (tmp_path / "again" / "models" / "roberta_base" / "vocab.json").write_text("{}")   # tampered -> rebuilt
    assert build_standins(tmp_path / "again")["files"] == manifest["files"]


def test_refuses_folders_it_did_not_make(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(SymfusionError, match=f"not made by make_standins.*{MARKER}") as error:
        build_standins(foreign)
    assert "\n" not in str(error.value) and (foreign / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign"]          # nothing written beside it
    (tmp_path / "file").write_text("x")
    with pytest.raises(SymfusionError, match="is a file"):
        build_standins(tmp_path / "file")
    with pytest.raises(SymfusionError, match="run `python scripts/make_standins.py"):
        load_manifest(foreign)


def test_random_bio_is_valid_iob2():
    import random

    rng = random.Random(0)
    for _ in range(200):
        tags = random_bio(rng, rng.randint(1, 30), ["PER", "ORG"], rate=0.4)
        for previous, tag in zip(["O"] + tags, tags):
            assert tag == "O" or tag.startswith("B-") or previous[2:] == tag[2:] != ""


# ---------------------------------------------------------------------------------------------- models

def test_roberta_standin_is_roberta_base_scaled_down(manifest):
    folder = Path(manifest["models"]["roberta_base"]["base_model"])
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "vocab.json", "merges.txt",
                                                  "tokenizer.json", "tokenizer_config.json"}
    record = resolve_base(str(folder), revision=OmegaConf.load(ROOT / "conf/model/roberta_base.yaml").revision)
    assert record.source == "local" and record.weights == ("model.safetensors",)
    model = load_model(folder)
    assert type(model).__name__ == "RobertaForMaskedLM"
    config = model.config
    # FacebookAI/roberta-base's flags (docs/data_card.md)
    assert (config.model_type, config.max_position_embeddings, config.type_vocab_size, config.layer_norm_eps,
            config.pad_token_id, config.bos_token_id, config.eos_token_id, config.hidden_act) == (
        "roberta", 514, 1, 1e-5, 1, 0, 2, "gelu")
    assert config.hidden_size // config.num_attention_heads * config.num_attention_heads == config.hidden_size
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(tokenizer).__name__ == "RobertaTokenizer" and len(tokenizer) == config.vocab_size
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2, 3)
    assert tokenizer.mask_token == "<mask>" and tokenizer.mask_token_id == config.vocab_size - 1
    encoded = tokenizer("Police said the fire was lit.", "It spread quickly.")["input_ids"]
    assert encoded[0] == 0 and encoded[-1] == 2 and encoded.count(2) == 3           # <s> A </s></s> B </s>
    assert "Ġsaid" in tokenizer.convert_ids_to_tokens(encoded)                         # byte-level BPE: space marker


def test_deberta_standin_is_deberta_v3_large_scaled_down(manifest):
    import sentencepiece

    folder = Path(manifest["models"]["deberta_v3_large"]["base_model"])
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "spm.model",
                                                  "tokenizer_config.json"}        # no tokenizer.json, as on the Hub
    assert json.loads((folder / "tokenizer_config.json").read_text()) == {"do_lower_case": False, "vocab_type": "spm"}
    raw = json.loads((folder / "config.json").read_text())
    assert "architectures" not in raw and raw["pos_att_type"] == "p2c|c2p"
    record = resolve_base(str(folder))
    assert record.source == "local" and record.weights == ("model.safetensors",)
    model = load_model(folder)
    assert type(model).__name__ == "DebertaV2Model"
    config = model.config
    # DeBERTa-v3-large's relative-attention settings (microsoft/DeBERTa rtd_large.json, docs/data_card.md)
    assert (config.relative_attention, config.position_buckets, config.norm_rel_ebd, config.share_att_key,
            list(config.pos_att_type), config.max_relative_positions, config.position_biased_input,
            config.type_vocab_size, config.layer_norm_eps, config.max_position_embeddings) == (
        True, 256, "layer_norm", True, ["p2c", "c2p"], -1, False, 0, 1e-7, 512)
    assert model.encoder.rel_embeddings.weight.shape[0] == 2 * 256             # position buckets, as in the real model
    assert config.num_attention_heads == 16 and config.attention_head_size * 16 == config.hidden_size
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    pieces = processor.get_piece_size()
    assert [processor.id_to_piece(i) for i in range(4)] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]
    assert config.vocab_size == pieces + 100                                     # 128,000 + 100 in the real model
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    assert type(tokenizer).__name__ == "DebertaV2Tokenizer" and tokenizer.mask_token_id == pieces
    for text in ("The Australian government said on Tuesday, 42 people were killed.", "Zyxx qwv  unseen\twords"):
        # the converted (fast) tokenizer agrees with SentencePiece itself (the slow reference)
        assert tokenizer(text)["input_ids"] == [1, *processor.encode(text), 2]
    assert tokenizer("a b", "c")["input_ids"] == [1, *processor.encode("a b"), 2, *processor.encode("c"), 2]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_standin_models_take_the_paper_heads(manifest, name):
    folder = manifest["models"][name]["base_model"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    batch = tokenizer(["Fires burned near Sydney.", "Rain"], padding=True, return_tensors="pt")
    for cls, labels in ((transformers.AutoModelForSequenceClassification, 7),
                        (transformers.AutoModelForTokenClassification, len(NER_TAGS))):
        torch.manual_seed(0)
        model = cls.from_pretrained(folder, num_labels=labels, local_files_only=True).eval()
        with torch.no_grad():
            logits = model(**batch).logits
        assert logits.shape[-1] == labels and torch.isfinite(logits).all()


# ---------------------------------------------------------------------------------------------- datasets

EXPECTED_LABELS = {"emo_dair": EMOTION_LABELS, "emo_tweeteval": EMOTION_LABELS, "emo_goemotions": EMOTION_LABELS,
                   "emo_dailydialog": EMOTION_LABELS, "conll2003": NER_TAGS, "glue_cola": ["unacceptable", "acceptable"],
                   "glue_stsb": None, **{f"onto_{d}": NER_TAGS for d in ("bc", "bn", "mz", "nw", "tc", "wb")}}


@pytest.mark.parametrize("task", sorted(t for t in TASKS if t != "cifar10"))
def test_every_text_standin_gives_splits_through_its_preset(manifest, task, tmp_path):
    config = _task(task)
    options = OmegaConf.to_container(config.options)
    swapped = {**options, **manifest["tasks"][task]["options"]}
    assert set(swapped) - set(options) <= {"dataset"} and swapped["preset"] == options["preset"]   # only the location
    splits = load_text_splits("hub_preset", seed=0, hf_cache_dir=str(tmp_path), **swapped)
    assert splits.kind == config.kind and splits.label_names == EXPECTED_LABELS[task]
    assert set(splits.splits) == {"train", "validation", "test"}
    assert all(len(examples) >= 5 for examples in splits.splits.values())
    assert len(splits.splits["train"]) >= 24
    preset = HUB_TEXT_PRESETS[options["preset"]]
    assert splits.info["location"] == "local" and splits.info["revision"] == preset.get("revision")
    if config.kind == "token_classification":
        labels = {t for e in splits.splits["train"] for t in e["tags"]}
        assert labels <= set(range(len(NER_TAGS))) and len(labels) > 1
    elif config.kind == "regression":
        assert all(0.0 <= e["label"] <= 5.0 for e in splits.splits["test"])        # GLUE validation: visible labels


SCHEMAS = {   # Hub id -> (config or None, data_dir or None, splits, {column: the feature, as `datasets` prints it})
    "dair-ai/emotion": ("split", None, {"train", "validation", "test"}, {
        "text": "Value('string')",
        "label": "ClassLabel(names=['sadness', 'joy', 'love', 'anger', 'fear', 'surprise'])"}),
    "cardiffnlp/tweet_eval": ("emotion", None, {"train", "validation", "test"}, {
        "text": "Value('string')", "label": "ClassLabel(names=['anger', 'joy', 'optimism', 'sadness'])"}),
    "li2017dailydialog/daily_dialog": (None, "default", {"train", "validation", "test"}, {
        "dialog": "List(Value('string'))",
        "act": "List(ClassLabel(names=['__dummy__', 'inform', 'question', 'directive', 'commissive']))",
        "emotion": "List(ClassLabel(names=['no emotion', 'anger', 'disgust', 'fear', 'happiness', 'sadness', "
                   "'surprise']))"}),
    "eriktks/conll2003": (None, "conll2003", {"train", "validation", "test"}, {
        "id": "Value('string')", "tokens": "List(Value('string'))",
        "ner_tags": "List(ClassLabel(names=['O', 'B-PER', 'I-PER', 'B-ORG', 'I-ORG', 'B-LOC', 'I-LOC', 'B-MISC', "
                    "'I-MISC']))"}),
    "nyu-mll/glue": ("stsb", None, {"train", "validation", "test"}, {
        "sentence1": "Value('string')", "sentence2": "Value('string')", "label": "Value('float32')",
        "idx": "Value('int32')"}),
    "uoft-cs/cifar10": (None, None, {"train", "test"}, {
        "img": "Image(mode=None, decode=True)",
        "label": "ClassLabel(names=['airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog', 'horse', 'ship', "
                 "'truck'])"}),
}


@pytest.mark.parametrize("hub_id", sorted(SCHEMAS))
def test_standin_schemas_are_the_hub_schemas(manifest, hub_id, tmp_path):
    config, data_dir, splits, columns = SCHEMAS[hub_id]
    loaded = datasets.load_dataset(manifest["stands_in_for"]["datasets"][hub_id], config, data_dir=data_dir,
                                   cache_dir=str(tmp_path))
    assert set(loaded) == splits
    features = loaded["train"].features
    for column, feature in columns.items():
        assert repr(features[column]) == feature, column
    assert set(columns) <= set(features)


def test_ontonotes_and_go_emotions_schemas(manifest, tmp_path):
    hub = manifest["stands_in_for"]["datasets"]
    onto = datasets.load_dataset(hub["ontonotes/conll2012_ontonotesv5"], data_dir="english_v4", cache_dir=str(tmp_path))
    sentence = onto["train"].features["sentences"].feature
    assert set(sentence) == {"part_id", "words", "pos_tags", "parse_tree", "predicate_lemmas", "predicate_framenet_ids",
                             "word_senses", "speaker", "named_entities", "srl_frames", "coref_spans"}
    assert len(sentence["named_entities"].feature.names) == 37 and len(sentence["pos_tags"].feature.names) == 49
    assert repr(sentence["coref_spans"]) == "List(List(Value('int32'), length=3))"
    genres = {row.split("/")[0] for split in onto.values() for row in split["document_id"]}
    assert genres == {"bc", "bn", "mz", "nw", "tc", "wb"}
    go = datasets.load_dataset(hub["google-research-datasets/go_emotions"], "simplified", cache_dir=str(tmp_path))
    labels = go["train"].features["labels"].feature
    assert len(labels.names) == 28 and labels.names[-1] == "neutral" and set(go["train"].features) == {"text", "labels", "id"}
    cola = datasets.load_dataset(hub["nyu-mll/glue"], "cola", cache_dir=str(tmp_path))
    assert set(cola["test"]["label"]) == {-1}                                   # GLUE test labels are hidden


def test_cifar10_standin_through_the_image_loader(manifest):
    options = {**OmegaConf.to_container(_task("cifar10").options), **manifest["tasks"]["cifar10"]["options"]}
    splits = load_image_splits("hub", seed=0, **options)
    assert set(splits) == {"train", "validation", "test"}
    pixels, labels = splits["train"].pixels, splits["train"].labels
    assert tuple(pixels.shape[1:]) == (3, 32, 32) and len(splits["test"]) == 40
    assert len(splits["train"]) + len(splits["validation"]) == 120
    assert int(labels.min()) >= 0 and int(labels.max()) <= 9 and len(set(labels.tolist())) > 5
