#!/usr/bin/env bash
# Issue 9's speed check: Debian's ib_write_bw through ferroce's libibverbs.so.1
# against `ferroce bench write` on the same two-namespace veth link, rounds
# alternating so both see the same machine. Prints MB/s per run and the ratio
# of the medians. Needs root and perftest.
# Usage: scripts/bench-compat.sh [ROUNDS] [BACKEND...]   (default: 3 afxdp afpacket)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}; shift || true
backends=${*:-afxdp afpacket}
[ "$(id -u)" = 0 ] || { echo "bench-compat: needs root (network namespaces)" >&2; exit 2; }
command -v ib_write_bw >/dev/null || { echo "bench-compat: needs perftest" >&2; exit 2; }
target=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p ferroce-verbs --bin ferroce
lib=$(mktemp -d)
cargo run --release -q -p ferroce-ibverbs-compat -- "$lib" >/dev/null
bin=$target/release/ferroce
name=bc$$
"$bin" netns up 2 "$name" > "$lib/hosts"
trap '"$bin" netns down >/dev/null; rm -rf "$lib"' EXIT
a=frc-$name-h0; b=frc-$name-h1
ipa=$(awk 'NR==1{print $3}' "$lib/hosts")
median() { sort -n | awk '{v[NR]=$1} END {print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

for backend in $backends; do
    for size in 65536 1048576; do
        iters=$(( size > 65536 ? 2000 : 20000 ))
        : > "$lib/shim"; : > "$lib/bench"
        for r in $(seq "$rounds"); do
            env="LD_LIBRARY_PATH=$lib FERROCE_DEVICE=veth0 FERROCE_BACKEND=$backend"
            ip netns exec "$a" env $env ib_write_bw -F -x 1 -s "$size" -n "$iters" -p 18700 >/dev/null 2>&1 & srv=$!
            sleep 0.5
            ip netns exec "$b" env $env ib_write_bw -F -x 1 -s "$size" -n "$iters" -p 18700 "$ipa" 2>/dev/null |
                awk -v s="$size" '$1==s {print $4}' >> "$lib/shim"
            wait $srv || true
            ip netns exec "$a" "$bin" bench write -s "$size" -n "$iters" -p 18701 --backend "$backend" --json >/dev/null 2>&1 & srv=$!
            sleep 0.5
            ip netns exec "$b" "$bin" bench write -s "$size" -n "$iters" -p 18701 --backend "$backend" --json "$ipa" 2>/dev/null |
                grep -o '"bw_mb_s":[0-9.]*' | cut -d: -f2 >> "$lib/bench"
            wait $srv || true
        done
        s=$(median < "$lib/shim"); f=$(median < "$lib/bench")
        echo "$backend $size B: ib_write_bw via the library [$(tr '\n' ' ' < "$lib/shim")] MB/s, ferroce bench write [$(tr '\n' ' ' < "$lib/bench")] MB/s; median ratio $(awk -v s="$s" -v f="$f" 'BEGIN {printf "%.2f", (f > 0) ? s / f : 0}')x"
    done
done
