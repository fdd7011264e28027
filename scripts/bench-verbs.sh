#!/usr/bin/env bash
# Issue 5's speed check: ferroce WRITE bandwidth (64 KiB) and 8-byte SEND
# latency between two namespace hosts on a veth pair, each side pinned to its
# own core, against kernel TCP over the same link in the same run. Prints
# JSON lines; "cpu=U+S" lines are user+system CPU seconds of each process.
# Needs root and /usr/bin/time (Debian package `time`).
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
trap 'ip netns del "$a"; ip netns del "$b"; rm -f "$hosts"' EXIT
ipa=$(awk 'NR==1{print $3}' "$hosts")
t() { /usr/bin/time -f "cpu=%U+%S ($1)" "${@:2}"; }

echo "== kernel TCP stream, 64 KiB writes, 5 s"
t tcp-server ip netns exec "$a" taskset -c 1 "$tcp" server 18600 & srv=$!
sleep 0.3
t tcp-client ip netns exec "$b" taskset -c 0 "$tcp" stream "$ipa" 18600 65536 5
echo "== kernel TCP ping-pong, 8 B, 20000 round trips"
ip netns exec "$b" taskset -c 0 "$tcp" pingpong "$ipa" 18600 8 20000
wait $srv || true

for backend in $backends; do
    echo "== ferroce bench write, 64 KiB, 5 s, backend $backend"
    t ferroce-server ip netns exec "$a" taskset -c 1 "$bin" bench write -s 65536 -D 5 --backend "$backend" --json > /dev/null & srv=$!
    sleep 0.5
    t ferroce-client ip netns exec "$b" taskset -c 0 "$bin" bench write -s 65536 -D 5 --backend "$backend" --json "$ipa"
    wait $srv || true
    echo "== ferroce bench send --lat, 8 B, 20000 iterations, backend $backend"
    ip netns exec "$a" taskset -c 1 "$bin" bench send --lat -s 8 -n 20000 --backend "$backend" --json > /dev/null & srv=$!
    sleep 0.5
    ip netns exec "$b" taskset -c 0 "$bin" bench send --lat -s 8 -n 20000 --backend "$backend" --json "$ipa"
    wait $srv || true
done
