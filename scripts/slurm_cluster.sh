#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, to run the pipeline through workflow/profiles/slurm
# without a real cluster (scripts/check_slurm.sh, CI). Debian or Ubuntu, as root, no systemd needed.
#
#   bash scripts/slurm_cluster.sh start    # install what is missing, write the configs, start, wait for the node
#   bash scripts/slurm_cluster.sh stop     # cancel the cluster's jobs, stop the daemons this script started
#   bash scripts/slurm_cluster.sh status   # exit 0 when the cluster answers and its node is up, else 3
#   eval "$(bash scripts/slurm_cluster.sh env)"   # the SYMFUSION_SLURM_* settings of workflow/profiles/slurm for it
#
# It writes /etc/slurm/slurm.conf and /etc/slurm/gres.conf (SLURM's clients and the srun inside each job read
# them there; the executor plugin's job step drops SLURM_CONF), but only when they are absent or were written
# by this script (their first line says so); everything else lives in a folder of its own, $SYMFUSION_SLURM_DIR
# (default /var/tmp/symfusion-slurm): a munge key and socket of its own (/etc/munge is left alone), the
# daemons' state, logs and pid files. Its slurmctld and slurmd listen on ports 6827/6828, not SLURM's
# defaults. `start` is idempotent: it installs packages only when missing (slurmctld slurmd slurm-client
# munge) and starts only the daemons not running. `stop` kills only the processes named in its own pid files
# and deletes nothing but those pid files and its two configs (the folder stays, with the logs and state).
#
# The cluster: one node with this machine's CPUs and its memory less a reserve (SLURM does not
# oversubscribe the machine); fake GPUs, one per CPU up to 4 (gres gpu backed by /dev/null, /dev/zero, ...:
# SLURM allocates them and sets CUDA_VISIBLE_DEVICES, no device is behind them); partitions `debug`
# (default, CPU jobs) and `debug_gpu` (GPU jobs) on that node; no accounting database (no sacct and no
# accounts: job status comes from squeue, and finished jobs stay in squeue/scontrol for a day, MinJobAge).
set -euo pipefail

DIR=${SYMFUSION_SLURM_DIR:-/var/tmp/symfusion-slurm}
MARKER="$DIR/.symfusion-slurm-cluster"
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
HEADER="# Written by scripts/slurm_cluster.sh (symfusion): a single-node test cluster. Rewritten at each start."
PACKAGES=(slurmctld slurmd slurm-client munge)
CTLD_PORT=6827
SLURMD_PORT=6828
RESERVE_MB=2048            # memory left to the machine itself, outside SLURM's node
NODE=$(hostname -s)

error() { echo "error: $*" >&2; exit 1; }
say() { echo "slurm_cluster: $*"; }

# pid file -> the daemon's executable name, to check that a pid still belongs to the daemon it names
declare -A DAEMON_OF=([munged.pid]=munged [slurmctld.pid]=slurmctld [slurmd.pid]=slurmd)

running_pid() {   # the pid in pid file $1 if that process is alive and is the daemon the file names
  local file="$DIR/run/$1" pid
  [ -s "$file" ] || return 1
  pid=$(cat "$file")
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${DAEMON_OF[$1]}" ] || return 1
  echo "$pid"
}

require_root() {
  [ "$(id -u)" -eq 0 ] || error "slurm_cluster.sh $1 must run as root (it installs packages and runs slurmd)"
}

