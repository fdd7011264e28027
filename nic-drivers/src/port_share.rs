//! Several processes on one UDP address and port 4791: the ranks of a job on
//! one host (`mpirun -np 4`, `torchrun --nproc_per_node 4`), each with its own
//! ferroce device on the same interface. rxe has one device in the kernel that
//! demultiplexes by QPN; here each process has its own socket, so the sockets
//! join one `SO_REUSEPORT` group and a classic-BPF program attached to the
//! group picks, for every datagram, the socket of the process that owns the
//! datagram's destination QP.
//!
//! Each member takes a QPN prefix, the top byte of all its QPNs (the core's
//! `Config::qpn_prefix`); the first member takes 0, so a lone process keeps
//! the QPNs it always had. Prefixes raw devices of the namespace hold
//! ([`raw_share`](crate::raw_share)) are skipped: their sockets see our
//! datagrams on the wire. The program reads the top byte of the BTH's
//! destination QP and maps it to the member's position in the group. The
//! kernel numbers a group's sockets in the order they joined and, when one
//! closes, moves the last one into its place (`reuseport_detach_sock`); a
//! program can only answer with a position. So the members keep a table of
//! (prefix, position, pid, nonce) in a file under `/dev/shm`, changed under
//! `flock(2)`, and build the program from it; a joiner takes the lock before
//! it binds. A member learns its position by sending itself probes: a probe
//! carries a position, which the program returns as is, so the lowest
//! position one of its own probes comes back through is its own (a probe for
//! a position past the last falls back to the kernel's hash and may land on
//! it too, but its own position is lower). It checks every [`CHECK_EVERY`]
//! while its engine runs. A member that leaves cleanly hands its position to
//! the last one before it closes; a member that finds a dead one in the
//! table does the kernel's move in the table itself, so even an idle member
//! is steered right again within a check of anyone's; in between the peers'
//! retransmissions cover the loss. A member alone runs no program: the
//! kernel would run it for every datagram.
//!
//! The members must see one `/dev/shm` and one PID namespace (a dead
//! member is known by its PID), as the processes of a job on one host or in
//! one container do; containers that share only a network namespace should
//! give each rank its own address instead.
//!
//! Connection management has one address per host, QP1: its MADs go to the
//! member whose prefix tops the comm ID the MAD names as the receiver's
//! (members' CMs draw their comm IDs with their prefix on top), and the
//! requests that name none (REQ, SIDR_REQ) to the member with prefix 0.
//!
//! While the group has more than one member that would take UDP GRO, none
//! does: a NIC's GRO would merge datagrams of one flow (same addresses and
//! ports) for different members into one, and the program steers it whole.
//! The kernel decides per datagram, by the socket the program picks for it,
//! whether it may join a merged one, so one GRO member among members without
//! it (a raw device's loopback-only socket for its local peers) gets only
//! merged datagrams of its own. For the same reason a sender puts only
//! frames to one QPN prefix into a GSO send.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::netns::ns_ino;
use crate::sys;
use crate::NicError;

/// How often a member checks its position in the group.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);
/// A probe: magic, position (both big-endian), the sender's nonce.
pub const PROBE_LEN: usize = 16;
// 0xFF as the BTH opcode is manufacturer-specific (IBTA 9.2.1 opcode table),
// never sent by ferroce or rxe; "frc" makes the word unlikely anywhere else.
const PROBE_MAGIC: u32 = 0xFF66_7263;
// Byte of the UDP payload with the top byte of the BTH destination QP.
const DEST_QP_TOP: u32 = 5;
// QP1's MADs (connection management), by UDP payload offset: a UD SEND's
// BTH (12) and DETH (8), then the MAD, whose attribute ID is at 16 and whose
// data starts at 24 (IBTA 13.4.3); a CM message names the receiver's comm ID
// at data offset 4 (REP, RTU, DREQ, DREP, REJ, MRA: the remote comm ID), a
// SIDR_REP its request ID at 0 (IBTA 12.6, 12.11).
const GSI_QPN: u32 = 1;
const MAD_CLASS: u32 = 20 + 1;
// Management class of the connection manager (IBTA 13.4.4).
const MAD_CLASS_CM: u32 = 0x07;
const MAD_ATTR_ID: u32 = 20 + 16;
const MAD_REQUEST_ID: u32 = 20 + 24;
const MAD_REMOTE_COMM_ID: u32 = 20 + 28;
// Attribute IDs of the CM messages that name no receiver's ID (IBTA table 96).
const CM_REQ: u32 = 0x0010;
const CM_SIDR_REQ: u32 = 0x0017;
const CM_SIDR_REP: u32 = 0x0018;
// Returned for a datagram no member owns: past any position, so the
// kernel picks by its hash instead (reuseport_select_sock).
const NO_MEMBER: u32 = u32::MAX;
// Prefix 255 would make QPNs 0xFFxxxx, next to the multicast QPN 0xFFFFFF.
pub(crate) const MAX_PREFIX: u8 = 254;
// Positions probed past the table's length when searching for our own.
const SEARCH_SLACK: u32 = 4;

