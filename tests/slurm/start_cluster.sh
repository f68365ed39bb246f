#!/usr/bin/env bash
# Start a one-node SLURM cluster on this machine, for tests/test_slurm_cluster.py.
#
#   tests/slurm/start_cluster.sh STATE_DIR
#
# Needs root and Debian (bookworm: Slurm 22.05). Installs munge, slurmctld, slurmd and
# slurm-client with apt-get when they are missing. Everything the cluster writes (its
# slurm.conf, gres.conf, spool, state, logs) lives under STATE_DIR; /etc/slurm/slurm.conf
# and gres.conf are symbolic links to them (SLURM_CONF is not enough: the jobstep plugin
# drops SLURM_* variables before its inner srun), and files that were there are kept in
# STATE_DIR/etc-slurm and put back by stop_cluster.sh. The PIDs of the daemons this script
# starts go to STATE_DIR/pids, one "name pid" a line; stop_cluster.sh stops exactly those.
#
# The node: localhost, a declared CPU count of CI_NODE_CPUS (default 8, more than this
# machine's: the DAG's independent jobs start side by side, as on a cluster of many nodes,
# instead of queueing for a 2-CPU node's slots) and a declared memory of CI_NODE_MEM_MB
# (default 131072: larger than this machine, so that the memory the real profile asks for
# a training job can be scheduled); nothing enforces either (no cgroups), and two fake GPUs of
# type CI_GPU_TYPE (gres files aliasing /dev/null and /dev/zero), so that `--gpus=<type>:1`
# requests are scheduled and counted as on a GPU node. One partition, CI_PARTITION.
# No accounting database: jobs are followed with squeue and scontrol, which keep a
# finished job for MinJobAge=3600 s.
set -euo pipefail

STATE=${1:?usage: start_cluster.sh STATE_DIR}
PARTITION=${CI_PARTITION:-ci}
GPU_TYPE=${CI_GPU_TYPE:-fakegpu}
NODE_MEM_MB=${CI_NODE_MEM_MB:-131072}
NODE_CPUS=${CI_NODE_CPUS:-8}
PACKAGES=(munge slurmctld slurmd slurm-client)

T0=$(date +%s%N)
say() { printf '[start_cluster %5.1fs] %s\n' "$(( ($(date +%s%N) - T0) / 1000000 ))e-3" "$*"; }
die() { echo "start_cluster: $*" >&2; exit 1; }
cannot_install() { echo "start_cluster: $*" >&2; exit 3; }   # exit 3: the test skips

[ "$(id -u)" -eq 0 ] || cannot_install "must run as root (it installs packages and starts daemons)"
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
PIDS="$STATE/pids"
: >> "$PIDS"