install_packages() {
  local missing=()
  for package in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || error "no apt-get: install ${missing[*]} (SLURM and munge) by hand"
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

make_dir() {
  if [ -e "$DIR" ] && [ ! -e "$MARKER" ]; then
    error "$DIR exists and was not made by slurm_cluster.sh: set SYMFUSION_SLURM_DIR to a new folder"
  fi
  mkdir -p "$DIR"
  touch "$MARKER"
  chmod 755 "$DIR"                      # munged requires its socket's folder to be searchable by all
  mkdir -p "$DIR/munge" "$DIR/run" "$DIR/log" "$DIR/state" "$DIR/spool"
  chmod 755 "$DIR/munge"
}

ours() {   # config file $1 is absent or was written by this script
  [ ! -e "$1" ] || [ "$(head -1 "$1")" = "$HEADER" ]
}

write_configs() {
  for file in "$CONF" "$GRES_CONF"; do
    ours "$file" || error "$file exists and was not written by slurm_cluster.sh (another SLURM setup?): move it away first"
  done
  mkdir -p /etc/slurm
  # This machine as `slurmd -C` sees it; memory less the reserve.
  local hardware cpus boards sockets cores threads memory
  hardware=$(slurmd -C | head -1)
  field() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$hardware"; }
  cpus=$(field CPUs); boards=$(field Boards); sockets=$(field SocketsPerBoard)
  cores=$(field CoresPerSocket); threads=$(field ThreadsPerCore); memory=$(field RealMemory)
  [ -n "$cpus" ] && [ -n "$memory" ] || error "could not read this machine's CPUs and memory from 'slurmd -C': $hardware"
  memory=$((memory - RESERVE_MB))
  [ "$memory" -gt 1024 ] || error "this machine has too little memory for a SLURM node ($((memory + RESERVE_MB)) MB)"

  # Fake GPUs, as many as CPUs (at most 4): GPU jobs then run side by side as on one machine. SLURM drops a
  # GPU without a device file, so each gets a harmless character device of its own.
  local devices=(/dev/null /dev/zero /dev/full /dev/urandom) gpus
  gpus=$(( cpus < ${#devices[@]} ? cpus : ${#devices[@]} ))
  { echo "$HEADER"
    echo "AutoDetect=off"
    for device in "${devices[@]:0:gpus}"; do echo "NodeName=$NODE Name=gpu Count=1 File=$device"; done
  } > "$GRES_CONF.new"
  cat > "$CONF.new" <<EOF
$HEADER
ClusterName=symfusion-test
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
MailProg=/bin/true
MinJobAge=86400
KillWait=5
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$memory Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE DefMemPerCPU=1024 State=UP
PartitionName=debug_gpu Nodes=$NODE MaxTime=INFINITE DefMemPerCPU=1024 State=UP
EOF
  mv "$GRES_CONF.new" "$GRES_CONF"
  mv "$CONF.new" "$CONF"
}

start_munge() {
  running_pid munged.pid >/dev/null && return 0
  if [ ! -s "$DIR/munge/munge.key" ]; then
    mungekey --create --keyfile="$DIR/munge/munge.key"
  fi
  chmod 600 "$DIR/munge/munge.key"
  munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || error "munged did not start; see $DIR/log/munged.log"
  for _ in $(seq 50); do
    munge -S "$DIR/munge/munge.socket" -n 2>/dev/null | unmunge -S "$DIR/munge/munge.socket" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  error "munged does not answer on $DIR/munge/munge.socket; see $DIR/log/munged.log"
}

start_daemon() {   # slurmctld | slurmd: daemonizes and writes its pid file
  local name=$1
  running_pid "$name.pid" >/dev/null && return 0
  rm -f "$DIR/run/$name.pid"           # a stale pid file of ours (its process is gone)
  "/usr/sbin/$name" -f "$CONF" || error "$name did not start; see $DIR/log/$name.log"
  for _ in $(seq 50); do running_pid "$name.pid" >/dev/null && return 0; sleep 0.2; done
  error "$name exited after starting; last lines of $DIR/log/$name.log:
$(tail -5 "$DIR/log/$name.log" 2>/dev/null)"
}

wait_for_node() {
  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1 || true)
    case "$state" in
      idle|mixed|allocated|completing) return 0 ;;
      inval*) break ;;
    esac
    sleep 0.5
  done
  error "node $NODE is '${state:-not known}' instead of idle: $(scontrol show node "$NODE" 2>/dev/null | grep -o 'Reason=.*' || true) (logs in $DIR/log)"
}

is_up() {
  running_pid munged.pid >/dev/null && running_pid slurmctld.pid >/dev/null && running_pid slurmd.pid >/dev/null \
    && scontrol ping 2>/dev/null | grep -q "is UP"
}

start() {
  require_root start
  install_packages
  if is_up; then
    wait_for_node
    say "already running"
    return 0
  fi
  make_dir
  running_pid slurmctld.pid >/dev/null || write_configs
  start_munge
  start_daemon slurmctld
  for _ in $(seq 50); do scontrol ping 2>/dev/null | grep -q "is UP" && break; sleep 0.2; done
  start_daemon slurmd
  wait_for_node
  say "started"
  sinfo -o "%P %a %D %T %c %m %G"
}

stop_pid_file() {
  local file=$1 pid
  if pid=$(running_pid "$file"); then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    say "stopped ${DAEMON_OF[$file]} ($pid)"
  fi
  rm -f "$DIR/run/$file"
}

stop() {
  require_root stop
  [ -e "$MARKER" ] || { say "not running (no $DIR)"; return 0; }
  # Jobs still on the cluster would outlive slurmd: let SLURM cancel them first.
  if running_pid slurmctld.pid >/dev/null && running_pid slurmd.pid >/dev/null; then
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      say "cancelling jobs $(echo $jobs)"
      scancel $jobs || true
      for _ in $(seq 30); do [ -z "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break; sleep 1; done
    fi
  fi
  stop_pid_file slurmd.pid
  stop_pid_file slurmctld.pid
  stop_pid_file munged.pid
  # Its configs go too: with a slurm.conf naming a controller that is down, every `scontrol show config`
  # (snakemake-executor-plugin-slurm runs one whenever Snakemake starts) waits ~10 s for it.
  for file in "$CONF" "$GRES_CONF"; do
    [ -e "$file" ] && ours "$file" && rm -f "$file"
  done
  return 0
}

status() {
  for file in munged.pid slurmctld.pid slurmd.pid; do
    if pid=$(running_pid "$file"); then echo "${DAEMON_OF[$file]}: running ($pid)"; else echo "${DAEMON_OF[$file]}: stopped"; fi
  done
  if is_up; then
    sinfo -o "%P %a %D %T %c %m %G"
    return 0
  fi
  return 3
}

environment() {   # what a shell needs to use the cluster, and to run workflow/profiles/slurm on it
  [ -s "$CONF" ] && ours "$CONF" || error "no cluster of slurm_cluster.sh configured: run 'bash scripts/slurm_cluster.sh start' first"
  local cpus memory
  cpus=$(sed -n 's/^NodeName=.* CPUs=\([0-9]*\).*/\1/p' "$CONF")
  memory=$(sed -n 's/^NodeName=.* RealMemory=\([0-9]*\).*/\1/p' "$CONF")
  # the profile's settings for this cluster: no account, its two partitions, and a memory cap that lets
  # one job per CPU run side by side
  echo "export SYMFUSION_SLURM_ACCOUNT='' SYMFUSION_SLURM_PARTITION=debug SYMFUSION_SLURM_GPU_PARTITION=debug_gpu" \
       "SYMFUSION_SLURM_MAX_MEM_MB=$((memory / cpus))"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) environment ;;
  *) error "usage: bash scripts/slurm_cluster.sh start|stop|status|env" ;;
esac
