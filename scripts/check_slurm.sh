#!/usr/bin/env bash
# Run a pipeline profile through SLURM (workflow/profiles/slurm, snakemake-executor-plugin-slurm) on a
# single-node test cluster (scripts/slurm_cluster.sh) and check it: every job of a rule that declares a GPU
# (`resources: gpu=1`) asked SLURM for one, got one and ran in the GPU partition, no other job did, and the
# run's tables and figure data equal a local run of the same profile exactly (symfusion-compare --exact).
# Needs root (it starts the cluster) and the local run first (CI: .ci/run's local run of a slice of the
# rehearsal profile); only the artefacts that local run made are compared.
#
#   bash scripts/check_slurm.sh [PROFILE] [--results DIR] [--figures DIR]
#                               [--reference DIR] [--reference-figures DIR] [--tolerance X]
#
# PROFILE: conf/profile/PROFILE.yaml (default smoke). The run writes to DIR/PROFILE of --results and --figures
# (default ci_slurm/results and ci_slurm/figures; they must not hold a run of PROFILE yet), its logs to ci_slurm/.
# It is compared with --reference (default results/PROFILE) and --reference-figures (default figures/PROFILE),
# exactly unless --tolerance is given (e.g. to compare with a committed reference/PROFILE run instead).
# A cluster this script starts is stopped at the end; one already running is left running.
#
# What the test cluster needs beyond a real cluster's is set here, not in the profile: its partitions and
# memory cap (the profile's SYMFUSION_SLURM_* variables, from `slurm_cluster.sh env`), no account, and job
# status from squeue (it has no accounting database).
set -euo pipefail
cd "$(dirname "$0")/.."

error() { echo "error: $*" >&2; exit 1; }

profile=smoke out=ci_slurm results="" figures="" reference="" reference_figures="" tolerance=""
while [ $# -gt 0 ]; do
  case "$1" in
    --results|--figures|--reference|--reference-figures|--tolerance)
      [ $# -ge 2 ] && [ -n "$2" ] || error "$1 needs a value"
      case "$1" in
        --results) results=$2 ;; --figures) figures=$2 ;; --reference) reference=$2 ;;
        --reference-figures) reference_figures=$2 ;; --tolerance) tolerance=$2 ;;
      esac
      shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) error "unknown option $1 (see: bash scripts/check_slurm.sh --help)" ;;
    *) profile=$1; shift ;;
  esac
done
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

# Every rule the profile sizes must exist in the workflow (Snakemake ignores unknown names silently).
snakemake --list-rules --workflow-profile none --config profile="$profile" > "$out/rules.txt" 2>"$out/rules.log" \
  || { cat "$out/rules.log" >&2; error "snakemake --list-rules failed"; }
python - "$out/rules.txt" <<'PY'
import sys, yte
rules = set(open(sys.argv[1]).read().split())
with open("workflow/profiles/slurm/config.yaml") as handle:
    profile = yte.process_yaml(handle, require_use_yte=True)
unknown = sorted(set(profile.get("set-resources") or {}) - rules)
if unknown:
    sys.exit(f"error: workflow/profiles/slurm/config.yaml sets resources for rules the workflow does not have: {', '.join(unknown)}")
PY

echo "check_slurm: running profile '$profile' through workflow/profiles/slurm (log: $out/snakemake.log)"
begin=$(date +%s)
if ! snakemake --workflow-profile workflow/profiles/slurm \
     --config profile="$profile" results_dir="$results" figures_dir="$figures" \
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
  "$SYMFUSION_SLURM_PARTITION" "$SYMFUSION_SLURM_GPU_PARTITION" "$profile" "$seconds"

# The same tables and figure data as the local run: every file of the reference exists, and agrees.
for pair in "$reference:$results/$profile" "$reference_figures:$figures/$profile"; do
  for ref_file in "${pair%%:*}"/*.csv; do
    [ -e "$ref_file" ] || continue
    [ -s "${pair#*:}/$(basename "$ref_file")" ] || error "the SLURM run made no ${pair#*:}/$(basename "$ref_file")"
  done
done
compare=(--exact); [ -n "$tolerance" ] && compare=(--tolerance "$tolerance")
# the artefacts the reference holds (all of them, or those of a local run of a slice of the DAG)
only=$(ls "$reference" "$reference_figures" \
       | grep -E '^(table1|table2|multimodel|fig3_ablation|fig4_distance|fig5_barrier|fig6_layers)\.csv$' | paste -sd, -)
symfusion-compare "$results/$profile" --figures "$figures/$profile" \
  --reference "$reference" --reference-figures "$reference_figures" --only "$only" "${compare[@]}"
