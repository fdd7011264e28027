#!/usr/bin/env bash
# ferroce-collectives allreduce vs Open MPI's MPI_Allreduce over TCP, one run:
# 4 ranks in 4 network namespaces on a bridge (MTU 9000, 198.18.0.0/24),
# both launched by the same mpirun on the same namespaces, interleaved per
# round. Prints both tables and the ratios. Needs root, openmpi-bin and
# libopenmpi-dev (.ci/install-deps.sh).
#
#   scripts/coll-vs-mpi.sh [-b 8] [-e 64M] [-f 4] [-i 10] [-w 2] [-r 1] [-B] [-- extra coll-bench args]
#
# -B: mpirun binds every rank of both jobs to one core, round robin over the cores
# (`--map-by core:oversubscribe --bind-to core:overload-allowed`: ranks 0, 1, 2, 3 on
# cores 0, 1, 0, 1 here), as `mpirun --bind-to core` does for a job that fits; without
# it neither job is bound (`--bind-to none`), Open MPI's choice for an oversubscribed job.
#
# Environment: CARGO_TARGET_DIR (where the release build goes); COLL_BENCH (a
# ferroce-coll-bench binary to run instead of building one, for A/B runs); FERROCE_BACKEND,
# FERROCE_ENGINE, FERROCE_ALLREDUCE_ALGO, FERROCE_COLL_*, FERROCE_ACK_DELAY_US, FERROCE_ACK_COALESCE,
# FERROCE_UDP_GATHER, FERROCE_UDP_MULTISHOT (passed to the ferroce ranks).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
B=8 E=64M F=4 I=10 W=2 R=1 N=4 BIND=none
while getopts "b:e:f:i:w:r:B" o; do
    case $o in
    b) B=$OPTARG ;; e) E=$OPTARG ;; f) F=$OPTARG ;; i) I=$OPTARG ;; w) W=$OPTARG ;; r) R=$OPTARG ;;
    B) BIND=core ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
[ "$(id -u)" = 0 ] || { echo "coll-vs-mpi: needs root (network namespaces)" >&2; exit 1; }
# .ci/install-deps.sh installs Open MPI (for the drop-in library's tests); fetch it here if missing.
if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then
    echo "coll-vs-mpi: installing openmpi-bin and libopenmpi-dev" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev ||
        { echo "coll-vs-mpi: needs openmpi-bin and libopenmpi-dev" >&2; exit 1; }
fi
bytes() { numfmt --from=iec "$1"; }
Bb=$(bytes "$B") Eb=$(bytes "$E")

work=$(mktemp -d /tmp/coll-vs-mpi.XXXXXX)
tag="fcvm$$"
cleanup() {
    for i in $(seq 0 $((N - 1))); do ip netns del "$tag-h$i" 2>/dev/null || true; done
    ip netns del "$tag-br" 2>/dev/null || true
    ip link del "$tag" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

if [ -n "${COLL_BENCH:-}" ]; then
    bench=$COLL_BENCH
else
    echo "# building (release) ..." >&2
    (cd "$repo" && cargo build -q --release -p ferroce-collectives --bin ferroce-coll-bench)
    bench="${CARGO_TARGET_DIR:-$repo/target}/release/ferroce-coll-bench"
fi
mpicc -O2 -o "$work/mpi-allreduce" "$here/mpi-allreduce.c"

# The topology of ferroce_nic::netns (bridge in its own namespace).
ip netns add "$tag-br"
ip -n "$tag-br" link add br0 mtu 9000 type bridge
ip -n "$tag-br" link set br0 up
for i in $(seq 0 $((N - 1))); do
    ns="$tag-h$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add name veth0 mtu 9000 type veth peer name "p$i" netns "$tag-br" mtu 9000
    ip -n "$ns" link set veth0 address "02:fe:00:00:00:0$((i + 1))"
    ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev veth0
    ip -n "$ns" link set veth0 up
    ip -n "$tag-br" link set "p$i" master br0
    ip -n "$tag-br" link set "p$i" up
done
for i in $(seq 0 $((N - 1))); do
    for j in $(seq 0 $((N - 1))); do
        [ "$i" = "$j" ] || ip -n "$tag-h$i" neigh replace "198.18.0.$((j + 1))" \
            lladdr "02:fe:00:00:00:0$((j + 1))" dev veth0 nud permanent
    done
done

# mpirun forks every rank on this host; the wrapper moves each into its
# namespace by rank before exec. The ranks reach mpirun's PMIx server over
# TCP, which listens on loopback by default: a leg from this namespace into
# the bridge (198.18.0.254) carries that control traffic instead.
ip link add name "$tag" mtu 9000 type veth peer name phost netns "$tag-br" mtu 9000
ip addr add 198.18.0.254/24 dev "$tag"
ip link set "$tag" up
ip -n "$tag-br" link set phost master br0
ip -n "$tag-br" link set phost up
cat >"$work/in-ns.sh" <<WRAP
#!/bin/sh
exec ip netns exec "$tag-h\$OMPI_COMM_WORLD_RANK" "\$@"
WRAP
chmod +x "$work/in-ns.sh"
export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include="$tag"
if [ "$BIND" = core ]; then
    binding=(--map-by core:oversubscribe --bind-to core:overload-allowed)
else
    binding=(--bind-to none)
fi
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$N" "${binding[@]}"
    --mca btl tcp,self --mca btl_tcp_if_include veth0 --mca oob_tcp_if_include $tag
    -x MASTER_ADDR=198.18.0.1 -x MASTER_PORT=29517)
