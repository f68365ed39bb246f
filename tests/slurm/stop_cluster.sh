#!/usr/bin/env bash
# Stop the cluster that start_cluster.sh started from STATE_DIR: cancel its jobs, stop the
# daemons it started, by the PIDs it wrote to STATE_DIR/pids, newest first (slurmd,
# slurmctld, then munged if it started one), and put back the /etc/slurm files it replaced.
#
#   tests/slurm/stop_cluster.sh STATE_DIR
#
# Exits non-zero if one of those daemons is still alive afterwards.
set -uo pipefail

STATE=${1:?usage: stop_cluster.sh STATE_DIR}
[ -d "$STATE" ] || exit 0
STATE=$(cd "$STATE" && pwd)
PIDS="$STATE/pids"

# alive PID NAME: process PID exists and is still the daemon NAME (not a reused PID)
alive() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]; }

status=0
if [ -f "$PIDS" ]; then
    if grep -q '^slurmctld ' "$PIDS"; then
        # cancel the jobs still queued or running on this cluster: their processes
        # (slurmstepd and below) would outlive slurmd otherwise
        jobs=$(timeout 10 squeue --noheader --format=%i --states=PENDING,RUNNING,SUSPENDED,REQUEUED 2>/dev/null)
        if [ -n "$jobs" ]; then
            # shellcheck disable=SC2086
            timeout 10 scancel $jobs 2>/dev/null
            echo "cancelled jobs" $jobs
        fi
        for _ in $(seq 100); do
            [ -z "$(timeout 5 squeue --noheader --states=RUNNING,COMPLETING 2>/dev/null)" ] && break
            sleep 0.2
        done
    fi
    while read -r name pid; do
        [ -n "${pid:-}" ] || continue
        alive "$pid" "$name" || continue
        kill -TERM "$pid"
        for _ in $(seq 100); do alive "$pid" "$name" || break; sleep 0.1; done
        if alive "$pid" "$name"; then
            kill -KILL "$pid"
            sleep 0.5
        fi
        if alive "$pid" "$name"; then
            echo "stop_cluster: $name ($pid) is still running" >&2
            status=1
        else
            echo "stopped $name ($pid)"
        fi
    done < <(tac "$PIDS")
    [ "$status" -eq 0 ] && rm -f "$PIDS"
fi

for conf in slurm.conf gres.conf; do
    if [ "$(readlink "/etc/slurm/$conf")" = "$STATE/$conf" ]; then
        rm -f "/etc/slurm/$conf"
        [ -e "$STATE/etc-slurm/$conf" ] && mv "$STATE/etc-slurm/$conf" "/etc/slurm/$conf"
    fi
done
exit "$status"
