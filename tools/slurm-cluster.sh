#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for testing the cluster path for real:
#   tools/slurm-cluster.sh up      install (apt), configure and start munge, slurmctld, slurmd
#   tools/slurm-cluster.sh down    stop the daemons (packages and configuration stay)
#   tools/slurm-cluster.sh status  exit 0 when the node takes jobs
# Debian/Ubuntu as root only (packages from apt, daemons in /etc and /var). Idempotent: `up`
# on a running cluster only checks it. No accounting database (accounting_storage/none, so
# sacct cannot report jobs: the profile's status command is squeue); two partitions, `debug`
# (the default) and `gpu`, on the one node, which advertises two GPUs backed by /dev/null
# and /dev/zero so that `--gpus=1` is accepted on a GPU-less machine (jobs see no GPU); and
# `cpu`, a partition without GPUs whose one node is a placeholder that is always down.
set -euo pipefail

CONF_DIR=/etc/slurm
STATE_DIR=/var/lib/slurm
LOG_DIR=/var/log/slurm
PACKAGES=(munge slurmctld slurmd slurm-client)

die() { echo "slurm-cluster: $*" >&2; exit 2; }

preflight() {
    [[ $(id -u) == 0 ]] || die "needs root (it installs packages and starts system daemons)"
    command -v apt-get >/dev/null || die "needs apt-get (a Debian or Ubuntu machine)"
}

install_packages() {
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return
    export DEBIAN_FRONTEND=noninteractive
    # Daemons are started by this script, not by the packages' init scripts.
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' RETURN
    apt-get update -qq || die "apt-get update failed (no package registry?)"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
    die "munged did not start"
}

write_config() {
    local host node
    host=$(hostname -s)
    # slurmd -C prints this node's CPUs, sockets, cores, threads and memory as a NodeName line.
    node=$(slurmd -C | head -1)
    [[ $node == NodeName=* ]] || die "slurmd -C printed no NodeName line"
    mkdir -p "$CONF_DIR" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd" "$LOG_DIR"
    cat > "$CONF_DIR/slurm.conf" <<CONF
# Written by tools/slurm-cluster.sh: a single-node test cluster.
ClusterName=race-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
JobAcctGatherType=jobacct_gather/none
# Finished jobs stay visible to squeue this long (the status command of profiles/slurm, and the
# test that reads every job of a study that may take over ten minutes on a loaded machine).
MinJobAge=3600
GresTypes=gpu
StateSaveLocation=$STATE_DIR/slurmctld
SlurmdSpoolDir=$STATE_DIR/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
$node Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
# A partition without GPUs, for the refusal of a GPU job there: its one node is a placeholder
# that never registers (it stays down), so nothing runs on it.
NodeName=no-gpu NodeAddr=127.0.0.2 CPUs=1 RealMemory=1000 State=DOWN Reason=placeholder
PartitionName=cpu Nodes=no-gpu MaxTime=INFINITE State=UP
CONF
    cat > "$CONF_DIR/gres.conf" <<CONF
# Two stand-in GPUs: device files that exist, so slurmd accepts them.
Name=gpu File=/dev/null
Name=gpu File=/dev/zero
CONF
}

node_ready() {
    sinfo --noheader --partition debug --format %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'
}

up() {
    preflight
    install_packages
    start_munge
    if node_ready; then echo "slurm-cluster: up (already running)"; return; fi
    write_config
    pgrep -x slurmctld >/dev/null || slurmctld
    pgrep -x slurmd >/dev/null || slurmd
    for _ in $(seq 100); do
        node_ready && { echo "slurm-cluster: up ($(sinfo --noheader --format '%P %T %G' | tr '\n' ';'))"; return; }
        # A node that was down when the controller last saw it comes back on request.
        scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
        sleep 0.2
    done
    die "the node did not come up: see $LOG_DIR/slurmctld.log and $LOG_DIR/slurmd.log"
}

down() {
    preflight
    pkill -x slurmd || true
    pkill -x slurmctld || true
    pkill -x munged || true
    echo "slurm-cluster: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) node_ready ;;
    *) echo "usage: $0 up|down|status" >&2; exit 64 ;;
esac
