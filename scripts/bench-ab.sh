#!/usr/bin/env bash
# Interleaved A/B of `ferroce bench write` against kernel TCP on a noisy
# machine: each round runs a TCP stream, then every variant, between two
# namespace hosts on a veth pair (each side pinned to its own core), and
# prints each variant's bandwidth, its ratio to that round's TCP, and the
# client's CPU seconds per GB; at the end, the medians.
# Needs root, python3 and /usr/bin/time.
#
#   scripts/bench-ab.sh ROUNDS LABEL=BINARY[,ENV=VALUE...][,--FLAG...] ...
#   e.g. scripts/bench-ab.sh 8 old=/tmp/old/ferroce new=target/release/ferroce \
#        spin=target/release/ferroce,FERROCE_ENGINE_SPIN_US=50 busy=target/release/ferroce,--busy-poll
# (a --FLAG is passed to both sides' `ferroce bench write`)
# Environment: BE (backend, default udp), D (seconds per run, default 3), S (message size, default 65536).
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 2; }
cargo build --release -q -p ferroce-verbs --bin ferroce --example tcp_baseline
tdir=${CARGO_TARGET_DIR:-target}
tcp=$tdir/release/examples/tcp_baseline
name=ab$$
hosts=/tmp/ferroce-ab-hosts.$$
log=/tmp/ferroce-ab-log.$$
cpu=/tmp/ferroce-ab-cpu.$$
"$tdir/release/ferroce" netns up 2 "$name" > "$hosts"
a=frc-$name-h0; b=frc-$name-h1; ipa=$(awk 'NR==1{print $3}' "$hosts")
trap 'ip netns del "$a"; ip netns del "$b"; rm -f "$hosts" "$log" "$cpu"' EXIT
D=${D:-3}; BE=${BE:-udp}; S=${S:-65536}
rounds=$1; shift
for _ in $(seq "$rounds"); do
    ip netns exec "$a" taskset -c 1 "$tcp" server 18600 & srv=$!
    sleep 0.2
    t=$(ip netns exec "$b" taskset -c 0 "$tcp" stream "$ipa" 18600 65536 "$D" |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["gbit_s"], 2))')
    ip netns exec "$b" "$tcp" pingpong "$ipa" 18600 8 1 > /dev/null
    wait $srv
    line="tcp $t"
    for v in "$@"; do
        label=${v%%=*}; rest=${v#*=}; bin=${rest%%,*}; envs=(); flags=(); items=()
        [ "$rest" != "$bin" ] && IFS=, read -r -a items <<< "${rest#*,}"
        for it in "${items[@]}"; do
            case $it in -*) flags+=("$it") ;; *) envs+=("$it") ;; esac
        done
        env "${envs[@]}" ip netns exec "$a" taskset -c 1 "$bin" bench write -s "$S" -D "$D" --backend "$BE" "${flags[@]}" --json > /dev/null & srv=$!
        sleep 0.4
        out=$(env "${envs[@]}" /usr/bin/time -o "$cpu" -f "%U %S" ip netns exec "$b" taskset -c 0 \
            "$bin" bench write -s "$S" -D "$D" --backend "$BE" "${flags[@]}" --json "$ipa")
        wait $srv
        line="$line | $(echo "$out" | python3 -c '
import json, sys
d = json.loads(sys.stdin.read()); label, tcp, cpu = sys.argv[1], float(sys.argv[2]), sys.argv[3].split()
gb = d["bw_mb_s"] * d["seconds"] / 1e3
ok = "" if d["data_verified"] else " DATA WRONG"
print("%s %.2f (%.2f) c/GB %.3f%s" % (label, d["bw_gbit_s"], d["bw_gbit_s"] / tcp, (float(cpu[0]) + float(cpu[1])) / gb, ok))
' "$label" "$t" "$(cat "$cpu")")"
    done
    echo "$line" | tee -a "$log"
done
python3 - "$log" <<'PY'
import re, statistics as st, sys
rows = [l for l in open(sys.argv[1]) if l.startswith("tcp")]
tcp = [float(l.split()[1]) for l in rows]
print("tcp median %.2f Gbit/s (%d rounds, %.2f-%.2f)" % (st.median(tcp), len(tcp), min(tcp), max(tcp)))
by = {}
for l in rows:
    for part in l.split("|")[1:]:
        m = re.match(r"\s*(\S+) (\S+) \((\S+)\) c/GB (\S+)", part)
        if m:
            by.setdefault(m.group(1), []).append([float(x) for x in m.groups()[1:]])
for k, v in by.items():
    print("%-10s median %.2f Gbit/s, %.2fx TCP (%.2f-%.2f), client CPU %.3f s/GB"
          % (k, st.median(x[0] for x in v), st.median(x[1] for x in v), min(x[1] for x in v), max(x[1] for x in v), st.median(x[2] for x in v)))
PY