/// One line of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) prefix: u8,
    /// In the reuseport group (0 in a raw device's table).
    pub(crate) position: u32,
    pub(crate) pid: u32,
    pub(crate) nonce: u64,
    /// Whether the member's socket would take UDP GRO (a line without the
    /// field, from an older ferroce, says yes).
    pub(crate) gro: bool,
}

/// This socket's membership of a shared port.
#[derive(Debug)]
pub struct PortShare {
    path: PathBuf,
    /// Where probes go: the bound address (loopback for a wildcard bind).
    target: SocketAddr,
    nonce: u64,
    prefix: u8,
    position: u32,
    members: usize,
    /// Whether this socket would take UDP GRO.
    gro: bool,
    /// Other members that would take UDP GRO, at the last check.
    gro_others: usize,
    next_check: Instant,
    /// The lowest position one of our probes came back through since the
    /// last check.
    seen: Option<u32>,
    /// Times a check found this socket moved.
    pub moves: u64,
}

impl PortShare {
    /// Locks the table of the group at `local` (before the socket binds,
    /// so that no datagram for another member reaches it unsteered).
    pub fn prepare(local: SocketAddr) -> Result<Joining, NicError> {
        sweep_dead_tables();
        let path = table_path(local);
        let mut table = Table::lock(&path)?;
        let members = table.read();
        Ok(Joining {
            path,
            table,
            members,
            local,
        })
    }

    /// The top byte of this member's QPNs.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Members of the group at the last check (this one included).
    pub fn members(&self) -> usize {
        self.members
    }

    /// Other members that would take UDP GRO, at the last check: while there
    /// are any, this one must not (see the module's notes).
    pub fn gro_others(&self) -> usize {
        self.gro_others
    }

    /// This socket's position in the group at the last check.
    pub fn position(&self) -> u32 {
        self.position
    }

    /// Whether `payload` (a received UDP payload) is a probe; one of ours
    /// is noted. Probes are not handed up.
    pub fn take_probe(&mut self, payload: &[u8]) -> bool {
        let mut any = false;
        for p in payload.chunks(PROBE_LEN) {
            match parse_probe(p) {
                Some((pos, nonce)) => {
                    any = true;
                    if nonce == self.nonce {
                        self.seen = Some(self.seen.map_or(pos, |s| s.min(pos)));
                    }
                }
                None => return any,
            }
        }
        any
    }

    /// Every [`CHECK_EVERY`]: looks at what the last round of probes showed,
    /// mends the table and the program if this socket moved, re-reads how
    /// many share the port, and sends the next round. Returns the number of
    /// members when it checked.
    pub fn tick(&mut self, fd: RawFd, now: Instant) -> Result<Option<usize>, NicError> {
        if now < self.next_check {
            return Ok(None);
        }
        self.next_check = now + CHECK_EVERY;
        let seen = self.seen.take();
        let mut table = Table::lock(&self.path)?;
        let mut members = table.read();
        let moved = match seen {
            Some(p) if p != self.position => Some(p),
            _ => None,
        };
        if let Some(p) = moved {
            tracing::debug!(
                "shared UDP port: position {} -> {p} (a member left)",
                self.position
            );
            self.position = p;
            self.moves += 1;
        }
        // Our line, as it should be: a position that changed, or a table
        // that lost or garbled it.
        let line = self.line();
        let mut changed = moved.is_some() || members.len() != self.members;
        match members.iter_mut().find(|m| m.nonce == self.nonce) {
            Some(m) if *m == line => {}
            Some(m) => {
                *m = line;
                changed = true;
            }
            None => {
                members.push(line);
                changed = true;
            }
        }
        if changed {
            attach(fd, &members)?;
            table.write(&members)?;
        }
        self.members = members.len();
        self.gro_others = gro_others(&members, self.nonce);
        drop(table);
        // A round that saw nothing searches the whole group next; otherwise
        // our position can only have gone down.
        let upto = if seen.is_none() {
            self.members as u32 + SEARCH_SLACK
        } else {
            self.position + 1
        };
        for pos in 0..upto {
            send_probe(fd, self.target, pos, self.nonce)?;
        }
        Ok(Some(self.members))
    }

