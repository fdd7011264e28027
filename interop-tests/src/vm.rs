//! Linux rxe in QEMU: boot VMs on a bridge in a private network namespace and run commands in them.
//!
//! Topology of an [`RxeLab`] (all inside one namespace the lab creates and deletes):
//!
//! ```text
//!   vm0 eth0 ── tap0 ─┐
//!   vm1 eth0 ── tap1 ─┼─ br0 ── veth-b ══ veth-h  (host side: 10.77.0.1/24, fd77::1/64)
//!   ...               ┘
//! ```
//!
//! VM `i` has 10.77.0.(10+i)/24 and fd77::(10+i)/64 on eth0 (MTU 9000) and an rxe device `rxe0`
//! on top; GID index 1 is the IPv4-mapped GID. ferroce reaches the VMs by running inside the
//! namespace ([`RxeLab::command`]) on `veth-h`.
//!
//! The VM's first serial port is its console (a log file, or the terminal for `shell`); the second
//! carries a line protocol to a small agent (see `vm/agent.sh`) that runs each command as a job
//! whose output goes to files, so nothing the command prints can mix with the protocol.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::image::{default_cache_dir, Image};

/// Errors of the VM harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A prerequisite is missing (not root, no QEMU, ...): tests skip on this.
    #[error("rxe VM unavailable: {0}")]
    Unavailable(String),
    /// The image could not be built or is incomplete.
    #[error("rxe VM image: {0}")]
    Image(String),
    /// An I/O operation of the harness failed.
    #[error("{what}: {source}")]
    Io {
        /// What the harness was doing.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A host command (ip, tcpdump, ...) failed.
    #[error("`{cmd}` failed: {detail}")]
    HostCommand {
        /// The command line.
        cmd: String,
        /// Exit status and stderr.
        detail: String,
    },
    /// The VM did not reach the ready state.
    #[error("VM {vm} did not become ready: {reason}\n--- console (last lines) ---\n{console}")]
    Boot {
        /// VM name.
        vm: String,
        /// What went wrong.
        reason: String,
        /// The tail of the console log.
        console: String,
    },
    /// The agent said something the harness does not understand.
    #[error("VM {vm}: control protocol: {detail}")]
    Protocol {
        /// VM name.
        vm: String,
        /// What was wrong.
        detail: String,
    },
    /// The control channel closed (QEMU exited).
    #[error("VM {vm}: control channel closed (QEMU exited?)")]
    Closed {
        /// VM name.
        vm: String,
    },
    /// A command or answer did not arrive in time.
    #[error("VM {vm}: `{what}` timed out after {after:?}")]
    Timeout {
        /// VM name.
        vm: String,
        /// The command or step.
        what: String,
        /// The time-out.
        after: Duration,
    },
    /// The VM's control agent did not answer in time: the guest stalled, or QEMU stopped
    /// running it. The console's last lines are where the guest kernel reports a soft lockup,
    /// an RCU stall or a driver error.
    #[error(
        "VM {vm}: no answer to `{what}` within {after:?}, {nudges} nudges sent (guest stalled?)\n--- console (last lines) ---\n{console}"
    )]
    Stalled {
        /// VM name.
        vm: String,
        /// The request that went unanswered.
        what: String,
        /// How long the harness waited.
        after: Duration,
        /// Empty lines sent to wake the agent meanwhile.
        nudges: u32,
        /// The tail of the console log.
        console: String,
    },
    /// A command in the VM exited with a non-zero status (from [`RxeVm::run_ok`] / [`Output::check`]).
    #[error(
        "`{cmd}` exited with status {status}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
    )]
    Failed {
        /// The command.
        cmd: String,
        /// Its exit status (128 + n: killed by signal n).
        status: i32,
        /// Its standard output (lossy UTF-8).
        stdout: String,
        /// Its standard error (lossy UTF-8).
        stderr: String,
    },
}

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result of the harness.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why VMs cannot run here, or `None` when they can: root (for namespaces and taps), QEMU, `ip`
/// and `/dev/net/tun`. Tests print this and skip.
pub fn unavailable_reason() -> Option<String> {
    if !is_root() {
        return Some("not running as root (namespaces and tap devices need it)".into());
    }
    for tool in ["qemu-system-x86_64", "ip"] {
        if which(tool).is_none() {
            return Some(format!(
                "{tool} not found (install qemu-system-x86 / iproute2, see .ci/install-deps.sh)"
            ));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun missing".into());
    }
    None
}

/// Why a test cannot boot VMs here ([`unavailable_reason`], or the image build failing), or
/// `None`; tests print it after `SKIP <test>: ` and return.
pub fn skip_reason() -> Option<String> {
    unavailable_reason().or_else(|| {
        crate::image::Image::build_default()
            .err()
            .map(|e| format!("cannot build the VM image: {e}"))
    })
}

/// Effective uid 0, read from /proc (no libc: this crate forbids unsafe code).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// The full path of `tool` on `PATH`.
pub fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| p.is_file())
}

/// How QEMU executes the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Software emulation: slow but works here.
    Tcg,
    /// KVM: a stock kernel hangs under it on these machines; opt in with
    /// `FERROCE_RXE_VM_ACCEL=kvm` where it is known to work.
    Kvm,
}

/// Where the VM's console (first serial port) goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Console {
    /// To `console.log` in the VM's run folder (included in boot errors).
    Log,
    /// To this process's terminal, with a shell on it (`ferroce-interop shell`).
    Interactive,
}

