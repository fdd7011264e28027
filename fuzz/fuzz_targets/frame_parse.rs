//! libFuzzer entry point; the body is `ferroce_fuzz::frame_parse` (replayed by `cargo test -p ferroce-fuzz`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ferroce_fuzz::frame_parse(data));
