#!/usr/bin/env bash
# A multi-node Slurm cluster on one machine, for the tests and for a site to try the kit
# across nodes (docs/multinode.md):
#
#   login node     a network namespace holding the cluster's bridge (ADDR.1) and slurmctld;
#                  user commands run here (`exec`), as on a real login node
#   compute nodes  N (default 3), each in its own network, UTS (host name) and mount
#                  namespace, on the bridge through a veth pair (ADDR.11, ADDR.12, ...), one
#                  slurmd each, its own node-local scratch: a tmpfs mounted at STATE/scratch
#                  in that node only (the host and the other nodes see an empty directory)
#   shared         the host's file tree is the "parallel file system" every node sees;
#                  munged runs once, on the host (a Unix socket under STATE)
#
# Every address lives only inside namespaces this script makes (private range, default
# 10.77.0.0/24, HPCKIT_MULTINODE_NET to change the first three octets). Node names:
# nid001..nidN, or HPCKIT_NODE_NAMES="cn01 cn02 gpu1" (names of several prefixes give host
# lists of several bracket groups). Node scratch size: HPCKIT_SCRATCH_SIZE (default 1g).
#
#   tests/slurm/multinode.sh start STATE_DIR [N]     # exit 0 once sinfo sees N nodes idle
#   tests/slurm/multinode.sh exec STATE_DIR CMD...   # run CMD on the login node (SLURM_CONF set)
#   tests/slurm/multinode.sh node STATE_DIR NODE CMD...  # run CMD inside compute node NODE
#   tests/slurm/multinode.sh pids STATE_DIR NODE     # the PIDs of every process on compute node NODE
#   tests/slurm/multinode.sh stop STATE_DIR          # every process in the namespaces, munged, the namespaces
#
# Needs root, Debian's slurm-wlm, munge and iproute2, util-linux (unshare, nsenter).
set -euo pipefail
usage="usage: multinode.sh start STATE_DIR [N] | exec STATE_DIR CMD... | node STATE_DIR NODE CMD... | pids STATE_DIR NODE | stop STATE_DIR"
cmd=${1:?$usage}
state=$(realpath -m "${2:?$usage}")
shift 2
here=$(cd "$(dirname "$0")" && pwd)
# namespace names from the state directory: two clusters on one machine do not meet
tag=hk$(printf %s "$state" | md5sum | cut -c1-6)
login_ns=$tag-login

in_ns() {   # in_ns NETNS HOSTNAME CMD...: CMD with that network namespace, host name and /etc/hosts
    local ns=$1 name=$2
    shift 2
    # nsenter, not `ip netns exec`: that remounts /sys without the cgroup tree slurmd needs
    nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private \
        sh -c 'hostname "$1"; mount --bind "$2/hosts" /etc/hosts; shift 2; exec "$@"' sh "$name" "$state" "$@"
}

slurmd_pid() { cat "$state/slurmd-$1.pid" 2>/dev/null; }

stop() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk -v t="$tag-" 'index($1, t) == 1 {print $1}'); do
        for sig in TERM KILL; do
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            [ -n "$pids" ] || break
            kill -s "$sig" $pids 2>/dev/null || true
            for _ in $(seq 50); do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.1; done
        done
    done
    if [ -f "$state/munge/munged.pid" ]; then
        pid=$(cat "$state/munge/munged.pid")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$state/munge/munged.pid"
    fi
    for ns in $(ip netns list 2>/dev/null | awk -v t="$tag-" 'index($1, t) == 1 {print $1}'); do
        ip netns del "$ns"
    done
    rm -f "$state"/slurmd-*.pid "$state/slurmctld.pid"
}

case $cmd in
stop) stop; exit 0 ;;
exec)
    [ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
    ip netns list | grep -q "^$login_ns\b" || { echo "multinode.sh: no cluster running for $state" >&2; exit 2; }
    export SLURM_CONF=$state/slurm.conf
    rc=0; in_ns "$login_ns" login "$@" || rc=$?
    exit $rc ;;
node)
    [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
    node=$1; shift
    pid=$(slurmd_pid "$node") || { echo "multinode.sh: no slurmd of node $node under $state" >&2; exit 2; }
    export SLURM_CONF=$state/slurm.conf
    exec nsenter -t "$pid" -n -u -m "$@" ;;
pids)
    [ $# = 1 ] || { echo "$usage" >&2; exit 2; }
    pid=$(slurmd_pid "$1") || { echo "multinode.sh: no slurmd of node $1 under $state" >&2; exit 2; }
    ns=$(for n in $(ip netns list | awk -v t="$tag-n" 'index($1, t) == 1 {print $1}'); do
        if ip netns pids "$n" | grep -x "$pid" >/dev/null; then echo "$n"; fi; done)
    [ -n "$ns" ] || { echo "multinode.sh: node $1 has no namespace under $state" >&2; exit 2; }
    ip netns pids "$ns"
    exit 0 ;;
start) ;;
*) echo "$usage" >&2; exit 2 ;;
esac