/// Settings of the VMs.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Guest memory.
    pub memory_mib: u32,
    /// MTU of eth0, the tap, the bridge and the host veth.
    pub mtu: u32,
    /// Time from starting QEMU to the agent's ready line.
    pub boot_timeout: Duration,
    /// TCG or KVM.
    pub accel: Accel,
    /// Console destination.
    pub console: Console,
    /// Image folder; `None`: [`default_cache_dir`], built when incomplete.
    pub image_dir: Option<PathBuf>,
    /// Extra kernel command line.
    pub extra_append: String,
    /// QEMU `-cpu` model under TCG (`None`: QEMU's default, qemu64). From
    /// `FERROCE_RXE_VM_CPU` by default.
    pub cpu: Option<String>,
}

impl Default for VmConfig {
    fn default() -> VmConfig {
        let accel = match std::env::var("FERROCE_RXE_VM_ACCEL").as_deref() {
            Ok("kvm") => Accel::Kvm,
            _ => Accel::Tcg,
        };
        VmConfig {
            memory_mib: 512,
            mtu: 9000,
            // Typically ~6 s; generous because other builds share the two cores.
            boot_timeout: Duration::from_secs(90),
            accel,
            console: Console::Log,
            image_dir: None,
            extra_append: String::new(),
            cpu: std::env::var("FERROCE_RXE_VM_CPU")
                .ok()
                .filter(|c| !c.is_empty()),
        }
    }
}

/// Exit status and output of a command run in a VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit status (128 + n when killed by signal n).
    pub status: i32,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

impl Output {
    /// Exit status 0.
    pub fn success(&self) -> bool {
        self.status == 0
    }

    /// Standard output as (lossy) UTF-8.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as (lossy) UTF-8.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Status and both outputs under a title, for a failed assertion's message.
    pub fn describe(&self, what: &str) -> String {
        format!(
            "{what}: status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.stdout_str(),
            self.stderr_str()
        )
    }

    /// `Ok(self)` on success, else [`Error::Failed`] carrying both outputs.
    pub fn check(self, cmd: &str) -> Result<Output> {
        if self.success() {
            Ok(self)
        } else {
            Err(Error::Failed {
                cmd: cmd.to_owned(),
                status: self.status,
                stdout: self.stdout_str(),
                stderr: self.stderr_str(),
            })
        }
    }
}

/// Default time-out of [`RxeVm::run`] and [`VmJob::wait`].
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

const SUBNET4: [u8; 3] = [10, 77, 0];
const HOST_IFACE: &str = "veth-h";
const BRIDGE: &str = "br0";
const NS_PREFIX: &str = "frx";

// ---------------------------------------------------------------------------------------------
// Host commands

fn host(cmd: &mut Command) -> Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::io(format!("running {line}"), e))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::HostCommand {
            cmd: line,
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

fn ip(args: &[&str]) -> Result<String> {
    host(Command::new("ip").args(args))
}

fn ip_ns(ns: &str, args: &[&str]) -> Result<String> {
    host(Command::new("ip").arg("-n").arg(ns).args(args))
}

/// SIGKILLs a process by pid through kill(1) (no libc here).
fn kill_pid(pid: &str, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn run_base() -> PathBuf {
    std::env::temp_dir().join("ferroce-rxe")
}

// ---------------------------------------------------------------------------------------------
// The namespace with its bridge and host veth

/// The namespace, bridge and host veth shared by the VMs of a lab; deleted with the last VM.
#[derive(Debug)]
struct LabNet {
    ns: String,
    rundir: PathBuf,
    mtu: u32,
}

impl LabNet {
    fn new(mtu: u32) -> Result<LabNet> {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        reap_stale();
        let ns = format!(
            "{NS_PREFIX}{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        if ip(&["netns", "add", &ns]).is_err() {
            // A leftover of an earlier process with the same pid: ours to remove.
            delete_netns(&ns);
            ip(&["netns", "add", &ns])?;
        }
        let rundir = run_base().join(&ns);
        let net = LabNet {
            ns: ns.clone(),
            rundir: rundir.clone(),
            mtu,
        };
        // From here on, Drop cleans up whatever was made.
        std::fs::create_dir_all(&rundir)
            .map_err(|e| Error::io(format!("creating {}", rundir.display()), e))?;
        let m = mtu.to_string();
        let h4 = format!("{}.{}.{}.1/24", SUBNET4[0], SUBNET4[1], SUBNET4[2]);
        ip_ns(&ns, &["link", "set", "lo", "up"])?;
        // The bridge and veth-h share this namespace, so by default both answer a VM's ARP
        // request for veth-h's address, br0 with its own MAC. When br0's answer wins, the VM
        // sends RoCE frames to br0: the namespace's IP stack takes them and a ferroce on veth-h
        // never sees them (a stock tool then stalls, or retransmits until the entry is
        // re-resolved). arp_ignore=1: only the interface holding the address answers.
        ip(&[
            "netns",
            "exec",
            &ns,
            "sh",
            "-c",
            "echo 1 > /proc/sys/net/ipv4/conf/all/arp_ignore",
        ])?;
        ip_ns(&ns, &["link", "add", BRIDGE, "mtu", &m, "type", "bridge"])?;
        ip_ns(&ns, &["link", "set", BRIDGE, "up"])?;
        ip_ns(
            &ns,
            &[
                "link", "add", HOST_IFACE, "mtu", &m, "type", "veth", "peer", "name", "veth-b",
                "mtu", &m,
            ],
        )?;
        ip_ns(&ns, &["link", "set", "veth-b", "master", BRIDGE, "up"])?;
        // Captures on veth-b are to show wire frames, as a NIC would send them: ferroce's
        // AF_PACKET and UDP backends send runs of frames as UDP GSO super-frames, which the
        // kernel cuts before they cross only if veth-h cannot (segmentation off), and leaves
        // the UDP checksums of the cuts to a NIC unless veth-h has no checksum offload (tx off).
        ip(&[
            "netns",
            "exec",
            &ns,
            "ethtool",
            "-K",
            HOST_IFACE,
            "tx",
            "off",
            "tx-udp-segmentation",
            "off",
        ])?;
        ip_ns(&ns, &["addr", "add", &h4, "dev", HOST_IFACE])?;
        // nodad: the address (and a ferroce GID on it) is usable at once.
        ip_ns(
            &ns,
            &[
                "-6",
                "addr",
                "add",
                "fd77::1/64",
                "dev",
                HOST_IFACE,
                "nodad",
            ],
        )?;
        ip_ns(&ns, &["link", "set", HOST_IFACE, "up"])?;
        Ok(net)
    }
}

impl Drop for LabNet {
    fn drop(&mut self) {
        delete_netns(&self.ns);
        let _ = std::fs::remove_dir_all(&self.rundir);
    }
}

/// Kills every process still in the namespace, then deletes it (with its taps, veths, bridge).
fn delete_netns(ns: &str) {
    if let Ok(pids) = ip(&["netns", "pids", ns]) {
        for pid in pids.split_whitespace() {
            kill_pid(pid, "KILL");
        }
    }
    let _ = ip(&["netns", "del", ns]);
}

/// Removes namespaces and run folders left by harness processes that died without cleaning up
/// (SIGKILL, abort): their names carry the owner's pid.
fn reap_stale() {
    let Ok(list) = ip(&["netns", "list"]) else {
        return;
    };
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        if let Some(pid) = owner_pid(name) {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                delete_netns(name);
                let _ = std::fs::remove_dir_all(run_base().join(name));
            }
        }
    }
}

