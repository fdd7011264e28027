//! The host side of ferroce ⇄ rxe tests: the `ferroce` binary, processes in the lab namespace,
//! and the oracles every capture goes through (`ferroce decode`, tshark).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::vm::{tail, which, Error, Output, Result};

/// The `ferroce` binary: `$FERROCE_BIN` if set, else built (release) with cargo into the target
/// folder of the running executable (`<target>/<profile>/deps/<test>` → `<target>`), so a test
/// and its peer binary share one build cache. Built once per process.
pub fn ferroce_bin() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| build_ferroce().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Unavailable)
}

fn build_ferroce() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("FERROCE_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(Error::Unavailable(format!(
            "FERROCE_BIN={} is not a file",
            bin.display()
        )));
    }
    let started = Instant::now();
    let target = release_tool(&["-p", "ferroce-verbs", "--bin", "ferroce"], "FERROCE_BIN")?;
    let bin = target.join("release").join("ferroce");
    eprintln!(
        "ferroce binary {} ready in {:.1} s",
        bin.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(bin)
}

/// `cargo build --release <args>` of this workspace into the target folder of the running
/// executable (`<target>/<profile>/deps/<test>` → `<target>`); returns that folder. `var`
/// names the variable that would point at a prebuilt binary instead.
fn cargo_release(args: &[&str], var: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| Error::io("current_exe", e))?;
    let target = target_dir_of(&exe).ok_or_else(|| {
        Error::Unavailable(format!(
            "cannot derive the target folder from {}; set {var}",
            exe.display()
        ))
    })?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(&cargo)
        .arg("build")
        .arg("--release")
        .args(args)
        .current_dir(&workspace)
        .env("CARGO_TARGET_DIR", &target)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io("running cargo build", e))?;
    if !out.status.success() {
        return Err(Error::HostCommand {
            cmd: format!("cargo build --release {}", args.join(" ")),
            detail: tail(&String::from_utf8_lossy(&out.stderr), 30),
        });
    }
    Ok(target)
}

/// The folder holding ferroce's drop-in `libibverbs.so.1` and `librdmacm.so.1`
/// (ferroce-ibverbs-compat, linked by its `ferroce-libibverbs` tool): stock rdma-core
/// programs run over ferroce with `LD_LIBRARY_PATH` set to it: `$FERROCE_DROPIN_DIR` if set,
/// else built once per process (needs libibverbs-dev, librdmacm-dev and libclang for bindgen).
pub fn dropin_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| build_dropin().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Unavailable)
}

fn build_dropin() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("FERROCE_DROPIN_DIR").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.join("librdmacm.so.1").is_file() {
            return Ok(dir);
        }
        return Err(Error::Unavailable(format!(
            "FERROCE_DROPIN_DIR={} holds no librdmacm.so.1",
            dir.display()
        )));
    }
    let started = Instant::now();
    let tool = libibverbs_tool()?;
    let dir = tool.with_file_name("dropin");
    let out = Command::new(&tool)
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io("running ferroce-libibverbs", e))?;
    if !out.status.success() {
        return Err(Error::HostCommand {
            cmd: format!("{} {}", tool.display(), dir.display()),
            detail: tail(&String::from_utf8_lossy(&out.stderr), 30),
        });
    }
    eprintln!(
        "drop-in libibverbs.so.1 / librdmacm.so.1 in {} ready in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(dir)
}

/// `ferroce-coll-bench` built with the `rdma-core` feature (ranks on ferroce with `--fabric env`,
/// ranks on rdma-core's libibverbs with `--fabric rdma-core`): `$FERROCE_COLL_BENCH_BIN` if set,
/// else built (release) like [`ferroce_bin`]. Needs cmake and libclang (sideway's
/// rdma-mummy-sys). It needs only glibc and libgcc_s at load time: libibverbs.so.1 is
/// `dlopen`ed when the process starts, the VM's own in the VM.
pub fn coll_bench_bin() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| build_coll_bench().map_err(|e| e.to_string()))
        .clone()
        .map_err(Error::Unavailable)
}

fn build_coll_bench() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("FERROCE_COLL_BENCH_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        if bin.is_file() {
            return Ok(bin);
        }
        return Err(Error::Unavailable(format!(
            "FERROCE_COLL_BENCH_BIN={} is not a file",
            bin.display()
        )));
    }
    if which("cmake").is_none() {
        return Err(Error::Unavailable(
            "cmake is missing (the rdma-core feature's rdma-mummy-sys builds with it)".into(),
        ));
    }
    let started = Instant::now();
    let target = release_tool(
        &[
            "-p",
            "ferroce-collectives",
            "--features",
            "rdma-core",
            "--bin",
            "ferroce-coll-bench",
        ],
        "FERROCE_COLL_BENCH_BIN",
    )?;
    let bin = target.join("release").join("ferroce-coll-bench");
    eprintln!(
        "ferroce-coll-bench (rdma-core) {} ready in {:.1} s",
        bin.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(bin)
}