# -- packages ---------------------------------------------------------------------------
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    command -v apt-get >/dev/null || cannot_install "no apt-get to install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$STATE/apt.log" 2>&1 \
        || { tail -n 20 "$STATE/apt.log" >&2; cannot_install "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 \
        || { tail -n 20 "$STATE/apt.log" >&2; cannot_install "apt-get install ${missing[*]} failed"; }
    say "installed ${missing[*]}"
fi

# pids_of NAME: the PIDs of the processes called NAME (no procps needed)
pids_of() {
    local comm
    for comm in /proc/[0-9]*/comm; do
        [ "$(cat "$comm" 2>/dev/null)" = "$1" ] && basename "$(dirname "$comm")"
    done
    return 0
}
# A daemon of an earlier cluster would hold the ports: refuse rather than share it.
for daemon in slurmctld slurmd; do
    running=$(pids_of "$daemon" | tr '\n' ' ')
    [ -z "$running" ] || die "a $daemon is already running (pid $running); stop it first"
done

# wait_for FILE: until FILE exists and is not empty (10 s)
wait_for() {
    local i
    for i in $(seq 100); do [ -s "$1" ] && return 0; sleep 0.1; done
    return 1
}

# -- munge: reuse a running munged, else start one ----------------------------------------
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munged already running: using it"
else
    if [ ! -s /etc/munge/munge.key ]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    wait_for /run/munge/munged.pid || die "munged did not start"
    echo "munged $(cat /run/munge/munged.pid)" >> "$PIDS"
    munge -n | unmunge >/dev/null || die "munge does not work"
    say "munged started"
fi

# -- configuration ------------------------------------------------------------------------
HOST=$(hostname -s)
mkdir -p "$STATE/ctld" "$STATE/slurmd" "$STATE/log" "$STATE/gpu"
for i in 0 1; do   # gres GPUs need device files; two harmless char devices stand in
    [ -e "$STATE/gpu/nvidia$i" ] || mknod "$STATE/gpu/nvidia$i" c 1 $((3 + 2 * i))
done

cat > "$STATE/gres.conf" <<EOF
NodeName=$HOST Name=gpu Type=$GPU_TYPE File=$STATE/gpu/nvidia[0-1]
EOF

cat > "$STATE/slurm.conf" <<EOF
# Written by tests/slurm/start_cluster.sh: one node on localhost for tests.
ClusterName=caprl-ci
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups on this machine: plain process tracking, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
# no accounting database: sacct does not work, squeue/scontrol keep jobs MinJobAge seconds
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=3600
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
GresTypes=gpu
# the node's memory is declared, not measured (see CI_NODE_MEM_MB above)
SlurmdParameters=config_overrides
ReturnToService=2
# only jobs submitted with --requeue may be requeued (the profile's slurm-requeue)
JobRequeue=0
KillWait=10
InactiveLimit=0
Waittime=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NODE_CPUS RealMemory=$NODE_MEM_MB Gres=gpu:$GPU_TYPE:2 State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
mkdir -p /etc/slurm "$STATE/etc-slurm"
for conf in slurm.conf gres.conf; do
    target="/etc/slurm/$conf"
    if [ -L "$target" ] && [ ! -e "$target" ]; then
        rm -f "$target"                       # a link left by a cluster whose state is gone
    elif [ -e "$target" ] && [ "$(readlink "$target")" != "$STATE/$conf" ]; then
        [ -e "$STATE/etc-slurm/$conf" ] || mv "$target" "$STATE/etc-slurm/$conf"
    fi
    ln -sfn "$STATE/$conf" "$target"
done
SLURM_CONF=/etc/slurm/slurm.conf

# -- daemons ------------------------------------------------------------------------------
/usr/sbin/slurmctld -c -f "$SLURM_CONF"   # -c: start clean, no saved jobs or node states
wait_for "$STATE/slurmctld.pid" || { tail -n 20 "$STATE/log/slurmctld.log" >&2; die "slurmctld did not start"; }
echo "slurmctld $(cat "$STATE/slurmctld.pid")" >> "$PIDS"
/usr/sbin/slurmd -f "$SLURM_CONF"
wait_for "$STATE/slurmd.pid" || { tail -n 20 "$STATE/log/slurmd.log" >&2; die "slurmd did not start"; }
echo "slurmd $(cat "$STATE/slurmd.pid")" >> "$PIDS"

state=""
for _ in $(seq 120); do
    for daemon in slurmctld slurmd; do
        if ! kill -0 "$(cat "$STATE/$daemon.pid")" 2>/dev/null; then
            tail -n 20 "$STATE/log/$daemon.log" >&2
            die "$daemon exited"
        fi
    done
    state=$(timeout 5 sinfo --noheader --Node --format=%t 2>/dev/null || true)
    [ "$state" = idle ] && break
    case "$state" in
        down*|drain*|inval*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
done
[ "$state" = idle ] || { sinfo -N -l >&2; die "node $HOST is '$state', not idle"; }
timeout 60 srun --partition="$PARTITION" --ntasks=1 --time=1 true || die "a test srun failed"
say "cluster up: node $HOST, $NODE_CPUS CPUs, 2 GPUs of type $GPU_TYPE, partition $PARTITION"