    /// Leaves the group: the last member is about to be moved into our
    /// position, so the table and the program say so before the socket closes.
    pub fn leave(&self, fd: RawFd) {
        let Ok(mut table) = Table::lock(&self.path) else {
            return;
        };
        let mut members = table.read();
        members.retain(|m| m.nonce != self.nonce);
        let last = members.len() as u32;
        if let Some(m) = members.iter_mut().find(|m| m.position == last) {
            m.position = self.position;
        }
        let _ = attach(fd, &members);
        let _ = table.store(&self.path, &members);
    }

    fn line(&self) -> Member {
        Member {
            prefix: self.prefix,
            position: self.position,
            pid: std::process::id(),
            nonce: self.nonce,
            gro: self.gro,
        }
    }

    /// Sends probes for positions `0..upto` and reads the socket until they
    /// are in; the lowest that came back to us is our position.
    fn find_position(&mut self, fd: RawFd, upto: u32) -> Result<u32, NicError> {
        // Local delivery happens inside sendto, so the probes are queued once
        // it returns. They are sent again now and then: a socket that has
        // just been closed may still sit in the group for a few tens of ms
        // (one an io_uring request held: the ring lets go of it only when
        // its exit work has run) and take every probe of a round.
        let until = Instant::now() + Duration::from_millis(500);
        let mut next_round = Instant::now();
        let mut buf = [0u8; 2048];
        loop {
            if Instant::now() >= next_round {
                for pos in 0..upto {
                    send_probe(fd, self.target, pos, self.nonce)?;
                }
                next_round = Instant::now() + Duration::from_millis(40);
            }
            loop {
                // SAFETY: buf is valid for buf.len() bytes for the call.
                let n = unsafe {
                    libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                };
                if n < 0 {
                    break;
                }
                let got = buf.get(..n as usize).unwrap_or_default();
                self.take_probe(got);
            }
            if let Some(p) = self.seen.take() {
                return Ok(p);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NicError::Config(format!(
                    "{}: none of {upto} probes came back to this socket; \
                     cannot find its place among the sockets sharing the port",
                    self.target
                )));
            }
            sys::poll_readable(fd, Some(left.min(Duration::from_millis(20))))?;
        }
    }
}

/// A group's table, locked, for a socket about to bind to `local` with
/// `SO_REUSEPORT` ([`PortShare::prepare`]).
#[derive(Debug)]
pub struct Joining {
    path: PathBuf,
    table: Table,
    members: Vec<Member>,
    local: SocketAddr,
}

impl Joining {
    /// The socket did not bind: a table this made for it alone goes again.
    pub fn abandon(self) {
        remove_if_unused(&self.path, &self.members);
    }

    /// Joins with `fd`, just bound: takes a free prefix (or `prefix`, a raw
    /// device's own, for the socket its local peers reach it through),
    /// finds the socket's position and attaches the program for the table
    /// with it added. Datagrams that reach the socket meanwhile are read and
    /// dropped (it has no QPs yet). `gro`: whether the socket would take UDP
    /// GRO when no other member would.
    pub fn join(self, fd: RawFd, prefix: Option<u8>, gro: bool) -> Result<PortShare, NicError> {
        let Joining {
            path,
            mut table,
            mut members,
            local,
        } = self;
        let prefix = match prefix {
            Some(p) if members.iter().any(|m| m.prefix == p) => {
                remove_if_unused(&path, &members);
                return Err(NicError::Config(format!(
                    "{local}: QPN prefix {p} is taken on this UDP port"
                )));
            }
            Some(p) => p,
            None => {
                // Raw devices on this host see our datagrams on the wire too.
                let raw = prefixes_in_other_tables(RAW_TABLE);
                (0..=MAX_PREFIX)
                    .find(|p| members.iter().all(|m| m.prefix != *p) && !raw.contains(p))
                    .ok_or_else(|| {
                        NicError::Config(format!(
                            "{local}: {} devices share this UDP port already, the most there \
                             can be",
                            members.len()
                        ))
                    })?
            }
        };
        let nonce = new_nonce();
        let mut me = PortShare {
            path,
            target: probe_target(local),
            nonce,
            prefix,
            position: 0,
            members: members.len() + 1,
            gro,
            gro_others: gro_others(&members, nonce),
            next_check: Instant::now() + CHECK_EVERY,
            seen: None,
            moves: 0,
        };
        // The others' datagrams go to them from now on, and our probes to
        // the positions they carry.
        if !members.is_empty() {
            attach_program(fd, &members)?;
        }
        me.position = match me.find_position(fd, members.len() as u32 + 1 + SEARCH_SLACK) {
            Ok(p) => p,
            Err(e) => {
                remove_if_unused(&me.path, &members);
                return Err(e);
            }
        };
        members.push(me.line());
        attach(fd, &members)?;
        table.write(&members)?;
        Ok(me)
    }
}

