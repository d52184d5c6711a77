#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, for tests: munged + slurmctld + slurmd, all state
# (config, keys, spool, logs, PIDs) under one directory.
#
#   tests/slurm/cluster.sh start STATE_DIR   # prints `export SLURM_CONF=...`; exit 0 when `sinfo` sees the node idle
#   tests/slurm/cluster.sh stop STATE_DIR    # stops the daemons it started, by PID
#
# Needs Debian's slurm-wlm and munge, and root (slurmd launches jobs as their users).
set -euo pipefail
cmd=${1:?usage: cluster.sh start|stop STATE_DIR}
state=$(realpath -m "${2:?usage: cluster.sh start|stop STATE_DIR}")
here=$(cd "$(dirname "$0")" && pwd)

stop() {
    for d in slurmd slurmctld munged; do
        pidfile="$state/$d.pid"
        [ -f "$state/munge/$d.pid" ] && pidfile="$state/munge/$d.pid"
        if [ -f "$pidfile" ]; then
            pid=$(cat "$pidfile")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
            kill -9 "$pid" 2>/dev/null || true
            rm -f "$pidfile"
        fi
    done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "cluster.sh: unknown command $cmd" >&2; exit 2; }
for exe in munged slurmctld slurmd sinfo; do
    command -v "$exe" >/dev/null || { echo "cluster.sh: $exe not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
done

mkdir -p "$state/munge" "$state/slurmctld" "$state/slurmd"
chmod 0700 "$state/munge"
[ -f "$state/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$state/munge/munge.key"; chmod 0600 "$state/munge/munge.key"; }
node=$(hostname -s)
mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
ctld_port=${HPCKIT_SLURMCTLD_PORT:-16817}
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 20); do   # another cluster (or anything) on these ports: take the next pair
    busy "$ctld_port" || busy "$((ctld_port + 1))" || break
    ctld_port=$((ctld_port + 10))
done
sed -e "s|@STATE@|$state|g" -e "s|@NODE@|$node|g" -e "s|@CPUS@|$(nproc)|g" -e "s|@MEMORY_MB@|$mem|g" \
    -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$((ctld_port + 1))|g" \
    "$here/slurm.conf.in" > "$state/slurm.conf"
export SLURM_CONF="$state/slurm.conf"

munged --force --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" \
    --pid-file="$state/munge/munged.pid" --log-file="$state/munge/munged.log" \
    --seed-file="$state/munge/munged.seed"
slurmctld -f "$SLURM_CONF" -i     # -i: ignore state from an earlier cluster in this directory
slurmd -f "$SLURM_CONF" -N "$node"
for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 1
done
echo "cluster.sh: the node did not become idle in 60 s; see $state/slurmctld.log and $state/slurmd.log" >&2
sinfo >&2 || true
stop
exit 1
