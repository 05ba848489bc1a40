#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, as plain processes (no systemd, no cgroups needed):
# munged, slurmctld and slurmd. For trying examples/slurm/sweep.sbatch and for tests/slurm/test_slurm.py.
#
#   tests/slurm/cluster.sh install          # apt-get install slurm-wlm munge when missing (root, Debian/Ubuntu)
#   tests/slurm/cluster.sh start [DIR]      # write DIR/slurm.conf, start the daemons, wait for the node
#   export SLURM_CONF=DIR/slurm.conf        # what `start` prints: sbatch/squeue/scontrol read it
#   tests/slurm/cluster.sh stop [DIR]       # cancel every job, stop the daemons (by their pid files)
#   tests/slurm/cluster.sh status [DIR]
#
# DIR (default $DSO_SLURM_DIR or /tmp/dso-slurm) holds the config, state, spool, logs and pid files;
# nothing is written to /etc/slurm. Ports: SLURMCTLD_PORT (default 6817) and SLURMD_PORT (6818), so a
# second cluster (the test's) can run beside one started for trying. munged is shared: when a working
# munged already answers, it is used and left running; otherwise `start` starts one and `stop` stops it.
# Every wait has a timeout (seconds): START_TIMEOUT_S (default 60), STOP_TIMEOUT_S (default 30).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CMD=${1:-}
DIR=${2:-${DSO_SLURM_DIR:-/tmp/dso-slurm}}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
START_TIMEOUT_S=${START_TIMEOUT_S:-60}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-30}
export SLURM_CONF="$DIR/slurm.conf"

die() { echo "cluster.sh: $*" >&2; exit 1; }

missing() {
    local m=()
    for b in sbatch scontrol squeue scancel sinfo; do command -v "$b" >/dev/null || m+=("$b"); done
    for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged /usr/bin/munge /usr/bin/unmunge; do
        [ -x "$b" ] || m+=("$b")
    done
    echo "${m[@]:-}"
}

install() {
    local m
    m=$(missing)
    [ -z "$m" ] && { echo "cluster.sh: slurm-wlm and munge already installed"; return 0; }
    # Exit 3: cannot install here (the test skips, naming the reason).
    [ "$(id -u)" = 0 ] || { echo "cluster.sh: missing $m and not root: cannot apt-get install slurm-wlm munge" >&2; exit 3; }
    command -v apt-get >/dev/null || { echo "cluster.sh: missing $m and no apt-get: install SLURM and munge yourself" >&2; exit 3; }
    echo "cluster.sh: installing slurm-wlm munge (missing: $m)"
    export DEBIAN_FRONTEND=noninteractive
    if ! timeout 300 apt-get install -y -q --no-install-recommends slurm-wlm munge >"/tmp/dso-slurm-apt.log" 2>&1; then
        timeout 300 apt-get update -q >>"/tmp/dso-slurm-apt.log" 2>&1 || true
        timeout 300 apt-get install -y -q --no-install-recommends slurm-wlm munge >>"/tmp/dso-slurm-apt.log" 2>&1 \
            || { tail -20 /tmp/dso-slurm-apt.log >&2; echo "cluster.sh: apt-get install slurm-wlm munge failed" >&2; exit 3; }
    fi
    m=$(missing)
    [ -z "$m" ] || { echo "cluster.sh: still missing after install: $m" >&2; exit 3; }
}

munge_works() { timeout 10 munge -n 2>/dev/null | timeout 10 unmunge >/dev/null 2>&1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# wait_for SECONDS WHAT CMD...: run CMD every 0.5 s until it succeeds; fail after SECONDS.
wait_for() {
    local limit=$1 what=$2; shift 2
    local end=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $end ] || return 1
        sleep 0.5
    done
}

node_idle() { sinfo -h -N -o '%t' | grep -qx 'idle'; }