/// Removes the table at `path` when `members` (read under its lock, which
/// the caller still holds) is empty: only a joiner that failed made it.
pub(crate) fn remove_if_unused(path: &std::path::Path, members: &[Member]) {
    if members.is_empty() {
        let _ = std::fs::remove_file(path);
    }
}

/// The table's file, open and locked until dropped.
#[derive(Debug)]
pub(crate) struct Table {
    file: File,
}

impl Table {
    pub(crate) fn lock(path: &std::path::Path) -> Result<Table, NicError> {
        use std::os::unix::fs::OpenOptionsExt;
        loop {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(|e| NicError::io("opening the shared-port table", e))?;
            // SAFETY: plain syscall on a file descriptor we own.
            while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(NicError::io("locking the shared-port table", e));
                }
            }
            // The last member to leave removes the file: if it did while we
            // waited for the lock, ours is gone from the path; open it anew.
            if still_at(&file, path) {
                return Ok(Table { file });
            }
        }
    }

    /// The members whose process is alive. A malformed line is skipped.
    pub(crate) fn read(&mut self) -> Vec<Member> {
        let mut text = String::new();
        if self.file.rewind().is_err() || self.file.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        let lines: Vec<Member> = text.lines().filter_map(parse_line).collect();
        without_the_dead(lines, |m| pid_alive(m.pid))
    }

    pub(crate) fn write(&mut self, members: &[Member]) -> Result<(), NicError> {
        let text: String = members
            .iter()
            .map(|m| {
                format!(
                    "{} {} {} {:016x} {}\n",
                    m.prefix,
                    m.position,
                    m.pid,
                    m.nonce,
                    u8::from(m.gro)
                )
            })
            .collect();
        let io = |e| NicError::io("writing the shared-port table", e);
        self.file.set_len(0).map_err(io)?;
        self.file.rewind().map_err(io)?;
        self.file.write_all(text.as_bytes()).map_err(io)
    }

    /// Writes `members` at `path`, or removes the file when none is left
    /// (still locked: whoever opens the path next makes a new table).
    pub(crate) fn store(
        &mut self,
        path: &std::path::Path,
        members: &[Member],
    ) -> Result<(), NicError> {
        if members.is_empty() {
            let _ = std::fs::remove_file(path);
            Ok(())
        } else {
            self.write(members)
        }
    }
}

/// `members` without those `alive` rejects, and with the positions the
/// kernel gave the others when their sockets closed: each time, the last
/// socket moved into the closed one's place. Two that died between checks
/// are taken last first (the order they died in is not known; a member
/// this puts in the wrong place finds its own at its next check).
fn without_the_dead(members: Vec<Member>, alive: impl Fn(&Member) -> bool) -> Vec<Member> {
    let (mut live, mut dead): (Vec<Member>, Vec<Member>) = members.into_iter().partition(alive);
    dead.sort_by_key(|m| std::cmp::Reverse(m.position));
    let mut size = live.len() + dead.len();
    for d in dead {
        size -= 1;
        let last = size as u32;
        if d.position < last {
            if let Some(m) = live.iter_mut().find(|m| m.position == last) {
                m.position = d.position;
            }
        }
    }
    live
}