fn owner_pid(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix(NS_PREFIX)?;
    let (pid, counter) = rest.split_once('x')?;
    counter.parse::<u32>().ok()?;
    pid.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Control channel

/// Reads `\n`-terminated lines with a deadline, keeping partial lines across time-outs.
#[derive(Debug)]
struct LineReader {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl LineReader {
    fn read_line(&mut self, vm: &str, what: &str, deadline: Instant) -> Result<Vec<u8>> {
        let started = Instant::now();
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                return Ok(line);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    vm: vm.to_owned(),
                    what: what.to_owned(),
                    after: started.elapsed(),
                });
            }
            self.stream
                .set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))
                .map_err(|e| Error::io("socket timeout", e))?;
            let mut chunk = [0u8; 8192];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(Error::Closed { vm: vm.to_owned() }),
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(Error::io(format!("VM {vm}: reading control channel"), e)),
            }
        }
    }
}

#[derive(Debug)]
struct CtlIo {
    writer: UnixStream,
    reader: LineReader,
}

/// One agent message: `@@F <id> <word> [arg]`.
struct Msg {
    id: String,
    word: String,
    arg: String,
}

fn parse_msg(line: &[u8]) -> Option<Msg> {
    let text = std::str::from_utf8(line).ok()?;
    let rest = text.strip_prefix("@@F ")?;
    let mut parts = rest.splitn(3, ' ');
    Some(Msg {
        id: parts.next()?.to_owned(),
        word: parts.next()?.to_owned(),
        arg: parts.next().unwrap_or("").to_owned(),
    })
}

#[derive(Debug)]
struct Ctl {
    vm: String,
    /// The VM's console log, quoted when the agent stalls.
    console_log: PathBuf,
    io: Mutex<CtlIo>,
    next_id: AtomicU64,
}

/// Silence from the agent after which the harness sends it an empty line ([`Ctl::read_line`]).
const NUDGE_AFTER: Duration = Duration::from_secs(10);

/// Console lines quoted in [`Error::Stalled`].
const STALL_CONSOLE_LINES: usize = 30;

/// Slack on top of a request's own duration for the agent to answer (output crosses a serial
/// port, which is slow under TCG).
const ANSWER_SLACK: Duration = Duration::from_secs(60);

