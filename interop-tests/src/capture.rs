//! Packet capture on the host side of the lab, with tcpdump inside the lab's namespace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::vm::{which, Error, Result};

/// A running tcpdump; [`Capture::stop`] ends it and flushes the file (drop does too).
#[derive(Debug)]
pub struct Capture {
    child: Option<Child>,
    path: PathBuf,
    log: PathBuf,
}

/// What tcpdump reported at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureStats {
    /// Packets written to the file.
    pub captured: u64,
    /// Packets the kernel dropped (the capture is incomplete when non-zero).
    pub dropped: u64,
}

impl Capture {
    /// Starts `tcpdump -i iface -w path filter` in `netns` and returns once it listens.
    pub fn start(netns: &str, iface: &str, path: &Path, filter: &str) -> Result<Capture> {
        if which("tcpdump").is_none() {
            return Err(Error::Unavailable(
                "tcpdump not found (see .ci/install-deps.sh)".into(),
            ));
        }
        let log = path.with_extension("tcpdump.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        // --immediate-mode and -U: without them the last packets stay in a buffer and are lost.
        // -Z root: tcpdump would otherwise drop privileges and fail to write the file.
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", netns, "tcpdump", "-i", iface])
            .args([
                "-n",
                // 256 MiB of kernel buffer: bursts of 8 QPs under load overran the default 2 MiB,
                // and an `-a` WRITE run (~100 MB in seconds, tcpdump starved of CPU by the other
                // test and builds) overran 32 and 128 MiB; this holds all of it.
                "-B",
                "262144",
                "-s",
                "0",
                "-U",
                "--immediate-mode",
                "-Z",
                "root",
                "-w",
            ])
            .arg(path)
            .args(filter.split_whitespace())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        let child = cmd.spawn().map_err(|e| Error::io("starting tcpdump", e))?;
        let mut cap = Capture {
            child: Some(child),
            path: path.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&cap.log).unwrap_or_default();
            if text.contains("listening on") {
                return Ok(cap);
            }
            let exited = !matches!(cap.child.as_mut().map(Child::try_wait), Some(Ok(None)));
            if exited || Instant::now() > deadline {
                return Err(Error::HostCommand {
                    cmd: format!("{cmd:?}"),
                    detail: text.trim().to_owned(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pcap file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Returns once the file has not grown for `quiet` (tcpdump runs with `-U`: each frame is
    /// written as it is captured), or after `at_most`: the last ACKs of a run that has just
    /// ended cross the link before [`Capture::stop`].
    pub fn settle(&self, quiet: Duration, at_most: Duration) {
        let started = Instant::now();
        let size = || std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        let (mut last, mut since) = (size(), Instant::now());
        while started.elapsed() < at_most && since.elapsed() < quiet {
            std::thread::sleep(Duration::from_millis(10));
            let now = size();
            if now != last {
                (last, since) = (now, Instant::now());
            }
        }
    }

    /// Stops tcpdump (SIGINT, so it flushes) and returns its counters.
    pub fn stop(mut self) -> Result<CaptureStats> {
        self.finish()?;
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        let count = |what: &str| {
            text.lines()
                .find(|l| l.contains(what))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        Ok(CaptureStats {
            captured: count("packets captured"),
            dropped: count("packets dropped by kernel"),
        })
    }

    fn finish(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // `ip netns exec` execs tcpdump, so the child's pid is tcpdump's.
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::HostCommand {
                        cmd: "tcpdump".into(),
                        detail: "did not stop on SIGINT".into(),
                    });
                }
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