fn parse_line(l: &str) -> Option<Member> {
    let mut it = l.split_ascii_whitespace();
    Some(Member {
        prefix: it.next()?.parse().ok()?,
        position: it.next()?.parse().ok()?,
        pid: it.next()?.parse().ok()?,
        nonce: u64::from_str_radix(it.next()?, 16).ok()?,
        gro: match it.next() {
            None => true,
            Some(g) => g.parse::<u8>().ok()? != 0,
        },
    })
}

/// Members other than the one with `nonce` that would take UDP GRO.
fn gro_others(members: &[Member], nonce: u64) -> usize {
    members.iter().filter(|m| m.gro && m.nonce != nonce).count()
}

/// The kinds of table: UDP groups and raw devices' interfaces.
pub(crate) const UDP_TABLE: &str = "udp";
pub(crate) const RAW_TABLE: &str = "raw";

/// The start of the names of `kind`'s tables of this user in the calling
/// thread's network namespace (where the socket was just made: a thread may
/// have entered another than the process's). One table per namespace (a
/// group lives in one; `/dev/shm` is shared by all) and user (only one
/// user's sockets can join a group). The PID namespace is named too: a
/// member is known dead by its PID, which only means something there.
pub(crate) fn table_stem(kind: &str) -> String {
    let netns = crate::netns::current_net_ino();
    format!("{}{netns}-", owner_stem(kind))
}

/// `kind`'s tables of this user and PID namespace, in any network namespace.
pub(crate) fn owner_stem(kind: &str) -> String {
    let pidns = ns_ino(&["/proc/self/ns/pid"]);
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    format!("ferroce-{kind}-{uid}-{pidns}-")
}

pub(crate) fn table_dir() -> PathBuf {
    if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

fn table_path(local: SocketAddr) -> PathBuf {
    let ip = match local.ip() {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => a.to_string().replace(':', "-"),
    };
    table_dir().join(format!(
        "{}{ip}-{}.members",
        table_stem(UDP_TABLE),
        local.port()
    ))
}

/// Removes this user's tables whose members are all dead: a process that
/// was killed (or ended with `process::exit`) ran no `leave`, and its table
/// would stay in `/dev/shm` until a device opens on the same address or
/// interface, or for good once its network namespace is gone. Only tables
/// of this PID namespace are judged (a PID means nothing outside it), in
/// every network namespace; a table another process holds locked is left
/// alone.
pub(crate) fn sweep_dead_tables() {
    for path in table_files(&[UDP_TABLE, RAW_TABLE].map(owner_stem)) {
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        // SAFETY: plain syscall on a file descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            continue;
        }
        // The path may name a newer table by now (the last member removed
        // ours and a joiner made another): only ours may go.
        if still_at(&file, &path) && live_members(&text).next().is_none() {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// The tables in the table directory whose names start with one of `stems`.
fn table_files(stems: &[String]) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(table_dir()) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.ends_with(".members") && stems.iter().any(|s| n.starts_with(s.as_str()))
            })
        })
        .map(|e| e.path())
        .collect()
}

/// The lines of a table's `text` whose process is alive.
fn live_members(text: &str) -> impl Iterator<Item = Member> + '_ {
    text.lines()
        .filter_map(parse_line)
        .filter(|m| pid_alive(m.pid))
}

/// Whether `file` is still the one at `path` (a table's last member removes
/// the file, and a joiner may make a new one there).
fn still_at(file: &File, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = file.metadata().map(|m| m.ino()).ok();
    ours.is_some() && ours == std::fs::metadata(path).map(|m| m.ino()).ok()
}

/// The prefixes live members hold in `kind`'s tables of this namespace.
/// Read without their locks (taking a second table's lock while holding
/// one could deadlock against a joiner of the other kind): a table being
/// rewritten at that moment may be missed.
pub(crate) fn prefixes_in_other_tables(kind: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for path in table_files(&[table_stem(kind)]) {
        if let Ok(text) = std::fs::read_to_string(path) {
            out.extend(live_members(&text).map(|m| m.prefix));
        }
    }
    out
}

fn probe_target(local: SocketAddr) -> SocketAddr {
    let ip = match local.ip() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, local.port())
}

fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

pub(crate) fn new_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

fn probe(pos: u32, nonce: u64) -> [u8; PROBE_LEN] {
    let mut p = [0u8; PROBE_LEN];
    p[..4].copy_from_slice(&PROBE_MAGIC.to_be_bytes());
    p[4..8].copy_from_slice(&pos.to_be_bytes());
    p[8..].copy_from_slice(&nonce.to_le_bytes());
    p
}

