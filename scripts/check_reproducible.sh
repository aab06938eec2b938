#!/usr/bin/env bash
# Determinism and interruption safety of a profile. Needs a finished reference run in results/<profile>
# and figures/<profile>. Runs the profile again from scratch into ci_rerun/, killed once with SIGINT and
# once with SIGKILL and restarted (scripts/run_interrupted.sh), and requires the tables and figure data
# to equal the reference exactly. (CI does the same with the rehearsal: its local slice is run
# interrupted, and compared with the SLURM run of the whole rehearsal.)
#   bash scripts/check_reproducible.sh [profile] [seconds before each kill]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-smoke}
wait_s=${2:-45}
out=ci_rerun
compgen -G "results/$profile/*.csv" >/dev/null \
  || { echo "error: no run of '$profile' to compare with in results/$profile (run: snakemake --cores 2 --config profile=$profile)" >&2; exit 2; }
[ -e "$out" ] && { echo "error: $out exists; remove it first (this script writes its rerun there)" >&2; exit 2; }
mkdir -p "$out"
bash scripts/run_interrupted.sh "$profile" "$wait_s" "$out.log" --results "$out/results" --figures "$out/figures"
symfusion-compare "$out/results/$profile" --figures "$out/figures/$profile" \
  --reference "results/$profile" --reference-figures "figures/$profile" --exact
