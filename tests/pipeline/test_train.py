"""Training from scratch: learns a separable task, is seeded, and resumes after an interruption exactly."""
import json
import math

import pytest
import torch
import transformers
from safetensors.torch import load_file

import symfusion.pipeline.tasks.image as train_module
from symfusion.pipeline.data.images import ImageDataset
from symfusion.errors import SymfusionError
from symfusion.pipeline.tasks.image import evaluate_image_classifier, train_image_classifier, vit_config
from symfusion.pipeline.training import evaluation_precision, loader_options, warmup_cosine

MODEL = dict(patch_size=4, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24)


def toy_splits(n=96):
    """Two classes told apart by the sign of the image mean: learnable in a few steps."""
    gen = torch.Generator().manual_seed(0)
    labels = torch.arange(n) % 2
    pixels = torch.randn(n, 1, 8, 8, generator=gen) * 0.5 + (labels.float() * 2 - 1)[:, None, None, None]
    data = ImageDataset(pixels, labels)
    return {"train": data, "validation": ImageDataset(pixels[:32], labels[:32])}


def train(tmp_path, name, epochs=3, seed=0, precision="auto"):
    return train_image_classifier(str(tmp_path / name), toy_splits(), MODEL, seed=seed, epochs=epochs,
                                  batch_size=16, lr=3e-3, weight_decay=0.0, warmup_ratio=0.1, precision=precision)


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_schedule_warms_up_then_decays_to_zero():
    factors = [warmup_cosine(s, 100, 0.1) for s in range(101)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:])) and factors[100] == pytest.approx(0.0)


def test_training_learns_and_writes_a_model_folder(tmp_path):
    report = train(tmp_path, "model")
    assert report["validation_accuracy"] > 0.9
    assert (tmp_path / "model" / "config.json").is_file()
    assert json.loads((tmp_path / "model" / "train.json").read_text())["best_epoch"] == report["best_epoch"]
    assert not (tmp_path / ".model.checkpoint").exists()        # removed after success


def test_same_seed_same_weights_other_seed_other_weights(tmp_path):
    train(tmp_path, "a", epochs=1), train(tmp_path, "b", epochs=1), train(tmp_path, "c", epochs=1, seed=1)
    a, b, c = weights(tmp_path / "a"), weights(tmp_path / "b"), weights(tmp_path / "c")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_interrupted_run_resumes_from_its_checkpoint_to_identical_weights(tmp_path, monkeypatch):
    uninterrupted = train(tmp_path, "full")
    real_evaluate, calls = train_module.evaluate_image_classifier, []

    def interrupt_in_second_epoch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(train_module, "evaluate_image_classifier", interrupt_in_second_epoch)
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, "resumed")
    assert not (tmp_path / "resumed").exists() and (tmp_path / ".resumed.checkpoint").is_dir()
    monkeypatch.setattr(train_module, "evaluate_image_classifier", real_evaluate)
    report = train(tmp_path, "resumed")
    assert report["resumed_after_epoch"] == 1
    assert report["history"] == uninterrupted["history"]
    full, resumed = weights(tmp_path / "full"), weights(tmp_path / "resumed")
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_a_checkpoint_of_another_configuration_is_ignored(tmp_path, monkeypatch):
    real_evaluate = train_module.evaluate_image_classifier
    monkeypatch.setattr(train_module, "evaluate_image_classifier",
                        lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path, "model", seed=5)
    monkeypatch.setattr(train_module, "evaluate_image_classifier", real_evaluate)
    assert train(tmp_path, "model", seed=0)["resumed_after_epoch"] is None


def test_bad_model_configs_are_refused(tmp_path):
    with pytest.raises(SymfusionError, match="lacks"):
        train_image_classifier(str(tmp_path / "m"), toy_splits(), {"patch_size": 4}, 0, 1, 16, 1e-3, 0.0, 0.1)
    with pytest.raises(SymfusionError, match="divisible by patch_size"):
        train_image_classifier(str(tmp_path / "m"), toy_splits(), dict(MODEL, patch_size=3), 0, 1, 16, 1e-3, 0.0, 0.1)


def test_a_resumed_run_with_the_gpus_loader_workers_reaches_the_same_weights(tmp_path, monkeypatch):
    """The DataLoader options a GPU gets in the text trainers (worker processes), on the CPU, in the image trainer in
    place of its single-process batches: resuming must not shuffle otherwise."""
    gpu_options = {k: v for k, v in loader_options(torch.device("cuda")).items() if k != "pin_memory"}
    assert gpu_options["num_workers"] >= 1
    monkeypatch.setattr(train_module, "shuffled_batches", lambda data, size, generator, device: torch.utils.data.DataLoader(
        data, batch_size=size, shuffle=True, generator=generator, drop_last=True, **gpu_options))
    test_interrupted_run_resumes_from_its_checkpoint_to_identical_weights(tmp_path, monkeypatch)