for v in FERROCE_BACKEND FERROCE_ENGINE FERROCE_ALLREDUCE_ALGO FERROCE_COLL_CHUNK FERROCE_COLL_SLOTS \
    FERROCE_COLL_SPIN_US FERROCE_COLL_ACK_TIMEOUT FERROCE_COLL_SMALL_BACKEND FERROCE_COLL_SMALL_MAX FERROCE_XDP_MODE FERROCE_COLL_STATS FERROCE_ACK_DELAY_US FERROCE_ACK_COALESCE FERROCE_UDP_GATHER FERROCE_UDP_MULTISHOT FERROCE_COLL_BIND; do
    [ -n "${!v:-}" ] && mpi+=(-x "$v")
done

# CPU time of each whole run (all ranks and mpirun), when perf is there:
# on a shared machine it says more than wall time about the cost per byte.
cpu() {
    local out=$1
    shift
    if command -v perf >/dev/null; then
        perf stat -x, -e task-clock -o "$out.cpu" -- "$@"
    else
        "$@"
    fi
}
for round in $(seq 1 "$R"); do
    echo "# round $round/$R: Open MPI ..." >&2
    cpu "$work/mpi.$round" timeout 600 "${mpi[@]}" "$work/in-ns.sh" "$work/mpi-allreduce" \
        "$Bb" "$Eb" "$F" "$W" "$I" >"$work/mpi.$round.txt"
    echo "# round $round/$R: ferroce ..." >&2
    cpu "$work/ferroce.$round" timeout 600 "${mpi[@]}" "$work/in-ns.sh" "$bench" allreduce \
        --fabric env -b "$Bb" -e "$Eb" -f "$F" -w "$W" -i "$I" "$@" \
        >"$work/ferroce.$round.txt" 2>"$work/ferroce.$round.err" ||
        { cat "$work/ferroce.$round.err" >&2; exit 1; }
done
cpusum() { awk -F, '/task-clock/ { s += $1 } END { if (s) printf "%.2f", s / 1e3; else printf "n/a" }' "$@" 2>/dev/null || echo n/a; }

echo "## ranks bound: $BIND (mpirun ${binding[*]})"
echo "## Open MPI $(mpirun --version | head -1 | awk '{print $NF}') MPI_Allreduce, btl tcp (round 1)"
cat "$work/mpi.1.txt"
echo
echo "## ferroce-coll-bench allreduce, one process per rank under the same mpirun (round 1)"
cat "$work/ferroce.1.txt"
# FERROCE_COLL_STATS: each rank's device counters (on its stderr).
[ -n "${FERROCE_COLL_STATS:-}" ] && sed 's/^/# /' "$work/ferroce.1.err"
echo
# Per size over the rounds: the best (lowest) time and the median, for both.
times() { awk '!/^#/ && NF { print $1, $(NF-3) }' "$@"; }
summary() {
    times "$@" | sort -k1,1n -k2,2g | awk '
        function flush() { if (n) printf "%s %s %s\n", s, v[1], (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }
        $1 != s { flush(); s = $1; n = 0 }
        { v[++n] = $2 }
        END { flush() }' | sort -k1,1
}
summary "$work"/mpi.*.txt >"$work/mpi.sum"
summary "$work"/ferroce.*.txt >"$work/ferroce.sum"
echo "## CPU seconds over all $R rounds (every rank, mpirun, start-up): Open MPI $(cpusum "$work"/mpi.*.cpu), ferroce $(cpusum "$work"/ferroce.*.cpu)"
echo "## load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (2 vCPUs; other jobs share the machine)"
echo "## ratios over $R rounds (ratio = Open MPI time / ferroce time, so > 1 means ferroce is faster)"
printf "# %10s  %10s  %10s  %10s  %10s  %7s  %10s  %10s  %7s\n" size "ompi best" "frc best" \
    "ompi busbw" "frc busbw" ratio "ompi med" "frc med" "ratio"
printf "# %10s  %10s  %10s  %10s  %10s  %7s  %10s  %10s  %7s\n" "(B)" "(us)" "(us)" "(GB/s)" "(GB/s)" \
    "(best)" "(us)" "(us)" "(med)"
join "$work/mpi.sum" "$work/ferroce.sum" | sort -n | awk -v n="$N" '{
    bus = 2 * (n - 1) / n; ob = $1 / $2 / 1e3 * bus; fb = $1 / $4 / 1e3 * bus;
    printf "%12d  %10.1f  %10.1f  %10.3f  %10.3f  %7.2f  %10.1f  %10.1f  %7.2f\n",
        $1, $2, $4, ob, fb, $2 / $4, $3, $5, $3 / $5 }'
