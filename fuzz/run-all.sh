#!/usr/bin/env bash
# Run every fuzz target for a bounded time; exit non-zero on the first crash.
#
#   fuzz/run-all.sh [SECONDS_PER_TARGET] [TARGET...]     (default 30 s, all targets)
#
# Stable Rust, no sanitizer (`-s none`), unless FERROCE_FUZZ_ASAN=1 and a nightly
# toolchain exists: then `cargo +nightly fuzz run` with AddressSanitizer.
# The committed seeds (fuzz/corpus/<target>/) are read only; what libFuzzer
# finds goes to a scratch corpus under fuzz/libfuzzer/target/corpus/<target>/
# (kept between runs, ignored by git). Crashes land in
# fuzz/libfuzzer/artifacts/<target>/; turn each into a test in fuzz/tests/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(frame_parse header_parsers frame_roundtrip responder requester decode raw_offload)
command -v cargo-fuzz >/dev/null 2>&1 || { echo "run-all: cargo-fuzz missing (cargo install cargo-fuzz --locked)" >&2; exit 1; }

if [ "${FERROCE_FUZZ_ASAN:-0}" = 1 ] && cargo +nightly --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer -s address)
    mode="nightly + ASan"
else
    fuzz=(cargo +stable fuzz run --fuzz-dir fuzz/libfuzzer -s none)
    mode="stable, -s none"
fi
echo "run-all: ${targets[*]} for ${secs}s each ($mode)"
# Build once up front, so the time budget is spent fuzzing.
"${fuzz[0]}" "${fuzz[1]}" fuzz build "${fuzz[@]:4}"

status=0
for t in "${targets[@]}"; do
    scratch="fuzz/libfuzzer/target/corpus/$t"
    mkdir -p "$scratch" "fuzz/libfuzzer/artifacts/$t"
    log="fuzz/libfuzzer/target/$t.log"
    echo "== $t"
    if "${fuzz[@]}" "$t" "$scratch" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
        -dict=fuzz/roce.dict -print_final_stats=1 \
        -artifact_prefix="fuzz/libfuzzer/artifacts/$t/" >"$log" 2>&1; then
        # The last status line: execs, exec/s, cov, ft, corpus.
        grep -E '^#[0-9]+' "$log" | tail -n 1 || true
        grep -E 'stat::(number_of_executed_units|average_exec_per_sec)' "$log" || true
    else
        status=1
        echo "run-all: $t FAILED (log: $log)" >&2
        grep -E -A 30 'panicked|ERROR: libFuzzer|deadly signal|Test unit written' "$log" | head -n 60 >&2 || tail -n 40 "$log" >&2
    fi
done
exit "$status"