n=${1:-3}
[ "$(id -u)" = 0 ] || { echo "multinode.sh: run as root (namespaces, slurmd)" >&2; exit 2; }
for exe in munged slurmctld slurmd sinfo ip unshare nsenter; do
    command -v "$exe" >/dev/null || { echo "multinode.sh: $exe not found (apt-get install slurm-wlm munge iproute2 util-linux)" >&2; exit 2; }
done
if ip netns list | grep -q "^$login_ns\b"; then
    echo "multinode.sh: a cluster is already running for $state: stop it first" >&2; exit 2
fi
read -r -a names <<< "${HPCKIT_NODE_NAMES:-$(for i in $(seq "$n"); do printf 'nid%03d ' "$i"; done)}"
[ "${#names[@]}" = "$n" ] || { echo "multinode.sh: HPCKIT_NODE_NAMES has ${#names[@]} names for $n nodes" >&2; exit 2; }
net=${HPCKIT_MULTINODE_NET:-10.77.0}
scratch_size=${HPCKIT_SCRATCH_SIZE:-1g}

mkdir -p "$state/munge" "$state/slurmctld" "$state/scratch"
for name in "${names[@]}"; do mkdir -p "$state/slurmd/$name"; done
chmod 0700 "$state/munge"
[ -f "$state/munge/munge.key" ] || { head -c 1024 /dev/urandom > "$state/munge/munge.key"; chmod 0600 "$state/munge/munge.key"; }
mem=$(awk -v n="$n" '/MemTotal/ {print int($2 / 1024 * 0.8 / n)}' /proc/meminfo)
{
    printf '127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n%s.1 login\n' "$net"
    for i in "${!names[@]}"; do printf '%s.%d %s\n' "$net" $((11 + i)) "${names[$i]}"; done
} > "$state/hosts"
nodes=$(for i in "${!names[@]}"; do
    printf 'NodeName=%s NodeAddr=%s.%d CPUs=%d RealMemory=%d State=UNKNOWN\n' "${names[$i]}" "$net" $((11 + i)) "$(nproc)" "$mem"
done)
awk -v nodes="$nodes" '$0 == "@NODES@" {print nodes; next} {print}' "$here/multinode.conf.in" |
    sed -e "s|@STATE@|$state|g" -e "s|@LOGIN@|login|g" -e "s|@LOGIN_ADDR@|$net.1|g" > "$state/slurm.conf"
export SLURM_CONF=$state/slurm.conf

trap 'echo "multinode.sh: start failed; stopping what was started" >&2; stop' ERR
munged --force --socket="$state/munge/munge.socket" --key-file="$state/munge/munge.key" \
    --pid-file="$state/munge/munged.pid" --log-file="$state/munge/munged.log" --seed-file="$state/munge/munged.seed"

# the network: a bridge in the login node's namespace, a veth pair per compute node
ip netns add "$login_ns"
ip -n "$login_ns" link set lo up
ip -n "$login_ns" link add br0 type bridge
ip -n "$login_ns" addr add "$net.1/24" dev br0
ip -n "$login_ns" link set br0 up
for i in "${!names[@]}"; do
    ns=$tag-n$((i + 1))
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$login_ns" link add "v$((i + 1))" type veth peer name eth0 netns "$ns"
    ip -n "$login_ns" link set "v$((i + 1))" master br0 up
    ip -n "$ns" addr add "$net.$((11 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
done

in_ns "$login_ns" login slurmctld -f "$SLURM_CONF" -i
for i in "${!names[@]}"; do
    # the node's scratch: a tmpfs mounted in this node's mount namespace only, alive as long
    # as its slurmd (and the jobs slurmd starts, which inherit the namespaces)
    in_ns "$tag-n$((i + 1))" "${names[$i]}" sh -c \
        'mount -t tmpfs -o size="$1",mode=1777 "hpckit-scratch-$2" "$3/scratch" && exec slurmd -f "$4" -N "$2"' \
        sh "$scratch_size" "${names[$i]}" "$state" "$SLURM_CONF"
done
trap - ERR
for _ in $(seq 90); do
    idle=$(in_ns "$login_ns" login sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 == "idle"' | wc -l)
    if [ "$idle" = "$n" ]; then
        echo "export SLURM_CONF=$SLURM_CONF"
        echo "# run commands on the login node: $0 exec $state CMD..."
        exit 0
    fi
    sleep 1
done
echo "multinode.sh: $n nodes did not become idle in 90 s; see $state/slurmctld.log and $state/slurmd-*.log" >&2
in_ns "$login_ns" login sinfo -N >&2 || true
stop
exit 1
