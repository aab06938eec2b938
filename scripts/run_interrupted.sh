#!/usr/bin/env bash
# Run a profile (or some of its targets) to the end the hard way: start it, kill it once with SIGINT and
# once with SIGKILL (the whole process group, jobs included), each after SECONDS, then restart it until it
# finishes, and require that no half-written file remains. The finished run must equal an uninterrupted
# one exactly; the callers compare (scripts/check_reproducible.sh; CI: the SLURM run of the rehearsal).
#   bash scripts/run_interrupted.sh PROFILE SECONDS LOG [--results DIR --figures DIR] [TARGET ...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "error: usage: bash scripts/run_interrupted.sh PROFILE SECONDS LOG [--results DIR --figures DIR] [TARGET ...]" >&2; exit 2; }
profile=$1 wait_s=$2 log=$3
shift 3
dirs=() scan=results
if [ "${1:-}" = "--results" ]; then
  [ $# -ge 4 ] && [ "$3" = "--figures" ] || { echo "error: --results DIR needs --figures DIR after it" >&2; exit 2; }
  dirs=(results_dir="$2" figures_dir="$4") scan=$2
  shift 4
fi
# targets first: everything after --config is read as key=value
command=(snakemake --cores 2 "$@" --config profile="$profile" "${dirs[@]}")

# Background jobs of a script start with SIGINT ignored, and snakemake would inherit that: start the
# run from Python in its own session with SIGINT restored, then signal the whole group.
interrupt() {
  python - "$1" "$wait_s" "$log" "${command[@]}" <<'PY'
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
"${command[@]}" >> "$log" 2>&1 || { tail -30 "$log"; echo "restarted run failed" >&2; exit 1; }
# no half-written file may remain: temp names are hidden (.NAME.tmp*) and removed on success
leftovers=$(find "$scan" \( -name ".*.tmp*" -o -name ".*.checkpoint" \) | head -5)
[ -z "$leftovers" ] || { echo "temp files left behind: $leftovers" >&2; exit 1; }