start() {
    [ -z "$(missing)" ] || die "missing $(missing): run '$0 install' first"
    if alive "$DIR/slurmctld.pid" || alive "$DIR/slurmd.pid"; then
        die "a cluster already runs from $DIR (stop it with '$0 stop $DIR')"
    fi
    mkdir -p "$DIR/state" "$DIR/spool"
    # The node line as slurmd measures this machine, with RealMemory lowered by 5% (a node that
    # reports less memory than configured is drained).
    local node host mem
    node=$(/usr/sbin/slurmd -C | head -n 1)
    host=$(hostname -s)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    node=$(sed "s/RealMemory=[0-9]*/RealMemory=$((mem * 95 / 100))/; s/^NodeName=[^ ]*/NodeName=$host/" <<<"$node")
    sed -e "s|@HOST@|$host|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@SLURMD_PORT@|$SLURMD_PORT|g" \
        -e "s|@DIR@|$DIR|g" -e "s|@NODE_LINE@|$node|g" "$HERE/slurm.conf" >"$SLURM_CONF"

    if munge_works; then
        echo "cluster.sh: using the munged already running"
    else
        mkdir -p /run/munge && chown munge:munge /run/munge && chmod 0755 /run/munge
        [ -f /etc/munge/munge.key ] || die "/etc/munge/munge.key missing (reinstall munge)"
        runuser -u munge -- /usr/sbin/munged
        wait_for 10 munged munge_works || die "munged started but 'munge -n | unmunge' fails"
        cp /run/munge/munged.pid "$DIR/munged.pid"  # ours: stop stops it
    fi

    /usr/sbin/slurmctld -f "$SLURM_CONF"
    wait_for 20 slurmctld scontrol ping || { tail -20 "$DIR/slurmctld.log" >&2; die "slurmctld does not answer"; }
    /usr/sbin/slurmd -f "$SLURM_CONF"
    if ! wait_for "$START_TIMEOUT_S" "the node" node_idle; then
        sinfo -N -l >&2 || true
        tail -20 "$DIR/slurmd.log" >&2 || true
        die "the node is not idle after $START_TIMEOUT_S s"
    fi
    echo "cluster.sh: cluster up in $DIR (slurmctld port $CTLD_PORT, slurmd port $SLURMD_PORT)"
    sinfo
    echo "export SLURM_CONF=$SLURM_CONF"
}

# stop_pid PIDFILE: SIGTERM, wait up to STOP_TIMEOUT_S, then SIGKILL.
stop_pid() {
    local f=$1 pid
    [ -f "$f" ] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        local end=$((SECONDS + STOP_TIMEOUT_S))
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$f"
}

stop() {
    [ -f "$SLURM_CONF" ] || { echo "cluster.sh: no cluster in $DIR"; return 0; }
    if alive "$DIR/slurmctld.pid"; then
        # Cancel every job and wait until the node has no job left, so that no task outlives the cluster.
        timeout 10 scancel --full --quiet --user="$(id -un)" 2>/dev/null || true
        wait_for "$STOP_TIMEOUT_S" "jobs to end" bash -c '[ -z "$(squeue -h -o %i)" ]' \
            || echo "cluster.sh: jobs still listed after $STOP_TIMEOUT_S s: $(squeue -h 2>&1 | head -5)" >&2
    fi
    stop_pid "$DIR/slurmd.pid"
    stop_pid "$DIR/slurmctld.pid"
    # Job steps left behind by a killed slurmd (slurmstepd of this cluster's spool dir).
    local pid
    for pid in $(pgrep -f "slurmstepd" || true); do
        grep -qs "$DIR" "/proc/$pid/environ" "/proc/$pid/cmdline" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    done
    stop_pid "$DIR/munged.pid"
    echo "cluster.sh: cluster in $DIR stopped"
}

status() {
    for d in slurmctld slurmd munged; do
        if alive "$DIR/$d.pid"; then echo "$d: running (pid $(cat "$DIR/$d.pid"))"; else echo "$d: not started from $DIR"; fi
    done
    alive "$DIR/slurmctld.pid" && { sinfo; squeue; } || true
}

case "$CMD" in
install) install ;;
start) start ;;
stop) stop ;;
status) status ;;
*) echo "usage: $0 install | start [DIR] | stop [DIR] | status [DIR]" >&2; exit 2 ;;
esac
