#!/usr/bin/env bash
# Run a pipeline profile (or a slice of it) through SLURM (workflow/profiles/slurm, snakemake-executor-plugin-slurm)
# on a single-node test cluster (scripts/slurm_cluster.sh) and check it: every job of a rule that declares a GPU
# (`resources: gpu=1`) asked SLURM for one, got one and ran in the GPU partition, no other job did, every rule
# of the workflow had at least one job through SLURM, and the run's tables and figure data equal a local run of
# the same profile exactly (symfusion-compare --exact).
# Needs root (it starts the cluster) and the local run first (CI: .ci/run's interrupted local run of the whole
# rehearsal profile); the artefacts both runs made are compared.
#
#   bash scripts/check_slurm.sh [PROFILE] [--results DIR] [--figures DIR] [--reference DIR]
#                               [--reference-figures DIR] [--tolerance X] [--skip-rules RULE,...] [--prefill]
#                               [TARGET ...]
#
# PROFILE: conf/profile/PROFILE.yaml (default smoke). The run writes to DIR/PROFILE of --results and --figures
# (default ci_slurm/results and ci_slurm/figures; they must not hold a run of PROFILE yet), its logs to ci_slurm/.
# It is compared with --reference (default results/PROFILE) and --reference-figures (default figures/PROFILE),
# exactly unless --tolerance is given (e.g. to compare with a committed reference/PROFILE run instead).
# TARGETs (default: the profile's whole DAG) make it a slice: an experiment of conf/experiments.yaml by name (its
# table or figure) or a file by its path inside the run's results/PROFILE folder. Every rule but `all` and those of
# --skip-rules must still have a job in the slice (a rule that waits for the whole DAG, `report`, cannot).
# --prefill: copy (never move) into the run's folders the reference's outputs of every job of the slice but those
# that give each of those rules one job through SLURM (scripts/check_slurm_prefill.py: the targets' jobs, one job
# of every rule chosen by the local run's job times, and whatever Snakemake reruns with them), with their
# modification times, so that only these run through SLURM; the reference must be a complete run of this checkout.
# --prefill without TARGETs chooses the slice itself: from the whole DAG's dry run, one job of every rule (the
# cheapest by the local run's job times with what it drags along); their outputs are the targets, compared as
# above (result files; the tables and figure data a chosen job makes), a new rule needs no new target.
# A cluster this script starts is stopped at the end; one already running is left running.
#
# What the test cluster needs beyond a real cluster's is set here, not in the profile: its partitions and
# memory cap (the profile's SYMFUSION_SLURM_* variables, from `slurm_cluster.sh env`), no account, and job
# status from squeue (it has no accounting database).
set -euo pipefail
cd "$(dirname "$0")/.."

error() { echo "error: $*" >&2; exit 1; }

profile="" out=ci_slurm results="" figures="" reference="" reference_figures="" tolerance="" skip_rules="" prefill=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --results|--figures|--reference|--reference-figures|--tolerance|--skip-rules)
      [ $# -ge 2 ] && [ -n "$2" ] || error "$1 needs a value"
      case "$1" in
        --results) results=$2 ;; --figures) figures=$2 ;; --reference) reference=$2 ;;
        --reference-figures) reference_figures=$2 ;; --tolerance) tolerance=$2 ;; --skip-rules) skip_rules=$2 ;;
      esac
      shift 2 ;;
    --prefill) prefill=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) error "unknown option $1 (see: bash scripts/check_slurm.sh --help)" ;;
    *) if [ -z "$profile" ]; then profile=$1; else targets+=("$1"); fi; shift ;;
  esac
done
profile=${profile:-smoke}
[ -f "conf/profile/$profile.yaml" ] || error "no pipeline profile '$profile' (conf/profile/$profile.yaml)"
results=${results:-$out/results}
figures=${figures:-$out/figures}
reference=${reference:-results/$profile}
reference_figures=${reference_figures:-figures/$profile}
[ -z "$tolerance" ] || [[ "$tolerance" =~ ^[0-9]*\.?[0-9]+$ ]] || error "--tolerance must be a number, not '$tolerance'"
compgen -G "$reference/*.csv" >/dev/null \
  || error "no run of '$profile' to compare with in $reference (run: snakemake --cores 2 --config profile=$profile)"
[ -d "$reference_figures" ] || error "no figures of '$profile' to compare with in $reference_figures"
command -v snakemake >/dev/null && command -v symfusion-compare >/dev/null \
  || error "snakemake or symfusion-compare not found: activate the project's environment (. .venv/bin/activate)"
python -c "import snakemake_executor_plugin_slurm" 2>/dev/null \
  || error "snakemake-executor-plugin-slurm is not installed: pip install snakemake-executor-plugin-slurm"

