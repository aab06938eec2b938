#!/usr/bin/env bash
# The library install that the README promises library users: `pip install symfusion` with no extra, in a fresh
# virtual environment (torch==2.13.0 first, the CPU wheel), must run symfusion.align() on two model folders and on
# two nn.Modules, symfusion-match and symfusion-align-many, without any of the [pipeline] extra's packages. About 3-4 minutes (most of
# it installing torch and transformers), so CI runs it (.ci/run) rather than the test suite.
#   bash scripts/check_core_install.sh [VENV_DIR]    # default: a temporary folder, removed afterwards
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
work=$(mktemp -d)
venv=${1:-$work/venv}
trap 'rm -rf "$work"' EXIT

python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
. scripts/torch_cpu_index.sh
# shellcheck disable=SC2046   # the options split into words on purpose
"$venv/bin/python" -m pip install --quiet "torch==2.13.0" $(torch_cpu_index "$venv/bin/python") 2>&1 \
  | grep -v "^WARNING: Location" || true
"$venv/bin/python" -m pip install --quiet "$repo" 2>&1 | grep -v "^WARNING: Location" || true

cd "$work"                                  # not the checkout: the installed package, not src/, is imported
"$venv/bin/python" - <<'EOF'
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch
import transformers as tf

import symfusion

assert "site-packages" in symfusion.__file__, symfusion.__file__
pipeline_only = [name for name in ("snakemake", "sklearn", "datasets", "matplotlib", "seqeval", "spacy")
                 if importlib.util.find_spec(name) is not None]
assert pipeline_only == [], f"the core install pulled the pipeline's packages {pipeline_only}"

config = tf.LlamaConfig(vocab_size=97, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=2, intermediate_size=96, max_position_embeddings=64)
models = []
for seed, name in ((0, "anchor"), (1, "source")):
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).eval()
    model.save_pretrained(name, max_shard_size="40KB")
    models.append(model)
out, report = symfusion.align("source", "anchor", matching="rotation", output="matched")
assert report["distance_after"] < report["distance_before"], report
assert report["max_block_relative_output_change"] < 1e-3, report
matched, report = symfusion.align(models[1], models[0])
assert report["relative_output_change"] < 1e-3, report

bert = tf.BertConfig(vocab_size=97, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=48,
                     max_position_embeddings=64, num_labels=3)
for seed, name in ((0, "bert_a"), (1, "bert_b")):
    torch.manual_seed(seed)
    tf.BertForSequenceClassification(bert).save_pretrained(name)
symfusion_match = str(Path(sys.executable).parent / "symfusion-match")
result = subprocess.run([symfusion_match, "source=bert_b", "anchor=bert_a", "output=bert_matched"],
                        capture_output=True, text=True)
assert result.returncode == 0, result.stderr[-2000:]
assert json.loads(Path("bert_matched/match.json").read_text())["relative_output_change"] < 1e-3
bad = subprocess.run([symfusion_match, "source=nope", "anchor=bert_a", "output=x"], capture_output=True, text=True)
assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
torch.manual_seed(2)
tf.BertForSequenceClassification(bert).save_pretrained("bert_c")
align_many = str(Path(sys.executable).parent / "symfusion-align-many")
result = subprocess.run([align_many, "models=[bert_a,bert_b,bert_c]", "output=bert_many"], capture_output=True, text=True)
assert result.returncode == 0, result.stderr[-2000:]
assert len(json.loads(Path("bert_many/many.json").read_text())["objective"]) >= 1
bad = subprocess.run([align_many, "models=[bert_a]", "output=y"], capture_output=True, text=True)
assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
print("core install: align() on folders and modules, symfusion-match, symfusion-align-many: ok (no pipeline packages "
      "installed)")
EOF
