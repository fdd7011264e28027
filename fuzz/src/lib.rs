//! ferroce-fuzz: the bodies of ferroce's fuzz targets.
//!
//! Each function takes arbitrary bytes and must never panic; the libFuzzer
//! entry points in `fuzz_targets/` call them, and plain `cargo test` replays
//! the seed corpus and every crash ever found through the same functions.
#![forbid(unsafe_code)]
