#!/usr/bin/env bash
# Issue 5's speed check: ferroce WRITE bandwidth (64 KiB) and 8-byte SEND
# latency between two namespace hosts on a veth pair, each side pinned to its
# own core, against kernel TCP over the same link in the same run. Prints
# JSON lines, with the user+system CPU seconds per GB moved of each side of
# the bandwidth runs.
# Needs root, python3 and /usr/bin/time (Debian package `time`).
# Usage: scripts/bench-verbs.sh [BACKEND...]   (default: afxdp udp afpacket)
set -euo pipefail
cd "$(dirname "$0")/.."
backends=${*:-afxdp udp afpacket}
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 2; }
cargo build --release -q -p ferroce-verbs --bin ferroce --example tcp_baseline
tdir=${CARGO_TARGET_DIR:-target}
bin=$tdir/release/ferroce
tcp=$tdir/release/examples/tcp_baseline
name=bench$$
hosts=/tmp/ferroce-bench-hosts.$$
"$bin" netns up 2 "$name" > "$hosts"
a=frc-$name-h0; b=frc-$name-h1
# Only this run's namespaces: `netns down` would also remove other runs' (tests on a shared machine).
ipa=$(awk 'NR==1{print $3}' "$hosts")
cpu=/tmp/ferroce-bench-cpu.$$
trap 'ip netns del "$a"; ip netns del "$b"; rm -f "$hosts" "$cpu".*' EXIT
# Runs a command, keeping its user+system CPU seconds in "$cpu.$1".
t() { /usr/bin/time -o "$cpu.$1" -f "%U %S" "${@:2}"; }
# {"test":..., "cpu_s_per_gb_client":..., "cpu_s_per_gb_server":...} for BYTES moved.
per_gb() {
    awk -v t="$1" -v b="$2" 'FNR == 1 { s[n++] = $1 + $2 }
        END { printf "{\"test\":\"%s\",\"gb\":%.2f,\"cpu_s_per_gb_client\":%.3f,\"cpu_s_per_gb_server\":%.3f}\n", t, b / 1e9, s[0] * 1e9 / b, s[1] * 1e9 / b }' \
        "$cpu.client" "$cpu.server"
}
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

echo "== kernel TCP stream, 64 KiB writes, 5 s"
t server ip netns exec "$a" taskset -c 1 "$tcp" server 18600 & srv=$!
sleep 0.3
out=$(t client ip netns exec "$b" taskset -c 0 "$tcp" stream "$ipa" 18600 65536 5)
echo "$out"
# The server takes two connections: a one-message ping-pong ends it.
ip netns exec "$b" "$tcp" pingpong "$ipa" 18600 8 1 > /dev/null
wait $srv || true
per_gb tcp_stream "$(echo "$out" | json 'd["bytes"]')"
echo "== kernel TCP ping-pong, 8 B, 20000 round trips"
ip netns exec "$a" taskset -c 1 "$tcp" server 18600 & srv=$!
sleep 0.3
ip netns exec "$b" taskset -c 0 "$tcp" pingpong "$ipa" 18600 8 20000
ip netns exec "$b" "$tcp" pingpong "$ipa" 18600 8 1 > /dev/null
wait $srv || true

for backend in $backends; do
    echo "== ferroce bench write, 64 KiB, 5 s, backend $backend"
    # -f 0: the figure covers the whole run, as the CPU time it is divided by does (perftest's
    # default margins would leave a second out at each end).
    t server ip netns exec "$a" taskset -c 1 "$bin" bench write -s 65536 -D 5 -f 0 --backend "$backend" --json > /dev/null & srv=$!
    sleep 0.5
    out=$(t client ip netns exec "$b" taskset -c 0 "$bin" bench write -s 65536 -D 5 -f 0 --backend "$backend" --json "$ipa")
    echo "$out"
    wait $srv || true
    per_gb "ferroce_write_$backend" "$(echo "$out" | json 'd["bw_mb_s"] * d["seconds"] * 1e6')"
    echo "== ferroce bench send --lat, 8 B, 20000 iterations, backend $backend"
    ip netns exec "$a" taskset -c 1 "$bin" bench send --lat -s 8 -n 20000 --backend "$backend" --json > /dev/null & srv=$!
    sleep 0.5
    ip netns exec "$b" taskset -c 0 "$bin" bench send --lat -s 8 -n 20000 --backend "$backend" --json "$ipa"
    wait $srv || true
done
