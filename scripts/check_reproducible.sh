#!/usr/bin/env bash
# Determinism and interruption safety of a profile (CI: smoke). Needs a finished reference run in
# results/<profile> and figures/<profile>. Runs the profile again from scratch into ci_rerun/, kills it
# once with SIGINT and once with SIGKILL (the whole process group, jobs included), restarts it to the
# end, and requires the tables and figure data to equal the reference exactly.
#   bash scripts/check_reproducible.sh [profile] [seconds before each kill]
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:-smoke}
wait_s=${2:-45}
out=ci_rerun
rm -rf "$out"
run() { snakemake --cores 2 --config profile="$profile" results_dir="$out/results" figures_dir="$out/figures" "$@"; }

interrupt() {  # start a run in its own process group, send $1 to the group after $wait_s seconds
  setsid bash -c "$(declare -f run); out=$out profile=$profile; run" > "$out.log" 2>&1 &
  local pid=$!
  sleep "$wait_s"
  kill -"$1" -- -"$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  echo "run interrupted with SIG$1 after ${wait_s}s"
}

mkdir -p "$out"
interrupt INT
interrupt KILL
run --unlock > /dev/null 2>&1 || true            # SIGKILL leaves snakemake's lock behind
run > "$out.log" 2>&1 || { tail -30 "$out.log"; echo "restarted run failed" >&2; exit 1; }
# no half-written file may remain: temp names are hidden (.NAME.tmp*) and removed on success
leftovers=$(find "$out" -name ".*.tmp*" -o -name ".*.checkpoint" | head -5)
[ -z "$leftovers" ] || { echo "temp files left behind: $leftovers" >&2; exit 1; }
symfusion-compare "$out/results/$profile" --figures "$out/figures/$profile" \
  --reference "results/$profile" --reference-figures "figures/$profile" --exact