/// `ferroce-libibverbs` (ferroce-ibverbs-compat), the tool that links ferroce's drop-in
/// `libibverbs.so.1` / `librdmacm.so.1` into a folder it is given; built (release) like
/// [`ferroce_bin`]. Needs libibverbs-dev, librdmacm-dev and libclang (bindgen).
pub fn libibverbs_tool() -> Result<PathBuf> {
    let target = release_tool(
        &[
            "-p",
            "ferroce-ibverbs-compat",
            "--bin",
            "ferroce-libibverbs",
        ],
        "FERROCE_DROPIN_DIR",
    )?;
    Ok(target.join("release").join("ferroce-libibverbs"))
}

/// Every release binary the tests run, in one cargo command: one command unifies the
/// dependencies' features once, so the crates they share compile once and a test's build of
/// any of them after another's is a no-op (from scratch here: 142 s, against 167 s for the
/// three commands one after another, which each rebuild the stack with other features).
const RELEASE_TOOLS: &[&str] = &[
    "-p",
    "ferroce-verbs",
    "--bin",
    "ferroce",
    "-p",
    "ferroce-ibverbs-compat",
    "--bin",
    "ferroce-libibverbs",
    "-p",
    "ferroce-collectives",
    "--features",
    "ferroce-collectives/rdma-core",
    "--bin",
    "ferroce-coll-bench",
];

/// `cargo build --release <args>` through [`RELEASE_TOOLS`], once per process; by itself where
/// the whole set does not build here (the rdma-core feature needs cmake, the drop-in library
/// rdma-core's headers and libclang), so `ferroce` alone still builds without them.
fn release_tool(args: &[&str], var: &str) -> Result<PathBuf> {
    static ALL: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        if which("cmake").is_none() {
            return Err("cmake is missing".into());
        }
        cargo_release(RELEASE_TOOLS, var).map_err(|e| e.to_string())
    });
    match all {
        Ok(target) => Ok(target.clone()),
        Err(_) => cargo_release(args, var),
    }
}

/// `<target>` of `<target>/<profile>/deps/<exe>` (integration tests) or `<target>/<profile>/<exe>`.
fn target_dir_of(exe: &Path) -> Option<PathBuf> {
    let mut dir = exe.parent()?;
    if dir.file_name()? == "deps" {
        dir = dir.parent()?;
    }
    Some(dir.parent()?.to_path_buf())
}

/// A process on the host (usually `ip netns exec <lab> ...`), its output going to files.
#[derive(Debug)]
pub struct HostJob {
    child: Option<Child>,
    cmdline: String,
    out: PathBuf,
    err: PathBuf,
}