impl Ctl {
    fn lock(&self) -> MutexGuard<'_, CtlIo> {
        // A panic while holding the lock leaves the stream usable; the next reply resyncs by id.
        self.io.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, io: &mut CtlIo, line: &str) -> Result<()> {
        io.writer
            .write_all(line.as_bytes())
            .and_then(|()| io.writer.flush())
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe => Error::Closed {
                    vm: self.vm.clone(),
                },
                _ => Error::io(format!("VM {}: writing control channel", self.vm), e),
            })
    }

    /// The next line from the agent; a time-out here means the guest stopped answering.
    ///
    /// After each [`NUDGE_AFTER`] of silence an empty line goes to the agent: a no-op for it
    /// (answered `- BAD`, which `expect` skips), but a received byte and an interrupt for the
    /// guest. In CI a guest has now and then gone silent for a minute with nothing on its
    /// console and then answered the next request at once, as if it waited for an event;
    /// the nudge gives it one, and the error says whether nudging helped.
    fn read_line(&self, io: &mut CtlIo, what: &str, deadline: Instant) -> Result<Vec<u8>> {
        let started = Instant::now();
        let mut nudges = 0u32;
        loop {
            let step = (Instant::now() + NUDGE_AFTER).min(deadline);
            match io.reader.read_line(&self.vm, what, step) {
                Ok(line) => {
                    if nudges > 0 {
                        eprintln!(
                            "VM {}: the agent answered `{what}` after {nudges} nudge(s), {:?}",
                            self.vm,
                            started.elapsed()
                        );
                    }
                    return Ok(line);
                }
                Err(Error::Timeout { .. }) if step < deadline => {
                    self.send(io, "\n")?;
                    nudges += 1;
                }
                Err(Error::Timeout { vm, what, .. }) => {
                    return Err(Error::Stalled {
                        vm,
                        what,
                        after: started.elapsed(),
                        nudges,
                        console: tail(
                            &std::fs::read_to_string(&self.console_log).unwrap_or_default(),
                            STALL_CONSOLE_LINES,
                        ),
                    })
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// Next message about `id`; lines that are not protocol messages or concern other ids (left
    /// over from an interrupted request) are skipped.
    fn expect(&self, io: &mut CtlIo, id: &str, what: &str, deadline: Instant) -> Result<Msg> {
        loop {
            let line = self.read_line(io, what, deadline)?;
            if let Some(msg) = parse_msg(&line) {
                if msg.id == id {
                    return Ok(msg);
                }
            }
        }
    }

    fn spawn(&self, script: &str) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let ids = id.to_string();
        let mut io = self.lock();
        self.send(
            &mut io,
            &format!("S {id} {}\n", base64_encode(script.as_bytes())),
        )?;
        let msg = self.expect(&mut io, &ids, "spawn", Instant::now() + ANSWER_SLACK)?;
        if msg.word != "SPAWNED" {
            return Err(self.protocol(format!("spawn {id}: got {}", msg.word)));
        }
        Ok(id)
    }

    /// Waits up to `wait` inside the VM for job `id` to end; `None` while it runs.
    fn poll(&self, id: u64, wait: Duration) -> Result<Option<Output>> {
        let ids = id.to_string();
        let mut io = self.lock();
        self.send(&mut io, &format!("P {id} {}\n", wait.as_millis()))?;
        let deadline = Instant::now() + wait + ANSWER_SLACK;
        let msg = self.expect(&mut io, &ids, "poll", deadline)?;
        match msg.word.as_str() {
            "RUNNING" => Ok(None),
            "OUT" => {
                let stdout = self.collect(&mut io, &ids, "ERR", deadline)?.0;
                let (stderr, end) = self.collect(&mut io, &ids, "END", deadline)?;
                let status = end
                    .trim()
                    .parse()
                    .map_err(|_| self.protocol(format!("job {id}: bad status {end:?}")))?;
                Ok(Some(Output {
                    status,
                    stdout,
                    stderr,
                }))
            }
            // Seen once in CI (job output lost its head under load): the rest of the answer
            // is read so the next request starts clean, and the caller hears of it.
            "ERR" => {
                let _ = self.collect(&mut io, &ids, "END", deadline);
                Err(self.protocol(format!("job {id}: got ERR (its OUT line was lost)")))
            }
            other => Err(self.protocol(format!("job {id}: got {other}"))),
        }
    }

    /// Base64 lines up to the message `word` about `id`: (decoded bytes, that message's argument).
    fn collect(
        &self,
        io: &mut CtlIo,
        id: &str,
        word: &str,
        deadline: Instant,
    ) -> Result<(Vec<u8>, String)> {
        let mut text = Vec::new();
        loop {
            let line = self.read_line(io, "job output", deadline)?;
            match parse_msg(&line) {
                Some(msg) if msg.id == id && msg.word == word => {
                    let bytes = base64_decode(&text)
                        .ok_or_else(|| self.protocol(format!("job {id}: bad base64")))?;
                    return Ok((bytes, msg.arg));
                }
                Some(msg) => {
                    return Err(
                        self.protocol(format!("job {id}: {} {} inside output", msg.id, msg.word))
                    )
                }
                None => text.extend(line.iter().filter(|b| !b.is_ascii_whitespace())),
            }
        }
    }

    fn kill(&self, id: u64, signal: &str) -> Result<()> {
        let mut io = self.lock();
        self.send(&mut io, &format!("K {id} {signal}\n"))?;
        let msg = self.expect(
            &mut io,
            &id.to_string(),
            "kill",
            Instant::now() + ANSWER_SLACK,
        )?;
        if msg.word != "KILLED" {
            return Err(self.protocol(format!("kill {id}: got {}", msg.word)));
        }
        Ok(())
    }

    /// Asks for a power-off and waits (up to `within`) for QEMU to close the channel.
    fn poweroff(&self, within: Duration) -> Result<()> {
        let mut io = self.lock();
        self.send(&mut io, "X 0\n")?;
        let deadline = Instant::now() + within;
        loop {
            match io.reader.read_line(&self.vm, "poweroff", deadline) {
                Ok(_) => {}
                Err(Error::Closed { .. }) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    fn protocol(&self, detail: String) -> Error {
        Error::Protocol {
            vm: self.vm.clone(),
            detail,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// VMs

/// A command running in a VM ([`RxeVm::spawn`]). Dropping it unfinished kills it.
#[derive(Debug)]
pub struct VmJob {
    ctl: Arc<Ctl>,
    id: u64,
    cmd: String,
    done: bool,
}

impl VmJob {
    /// The command line.
    pub fn command(&self) -> &str {
        &self.cmd
    }

    /// The output if the job has ended (returned once), else `None`.
    pub fn try_wait(&mut self) -> Result<Option<Output>> {
        self.poll(Duration::ZERO)
    }

    fn poll(&mut self, wait: Duration) -> Result<Option<Output>> {
        if self.done {
            return Err(self.ctl.protocol(format!("job {} already reaped", self.id)));
        }
        let out = self.ctl.poll(self.id, wait)?;
        if out.is_some() {
            self.done = true;
        }
        Ok(out)
    }

    /// Waits for the job to end, up to [`DEFAULT_COMMAND_TIMEOUT`].
    pub fn wait(self) -> Result<Output> {
        self.wait_timeout(DEFAULT_COMMAND_TIMEOUT)
    }

    /// Waits up to `timeout`; on time-out the job is killed and [`Error::Timeout`] returned.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Output> {
        let deadline = Instant::now() + timeout;
        loop {
            // Short waits inside the VM keep the channel free for other users between polls.
            let left = deadline.saturating_duration_since(Instant::now());
            if let Some(out) = self.poll(left.min(Duration::from_millis(500)))? {
                return Ok(out);
            }
            if left.is_zero() {
                let _ = self.kill("KILL");
                return Err(Error::Timeout {
                    vm: self.ctl.vm.clone(),
                    what: self.cmd.clone(),
                    after: timeout,
                });
            }
        }
    }

    /// Sends `signal` (a name like `INT`, `TERM`, `KILL`) to the job's process group.
    pub fn kill(&self, signal: &str) -> Result<()> {
        self.ctl.kill(self.id, signal)
    }

    /// Sends `signal` and waits (up to 30 s) for the job to end; returns its output.
    pub fn stop(self, signal: &str) -> Result<Output> {
        self.kill(signal)?;
        self.wait_timeout(Duration::from_secs(30))
    }
}

impl Drop for VmJob {
    fn drop(&mut self) {
        // Reap after the kill, so the agent forgets the job's files.
        if !self.done && self.ctl.kill(self.id, "KILL").is_ok() {
            let _ = self.ctl.poll(self.id, Duration::from_millis(500));
        }
    }
}

/// A QEMU VM running Linux with rxe0 ready on eth0. Dropping it powers it off and removes its
/// tap; the namespace goes with the last VM of its lab.
#[derive(Debug)]
pub struct RxeVm {
    name: String,
    index: usize,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
    mac: String,
    tap: String,
    rundir: PathBuf,
    share: PathBuf,
    ctl: Arc<Ctl>,
    qemu: Mutex<Option<Child>>,
    watchdog: Mutex<Option<ChildStdin>>,
    boot_time: Duration,
    net: Arc<LabNet>,
}

impl RxeVm {
    /// Boots one VM in a namespace of its own (with bridge and host veth, as in [`RxeLab`]).
    pub fn boot(config: &VmConfig) -> Result<RxeVm> {
        let image = open_image(config)?;
        let net = Arc::new(LabNet::new(config.mtu)?);
        boot_in(&net, 0, config, &image)
    }

    /// Runs `cmd` (a busybox `sh` script; iproute2's `ip`/`tc` win over busybox's applets) and
    /// waits for it, up to [`DEFAULT_COMMAND_TIMEOUT`].
    pub fn run(&self, cmd: &str) -> Result<Output> {
        self.spawn(cmd)?.wait()
    }

    /// [`RxeVm::run`] with a time-out; on time-out the command is killed.
    pub fn run_timeout(&self, cmd: &str, timeout: Duration) -> Result<Output> {
        self.spawn(cmd)?.wait_timeout(timeout)
    }

    /// [`RxeVm::run`], and an [`Error::Failed`] unless the status is 0.
    pub fn run_ok(&self, cmd: &str) -> Result<Output> {
        self.run(cmd)?.check(cmd)
    }

    /// Starts `cmd` in the background (in a session of its own) and returns at once.
    pub fn spawn(&self, cmd: &str) -> Result<VmJob> {
        let id = self.ctl.spawn(cmd)?;
        Ok(VmJob {
            ctl: Arc::clone(&self.ctl),
            id,
            cmd: cmd.to_owned(),
            done: false,
        })
    }

    /// Waits until a TCP socket listens on `port` in the VM (e.g. 18515, the side channel of
    /// ibv_*_pingpong and perftest), so a client started next does not find the port closed.
    pub fn wait_listening(&self, port: u16, timeout: Duration) -> Result<()> {
        self.wait_until(
            &format!("netstat -ltn | grep -q ':{port} '"),
            &format!("waiting for TCP port {port} to listen"),
            timeout,
        )
    }

    /// [`RxeVm::wait_listening`] in the VM's network namespace `netns`.
    pub fn wait_listening_in(&self, netns: &str, port: u16, timeout: Duration) -> Result<()> {
        self.wait_until(
            &format!("ip netns exec {netns} netstat -ltn | grep -q ':{port} '"),
            &format!("waiting for TCP port {port} to listen in {netns}"),
            timeout,
        )
    }

    /// Waits until an rdma_cm ID of the VM listens on `port` (TCP or UDP port space), from
    /// `rdma res show cm_id`: a stock rdma_cm server opens no socket to wait for.
    pub fn wait_cm_listening(&self, port: u16, timeout: Duration) -> Result<()> {
        self.wait_until(
            &format!("rdma res show cm_id | grep 'state LISTEN' | grep -qE ':{port}( |$)'"),
            &format!("waiting for an rdma_cm listener on port {port}"),
            timeout,
        )
    }

    /// Runs `check` in the VM until it succeeds, for up to `timeout`.
    fn wait_until(&self, check: &str, what: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.run_timeout(check, timeout) {
                Ok(out) if out.success() => return Ok(()),
                Ok(_) => {}
                // A check can simply run again when its answer was garbled.
                Err(e @ Error::Protocol { .. }) => {
                    eprintln!("VM {}: {e}; checking again", self.name)
                }
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    vm: self.name.clone(),
                    what: what.to_owned(),
                    after: timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Reads a file of the VM (through the control channel: fine for kilobytes; use
    /// [`RxeVm::share_dir`] for bulk).
    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let cmd = format!("cat '{}'", path.replace('\'', r"'\''"));
        Ok(self.run_ok(&cmd)?.stdout)
    }

    /// Writes a file in the VM (through the control channel).
    pub fn write_file(&self, path: &str, contents: &[u8]) -> Result<()> {
        let cmd = format!(
            "printf %s '{}' | base64 -d > '{}'",
            base64_encode(contents),
            path.replace('\'', r"'\''")
        );
        self.run_ok(&cmd).map(drop)
    }

    /// The VM's name (`<namespace>-vm<index>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Index in its lab.
    pub fn index(&self) -> usize {
        self.index
    }

    /// eth0's IPv4 address (prefix /24).
    pub fn ip(&self) -> Ipv4Addr {
        self.ipv4
    }

    /// eth0's IPv6 address (prefix /64).
    pub fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }

    /// eth0's MAC address, `52:54:00:..`.
    pub fn mac(&self) -> &str {
        &self.mac
    }

    /// rxe0's GID at `index` (0: link-local from the MAC, 1: IPv4-mapped, then IPv6 ones).
    pub fn gid(&self, index: u32) -> Result<Ipv6Addr> {
        let path = format!("/sys/class/infiniband/rxe0/ports/1/gids/{index}");
        let text = String::from_utf8_lossy(&self.read_file(&path)?).into_owned();
        text.trim().parse().map_err(|_| {
            self.ctl
                .protocol(format!("GID {index}: cannot parse {:?}", text.trim()))
        })
    }

    /// The host-side tap device of this VM (in the lab namespace): capture here to see all of
    /// this VM's traffic (a capture on the bridge itself misses forwarded frames).
    pub fn tap(&self) -> &str {
        &self.tap
    }

    /// The namespace holding this VM's tap.
    pub fn netns(&self) -> &str {
        &self.net.ns
    }

    /// A host folder mounted at `/mnt/host` in the VM (9p): the way to move big files.
    pub fn share_dir(&self) -> &Path {
        &self.share
    }

    /// Wall time from starting QEMU to the agent's ready line.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// The console log so far (empty with [`Console::Interactive`]).
    pub fn console_log(&self) -> String {
        std::fs::read_to_string(self.rundir.join("console.log")).unwrap_or_default()
    }

    /// Waits for QEMU to exit by itself (the user powered off from the interactive console).
    pub fn wait_exit(&self) -> Result<()> {
        let mut qemu = self.qemu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(child) = qemu.as_mut() {
            child.wait().map_err(|e| Error::io("waiting for QEMU", e))?;
        }
        *qemu = None;
        Ok(())
    }

    /// Powers off (also done on drop).
    pub fn shutdown(self) {}
}

impl Drop for RxeVm {
    fn drop(&mut self) {
        let mut qemu = self.qemu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut child) = qemu.take() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                let _ = self.ctl.poweroff(Duration::from_secs(3));
            }
            // Closing the watchdog's stdin makes it SIGKILL QEMU if the power-off did not end it.
            drop(
                self.watchdog
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(),
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        let _ = ip_ns(&self.net.ns, &["link", "del", &self.tap]);
        let _ = std::fs::remove_dir_all(&self.rundir);
    }
}

fn open_image(config: &VmConfig) -> Result<Image> {
    if let Some(why) = unavailable_reason() {
        return Err(Error::Unavailable(why));
    }
    match &config.image_dir {
        Some(dir) => Image::open(dir),
        None => Image::build(&default_cache_dir()),
    }
}

/// Starts QEMU for VM `index` of `net` and waits for the agent's ready line.
fn boot_in(net: &Arc<LabNet>, index: usize, config: &VmConfig, image: &Image) -> Result<RxeVm> {
    let name = format!("{}-vm{index}", net.ns);
    let host_octet = u8::try_from(10 + index)
        .map_err(|_| Error::Unavailable(format!("VM index {index} too large")))?;
    let ipv4 = Ipv4Addr::new(SUBNET4[0], SUBNET4[1], SUBNET4[2], host_octet);
    let ipv6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, u16::from(host_octet));
    let mac = format!("52:54:00:77:00:{host_octet:02x}");
    let tap = format!("tap{index}");
    let rundir = net.rundir.join(format!("vm{index}"));
    let share = rundir.join("share");
    std::fs::create_dir_all(&share)
        .map_err(|e| Error::io(format!("creating {}", share.display()), e))?;
    let sock = rundir.join("ctl.sock");
    let console_log = rundir.join("console.log");
    let _ = std::fs::remove_file(&sock);

    let m = net.mtu.to_string();
    ip_ns(&net.ns, &["tuntap", "add", "dev", &tap, "mode", "tap"])?;
    ip_ns(
        &net.ns,
        &["link", "set", &tap, "mtu", &m, "master", BRIDGE, "up"],
    )?;

    let append = format!(
        "console=ttyS0 edd=off panic=-1 mitigations=off loglevel=4 ferroce.ip={ipv4}/24 ferroce.ip6={ipv6}/64 \
         ferroce.mtu={} ferroce.name=vm{index} ferroce.share=host {}",
        net.mtu, config.extra_append
    );
    let mut args: Vec<String> = vec![
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-nographic".into(),
        "-no-reboot".into(),
        "-m".into(),
        format!("{}M", config.memory_mib),
        "-smp".into(),
        "1".into(),
        "-kernel".into(),
        path_str(&image.kernel()),
        "-initrd".into(),
        path_str(&image.initramfs()),
        "-append".into(),
        append,
        "-netdev".into(),
        format!("tap,id=n0,ifname={tap},script=no,downscript=no"),
        "-device".into(),
        // romfile=: no iPXE option ROM; SeaBIOS would spend time initialising it.
        format!("virtio-net-pci,netdev=n0,mac={mac},romfile="),
        "-fsdev".into(),
        format!("local,id=fs0,path={},security_model=none", path_str(&share)),
        "-device".into(),
        "virtio-9p-pci,fsdev=fs0,mount_tag=host".into(),
    ];
    match config.accel {
        Accel::Tcg => {
            args.extend(["-accel".into(), "tcg".into()]);
            if let Some(cpu) = &config.cpu {
                args.extend(["-cpu".into(), cpu.clone()]);
            }
        }
        Accel::Kvm => args.extend(["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()]),
    }
    match config.console {
        Console::Log => args.extend([
            "-chardev".into(),
            format!("file,id=con,path={}", path_str(&console_log)),
            "-serial".into(),
            "chardev:con".into(),
        ]),
        Console::Interactive => args.extend(["-serial".into(), "mon:stdio".into()]),
    }
    // wait=on: QEMU starts the guest only once we are connected, so no agent line is lost.
    args.extend([
        "-chardev".into(),
        format!("socket,id=ctl,path={},server=on,wait=on", path_str(&sock)),
        "-serial".into(),
        "chardev:ctl".into(),
    ]);

    let qemu_err = rundir.join("qemu.err");
    let err_file = std::fs::File::create(&qemu_err)
        .map_err(|e| Error::io(format!("creating {}", qemu_err.display()), e))?;
    let started = Instant::now();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.ns]);
    let watchdog_stdin;
    let mut child = match config.console {
        Console::Log => {
            // The watchdog: QEMU dies with us even on SIGKILL, because our end of its stdin
            // pipe closes and `read` returns.
            cmd.args([
                "sh",
                "-c",
                "\"$@\" </dev/null & q=$!; read -r _; kill -9 $q 2>/dev/null; wait $q",
                "sh",
                "qemu-system-x86_64",
            ]);
            cmd.args(&args).stdin(Stdio::piped());
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(err_file)
                .spawn()
                .map_err(|e| Error::io("starting qemu-system-x86_64", e))?;
            watchdog_stdin = child.stdin.take();
            child
        }
        Console::Interactive => {
            watchdog_stdin = None;
            cmd.arg("qemu-system-x86_64")
                .args(&args)
                .stderr(err_file)
                .spawn()
                .map_err(|e| Error::io("starting qemu-system-x86_64", e))?
        }
    };

    let deadline = started + config.boot_timeout;
    let fail = |child: &mut Child, reason: String| -> Error {
        let _ = child.kill();
        let _ = child.wait();
        let mut console = tail(
            &std::fs::read_to_string(&console_log).unwrap_or_default(),
            40,
        );
        let qerr = std::fs::read_to_string(&qemu_err).unwrap_or_default();
        if !qerr.trim().is_empty() {
            console.push_str("\n--- qemu stderr ---\n");
            console.push_str(&tail(&qerr, 20));
        }
        Error::Boot {
            vm: name.clone(),
            reason,
            console,
        }
    };
    let stream = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(fail(&mut child, format!("QEMU exited: {status}")));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(fail(&mut child, format!("control socket: {e}"))),
        }
    };
    let writer = match stream.try_clone() {
        Ok(w) => w,
        Err(e) => return Err(fail(&mut child, format!("control socket: {e}"))),
    };
    let mut reader = LineReader {
        stream,
        buf: Vec::new(),
    };
    let ready = loop {
        match reader.read_line(&name, "boot", deadline) {
            Ok(line) => match parse_msg(&line) {
                Some(msg) if msg.id == "-" && msg.word == "READY" => break msg.arg,
                _ => {}
            },
            Err(Error::Timeout { .. }) => {
                return Err(fail(
                    &mut child,
                    format!("no ready line within {:?}", config.boot_timeout),
                ))
            }
            Err(e) => return Err(fail(&mut child, e.to_string())),
        }
    };
    if ready != "ok" {
        return Err(fail(&mut child, format!("in-VM setup: {ready}")));
    }
    let boot_time = started.elapsed();
    Ok(RxeVm {
        name: name.clone(),
        index,
        ipv4,
        ipv6,
        mac,
        tap,
        rundir,
        share,
        ctl: Arc::new(Ctl {
            vm: name,
            console_log,
            io: Mutex::new(CtlIo { writer, reader }),
            next_id: AtomicU64::new(1),
        }),
        qemu: Mutex::new(Some(child)),
        watchdog: Mutex::new(watchdog_stdin),
        boot_time,
        net: Arc::clone(net),
    })
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Labs

/// Several VMs on one bridge in one namespace, plus a host veth on the same bridge.
#[derive(Debug)]
pub struct RxeLab {
    // Field order: VMs drop (power off) before the namespace goes, and the turn is given up last.
    vms: Vec<RxeVm>,
    net: Arc<LabNet>,
    _turn: LabTurn,
}

/// Labs in one process share the machine's cores: each VM is an emulator (TCG) that wants a
/// whole core, and a test binary runs its tests in parallel: six labs at once on two cores
/// stalled VMs past the control channel's 60 s answer slack (a full CI run, 2026-12-03). A lab
/// of n VMs waits for n free cores (all of them, if it has more VMs than the machine has cores);
/// `FERROCE_LAB_CPUS` sets how many there are (default: the CPUs this process may use).
#[derive(Debug)]
struct LabTurn(usize);

static FREE_CPUS: Mutex<Option<usize>> = Mutex::new(None);
static CPU_FREED: std::sync::Condvar = std::sync::Condvar::new();

fn lab_cpus() -> usize {
    std::env::var("FERROCE_LAB_CPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .max(1)
}

impl LabTurn {
    fn take(vms: usize) -> LabTurn {
        // A test that panicked while holding the lock left the count right: go on.
        let mut free = FREE_CPUS.lock().unwrap_or_else(|p| p.into_inner());
        let cpus = lab_cpus();
        let want = vms.clamp(1, cpus);
        loop {
            let now = free.get_or_insert(cpus);
            if *now >= want {
                *now -= want;
                return LabTurn(want);
            }
            free = CPU_FREED.wait(free).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for LabTurn {
    fn drop(&mut self) {
        let mut free = FREE_CPUS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = free.as_mut() {
            *n += self.0;
        }
        CPU_FREED.notify_all();
    }
}

impl RxeLab {
    /// Boots `n` VMs with the default configuration, in parallel.
    pub fn new(n: usize) -> Result<RxeLab> {
        RxeLab::with_config(n, &VmConfig::default())
    }

    /// Boots `n` VMs with `config`, in parallel.
    pub fn with_config(n: usize, config: &VmConfig) -> Result<RxeLab> {
        let turn = LabTurn::take(n);
        let image = open_image(config)?;
        let net = Arc::new(LabNet::new(config.mtu)?);
        let results: Vec<Result<RxeVm>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let (net, image) = (&net, &image);
                    scope.spawn(move || boot_in(net, i, config, image))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(Error::Unavailable("a VM boot thread panicked".into()))
                    })
                })
                .collect()
        });
        let vms = results.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(RxeLab {
            vms,
            net,
            _turn: turn,
        })
    }

    /// The VMs, in index order.
    pub fn vms(&self) -> &[RxeVm] {
        &self.vms
    }

    /// VM `i`. Panics when out of range.
    pub fn vm(&self, i: usize) -> &RxeVm {
        &self.vms[i]
    }

    /// The lab's network namespace.
    pub fn netns(&self) -> &str {
        &self.net.ns
    }

    /// The bridge joining the taps and the host veth.
    pub fn bridge(&self) -> &'static str {
        BRIDGE
    }

    /// The host's interface on the bridge (in the namespace): where ferroce attaches.
    pub fn host_iface(&self) -> &'static str {
        HOST_IFACE
    }

    /// The host interface's IPv4 address (prefix /24).
    pub fn host_ipv4(&self) -> Ipv4Addr {
        Ipv4Addr::new(SUBNET4[0], SUBNET4[1], SUBNET4[2], 1)
    }

    /// The host interface's IPv6 address (prefix /64).
    pub fn host_ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 1)
    }

    /// `program` to be run inside the lab namespace (`ip netns exec <ns> program`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.net.ns]).arg(program);
        cmd
    }

    /// Starts tcpdump on `iface` (in the namespace) writing `path`; see [`crate::capture`].
    pub fn capture(
        &self,
        iface: &str,
        path: &Path,
        filter: &str,
    ) -> Result<crate::capture::Capture> {
        crate::capture::Capture::start(&self.net.ns, iface, path, filter)
    }
}