# A fresh run: ci_slurm/ is this script's own folder (marked); anything else must not hold a run yet.
if [ -e "$out" ]; then
  [ -e "$out/.check_slurm" ] || error "$out exists and was not made by check_slurm.sh; move it away"
  rm -rf "$out"
fi
for dir in "$results/$profile" "$figures/$profile"; do
  [ ! -e "$dir" ] || error "$dir exists: the SLURM run needs a fresh folder (pass other --results/--figures)"
done
mkdir -p "$out"
touch "$out/.check_slurm"

started=0
if ! bash scripts/slurm_cluster.sh status >/dev/null 2>&1; then
  bash scripts/slurm_cluster.sh start
  started=1
fi
finish() {
  local code=$?
  [ "$started" = 1 ] && { bash scripts/slurm_cluster.sh stop || true; }
  exit $code
}
trap finish EXIT
eval "$(bash scripts/slurm_cluster.sh env)"

# Every rule the profile sizes must exist in the workflow (Snakemake ignores unknown names silently); every rule but
# `all` and --skip-rules must get a job through SLURM (required_rules, checked after the run); a rule with no job in
# the profile's default DAG (one that only an on-demand experiment needs, conf/experiments.yaml `on_demand`) is not
# required.
snakemake --list-rules --workflow-profile none --config profile="$profile" > "$out/rules.txt" 2>"$out/rules.log" \
  || { cat "$out/rules.log" >&2; error "snakemake --list-rules failed"; }
snakemake -n --workflow-profile none --config profile="$profile" results_dir="$results" figures_dir="$figures" \
  > "$out/default_dag.log" 2>&1 || { tail -40 "$out/default_dag.log" >&2; error "snakemake -n of the default DAG failed"; }
required_rules=$(python - "$out/rules.txt" "$skip_rules" "$out/default_dag.log" <<'PY'
import re, sys, yte
listed = set(open(sys.argv[1]).read().split())
rules = listed & set(re.findall(r"^(?:local)?rule (\w+):$", open(sys.argv[3]).read(), re.M))
skipped = {rule for rule in sys.argv[2].split(",") if rule}
with open("workflow/profiles/slurm/config.yaml") as handle:
    profile = yte.process_yaml(handle, require_use_yte=True)
unknown = sorted((set(profile.get("set-resources") or {}) | skipped) - listed)
if unknown:
    sys.exit(f"error: workflow/profiles/slurm/config.yaml or --skip-rules names rules the workflow does not have: {', '.join(unknown)}")
print(",".join(sorted(rules - skipped - {"all"})))
PY
)