fn parse_probe(p: &[u8]) -> Option<(u32, u64)> {
    let p: &[u8; PROBE_LEN] = p.try_into().ok()?;
    let (magic, rest) = p.split_first_chunk::<4>()?;
    let (pos, nonce) = rest.split_first_chunk::<4>()?;
    if u32::from_be_bytes(*magic) != PROBE_MAGIC {
        return None;
    }
    Some((
        u32::from_be_bytes(*pos),
        u64::from_le_bytes(nonce.try_into().ok()?),
    ))
}

fn send_probe(fd: RawFd, to: SocketAddr, pos: u32, nonce: u64) -> Result<(), NicError> {
    let p = probe(pos, nonce);
    // A v4 target from a v6 (dual-stack) socket goes v4-mapped.
    let to = match to {
        SocketAddr::V4(a) if socket_is_v6(fd) => {
            SocketAddr::new(IpAddr::V6(a.ip().to_ipv6_mapped()), a.port())
        }
        t => t,
    };
    let (ss, len) = crate::udp::to_sockaddr(&to);
    // SAFETY: p and ss are valid for the lengths given for the call.
    let r = unsafe {
        libc::sendto(
            fd,
            p.as_ptr().cast(),
            p.len(),
            libc::MSG_DONTWAIT,
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        // A full buffer loses a probe; the next round sends it again.
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(NicError::io("sending a shared-port probe", e));
        }
    }
    Ok(())
}

fn socket_is_v6(fd: RawFd) -> bool {
    sys::getsockopt::<libc::c_int>(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, "SO_DOMAIN")
        .is_ok_and(|d| d == libc::AF_INET6)
}

/// The group's program for `members`: probes get the position they carry;
/// RoCE datagrams the position of the member with their QPN's prefix. A
/// MAD to QP1 (connection management) carries no member's QPN: it goes to
/// the member whose prefix tops the comm ID it names as the receiver's (the
/// remote comm ID of REP, RTU, DREQ, DREP, REJ, MRA; the request ID of a
/// SIDR_REP), which each member's CM draws with its prefix on top; a REQ or
/// SIDR_REQ, which names none, to the member with prefix 0.
fn program(members: &[Member]) -> Vec<libc::sock_filter> {
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const LD_IMM: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_IMM) as u16;
    const AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
    const RET_A: u16 = (libc::BPF_RET | libc::BPF_A) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let ins = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    // The member switch starts at 20; JA's k is the instructions skipped.
    const SWITCH: u32 = 20;
    const PREFIX: u32 = 19;
    vec![
        ins(LD_W_ABS, 0, 0, 0),                          // 0
        ins(JEQ_K, 0, 2, PROBE_MAGIC),                   // 1: a probe?
        ins(LD_W_ABS, 0, 0, 4),                          // 2
        ins(RET_A, 0, 0, 0),                             // 3: its position
        ins(LD_W_ABS, 0, 0, 4),                          // 4: BTH word 1
        ins(AND_K, 0, 0, 0x00FF_FFFF),                   // 5: destination QP
        ins(JEQ_K, 0, (PREFIX - 7) as u8, GSI_QPN),      // 6: not QP1 -> 19
        ins(LD_B_ABS, 0, 0, MAD_CLASS),                  // 7
        ins(JEQ_K, 0, (PREFIX - 9) as u8, MAD_CLASS_CM), // 8: not CM -> 19
        ins(LD_H_ABS, 0, 0, MAD_ATTR_ID),                // 9: the MAD's attribute
        ins(JEQ_K, 4, 0, CM_SIDR_REP),                   // 10: -> 15
        ins(JEQ_K, 5, 0, CM_REQ),                        // 11: -> 17
        ins(JEQ_K, 4, 0, CM_SIDR_REQ),                   // 12: -> 17
        ins(LD_B_ABS, 0, 0, MAD_REMOTE_COMM_ID),         // 13
        ins(JA, 0, 0, SWITCH - 15),                      // 14
        ins(LD_B_ABS, 0, 0, MAD_REQUEST_ID),             // 15: a SIDR_REP's
        ins(JA, 0, 0, SWITCH - 17),                      // 16
        ins(LD_IMM, 0, 0, 0),                            // 17: a request: prefix 0
        ins(JA, 0, 0, SWITCH - 19),                      // 18
        ins(LD_B_ABS, 0, 0, DEST_QP_TOP),                // 19: the QPN's prefix
    ]
    .into_iter()
    .chain(members.iter().flat_map(|m| {
        [
            ins(JEQ_K, 0, 1, u32::from(m.prefix)),
            ins(RET_K, 0, 0, m.position),
        ]
    }))
    .chain(std::iter::once(ins(RET_K, 0, 0, NO_MEMBER)))
    .collect()
}

