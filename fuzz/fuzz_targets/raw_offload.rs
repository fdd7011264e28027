//! libFuzzer entry point; the body is `ferroce_fuzz::raw_offload` (replayed by `cargo test -p ferroce-fuzz`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroce_fuzz::raw_offload(data));
