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
rm -rf "$out" "$out.log"
mkdir -p "$out"
command=(snakemake --cores 2 --config profile="$profile" results_dir="$out/results" figures_dir="$out/figures")

# Background jobs of a script start with SIGINT ignored, and snakemake would inherit that: start the
# run from Python in its own session with SIGINT restored, then signal the whole group.
interrupt() {
  python - "$1" "$wait_s" "$out.log" "${command[@]}" <<'PY'
import os, signal, subprocess, sys, time
name, wait_s, log, command = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
with open(log, "a") as handle:
    run = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(wait_s)
    finished = run.poll() is not None
    if not finished:
        os.killpg(run.pid, getattr(signal, name))
    code = run.wait()
print(f"run {'finished before' if finished else 'interrupted by'} {name} after {wait_s:.0f}s (exit {code})")
PY
}

"${command[@]}" --unlock > /dev/null 2>&1 || true     # a lock left by an earlier killed run
interrupt SIGINT
interrupt SIGKILL
"${command[@]}" --unlock > /dev/null 2>&1 || true     # SIGKILL leaves snakemake's lock behind
"${command[@]}" >> "$out.log" 2>&1 || { tail -30 "$out.log"; echo "restarted run failed" >&2; exit 1; }
# no half-written file may remain: temp names are hidden (.NAME.tmp*) and removed on success
leftovers=$(find "$out" \( -name ".*.tmp*" -o -name ".*.checkpoint" \) | head -5)
[ -z "$leftovers" ] || { echo "temp files left behind: $leftovers" >&2; exit 1; }
symfusion-compare "$out/results/$profile" --figures "$out/figures/$profile" \
  --reference "results/$profile" --reference-figures "figures/$profile" --exact