impl HostJob {
    /// Starts `cmd` with stdout/stderr to `<dir>/<name>.out|.err`.
    pub fn spawn(mut cmd: Command, dir: &Path, name: &str) -> Result<HostJob> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let f_out = std::fs::File::create(&out)
            .map_err(|e| Error::io(format!("creating {}", out.display()), e))?;
        let f_err = std::fs::File::create(&err)
            .map_err(|e| Error::io(format!("creating {}", err.display()), e))?;
        let cmdline = format!("{cmd:?}");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(f_out)
            .stderr(f_err)
            .spawn()
            .map_err(|e| Error::io(format!("starting {cmdline}"), e))?;
        Ok(HostJob {
            child: Some(child),
            cmdline,
            out,
            err,
        })
    }

    /// The command line.
    pub fn cmdline(&self) -> &str {
        &self.cmdline
    }

    /// The pid (`ip netns exec` execs its program, so this is the program's pid).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Output so far (lossy UTF-8), stdout then stderr.
    pub fn output_so_far(&self) -> String {
        format!(
            "{}{}",
            std::fs::read_to_string(&self.out).unwrap_or_default(),
            std::fs::read_to_string(&self.err).unwrap_or_default()
        )
    }

    /// Waits until the process holds a socket ferroce moves RoCE frames through: an AF_PACKET
    /// socket, or a UDP socket on port 4791 (from `/proc/<pid>/fd` and the process's
    /// `/proc/<pid>/net/{packet,udp,udp6}`). A ferroce tool opens its device there, moments
    /// before its rdma_cm agent listens: a server with no TCP port to wait for is up then.
    pub fn wait_roce_socket(&mut self, timeout: Duration) -> Result<()> {
        self.wait_until("opening a packet socket", timeout, roce_socket_open)
    }

    /// Waits until the process has a TCP socket listening on `port` (read from
    /// `/proc/<pid>/net/tcp{,6}`, which shows the process's namespace, so nothing connects to it
    /// and the one accept of a pingpong/perftest server is not used up).
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) -> Result<()> {
        let want = format!(":{port:04X}");
        self.wait_until(&format!("listening on {port}"), timeout, |pid| {
            ["tcp", "tcp6"].iter().any(|table| {
                let text =
                    std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
                text.lines().skip(1).any(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    f.len() > 3 && f[1].ends_with(&want) && f[3] == "0A"
                })
            })
        })
    }

    /// Polls `ready(pid)` until it holds, the process ends, or `timeout` passes (`goal` says
    /// what is awaited, for the errors).
    fn wait_until(
        &mut self,
        goal: &str,
        timeout: Duration,
        ready: impl Fn(u32) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let Some(pid) = self.pid() else {
                return Err(self.died("not started"));
            };
            if ready(pid) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(self.died(&format!("exited ({status}) before {goal}")));
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    vm: "host".into(),
                    what: format!("{} {goal}", self.cmdline),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn died(&self, what: &str) -> Error {
        Error::HostCommand {
            cmd: self.cmdline.clone(),
            detail: format!("{what}\n{}", self.output_so_far()),
        }
    }

    /// Has it ended?
    pub fn finished(&mut self) -> bool {
        matches!(self.child.as_mut().map(Child::try_wait), Some(Ok(Some(_))))
    }

    /// Waits up to `timeout`; on time-out kills it (SIGKILL) and returns its output with
    /// status 137 and a note on stderr, so callers can still show what it printed.
    pub fn wait_timeout(mut self, timeout: Duration) -> Output {
        let deadline = Instant::now() + timeout;
        let mut status = -1;
        let mut timed_out = false;
        if let Some(mut child) = self.child.take() {
            loop {
                match child.try_wait() {
                    Ok(Some(s)) => {
                        status = s.code().unwrap_or(128 + 9);
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        status = 128 + 9;
                        timed_out = true;
                        break;
                    }
                }
            }
        }
        let mut stderr = std::fs::read(&self.err).unwrap_or_default();
        if timed_out {
            stderr.extend_from_slice(format!("\n[killed after {timeout:?}]\n").as_bytes());
        }
        Output {
            status,
            stdout: std::fs::read(&self.out).unwrap_or_default(),
            stderr,
        }
    }
}

impl Drop for HostJob {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether process `pid` holds an AF_PACKET socket or a UDP socket bound to port 4791.
fn roce_socket_open(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: std::collections::HashSet<String> = fds
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?;
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    if inodes.is_empty() {
        return false;
    }
    let table = |name: &str| std::fs::read_to_string(format!("/proc/{pid}/net/{name}"));
    // packet: "sk RefCnt Type Proto Iface R Rmem User Inode".
    let packet = table("packet").unwrap_or_default();
    if packet.lines().skip(1).any(|l| {
        l.split_whitespace()
            .nth(8)
            .is_some_and(|i| inodes.contains(i))
    }) {
        return true;
    }
    // udp: "sl local_address rem_address st ... uid timeout inode"; 4791 = 0x12B7.
    ["udp", "udp6"].iter().any(|t| {
        table(t).unwrap_or_default().lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 9 && f[1].ends_with(":12B7") && inodes.contains(f[9])
        })
    })
}

/// What the oracles said about one capture.
#[derive(Debug, Clone, Default)]
pub struct CaptureCheck {
    /// RoCE frames in the file.
    pub frames: usize,
    /// `ferroce decode` exit status (0: every ICRC right).
    pub decode_status: i32,
    /// The lines of `ferroce decode` output that mention a problem.
    pub decode_problems: Vec<String>,
    /// `ferroce decode`'s whole text output (one line per frame).
    pub decode_text: String,
    /// BTH opcodes tshark read (opcode → count); empty if tshark is missing.
    pub tshark_opcodes: BTreeMap<u8, usize>,
    /// Frames tshark did not dissect as InfiniBand (no BTH opcode).
    pub tshark_not_ib: usize,
    /// tshark missing or failed: why.
    pub tshark_note: Option<String>,
}

