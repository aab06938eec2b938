"""Random corruptions of a tiny checkpoint, through symfusion-match: a one-line error or a correct result,
never a traceback, never a written output for a refused input (a seeded loop, reproducible)."""
import json
import random
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from symfusion.pipeline import cli
from tiny_models import tiny_model

CASES = 40


def mutate(folder, rng: random.Random) -> str:
    """Break the checkpoint in `folder` in one random way; returns what was done."""
    weights, config_path = folder / "model.safetensors", folder / "config.json"
    kind = rng.choice(["truncate", "flip", "drop_key", "dtype", "shape", "extra_key", "config_json", "config_field"])
    if kind == "truncate":
        data = weights.read_bytes()
        weights.write_bytes(data[: rng.randrange(len(data))])
    elif kind == "flip":
        data = bytearray(weights.read_bytes())
        header = int.from_bytes(data[:8], "little") + 8
        for _ in range(rng.randint(1, 8)):                   # in the header half of the time, else in the data
            position = rng.randrange(header) if rng.random() < 0.5 else rng.randrange(header, len(data))
            data[position] ^= 1 << rng.randrange(8)
        weights.write_bytes(bytes(data))
    else:
        state = load_file(str(weights)) if kind != "config_json" and kind != "config_field" else None
        key = rng.choice(sorted(state)) if state else None
        if kind == "drop_key":
            del state[key]
        elif kind == "dtype":
            state[key] = state[key].to(rng.choice([torch.int32, torch.int8, torch.float16, torch.bool, torch.float64]))
        elif kind == "shape":
            tensor = state[key]
            state[key] = tensor.flatten()[: max(1, tensor.numel() // 2)] if rng.random() < 0.5 else \
                torch.cat([tensor.flatten(), tensor.flatten()[:1]])
        elif kind == "extra_key":
            state[f"bert.encoder.layer.9.rogue_{rng.randrange(100)}"] = torch.zeros(3)
        elif kind == "config_json":
            text = config_path.read_text()
            config_path.write_text(text[: rng.randrange(len(text))])
        elif kind == "config_field":
            config = json.loads(config_path.read_text())
            field = rng.choice(["hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                                "model_type", "vocab_size"])
            config[field] = rng.choice([0, 3, 7, 64, "gpt9", None, -1])
            config_path.write_text(json.dumps(config))
        if state is not None:
            save_file(state, str(weights), metadata={"format": "pt"})
    return kind


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    tiny_model("bert", seed=1).save_pretrained(str(root / "anchor"))
    tiny_model("bert", seed=2).save_pretrained(str(root / "source"))
    return root


@pytest.mark.parametrize("case", range(CASES))
def test_a_corrupted_checkpoint_gives_one_line_or_a_correct_result(pair, tmp_path, capsys, case):
    rng = random.Random(case)
    source = tmp_path / "source"
    shutil.copytree(pair / "source", source)
    kind = mutate(source, rng)
    output = tmp_path / "out"
    try:
        code = cli.command_line("match", cli.match_command,
                                [f"source={source}", f"anchor={pair / 'anchor'}", f"output={output}"])
    except SystemExit as exit_info:                # the stage's one-line errors exit through report_errors
        code = exit_info.code
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), (kind, err)
    if code == 2:
        assert len(err.splitlines()) == 1 and err.startswith("error:"), (kind, err)
        assert not output.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["source"], kind
    else:                                          # accepted: then it is a correct matched model
        report = json.loads((output / "match.json").read_text())
        assert report["relative_output_change"] < 1e-3, kind