// ---------------------------------------------------------------------------------------------
// Base64 (the agent's transport encoding; busybox has base64)

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_encode(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decodes standard padded base64; `None` on anything malformed.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let quads = text.len() / 4;
    for (q, quad) in text.chunks(4).enumerate() {
        let mut n = 0u32;
        let mut pad = 0usize;
        for (i, &c) in quad.iter().enumerate() {
            let v = match c {
                b'A'..=b'Z' => c - b'A',
                b'a'..=b'z' => c - b'a' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'+' => 62,
                b'/' => 63,
                // Padding only at the end of the last quad.
                b'=' if q + 1 == quads && i >= 2 => {
                    pad += 1;
                    0
                }
                _ => return None,
            };
            if pad > 0 && c != b'=' {
                return None;
            }
            n = (n << 6) | u32::from(v);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trip() {
        for len in 0..40usize {
            let data: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let enc = base64_encode(&data);
            assert_eq!(base64_decode(enc.as_bytes()).unwrap(), data);
        }
        assert_eq!(base64_encode(b"foob"), "Zm9vYg==");
        assert_eq!(base64_decode(b"Zm9vYg==").unwrap(), b"foob");
        assert!(base64_decode(b"Zm9").is_none());
        assert!(base64_decode(b"Z=9v").is_none());
        assert!(base64_decode(b"Zg==Zg==").is_none());
        assert!(base64_decode(b"Zm9!").is_none());
    }

    #[test]
    fn protocol_messages() {
        let m = parse_msg(b"@@F 12 END 0").unwrap();
        assert_eq!(
            (m.id.as_str(), m.word.as_str(), m.arg.as_str()),
            ("12", "END", "0")
        );
        let m = parse_msg(b"@@F - READY fail: eth0 up").unwrap();
        assert_eq!(m.arg, "fail: eth0 up");
        assert!(parse_msg(b"hello").is_none());
        assert!(parse_msg(&[0xff, 0xfe]).is_none());
    }

    #[test]
    fn stale_namespace_names() {
        assert_eq!(owner_pid("frx123x4"), Some(123));
        assert_eq!(owner_pid("frx123"), None);
        assert_eq!(owner_pid("other"), None);
    }
}