impl CaptureCheck {
    /// `ferroce decode` passed and tshark (if present) read a BTH in every frame.
    pub fn ok(&self) -> bool {
        self.frames > 0
            && self.decode_status == 0
            && self.tshark_not_ib == 0
            && (self.tshark_note.is_some() || !self.tshark_opcodes.is_empty())
    }

    /// The opcodes in `want` that tshark did not see (all of them when tshark is missing).
    pub fn missing(&self, want: &[u8]) -> Vec<u8> {
        want.iter()
            .copied()
            .filter(|op| !self.tshark_opcodes.contains_key(op))
            .collect()
    }

    /// One line for reports: `frames, decode ok, opcodes 0a×5 11×5`.
    pub fn summary(&self) -> String {
        let ops: Vec<String> = self
            .tshark_opcodes
            .iter()
            .map(|(op, n)| format!("{op:02x}×{n}"))
            .collect();
        format!(
            "{} frames, decode {}, tshark [{}]{}",
            self.frames,
            if self.decode_status == 0 {
                "ok".to_string()
            } else {
                format!("FAILED ({})", self.decode_status)
            },
            ops.join(" "),
            self.tshark_note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )
    }
}

/// Runs `ferroce decode` (ICRC of every frame) and tshark (InfiniBand dissection, BTH opcodes)
/// over a capture.
pub fn check_capture(ferroce: &Path, pcap: &Path) -> Result<CaptureCheck> {
    let mut check = CaptureCheck::default();
    let out = Command::new(ferroce)
        .arg("decode")
        .arg(pcap)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io("running ferroce decode", e))?;
    check.decode_status = out.status.code().unwrap_or(-1);
    let text = String::from_utf8_lossy(&out.stdout);
    check.decode_text = text.clone().into_owned();
    check.decode_problems = text
        .lines()
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            (l.contains("icrc-bad")
                || l.contains("icrc=bad")
                || l.contains("malformed")
                || l.contains("error"))
                && !l.contains(" 0 icrc-bad, 0 malformed")
                && !l.contains("rem-access-err")
        })
        .take(10)
        .map(str::to_owned)
        .collect();
    if !out.status.success() && check.decode_problems.is_empty() {
        check.decode_problems.push(tail(
            &format!("{}{}", text, String::from_utf8_lossy(&out.stderr)),
            5,
        ));
    }
    if which("tshark").is_none() {
        check.tshark_note = Some("tshark not installed".into());
        check.frames = count_frames(pcap);
        return Ok(check);
    }
    match crate::tshark::bth_opcodes(pcap) {
        Ok(ops) => {
            check.frames = ops.len();
            for op in ops {
                match op {
                    Some(op) => *check.tshark_opcodes.entry(op).or_default() += 1,
                    None => check.tshark_not_ib += 1,
                }
            }
        }
        Err(e) => {
            check.tshark_note = Some(format!("tshark failed: {e}"));
            check.frames = count_frames(pcap);
        }
    }
    Ok(check)
}

/// Frames in a pcap (0 if unreadable).
fn count_frames(pcap: &Path) -> usize {
    let Ok(file) = std::fs::File::open(pcap) else {
        return 0;
    };
    let Ok(mut reader) = pcap_file::pcap::PcapReader::new(file) else {
        return 0;
    };
    let mut n = 0;
    while let Some(Ok(_)) = reader.next_packet() {
        n += 1;
    }
    n
}

/// Retransmission evidence in `ferroce decode` text: (request packets seen more than once, NAKs).
/// A request is (source, dest QP, PSN, opcode); ACKs and read responses are not counted as
/// duplicates (a READ response replay is counted through its request).
pub fn retransmissions(decode_text: &str) -> (usize, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut dups = 0;
    let mut naks = 0;
    for line in decode_text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 7 || f.get(2) != Some(&"->") {
            continue;
        }
        if line.contains("aeth(NAK") {
            naks += 1;
        }
        let op = f[4];
        if op.contains("ACKNOWLEDGE") || op.contains("READ_RESPONSE") {
            continue;
        }
        let qp = f
            .iter()
            .find(|x| x.starts_with("qp="))
            .copied()
            .unwrap_or("");
        let psn = f
            .iter()
            .find(|x| x.starts_with("psn="))
            .copied()
            .unwrap_or("");
        if !seen.insert((
            f[1].to_string(),
            qp.to_string(),
            psn.to_string(),
            op.to_string(),
        )) {
            dups += 1;
        }
    }
    (dups, naks)
}
