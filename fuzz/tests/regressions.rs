//! Every crash the fuzzers found, replayed through the plain-Rust bodies.
//!
//! A crash file from `fuzz/libfuzzer/artifacts/<target>/` goes to
//! `fuzz/regressions/<target>/<short-name>`; `every_saved_crash_input` replays
//! them all. Crashes in code owned by someone else that is not fixed yet get a
//! named test here marked `#[ignore = "<the bug>"]` until it is.

use std::fs;
use std::path::Path;

fn body(target: &str) -> Option<fn(&[u8])> {
    Some(match target {
        "frame_parse" => ferroce_fuzz::frame_parse,
        "header_parsers" => ferroce_fuzz::header_parsers,
        "frame_roundtrip" => ferroce_fuzz::frame_roundtrip,
        "responder" => ferroce_fuzz::responder,
        "requester" => ferroce_fuzz::requester,
        "decode" => ferroce_fuzz::decode,
        _ => return None,
    })
}

#[test]
fn every_saved_crash_input() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions");
    let Ok(dirs) = fs::read_dir(&root) else {
        return;
    };
    for d in dirs {
        let d = d.unwrap().path();
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        let Some(f) = body(&name) else {
            continue;
        };
        for file in fs::read_dir(&d).unwrap() {
            let p = file.unwrap().path();
            if p.extension().is_some_and(|e| e == "md") {
                continue;
            }
            let bytes = fs::read(&p).unwrap();
            eprintln!("replaying {}", p.display());
            f(&bytes);
        }
    }
}
