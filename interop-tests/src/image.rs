//! The rxe VM image cache: built by `vm/build-image.sh`, found here.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::vm::Error;

/// The image builder shipped with this crate.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vm/build-image.sh")
}

/// Where the image lives: `$FERROCE_RXE_VM_CACHE`, else `<workspace>/target/rxe-vm`.
///
/// Derived from the manifest directory rather than `CARGO_TARGET_DIR` so that builds with a
/// different target directory share one cache (the image takes a minute to build).
pub fn default_cache_dir() -> PathBuf {
    match std::env::var_os("FERROCE_RXE_VM_CACHE") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/rxe-vm"),
    }
}

/// A complete image: kernel and initramfs.
#[derive(Debug, Clone)]
pub struct Image {
    dir: PathBuf,
}

impl Image {
    /// Builds the image into `dir` unless it is already complete (the script checks its stamp,
    /// which covers the script and the in-VM init and agent), then opens it.
    pub fn build(dir: &Path) -> Result<Image, Error> {
        let out = Command::new("bash")
            .arg(build_script())
            .env("FERROCE_RXE_VM_CACHE", dir)
            .output()
            .map_err(|e| Error::io("running vm/build-image.sh", e))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(Error::Image(format!(
                "vm/build-image.sh failed ({}):\n{}",
                out.status,
                tail.join("\n")
            )));
        }
        Image::open(dir)
    }

    /// Builds (if needed) and opens the image in [`default_cache_dir`].
    pub fn build_default() -> Result<Image, Error> {
        Image::build(&default_cache_dir())
    }

    /// Opens an image that is already built, without running the builder.
    pub fn open(dir: &Path) -> Result<Image, Error> {
        for file in ["stamp", "vmlinuz", "initramfs.cpio"] {
            if !dir.join(file).is_file() {
                return Err(Error::Image(format!(
                    "{} is incomplete (no {file}); run `cargo run -p ferroce-interop -- build`",
                    dir.display()
                )));
            }
        }
        Ok(Image {
            dir: dir.to_path_buf(),
        })
    }

    /// The cache folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The kernel to boot: the uncompressed `vmlinux` when the builder could extract it (QEMU
    /// boots it through the PVH entry, skipping ~4 s of decompression under TCG), else `vmlinuz`.
    pub fn kernel(&self) -> PathBuf {
        let vmlinux = self.dir.join("vmlinux");
        if vmlinux.is_file() {
            vmlinux
        } else {
            self.dir.join("vmlinuz")
        }
    }

    /// The initramfs (uncompressed newc cpio).
    pub fn initramfs(&self) -> PathBuf {
        self.dir.join("initramfs.cpio")
    }

    /// The kernel release, e.g. `6.1.0-57-amd64`.
    pub fn kernel_version(&self) -> String {
        std::fs::read_to_string(self.dir.join("kernel-version"))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    }
}