# The slice's targets as the run's files (an experiment: its table or figure CSV), and the artefacts to compare:
# the experiments symfusion-compare checks that the reference holds and, in a slice, the targets name.
resolved=$(python - "$results/$profile" "$figures/$profile" "$reference" "$reference_figures" "${targets[@]}" <<'PY'
import os, sys, yaml
results, figures, reference, reference_figures, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
with open("conf/experiments.yaml") as handle:
    registry = yaml.safe_load(handle)
def folders(name):
    return (figures, reference_figures) if registry[name]["kind"] == "figure" else (results, reference)
files = []
for target in targets:
    if target in registry:
        files.append(os.path.join(folders(target)[0], f"{target}.csv"))
    elif target.startswith("/") or ".." in target.split("/"):
        sys.exit(f"error: target {target!r} is neither an experiment of conf/experiments.yaml nor a path inside results/<profile>")
    else:
        files.append(os.path.join(results, target))
named = [t for t in targets if t in registry] if targets else list(registry)
compared = [name for name in named if registry[name].get("compare")
            and os.path.exists(os.path.join(folders(name)[1], f"{name}.csv"))]
print(",".join(f"{name}.csv" for name in compared))
print("\n".join(files))
PY
) || exit 1
only=$(head -1 <<<"$resolved")
mapfile -t target_files < <(tail -n +2 <<<"$resolved" | sed '/^$/d')
[ -n "$only" ] || [ ${#target_files[@]} -gt 0 ] \
  || error "nothing to compare: the targets name no experiment that $reference holds"

config=(--config profile="$profile" results_dir="$results" figures_dir="$figures")
if [ "$prefill" = 1 ]; then
  # No TARGETs: the whole DAG's dry run, and the targets chosen from it (one job of every required rule).
  choose=(); [ ${#targets[@]} -gt 0 ] || choose=(--choose "$out/targets.txt")
  snakemake -n --workflow-profile workflow/profiles/slurm "${target_files[@]}" "${config[@]}" \
    > "$out/dry_run.log" 2>&1 || { tail -40 "$out/dry_run.log" >&2; error "snakemake -n failed"; }
  python scripts/check_slurm_prefill.py "${choose[@]}" "$out/dry_run.log" "$results/$profile" "$figures/$profile" \
    "$reference" "$reference_figures" "$required_rules" "${target_files[@]}"
  if [ ${#targets[@]} = 0 ]; then
    # The chosen jobs' outputs are the slice's targets; the experiments compared: those whose table or figure data
    # a chosen job makes (the others are copies of the reference's).
    mapfile -t target_files < "$out/targets.txt"
    only=$(python - "$results/$profile" "$figures/$profile" "$reference" "$reference_figures" "${target_files[@]}" <<'PY'
import os, sys, yaml
results, figures, reference, reference_figures, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
with open("conf/experiments.yaml") as handle:
    registry = yaml.safe_load(handle)
local = {results: reference, figures: reference_figures}
names = [name for path in files for name in registry if registry[name].get("compare")
         and os.path.dirname(path) in local and os.path.basename(path) == f"{name}.csv"
         and os.path.exists(os.path.join(local[os.path.dirname(path)], f"{name}.csv"))]
print(",".join(f"{name}.csv" for name in names))
PY
)
  fi
fi
run=(--workflow-profile workflow/profiles/slurm "${target_files[@]}" "${config[@]}")

echo "check_slurm: running profile '$profile' through workflow/profiles/slurm (log: $out/snakemake.log)"
begin=$(date +%s)
if ! snakemake "${run[@]}" \
     --slurm-status-command squeue --slurm-init-seconds-before-status-checks 1 \
     --slurm-logdir "$out/slurm_logs" > "$out/snakemake.log" 2>&1; then
  tail -40 "$out/snakemake.log" >&2
  error "the SLURM run of '$profile' failed (log: $out/snakemake.log, job logs: $out/slurm_logs)"
fi
seconds=$(( $(date +%s) - begin ))
scontrol show job -d -o > "$out/scontrol.txt"

# What SLURM made of each job (scontrol: GPU request, allocation, partition), against what Snakemake
# asked for (its log: each job's rule and resources, and the SLURM job id it got).
python scripts/check_slurm_jobs.py "$out/snakemake.log" "$out/scontrol.txt" \
  "$SYMFUSION_SLURM_PARTITION" "$SYMFUSION_SLURM_GPU_PARTITION" "$profile" "$seconds" --rules "$required_rules"

# The same tables and figure data as the local run (symfusion-compare fails on an artefact the run lacks).
compare=(--exact); [ -n "$tolerance" ] && compare=(--tolerance "$tolerance")
if [ -n "$only" ]; then
  echo "check_slurm: comparing ${only//,/, } with $reference"
  symfusion-compare "$results/$profile" --figures "$figures/$profile" \
    --reference "$reference" --reference-figures "$reference_figures" --only "$only" "${compare[@]}"
fi
# A slice's targets that are a job's result files: everything in them (metrics, per-example results, loss path,
# barriers, matching distances, data splits' sizes and hashes) equals the local run's, numbers within the same
# tolerance, paths up to the run's folder; only times (a key naming seconds, at any depth), provenance and the
# merged models' paths may differ.
python - "$results/$profile" "$reference" "${tolerance:-0}" "${target_files[@]}" <<'PY'
import json, math, os, sys
run, reference, tolerance, files = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
VARIES = ("provenance", "merged_models")
numbers = 0
def same(a, b):
    global numbers
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in a.keys() | b.keys() if "seconds" not in k}
        return all(k in a and k in b and same(a[k], b[k]) for k in sorted(keys))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        numbers += 1
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance
    if isinstance(a, str) and isinstance(b, str):      # a path names its own run's folder
        return a.replace(run, reference) == b
    return a == b
problems = 0
for path in files:
    if not path.endswith(".json") or not path.startswith(run + "/"):
        continue
    relative = os.path.relpath(path, run)
    with open(path) as ours, open(os.path.join(reference, relative)) as theirs:
        mine, local = json.load(ours), json.load(theirs)
    numbers = 0
    keys = sorted(k for k in mine.keys() | local.keys() if k not in VARIES and "seconds" not in k)
    differ = [key for key in keys if key not in mine or key not in local or not same(mine[key], local[key])]
    if not numbers or differ:
        problems += 1
        print(f"error: {relative}: {'no numbers to compare' if not numbers else 'differs in ' + ', '.join(differ)}", file=sys.stderr)
    else:
        print(f"check_slurm: {relative}: {', '.join(keys)} ({numbers} numbers) agree with the local run")
sys.exit(1 if problems else 0)
PY