/// Attaches the program for `members`, or none for a member alone: a
/// program runs for every datagram the port receives (over 2 % of a
/// sending core at 25 Gbit/s here), and one socket gets them all anyway.
fn attach(fd: RawFd, members: &[Member]) -> Result<(), NicError> {
    if members.len() < 2 {
        let zero: libc::c_int = 0;
        return match sys::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_DETACH_REUSEPORT_BPF,
            &zero,
            "SO_DETACH_REUSEPORT_BPF",
        ) {
            // None was attached.
            Err(NicError::Sys { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            r => r,
        };
    }
    attach_program(fd, members)
}

fn attach_program(fd: RawFd, members: &[Member]) -> Result<(), NicError> {
    sys::attach_cbpf(
        fd,
        libc::SO_ATTACH_REUSEPORT_CBPF,
        &program(members),
        "SO_ATTACH_REUSEPORT_CBPF",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::{PacketIo, UdpConfig, UdpIo};

    /// A table and program gone wrong (as after a member died between
    /// checks, or wrote a stale line): the members' checks put it right.
    #[test]
    fn members_mend_a_wrong_table_and_program() {
        let probe = std::net::UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        let port = probe.local_addr().unwrap().port();
        let at: SocketAddr = format!("127.62.{}.1:{port}", std::process::id() % 250)
            .parse()
            .unwrap();
        let mut devs: Vec<UdpIo> = (0..3)
            .map(|_| UdpIo::bind(UdpConfig::new(at)).unwrap())
            .collect();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = |qpn: u32, tag: u8| {
            let mut p = [0u8; 40];
            p[0] = 0x04;
            p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            p[12] = tag;
            tx.send_to(&p, at).unwrap();
        };
        let recv_all = |devs: &mut [UdpIo], ms: u64| -> Vec<Vec<u8>> {
            let mut got = vec![Vec::new(); devs.len()];
            let until = Instant::now() + Duration::from_millis(ms);
            while Instant::now() < until {
                for (d, g) in devs.iter_mut().zip(got.iter_mut()) {
                    let mut frames = Vec::new();
                    d.recv_owned(64, &mut frames).unwrap();
                    g.extend(frames.iter().filter_map(|f| f.get(54).copied()));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            got
        };
        // Swap the second and third members' positions in the table and
        // the program.
        let path = table_path(at);
        {
            let mut t = Table::lock(&path).unwrap();
            let mut ms = t.read();
            assert_eq!(ms.len(), 3);
            for m in ms.iter_mut() {
                m.position = match m.position {
                    1 => 2,
                    2 => 1,
                    p => p,
                };
            }
            attach(devs[0].poll_fd(), &ms).unwrap();
            t.write(&ms).unwrap();
        }
        to(0x01_0011, 1);
        to(0x02_0011, 2);
        assert_eq!(recv_all(&mut devs, 20), [vec![], vec![2], vec![1]]);
        // Two checks each (CHECK_EVERY apart) find their lines wrong.
        recv_all(&mut devs, 350);
        to(0x00_0011, 3);
        to(0x01_0011, 4);
        to(0x02_0011, 5);
        assert_eq!(recv_all(&mut devs, 20), [vec![3], vec![4], vec![5]]);
        let moves: u64 = devs.iter().filter_map(|d| d.share()).map(|s| s.moves).sum();
        assert_eq!(moves, 0, "nobody moved; only the table was wrong");
    }

    #[test]
    fn probes_round_trip_and_nothing_else_is_one() {
        let p = probe(3, 0x1234_5678_9abc_def0);
        assert_eq!(parse_probe(&p), Some((3, 0x1234_5678_9abc_def0)));
        // An RC SEND ONLY BTH is not a probe.
        let mut bth = [0u8; PROBE_LEN];
        bth[0] = 0x04;
        assert_eq!(parse_probe(&bth), None);
        assert_eq!(parse_probe(&p[..15]), None);
    }

    #[test]
    fn the_dead_leave_their_places_to_the_last() {
        let m = |prefix: u8, position| Member {
            prefix,
            position,
            pid: u32::from(prefix),
            nonce: u64::from(prefix),
            gro: false,
        };
        let four = vec![m(0, 0), m(1, 1), m(2, 2), m(3, 3)];
        // The first died: the last took its place.
        let left = without_the_dead(four.clone(), |x| x.prefix != 0);
        assert_eq!(left, [m(1, 1), m(2, 2), m(3, 0)]);
        // The last died: nobody moved.
        let left = without_the_dead(four.clone(), |x| x.prefix != 3);
        assert_eq!(left, [m(0, 0), m(1, 1), m(2, 2)]);
        // Two died: the one at 2 first (3 takes 2), then the one at 0 (3,
        // the last again, takes 0).
        let left = without_the_dead(four, |x| x.prefix == 1 || x.prefix == 3);
        assert_eq!(left, [m(1, 1), m(3, 0)]);
    }

    #[test]
    fn table_lines_parse_back() {
        for gro in [false, true] {
            let m = Member {
                prefix: 7,
                position: 2,
                pid: 4242,
                nonce: 0xdead_beef,
                gro,
            };
            let l = format!(
                "{} {} {} {:016x} {}",
                m.prefix,
                m.position,
                m.pid,
                m.nonce,
                u8::from(gro)
            );
            assert_eq!(parse_line(&l), Some(m));
        }
        // A line of an older ferroce, without the GRO field: it may take GRO.
        assert_eq!(
            parse_line("7 2 4242 00000000deadbeef").map(|m| m.gro),
            Some(true)
        );
        assert_eq!(parse_line("7 2 x 00"), None);
        assert_eq!(parse_line("7 2 4242 00 x"), None);
    }

    #[test]
    fn the_program_maps_each_prefix_to_its_position() {
        let ms = [
            Member {
                prefix: 0,
                position: 1,
                pid: 1,
                nonce: 1,
                gro: true,
            },
            Member {
                prefix: 3,
                position: 0,
                pid: 1,
                nonce: 2,
                gro: false,
            },
        ];
        let p = program(&ms);
        // Header (20), two instructions a member, the fallback.
        assert_eq!(p.len(), 20 + 2 * ms.len() + 1);
        assert_eq!(p.last().map(|i| i.k), Some(NO_MEMBER));
        let run = |payload: &[u8]| crate::afpacket::tests::run_cbpf(&p, payload);
        let bth = |qpn: u32| {
            let mut d = vec![0u8; 80];
            d[0] = 0x64;
            d[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            d
        };
        assert_eq!(run(&bth(0x03_0011)), 0, "prefix 3 is at position 0");
        assert_eq!(run(&bth(0x00_0011)), 1);
        assert_eq!(run(&bth(0x07_0011)), NO_MEMBER);
        assert_eq!(run(&probe(5, 9)), 5);
        // MADs to QP1: by the receiver's comm ID's top byte, or to prefix 0.
        let mad = |attr: u16, request_id: u32, remote_comm_id: u32| {
            let mut d = bth(1);
            d[21] = 0x07;
            d[36..38].copy_from_slice(&attr.to_be_bytes());
            d[44..48].copy_from_slice(&request_id.to_be_bytes());
            d[48..52].copy_from_slice(&remote_comm_id.to_be_bytes());
            d
        };
        assert_eq!(
            run(&mad(0x0013, 0x0000_0001, 0x0312_3456)),
            0,
            "a REP for prefix 3"
        );
        assert_eq!(
            run(&mad(0x0015, 0x0312_3456, 0x0012_3456)),
            1,
            "a DREQ for 0"
        );
        assert_eq!(run(&mad(0x0018, 0x03ab_cdef, 0)), 0, "a SIDR_REP for 3");
        assert_eq!(run(&mad(0x0010, 0x0312_3456, 0)), 1, "a REQ: to prefix 0");
        assert_eq!(
            run(&mad(0x0017, 0x0312_3456, 0)),
            1,
            "a SIDR_REQ: to prefix 0"
        );
        assert_eq!(run(&mad(0x0014, 0, 0x0912_3456)), NO_MEMBER);
        // Not the CM's class: to QP1's prefix, 0, as any datagram by its QPN.
        let mut other = mad(0x0013, 0, 0x0312_3456);
        other[21] = 0x04;
        assert_eq!(run(&other), 1);
    }
}
