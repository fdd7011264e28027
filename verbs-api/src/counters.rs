//! Counter snapshots other processes can read, the way rxe's counters sit in
//! `/sys/class/infiniband/rxe0/ports/1/hw_counters`: every open device's
//! engine writes its counters about once a second, and when it closes, to
//! `<dir>/<device>.<pid>.<n>.stats`. `ferroce devices --stats` reads them,
//! skipping (and removing) the files of processes that are gone.
//!
//! The directory is `$FERROCE_STATS_DIR` if set (`off` turns publishing
//! off), else the first of `/run/ferroce`, `$XDG_RUNTIME_DIR/ferroce` and
//! `/tmp/ferroce-<uid>` that can be written. Readers look in all of them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often a running engine refreshes its file.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

const SUFFIX: &str = ".stats";

/// One device's counters as a file holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub device: String,
    pub backend: String,
    pub pid: u32,
    /// `open`, or `closed` once the device was dropped.
    pub state: String,
    /// Seconds since the Unix epoch when it was written.
    pub updated: u64,
    /// rxe's hw_counters first, in rxe's order, then ferroce's own.
    pub counters: Vec<(String, u64)>,
}

impl Snapshot {
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "device {}\nbackend {}\npid {}\nstate {}\nupdated {}\n",
            self.device, self.backend, self.pid, self.state, self.updated
        );
        for (name, v) in &self.counters {
            s += &format!("{name} {v}\n");
        }
        s
    }

    /// The inverse of [`Snapshot::to_text`]; `None` if a header line is missing.
    pub fn parse(text: &str) -> Option<Snapshot> {
        let mut lines = text.lines();
        let mut header = |key: &str| -> Option<String> {
            let l = lines.next()?;
            l.strip_prefix(key)?.strip_prefix(' ').map(str::to_string)
        };
        let device = header("device")?;
        let backend = header("backend")?;
        let pid = header("pid")?.parse().ok()?;
        let state = header("state")?;
        let updated = header("updated")?.parse().ok()?;
        let counters = lines
            .filter_map(|l| {
                let (k, v) = l.split_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        Some(Snapshot {
            device,
            backend,
            pid,
            state,
            updated,
            counters,
        })
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.counters
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }
}

fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(0, |m| m.uid())
}

/// Every directory snapshots may be in, the preferred one first.
pub fn dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("FERROCE_STATS_DIR") {
        if d == "off" {
            return Vec::new();
        }
        return vec![PathBuf::from(d)];
    }
    let mut v = vec![PathBuf::from("/run/ferroce")];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR") {
        v.push(Path::new(&x).join("ferroce"));
    }
    v.push(PathBuf::from(format!("/tmp/ferroce-{}", uid())));
    v
}

fn writable_dir() -> Option<PathBuf> {
    dirs().into_iter().find(|d| {
        std::fs::create_dir_all(d).is_ok()
            && tempfile_in(d).is_some_and(|p| std::fs::remove_file(p).is_ok())
    })
}

fn tempfile_in(d: &Path) -> Option<PathBuf> {
    let p = d.join(format!(".probe.{}", std::process::id()));
    std::fs::write(&p, b"").ok().map(|_| p)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Writes one device's snapshot file, at most every [`PUBLISH_EVERY`].
#[derive(Debug)]
pub struct Publisher {
    path: PathBuf,
    device: String,
    backend: String,
    next: Instant,
}

impl Publisher {
    /// `None` when publishing is off or no directory can be written.
    pub fn new(device: &str, backend: &str) -> Option<Publisher> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = writable_dir()?;
        sweep(&dir);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        // Device names come from interface names; keep the file name plain.
        let safe: String = device
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        Some(Publisher {
            path: dir.join(format!("{safe}.{}.{n}{SUFFIX}", std::process::id())),
            device: device.to_string(),
            backend: backend.to_string(),
            next: Instant::now(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a periodic write is due.
    /// Whether a snapshot is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// Write the counters now (whole file replaced by a rename, so readers
    /// never see half of it). Errors are ignored: counters are best effort.
    pub fn write(&mut self, counters: &[(&'static str, u64)], closed: bool) {
        self.next = Instant::now() + PUBLISH_EVERY;
        let snap = Snapshot {
            device: self.device.clone(),
            backend: self.backend.clone(),
            pid: std::process::id(),
            state: if closed { "closed" } else { "open" }.to_string(),
            updated: unix_now(),
            counters: counters.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        };
        let tmp = self.path.with_extension("tmp");
        let ok = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(snap.to_text().as_bytes()))
            .is_ok();
        if ok {
            let _ = std::fs::rename(&tmp, &self.path);
        }
    }
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a file name `<device>.<pid>.<n>.stats`.
fn pid_of(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(SUFFIX)?;
    let mut parts = stem.rsplit('.');
    parts.next()?;
    parts.next()?.parse().ok()
}

/// Remove the files of processes that are gone (so a directory written by
/// many short runs, test suites say, does not fill up).
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if let Some(pid) = pid_of(&name.to_string_lossy()) {
            if !alive(pid) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The snapshots of live processes, oldest device first. Files of dead
/// processes are removed where permitted and skipped otherwise.
pub fn read_all() -> Vec<Snapshot> {
    let mut out = Vec::new();
    for dir in dirs() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if !p.to_string_lossy().ends_with(SUFFIX) {
                continue;
            }
            let Some(s) = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| Snapshot::parse(&t))
            else {
                continue;
            };
            if !alive(s.pid) {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            out.push((p, s));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, s)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let s = Snapshot {
            device: "ferroce_udp_lo".into(),
            backend: "udp".into(),
            pid: 42,
            state: "open".into(),
            updated: 7,
            counters: vec![("sent_pkts".into(), 3), ("rx_unknown_qp".into(), 0)],
        };
        assert_eq!(Snapshot::parse(&s.to_text()), Some(s));
        assert_eq!(Snapshot::parse("device x\n"), None);
        assert_eq!(pid_of("ferroce_udp_lo.1234.0.stats"), Some(1234));
        assert_eq!(pid_of("mem.0.stats"), None);
    }
}