def test_the_bf16_autocast_path_trains_and_saves_float32_weights(tmp_path):
    """The path GPUs take by default (bfloat16 autocast), run on the CPU so that it cannot rot."""
    report = train_image_classifier(str(tmp_path / "bf16"), toy_splits(), MODEL, seed=0, epochs=3, batch_size=16,
                                    lr=3e-3, weight_decay=0.0, warmup_ratio=0.1, precision="bf16")
    assert report["bf16_autocast"] is True and report["validation_accuracy"] > 0.9
    assert all(t.dtype == torch.float32 for t in weights(tmp_path / "bf16").values())
    fp32 = train(tmp_path, "fp32", epochs=1, precision="fp32")      # auto would be bf16 on a GPU
    assert json.loads((tmp_path / "fp32" / "train.json").read_text())["bf16_autocast"] is False
    assert fp32["validation_accuracy"] > 0.5


def test_image_evaluation_is_the_mean_of_its_per_example_record_whatever_the_batching():
    """accuracy = mean of the hits; loss = fsum of the per-example cross-entropies / n (each checked against a
    one-image forward), so a batch size that only regroups the images cannot move the reported means."""
    data = toy_splits(37)["train"]
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification(vit_config(MODEL, data.image_shape, 2)).eval()
    for batch_size in (5, 37):
        result = evaluate_image_classifier(model, data, batch_size=batch_size)
        record = result["per_example"]
        assert result["n"] == len(record["loss"]) == len(record["correct"]) == 37
        assert result["accuracy"] == sum(record["correct"]) / 37
        assert result["loss"] == math.fsum(record["loss"]) / 37
        for i in (0, 17, 36):
            with torch.inference_mode():
                logits = model(pixel_values=data.pixels[i:i + 1]).logits.double()
            assert record["loss"][i] == pytest.approx(
                torch.nn.functional.cross_entropy(logits, data.labels[i:i + 1]).item(), rel=1e-6)
            assert record["correct"][i] == int(logits.argmax(-1).item() == data.labels[i].item())


def test_evaluations_score_in_float32_unless_bf16_is_asked_for():
    """`auto` trains under bfloat16 on a GPU but every evaluation scores in float32 (no autocast, no TF32: bf16
    ties close predictions); `bf16` keeps autocast (how the CPU tests keep that path alive)."""
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(3, 8)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    for device in [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else []):
        layer.to(device)
        for precision, dtype in (("auto", torch.float32), ("fp32", torch.float32), ("bf16", torch.bfloat16)):
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = True          # as training under `auto` leaves it
            with evaluation_precision(precision, device):
                assert layer(x.to(device)).dtype == dtype
                if device.type == "cuda":
                    assert torch.backends.cuda.matmul.allow_tf32 == (precision == "bf16")
            if device.type == "cuda":
                assert torch.backends.cuda.matmul.allow_tf32            # restored after
    torch.backends.cuda.matmul.allow_tf32 = tf32                        # as the test found it
    with pytest.raises(SymfusionError, match="precision='half'"):
        with evaluation_precision("half", torch.device("cpu")):
            pass


def test_training_batches_are_dataloaders_batches_taken_by_one_gather():
    """shuffled_batches gives, over several epochs, the very batches (and the very draws of the shared generator,
    augmentation included) that DataLoader(shuffle=True, drop_last=True) stacks image by image."""
    data = ImageDataset(torch.randn(300, 3, 8, 8), torch.randint(0, 10, (300,)))

    def epochs(gathered: bool):
        generator = torch.Generator().manual_seed(3)
        loader = (train_module.shuffled_batches(data, 64, generator, torch.device("cpu")) if gathered else
                  torch.utils.data.DataLoader(data, batch_size=64, shuffle=True, generator=generator, drop_last=True))
        seen = [(train_module.augment(batch["pixel_values"], generator), batch["labels"])
                for _ in range(3) for batch in loader]
        return seen, len(loader), generator.get_state()

    (stacked, stacked_steps, stacked_state), (gathered, gathered_steps, gathered_state) = epochs(False), epochs(True)
    assert stacked_steps == gathered_steps == 4 and len(gathered) == 12
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(stacked, gathered))
    assert torch.equal(stacked_state, gathered_state)
