//! Links `libibverbs.so.1` from this crate's static library with rdma-core's
//! version script, so each symbol carries the version programs bind to.
//!
//! `cargo run --release -p ferroce-ibverbs-compat [-- <output dir>]` builds
//! the static library and this tool, then writes `<output dir>/libibverbs.so.1`
//! (default: the cargo target directory of the build, e.g. target/release)
//! and `librdmacm.so.1`, a link to it (the library is librdmacm too).
//! Run programs with `LD_LIBRARY_PATH=<output dir>`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const STATICLIB: &str = "libferroce_ibverbs_compat.a";

fn find_staticlib(exe_dir: &Path) -> Option<PathBuf> {
    // Next to the tool (target/<profile>/) or in its deps/ (test builds do
    // not copy it up): the newest, which is the one this build made.
    let mut found = vec![exe_dir.join(STATICLIB)];
    for dir in [exe_dir.join("deps"), exe_dir.to_path_buf()] {
        if let Ok(rd) = std::fs::read_dir(&dir) {
            found.extend(rd.flatten().map(|e| e.path()).filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    n.starts_with("libferroce_ibverbs_compat-") && n.ends_with(".a")
                })
            }));
        }
    }
    found
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

fn main() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ferroce-libibverbs: where am I? {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe_dir = exe.parent().unwrap_or(Path::new(".")).to_path_buf();
    let out_dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| exe_dir.clone());
    let Some(lib) = find_staticlib(&exe_dir) else {
        eprintln!(
            "ferroce-libibverbs: {STATICLIB} not found next to {} (build with cargo, which makes both)",
            exe.display()
        );
        return ExitCode::FAILURE;
    };
    if let Err(e) = std::fs::create_dir_all(&out_dir) {
        eprintln!("ferroce-libibverbs: {}: {e}", out_dir.display());
        return ExitCode::FAILURE;
    }
    let map = out_dir.join("libibverbs.map");
    if let Err(e) = std::fs::write(&map, ferroce_ibverbs_compat::VERSION_SCRIPT) {
        eprintln!("ferroce-libibverbs: {}: {e}", map.display());
        return ExitCode::FAILURE;
    }
    let so = out_dir.join("libibverbs.so.1");
    let tmp = out_dir.join("libibverbs.so.1.tmp");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&cc)
        .arg("-shared")
        .arg("-o")
        .arg(&tmp)
        .arg("-Wl,-soname,libibverbs.so.1")
        .arg(format!("-Wl,--version-script={}", map.display()))
        .arg("-Wl,--gc-sections")
        .arg("-Wl,-z,now")
        .arg("-Wl,--whole-archive")
        .arg(&lib)
        .arg("-Wl,--no-whole-archive")
        .args(["-lpthread", "-ldl", "-lm", "-lgcc_s", "-lc"])
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => {
            eprintln!("ferroce-libibverbs: {cc} failed ({s})");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("ferroce-libibverbs: running {cc}: {e}");
            return ExitCode::FAILURE;
        }
    }
    // Replace atomically: a running program keeps its mapping of the old file.
    if let Err(e) = std::fs::rename(&tmp, &so) {
        eprintln!("ferroce-libibverbs: {}: {e}", so.display());
        return ExitCode::FAILURE;
    }
    // librdmacm.so.1 is the same file: the loader maps a file once however
    // it is named, so programs linked with both libraries get one instance.
    let cm = out_dir.join("librdmacm.so.1");
    if std::fs::read_link(&cm).ok().as_deref() != Some(Path::new("libibverbs.so.1")) {
        let _ = std::fs::remove_file(&cm);
        if let Err(e) = std::os::unix::fs::symlink("libibverbs.so.1", &cm) {
            eprintln!("ferroce-libibverbs: {}: {e}", cm.display());
            return ExitCode::FAILURE;
        }
    }
    println!("{}", so.display());
    ExitCode::SUCCESS
}
