//! The TCP exchange of perftest 4.5 (Debian 12) over Ethernet sockets
//! (`src/perftest_communication.c`, driven from `write_bw.c` / `read_bw.c` /
//! `send_bw.c` / `*_lat.c`), and its rdma_cm variant (`-R`, below).
//!
//! Every step is `ctx_xchg_data_ethernet` or `ctx_hand_shake`: the client
//! (the side given a server name) writes then reads, the server reads then
//! writes; each message has a fixed size and is read with a single `read()`.
//! The sequence of a run:
//!
//! | # | step (perftest function) | bytes each way |
//! |---|---|---|
//! | 1 | `exchange_versions`: `char version[MAX_VERSION]` | 16, NUL-padded, e.g. `"6.19"` |
//! | 2 | `check_sys_data` (peer version >= 5.32): `cycle_buffer`, then `cache_line_size`, each `htonl` int; both keep the max | 4, 4 |
//! | 3 | `check_mtu` (peer >= 5.1): `sprintf("%d", ibv_mtu enum)`; 2 bytes if peer >= 5.31 else 4; both keep the smaller valid one | 2 |
//! | 4 | per QP `ctx_hand_shake`: key message (`KEY_PRINT_FMT_GID`, or `KEY_PRINT_FMT` without GID) | 108 (59) |
//! | – | `ctx_check_gid_compatibility` on QP 0 (local: both IPv4-mapped or neither), `ctx_connect` (QPs to RTR/RTS) | – |
//! | 5 | [`HandshakeLayout::TwoPass`] only: per QP `ctx_hand_shake` again (the pass that prints the remote addresses) | 108 |
//! | 6 | "additional handshake after moving qp to RTR": `ctx_hand_shake` of QP 0 | 108 |
//! | – | the test runs (BW, half duplex: only the client) | – |
//! | 7 | BW tests: `ctx_hand_shake` QP 0 (the server waits here for the client's end), then `xchg_bw_reports`: size (u64), iters (u64; u32 if peer < 5.33), bw_peak, bw_avg, msgRate_avg (f64), and with `--report-per-port` bw_avg_p1, msgRate_avg_p1, bw_avg_p2, msgRate_avg_p2; all big-endian, each its own exchange | 108, 8×5 (+8×4) |
//! | 8 | `ctx_close_connection`: `ctx_hand_shake` QP 0, then each side writes `"done\0"` and closes without reading the other's | 108, 5 |
//!
//! Negotiation in 4.5 is only steps 1–3 (no test-parameter exchange: a
//! client and server with different `-s`/`-n` are not checked against each
//! other; `negotiate_params` came in later perftest releases).
//!
//! With `-R` (rdma_cm) perftest sends the same messages, each as one RDMA
//! SEND over an RC connection of its own that rdma_cm set up first on the
//! same port ([`MessageChannel`]); the key message is then `struct
//! pingpong_dest` in binary ([`KeyFormat::Binary`]); between steps 3 and 4
//! an all-zero key message each way brackets the test QPs' rdma_cm
//! connections ([`rdma_cm_session`]), which replace `ctx_connect`; and
//! `ctx_close_connection` is the hand-shake alone, without `"done"`.

use std::fmt;
use std::io;
use std::net::{TcpListener, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{
    c_text, ExchangeConfig, ExchangeError, ParseError, PerftestDest, Role, Wire, DONE_MSG,
};

/// `MAX_VERSION` in perftest_parameters.h: the version buffer sent whole.
pub const VERSION_LEN: usize = 16;

/// Version string we announce. perftest only compares the peer's version
/// numerically (thresholds 5.1, 5.31, 5.32, 5.33, 5.70), so any value
/// >= 5.70 selects the same wire formats as a 4.5 peer uses.
pub const DEFAULT_VERSION: &str = "6.19";

/// Which key message perftest uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFormat {
    /// `KEY_PRINT_FMT_GID`, 108 bytes: whenever a GID index is set, which
    /// perftest always does on an Ethernet (RoCE) link.
    Gid,
    /// `KEY_PRINT_FMT`, 59 bytes: InfiniBand without `-x`.
    Lid,
    /// `struct pingpong_dest`, 56 bytes, over the rdma_cm channel of `-R`;
    /// the GID index travels in it too.
    Binary { gid_index: u32 },
}

/// A transport for the exchange other than TCP: perftest's `-R` sends
/// every message as one RDMA SEND over a connection of its own.
pub trait MessageChannel: fmt::Debug {
    /// Who the peer is, for messages.
    fn peer(&self) -> String;
    /// Sends `msg` as one message.
    fn send(&mut self, msg: &[u8]) -> io::Result<()>;
    /// Receives the next message into `buf`, waiting up to `limit` (`None`:
    /// as long as it takes); its length, which may differ from `buf`'s, or
    /// `None` if none came in time.
    fn recv(&mut self, buf: &mut [u8], limit: Option<Duration>) -> io::Result<Option<usize>>;
}

/// Where a [`PerftestConn`]'s messages go.
#[derive(Debug)]
enum Link<'c> {
    Tcp(Wire),
    Channel {
        channel: Box<dyn MessageChannel + 'c>,
        peer: String,
        io_timeout: Duration,
    },
}

impl Link<'_> {
    fn peer(&self) -> &str {
        match self {
            Link::Tcp(w) => w.peer(),
            Link::Channel { peer, .. } => peer,
        }
    }

    fn send(&mut self, step: &'static str, msg: &[u8]) -> Result<(), ExchangeError> {
        match self {
            Link::Tcp(w) => w.send(step, msg),
            Link::Channel { channel, .. } => {
                let sent = channel.send(msg);
                sent.map_err(|source| self.io_err(step, source))
            }
        }
    }

    fn io_err(&self, step: &'static str, source: io::Error) -> ExchangeError {
        ExchangeError::Io {
            peer: self.peer().to_string(),
            step,
            source,
        }
    }

    fn recv_within(
        &mut self,
        step: &'static str,
        buf: &mut [u8],
        limit: Option<Duration>,
    ) -> Result<(), ExchangeError> {
        match self {
            Link::Tcp(w) => w.recv_within(step, buf, limit),
            Link::Channel {
                channel,
                io_timeout,
                ..
            } => {
                let timeout = limit.unwrap_or(*io_timeout);
                match channel.recv(buf, limit) {
                    Ok(Some(n)) if n == buf.len() => Ok(()),
                    Ok(Some(n)) => {
                        let why = format!("a message of {n} bytes where {} were due", buf.len());
                        let source = ParseError::new(why, &buf[..n.min(buf.len())]);
                        Err(self.malformed(step, source))
                    }
                    Ok(None) => Err(ExchangeError::Timeout {
                        peer: self.peer().to_string(),
                        step,
                        timeout,
                        got: 0,
                        want: buf.len(),
                    }),
                    Err(source) => Err(self.io_err(step, source)),
                }
            }
        }
    }

    fn malformed(&self, step: &'static str, source: ParseError) -> ExchangeError {
        ExchangeError::Malformed {
            peer: self.peer().to_string(),
            step,
            source,
        }
    }

    /// Until the peer is gone. A channel has no close of its own (its
    /// connection outlives the test): it waits for a message that never
    /// comes, or fails when the connection breaks.
    fn wait_closed_within(
        &mut self,
        step: &'static str,
        limit: Option<Duration>,
    ) -> Result<bool, ExchangeError> {
        match self {
            Link::Tcp(w) => w.wait_closed_within(step, limit),
            Link::Channel { channel, .. } => {
                let deadline = limit.map(|l| Instant::now() + l);
                let mut sink = [0u8; PerftestDest::WIRE_LEN_BINARY];
                loop {
                    let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                    match channel.recv(&mut sink, left) {
                        Ok(Some(_)) => {}
                        Ok(None) => return Ok(false),
                        Err(_) => return Ok(true),
                    }
                }
            }
        }
    }
}

/// How many key-message passes precede the test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeLayout {
    /// Per-QP pass, connect, per-QP pass again, one more on QP 0 (the main
    /// programs of perftest from the 4.5 era on).
    TwoPass,
    /// Per-QP pass, connect, one more on QP 0 (older perftest).
    OnePass,
}

/// What we announce and use.
#[derive(Debug, Clone)]
pub struct PerftestParams {
    /// At most 15 bytes (NUL-terminated in 16).
    pub version: String,
    /// perftest's `-v`/`--dont_xchg_versions`: skip steps 1–3.
    pub exchange_versions: bool,
    /// Local `cycle_buffer` (the page size by default).
    pub cycle_buffer: u32,
    /// Local `cache_line_size`.
    pub cache_line_size: u32,
    /// Local path MTU as the `ibv_mtu` enum value: 1=256 … 5=4096.
    pub mtu: u8,
    pub key_format: KeyFormat,
    pub layout: HandshakeLayout,
    /// `--report-per-port`: four more values in the BW report exchange.
    pub report_per_port: bool,
    /// QP-0 key exchanges before the first per-QP pass: 1 for ib_read_lat
    /// and ib_send_lat (seen on the wire between two perftest 4.5 peers).
    pub extra_rounds_before: u8,
    /// QP-0 key exchanges after the post-RTR hand-shake, before traffic:
    /// 1 for ib_send_bw (same source).
    pub extra_rounds_after: u8,
}

impl Default for PerftestParams {
    fn default() -> Self {
        Self {
            version: DEFAULT_VERSION.to_string(),
            exchange_versions: true,
            cycle_buffer: 4096,
            cache_line_size: 64,
            mtu: 3,
            key_format: KeyFormat::Gid,
            layout: HandshakeLayout::TwoPass,
            report_per_port: false,
            extra_rounds_before: 0,
            extra_rounds_after: 0,
        }
    }
}

/// Outcome of steps 1–3.
#[derive(Debug, Clone, PartialEq)]
pub struct Negotiated {
    /// The peer's version text (empty when versions are not exchanged).
    pub remote_version: String,
    /// Its numeric value as C `atof` reads it (0 when not exchanged).
    pub remote_version_num: f64,
    /// max(local, remote) when exchanged, else local.
    pub cycle_buffer: u32,
    /// max(local, remote) when exchanged, else local.
    pub cache_line_size: u32,
    /// The `ibv_mtu` to use: the smaller of both when the peer's is valid.
    pub mtu: u8,
    /// The peer's MTU enum as sent, if it was exchanged.
    pub remote_mtu: Option<u8>,
}

/// `struct bw_report_data` fields that travel in `xchg_bw_reports`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    pub size: u64,
    pub iters: u64,
    pub bw_peak: f64,
    pub bw_avg: f64,
    pub msg_rate_avg: f64,
    pub bw_avg_p1: f64,
    pub msg_rate_avg_p1: f64,
    pub bw_avg_p2: f64,
    pub msg_rate_avg_p2: f64,
}

/// Leading number of a version string as C `atof` would read it ("6.19"
/// -> 6.19); `None` if it does not start with a digit.
fn version_number(text: &str) -> Option<f64> {
    let end = text
        .char_indices()
        .find(|&(i, c)| !(c.is_ascii_digit() || (c == '.' && !text[..i].contains('.'))))
        .map_or(text.len(), |(i, _)| i);
    let num = text[..end].trim_end_matches('.');
    if num.is_empty() {
        return None;
    }
    num.parse().ok()
}

/// `ipv6_addr_v4mapped` in perftest_communication.c: `::ffff:a.b.c.d`, or
/// the IPv4-encoded multicast form `ff0e::ffff:a.b.c.d`.
pub fn gid_is_v4mapped(gid: &[u8; 16]) -> bool {
    let tail_ok = gid[4..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff;
    tail_ok && (gid[..4] == [0, 0, 0, 0] || gid[..4] == [0xff, 0x0e, 0, 0])
}

/// A perftest control connection; each method is one perftest step.
#[derive(Debug)]
pub struct PerftestConn<'c> {
    wire: Link<'c>,
    role: Role,
    key_format: KeyFormat,
    remote_version_num: f64,
    cfg: ExchangeConfig,
}

impl<'c> PerftestConn<'c> {
    /// Server: accept one client (`ethernet_server_connect`).
    pub fn accept(
        listener: &TcpListener,
        key_format: KeyFormat,
        cfg: &ExchangeConfig,
    ) -> Result<Self, ExchangeError> {
        let wire = Wire::accept(listener, cfg, "perftest server: accept")?;
        Ok(Self::new(Link::Tcp(wire), Role::Server, key_format, cfg))
    }

    /// Client: connect to the server (`ethernet_client_connect`).
    pub fn connect<A: ToSocketAddrs + fmt::Debug>(
        addr: A,
        key_format: KeyFormat,
        cfg: &ExchangeConfig,
    ) -> Result<Self, ExchangeError> {
        let wire = Wire::connect(addr, cfg, "perftest client: connect")?;
        Ok(Self::new(Link::Tcp(wire), Role::Client, key_format, cfg))
    }

    /// `-R`: the exchange over an rdma_cm connection already set up
    /// (`rdma_client_connect` / `rdma_server_connect`), binary key messages
    /// carrying `gid_index`.
    pub fn over_channel(
        channel: Box<dyn MessageChannel + 'c>,
        role: Role,
        gid_index: u32,
        cfg: &ExchangeConfig,
    ) -> Self {
        let peer = channel.peer();
        let link = Link::Channel {
            channel,
            peer,
            io_timeout: cfg.io_timeout,
        };
        Self::new(link, role, KeyFormat::Binary { gid_index }, cfg)
    }

    fn new(wire: Link<'c>, role: Role, key_format: KeyFormat, cfg: &ExchangeConfig) -> Self {
        Self {
            wire,
            role,
            key_format,
            remote_version_num: 0.0,
            cfg: cfg.clone(),
        }
    }

    /// Who the peer is.
    pub fn peer(&self) -> &str {
        self.wire.peer()
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// `ctx_xchg_data_ethernet`: the client writes then reads, the server
    /// reads then writes; `mine` and `theirs` have the same fixed size.
    pub fn xchg(
        &mut self,
        step: &'static str,
        mine: &[u8],
        theirs: &mut [u8],
    ) -> Result<(), ExchangeError> {
        self.xchg_within(step, mine, theirs, None)
    }

    /// [`Self::xchg`] where `wait` overrides the read bound (`Some(None)`:
    /// no bound; `None`: the I/O timeout).
    fn xchg_within(
        &mut self,
        step: &'static str,
        mine: &[u8],
        theirs: &mut [u8],
        wait: Option<Option<Duration>>,
    ) -> Result<(), ExchangeError> {
        let limit = wait.unwrap_or(Some(self.cfg.io_timeout));
        match self.role {
            Role::Client => {
                self.wire.send(step, mine)?;
                self.wire.recv_within(step, theirs, limit)
            }
            Role::Server => {
                self.wire.recv_within(step, theirs, limit)?;
                self.wire.send(step, mine)
            }
        }
    }

    /// `exchange_versions`: 16 bytes each way. Returns the peer's text.
    pub fn exchange_versions(&mut self, version: &str) -> Result<String, ExchangeError> {
        const STEP: &str = "perftest: exchange versions";
        if version.len() >= VERSION_LEN || version.contains('\0') {
            return Err(ExchangeError::Invalid(format!(
                "version {version:?} must be at most {} bytes without NUL",
                VERSION_LEN - 1
            )));
        }
        let mut mine = [0u8; VERSION_LEN];
        mine[..version.len()].copy_from_slice(version.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.xchg(STEP, &mine, &mut theirs)?;
        let text = c_text(&theirs).map_err(|e| self.wire.malformed(STEP, e))?;
        let num = version_number(text).ok_or_else(|| {
            self.wire.malformed(
                STEP,
                ParseError::new("version does not start with a number", &theirs),
            )
        })?;
        self.remote_version_num = num;
        Ok(text.to_string())
    }

    /// `check_sys_data`: exchanges `cycle_buffer` then `cache_line_size`
    /// (network-order ints) if the peer is >= 5.32; returns the maxima.
    pub fn check_sys_data(
        &mut self,
        cycle_buffer: u32,
        cache_line_size: u32,
    ) -> Result<(u32, u32), ExchangeError> {
        if self.remote_version_num < 5.32 {
            return Ok((cycle_buffer, cache_line_size));
        }
        let cb = self.xchg_int("perftest: exchange cycle buffer", cycle_buffer)?;
        let cl = self.xchg_int("perftest: exchange cache line size", cache_line_size)?;
        Ok((cycle_buffer.max(cb), cache_line_size.max(cl)))
    }

    fn xchg_int(&mut self, step: &'static str, v: u32) -> Result<u32, ExchangeError> {
        let mut theirs = [0u8; 4];
        self.xchg(step, &v.to_be_bytes(), &mut theirs)?;
        let r = u32::from_be_bytes(theirs);
        // Buffer sizes the caller will allocate: refuse absurd values.
        if r > 1 << 30 {
            return Err(self.wire.malformed(
                step,
                ParseError::new(format!("value {r} is not a plausible size"), &theirs),
            ));
        }
        Ok(r)
    }

    /// `check_mtu`: exchanges the MTU enum as decimal text (2 bytes, or 4
    /// for peers < 5.31; nothing for peers < 5.1). Returns the MTU to use
    /// and the peer's value.
    pub fn check_mtu(&mut self, mtu: u8) -> Result<(u8, Option<u8>), ExchangeError> {
        const STEP: &str = "perftest: exchange MTU";
        if !(1..=5).contains(&mtu) {
            return Err(ExchangeError::Invalid(format!(
                "MTU enum {mtu} is not 1..=5 (256..4096)"
            )));
        }
        if self.remote_version_num < 5.1 {
            return Ok((mtu, None));
        }
        let size = if self.remote_version_num >= 5.31 {
            2
        } else {
            4
        };
        let mut mine = [0u8; 4];
        mine[0] = b'0' + mtu;
        let mut theirs = [0u8; 4];
        self.xchg(STEP, &mine[..size], &mut theirs[..size])?;
        let raw = &theirs[..size];
        let text = c_text(raw).map_err(|e| self.wire.malformed(STEP, e))?;
        let rem: i64 = text.trim().parse().map_err(|_| {
            self.wire
                .malformed(STEP, ParseError::new("MTU is not a decimal number", raw))
        })?;
        // perftest: take the peer's only if valid and smaller.
        let valid = (1..=5).contains(&rem);
        let use_mtu = if valid && i64::from(mtu) > rem {
            rem as u8
        } else {
            mtu
        };
        Ok((use_mtu, valid.then_some(rem as u8)))
    }

    /// Steps 1–3 as the main programs run them.
    pub fn negotiate(&mut self, params: &PerftestParams) -> Result<Negotiated, ExchangeError> {
        if !params.exchange_versions {
            return Ok(Negotiated {
                remote_version: String::new(),
                remote_version_num: 0.0,
                cycle_buffer: params.cycle_buffer,
                cache_line_size: params.cache_line_size,
                mtu: params.mtu,
                remote_mtu: None,
            });
        }
        let remote_version = self.exchange_versions(&params.version)?;
        let (cycle_buffer, cache_line_size) =
            self.check_sys_data(params.cycle_buffer, params.cache_line_size)?;
        let (mtu, remote_mtu) = self.check_mtu(params.mtu)?;
        Ok(Negotiated {
            remote_version,
            remote_version_num: self.remote_version_num,
            cycle_buffer,
            cache_line_size,
            mtu,
            remote_mtu,
        })
    }

    /// `ctx_hand_shake`: one key message each way.
    pub fn hand_shake(&mut self, mine: &PerftestDest) -> Result<PerftestDest, ExchangeError> {
        self.hand_shake_within("perftest: exchange QP keys", mine, None)
    }

    fn hand_shake_within(
        &mut self,
        step: &'static str,
        mine: &PerftestDest,
        wait: Option<Option<Duration>>,
    ) -> Result<PerftestDest, ExchangeError> {
        match self.key_format {
            KeyFormat::Gid => {
                let out = mine.to_wire_gid()?;
                let mut theirs = [0u8; PerftestDest::WIRE_LEN_GID];
                self.xchg_within(step, &out, &mut theirs, wait)?;
                PerftestDest::parse_gid(&theirs).map_err(|e| self.wire.malformed(step, e))
            }
            KeyFormat::Lid => {
                let out = mine.to_wire_lid()?;
                let mut theirs = [0u8; PerftestDest::WIRE_LEN_LID];
                self.xchg_within(step, &out, &mut theirs, wait)?;
                PerftestDest::parse_lid(&theirs).map_err(|e| self.wire.malformed(step, e))
            }
            KeyFormat::Binary { gid_index } => {
                let out = mine.to_wire_binary(gid_index)?;
                let mut theirs = [0u8; PerftestDest::WIRE_LEN_BINARY];
                self.xchg_within(step, &out, &mut theirs, wait)?;
                PerftestDest::parse_binary(&theirs).map_err(|e| self.wire.malformed(step, e))
            }
        }
    }

    /// One `ctx_hand_shake` per QP, in order.
    pub fn exchange_dests(
        &mut self,
        mine: &[PerftestDest],
    ) -> Result<Vec<PerftestDest>, ExchangeError> {
        mine.iter().map(|d| self.hand_shake(d)).collect()
    }

    /// `xchg_bw_reports`: each field its own exchange, big-endian.
    pub fn xchg_bw_report(
        &mut self,
        mine: &BwReport,
        report_per_port: bool,
    ) -> Result<BwReport, ExchangeError> {
        const STEP: &str = "perftest: exchange BW report";
        let mut r = BwReport {
            size: self.xchg_u64(STEP, mine.size)?,
            ..BwReport::default()
        };
        r.iters = if self.remote_version_num >= 5.33 {
            self.xchg_u64(STEP, mine.iters)?
        } else {
            // Older peers send an int; ours is truncated the same way.
            let mut t = [0u8; 4];
            self.xchg(STEP, &(mine.iters as u32).to_be_bytes(), &mut t)?;
            u32::from_be_bytes(t).into()
        };
        r.bw_peak = self.xchg_f64(STEP, mine.bw_peak)?;
        r.bw_avg = self.xchg_f64(STEP, mine.bw_avg)?;
        r.msg_rate_avg = self.xchg_f64(STEP, mine.msg_rate_avg)?;
        if report_per_port {
            r.bw_avg_p1 = self.xchg_f64(STEP, mine.bw_avg_p1)?;
            r.msg_rate_avg_p1 = self.xchg_f64(STEP, mine.msg_rate_avg_p1)?;
            r.bw_avg_p2 = self.xchg_f64(STEP, mine.bw_avg_p2)?;
            r.msg_rate_avg_p2 = self.xchg_f64(STEP, mine.msg_rate_avg_p2)?;
        }
        Ok(r)
    }

    fn xchg_u64(&mut self, step: &'static str, v: u64) -> Result<u64, ExchangeError> {
        let mut t = [0u8; 8];
        self.xchg(step, &v.to_be_bytes(), &mut t)?;
        Ok(u64::from_be_bytes(t))
    }

    fn xchg_f64(&mut self, step: &'static str, v: f64) -> Result<f64, ExchangeError> {
        Ok(f64::from_bits(self.xchg_u64(step, v.to_bits())?))
    }

    /// A `ctx_hand_shake` of QP 0 used as a barrier (end of a test, or the
    /// per-size sync of duplex runs): the read may wait as long as
    /// `end_of_test_timeout` allows, since the peer may still be measuring.
    pub fn sync(&mut self, mine: &PerftestDest) -> Result<PerftestDest, ExchangeError> {
        let wait = Some(self.cfg.end_of_test_timeout);
        self.hand_shake_within("perftest: wait for the peer's end of test", mine, wait)
    }

    /// The end of a `--run_infinitely` run for the side that only serves:
    /// the peer has no end-of-test step and closes when it is stopped.
    pub fn wait_closed(&mut self) -> Result<(), ExchangeError> {
        self.wire
            .wait_closed_within("perftest: wait for the peer to stop (run_infinitely)", None)
            .map(drop)
    }

    /// The end of an `ib_write_lat` duration run, which has no closing
    /// hand-shake: when its time is up perftest leaves its wait for our
    /// WRITE, posts one more WRITE and waits for that to complete (rxe
    /// resends it without end: retry count 7 is unlimited there), then
    /// closes. So the QP must outlive the peer's run: we half-close and wait
    /// up to `limit` for the peer to close (another ferroce does the same).
    pub fn linger(&mut self, limit: Duration) -> Result<bool, ExchangeError> {
        const STEP: &str = "perftest: wait for the peer's end of test";
        match &mut self.wire {
            Link::Tcp(w) => w.linger(STEP, limit),
            // No half-close over a channel: the QPs stay up for the limit.
            link => link.wait_closed_within(STEP, Some(limit)),
        }
    }

    /// `ctx_close_connection`: a barrier hand-shake, then `"done\0"`, then
    /// close. Like perftest we do not require the peer's `"done"`, but we
    /// read it briefly so closing does not reset the connection.
    pub fn close_connection(mut self, mine: &PerftestDest) -> Result<(), ExchangeError> {
        let wait = Some(self.cfg.end_of_test_timeout);
        self.hand_shake_within("perftest: closing hand-shake", mine, wait)?;
        // Over the rdma_cm channel the hand-shake is all (perftest's
        // `ctx_close_connection` sends "done" on its TCP path only).
        if let Link::Tcp(w) = &mut self.wire {
            w.send("perftest: send \"done\"", DONE_MSG)?;
            w.drain_briefly();
        }
        Ok(())
    }
}

/// A connected perftest session after step 6: QPs are connected on both
/// sides and the test may start.
#[derive(Debug)]
pub struct PerftestSession<'c> {
    pub conn: PerftestConn<'c>,
    pub negotiated: Negotiated,
    pub my_dests: Vec<PerftestDest>,
    pub remote_dests: Vec<PerftestDest>,
    report_per_port: bool,
}

impl PerftestSession<'_> {
    /// End of a half-duplex BW test (steps 7–8): barrier, report exchange,
    /// closing hand-shake and `"done"`. The server calls it right after set-up
    /// (it waits for the client's run); the client after its run. Returns the
    /// peer's report (the server learns the client's results this way).
    pub fn finish_bw(mut self, mine: &BwReport) -> Result<BwReport, ExchangeError> {
        let d0 = self.my_dests[0];
        self.conn.sync(&d0)?;
        let theirs = self.conn.xchg_bw_report(mine, self.report_per_port)?;
        self.conn.close_connection(&d0)?;
        Ok(theirs)
    }

    /// `xchg_bw_reports` within the session: after each size of a
    /// bidirectional run, where both sides print the sum.
    pub fn xchg_bw_report(&mut self, mine: &BwReport) -> Result<BwReport, ExchangeError> {
        self.conn.xchg_bw_report(mine, self.report_per_port)
    }

    /// End of a latency test (or any test without a report): step 8 only.
    pub fn finish(self) -> Result<(), ExchangeError> {
        let d0 = self.my_dests[0];
        self.conn.close_connection(&d0)
    }
}

fn run<'c, P, K, C, E1, E2>(
    mut conn: PerftestConn<'c>,
    params: &PerftestParams,
    prepare: P,
    cm_connect: Option<K>,
    connect: C,
) -> Result<PerftestSession<'c>, ExchangeError>
where
    P: FnOnce(&Negotiated) -> Result<Vec<PerftestDest>, E1>,
    K: FnOnce(&Negotiated) -> Result<(), E2>,
    C: FnOnce(&Negotiated, &[PerftestDest]) -> Result<(), E2>,
    E1: fmt::Display,
    E2: fmt::Display,
{
    let negotiated = conn.negotiate(params)?;
    let my_dests = prepare(&negotiated).map_err(|e| ExchangeError::Callback {
        step: "perftest: create QPs after negotiation",
        message: e.to_string(),
    })?;
    if my_dests.is_empty() {
        return Err(ExchangeError::Invalid("no QP destination to send".into()));
    }
    for d in &my_dests {
        // Fail before sending anything half-way.
        match params.key_format {
            KeyFormat::Gid => drop(d.to_wire_gid()?),
            KeyFormat::Lid => drop(d.to_wire_lid()?),
            KeyFormat::Binary { gid_index } => drop(d.to_wire_binary(gid_index)?),
        }
    }
    if let Some(cm_connect) = cm_connect {
        // perftest -R: an all-zero key message each way, the test QPs'
        // rdma_cm connections, another all-zero message (seen on the wire
        // between two perftest 4.5 peers).
        let zero = PerftestDest::default();
        conn.hand_shake(&zero)?;
        cm_connect(&negotiated).map_err(|e| ExchangeError::Callback {
            step: "perftest: connect QPs with rdma_cm",
            message: e.to_string(),
        })?;
        conn.hand_shake(&zero)?;
    }
    for _ in 0..params.extra_rounds_before {
        conn.hand_shake(&my_dests[0])?;
    }
    let mut remote_dests = conn.exchange_dests(&my_dests)?;
    if params.key_format == KeyFormat::Gid
        && gid_is_v4mapped(&my_dests[0].gid) != gid_is_v4mapped(&remote_dests[0].gid)
    {
        return Err(ExchangeError::GidTypeMismatch {
            peer: conn.peer().to_string(),
            step: "perftest: check GID compatibility",
        });
    }
    connect(&negotiated, &remote_dests).map_err(|e| ExchangeError::Callback {
        step: "perftest: connect QPs (RTR/RTS)",
        message: e.to_string(),
    })?;
    if params.layout == HandshakeLayout::TwoPass {
        remote_dests = conn.exchange_dests(&my_dests)?;
    }
    // The extra hand-shake after RTR: neither side starts sending before
    // the other's QPs are ready.
    conn.hand_shake(&my_dests[0])?;
    for _ in 0..params.extra_rounds_after {
        conn.hand_shake(&my_dests[0])?;
    }
    Ok(PerftestSession {
        conn,
        negotiated,
        my_dests,
        remote_dests,
        report_per_port: params.report_per_port,
    })
}

/// perftest server (no server name given): accept, negotiate, run
/// `prepare` to create QPs and return their destinations, exchange them,
/// run `connect` (move QPs to RTR/RTS with the peer's destinations), sync.
pub fn server<P, C, E1, E2>(
    listener: &TcpListener,
    params: &PerftestParams,
    cfg: &ExchangeConfig,
    prepare: P,
    connect: C,
) -> Result<PerftestSession<'static>, ExchangeError>
where
    P: FnOnce(&Negotiated) -> Result<Vec<PerftestDest>, E1>,
    C: FnOnce(&Negotiated, &[PerftestDest]) -> Result<(), E2>,
    E1: fmt::Display,
    E2: fmt::Display,
{
    let conn = PerftestConn::accept(listener, params.key_format, cfg)?;
    run(
        conn,
        params,
        prepare,
        None::<fn(&Negotiated) -> Result<(), E2>>,
        connect,
    )
}

/// perftest client (server name given): same steps, writing first.
pub fn client<A, P, C, E1, E2>(
    addr: A,
    params: &PerftestParams,
    cfg: &ExchangeConfig,
    prepare: P,
    connect: C,
) -> Result<PerftestSession<'static>, ExchangeError>
where
    A: ToSocketAddrs + fmt::Debug,
    P: FnOnce(&Negotiated) -> Result<Vec<PerftestDest>, E1>,
    C: FnOnce(&Negotiated, &[PerftestDest]) -> Result<(), E2>,
    E1: fmt::Display,
    E2: fmt::Display,
{
    let conn = PerftestConn::connect(addr, params.key_format, cfg)?;
    run(
        conn,
        params,
        prepare,
        None::<fn(&Negotiated) -> Result<(), E2>>,
        connect,
    )
}

/// perftest `-R`, either role: over `conn` (an rdma_cm channel,
/// [`PerftestConn::over_channel`]) the same steps as [`server`] and
/// [`client`], with `cm_connect` connecting the test QPs through rdma_cm
/// between two all-zero key messages after `prepare`; `connect` still runs
/// where `ctx_connect` would (QPs are connected by then: post receives there).
pub fn rdma_cm_session<'c, P, K, C, E1, E2>(
    conn: PerftestConn<'c>,
    params: &PerftestParams,
    prepare: P,
    cm_connect: K,
    connect: C,
) -> Result<PerftestSession<'c>, ExchangeError>
where
    P: FnOnce(&Negotiated) -> Result<Vec<PerftestDest>, E1>,
    K: FnOnce(&Negotiated) -> Result<(), E2>,
    C: FnOnce(&Negotiated, &[PerftestDest]) -> Result<(), E2>,
    E1: fmt::Display,
    E2: fmt::Display,
{
    run(conn, params, prepare, Some(cm_connect), connect)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::thread;

    fn cfg() -> ExchangeConfig {
        ExchangeConfig {
            io_timeout: Duration::from_secs(5),
            accept_timeout: Some(Duration::from_secs(5)),
            end_of_test_timeout: Some(Duration::from_secs(5)),
        }
    }

    fn dest(qpn: u32, last: u8) -> PerftestDest {
        PerftestDest {
            lid: 0,
            out_reads: 16,
            qpn,
            psn: 0x10000 + qpn,
            rkey: 0x1000 + qpn,
            vaddr: 0x7f00_0000_0000 + u64::from(qpn) * 0x1000,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, last],
            srqn: 0,
        }
    }

    #[test]
    fn version_numbers_like_atof() {
        assert_eq!(version_number("6.19"), Some(6.19));
        assert_eq!(version_number("5.70abc"), Some(5.70));
        assert_eq!(version_number("6"), Some(6.0));
        assert_eq!(version_number("6.1.2"), Some(6.1));
        assert_eq!(version_number("x6"), None);
        assert_eq!(version_number(""), None);
    }

    #[test]
    fn v4mapped_rule() {
        assert!(gid_is_v4mapped(&dest(1, 1).gid));
        let mut mc = dest(1, 1).gid;
        mc[0] = 0xff;
        mc[1] = 0x0e;
        assert!(gid_is_v4mapped(&mc));
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        assert!(!gid_is_v4mapped(&ll));
        assert!(!gid_is_v4mapped(&[0; 16]));
    }

    /// Full ferroce server <-> ferroce client run with 3 QPs, through the
    /// BW finish; checks what each side learns.
    #[test]
    fn loopback_full_bw_run() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server_dests: Vec<_> = (0..3).map(|i| dest(0x20 + i, 1)).collect();
        let client_dests: Vec<_> = (0..3).map(|i| dest(0x40 + i, 2)).collect();
        let sd = server_dests.clone();
        let server = thread::spawn(move || {
            let params = PerftestParams {
                mtu: 5,
                cycle_buffer: 8192,
                ..Default::default()
            };
            let s = super::server(
                &listener,
                &params,
                &cfg(),
                |n| {
                    assert_eq!(n.mtu, 3);
                    assert_eq!(n.cycle_buffer, 8192);
                    Ok::<_, String>(sd)
                },
                |_, remote| {
                    assert_eq!(remote.len(), 3);
                    Ok::<(), String>(())
                },
            )
            .unwrap();
            let remote = s.remote_dests.clone();
            let neg = s.negotiated.clone();
            let report = s.finish_bw(&BwReport::default()).unwrap();
            (remote, neg, report)
        });
        let mine = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1234.5,
            bw_avg: 1200.25,
            msg_rate_avg: 0.019,
            ..Default::default()
        };
        let cd = client_dests.clone();
        let s = client(
            addr,
            &PerftestParams::default(),
            &cfg(),
            |n| {
                assert_eq!(n.remote_version, DEFAULT_VERSION);
                assert_eq!(n.remote_mtu, Some(5));
                Ok::<_, String>(cd)
            },
            |_, _| Ok::<(), String>(()),
        )
        .unwrap();
        assert_eq!(s.remote_dests, server_dests);
        assert_eq!(s.negotiated.mtu, 3);
        let back = s.finish_bw(&mine).unwrap();
        assert_eq!(back, BwReport::default());
        let (remote, neg, report) = server.join().unwrap();
        assert_eq!(remote, client_dests);
        assert_eq!(neg.cache_line_size, 64);
        assert_eq!(report, mine);
    }

    /// One end of an in-memory message channel; every message sent is also
    /// logged (its length) for the test to check the sequence.
    #[derive(Debug)]
    struct MemChannel {
        tx: std::sync::mpsc::Sender<Vec<u8>>,
        rx: std::sync::mpsc::Receiver<Vec<u8>>,
        sent: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl MessageChannel for MemChannel {
        fn peer(&self) -> String {
            "memory".into()
        }
        fn send(&mut self, msg: &[u8]) -> io::Result<()> {
            self.sent.lock().unwrap().push(msg.len());
            self.tx.send(msg.to_vec()).map_err(io::Error::other)
        }
        fn recv(&mut self, buf: &mut [u8], limit: Option<Duration>) -> io::Result<Option<usize>> {
            let got = match limit {
                Some(l) => match self.rx.recv_timeout(l) {
                    Ok(m) => m,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => return Ok(None),
                    Err(e) => return Err(io::Error::other(e)),
                },
                None => self.rx.recv().map_err(io::Error::other)?,
            };
            let n = got.len().min(buf.len());
            buf[..n].copy_from_slice(&got[..n]);
            Ok(Some(got.len()))
        }
    }

    fn mem_pair() -> (
        MemChannel,
        MemChannel,
        std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    ) {
        let (a_tx, b_rx) = std::sync::mpsc::channel();
        let (b_tx, a_rx) = std::sync::mpsc::channel();
        let client_log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let a = MemChannel {
            tx: a_tx,
            rx: a_rx,
            sent: client_log.clone(),
        };
        let b = MemChannel {
            tx: b_tx,
            rx: b_rx,
            sent: std::sync::Arc::new(std::sync::Mutex::new(Vec::new())),
        };
        (a, b, client_log)
    }

    /// `-R`, ib_write_bw shape with 2 QPs: the messages perftest 4.5 sends
    /// (seen between two perftest peers on rxe), the rdma_cm step between the
    /// all-zero key messages, binary keys, and a close without "done".
    #[test]
    fn rdma_cm_session_message_sequence() {
        let (client_end, server_end, client_log) = mem_pair();
        let server_dests: Vec<_> = (0..2).map(|i| dest(0x20 + i, 1)).collect();
        let client_dests: Vec<_> = (0..2).map(|i| dest(0x40 + i, 2)).collect();
        let sd = server_dests.clone();
        let server = thread::spawn(move || {
            let conn = PerftestConn::over_channel(Box::new(server_end), Role::Server, 1, &cfg());
            let s = rdma_cm_session(
                conn,
                &PerftestParams::default(),
                |_| Ok::<_, String>(sd),
                |_| Ok::<(), String>(()),
                |_, _| Ok::<(), String>(()),
            )
            .unwrap();
            let remote = s.remote_dests.clone();
            s.finish_bw(&BwReport::default()).unwrap();
            remote
        });
        let cd = client_dests.clone();
        let log = client_log.clone();
        let cm_at = std::cell::Cell::new(None);
        let conn = PerftestConn::over_channel(Box::new(client_end), Role::Client, 1, &cfg());
        let s = rdma_cm_session(
            conn,
            &PerftestParams::default(),
            |_| Ok::<_, String>(cd),
            |_| {
                cm_at.set(Some(log.lock().unwrap().clone()));
                Ok::<(), String>(())
            },
            |_, _| Ok::<(), String>(()),
        )
        .unwrap();
        assert_eq!(s.remote_dests, server_dests);
        s.finish_bw(&BwReport::default()).unwrap();
        assert_eq!(server.join().unwrap(), client_dests);
        // Version, cycle buffer, cache line, MTU, then one all-zero key message.
        assert_eq!(cm_at.take(), Some(vec![16, 4, 4, 2, 56]));
        let sent = client_log.lock().unwrap().clone();
        // After the rdma_cm step: zero key, 2 + 2 keys, the post-RTR key; at the end the
        // barrier key, five report fields, the closing key, and no "done".
        let mut want = vec![16, 4, 4, 2, 56, 56, 56, 56, 56, 56, 56, 56];
        want.extend([8, 8, 8, 8, 8, 56]);
        assert_eq!(sent, want);
    }

    #[test]
    fn rdma_cm_channel_refuses_a_message_of_the_wrong_size() {
        let (client_end, mut server_end, _) = mem_pair();
        let mut conn = PerftestConn::over_channel(Box::new(client_end), Role::Client, 1, &cfg());
        let peer = thread::spawn(move || {
            let mut buf = [0u8; 16];
            server_end.recv(&mut buf, None).unwrap();
            server_end.send(b"6.06\0\0\0").unwrap();
            server_end
        });
        let e = conn.exchange_versions("6.19").unwrap_err();
        assert!(matches!(e, ExchangeError::Malformed { .. }), "{e}");
        drop(peer.join());
    }

    fn expect(s: &mut TcpStream, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got, want, "{}", String::from_utf8_lossy(want));
    }

    /// Our client against a byte-level script of what a perftest 4.5 server
    /// sends and expects (ib_write_bw, 1 QP, RoCE): checks every byte we
    /// write, in order.
    #[test]
    fn client_against_scripted_perftest_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let srv = dest(0x11, 1);
        let cli = dest(0x12, 2);
        let script = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Version: "6.19" NUL-padded to 16.
            let mut v = [0u8; 16];
            v[..4].copy_from_slice(b"6.19");
            expect(&mut s, &v);
            let mut peer_v = [0u8; 16];
            peer_v[..4].copy_from_slice(b"6.09");
            s.write_all(&peer_v).unwrap();
            // cycle_buffer 4096 and cache line 64, network order.
            expect(&mut s, &4096u32.to_be_bytes());
            s.write_all(&4096u32.to_be_bytes()).unwrap();
            expect(&mut s, &64u32.to_be_bytes());
            s.write_all(&128u32.to_be_bytes()).unwrap();
            // MTU enum 3 ("3\0") against the server's 5.
            expect(&mut s, b"3\0");
            s.write_all(b"5\0").unwrap();
            let key_c = cli.to_wire_gid().unwrap();
            let key_s = srv.to_wire_gid().unwrap();
            // Pass 1, pass 2, extra hand-shake, end barrier.
            for _ in 0..4 {
                expect(&mut s, &key_c);
                s.write_all(&key_s).unwrap();
            }
            // BW report: size, iters, peak, avg, rate.
            for v in [
                65536u64,
                5000,
                1.5f64.to_bits(),
                2.5f64.to_bits(),
                0.5f64.to_bits(),
            ] {
                expect(&mut s, &v.to_be_bytes());
                s.write_all(&0u64.to_be_bytes()).unwrap();
            }
            // Close: hand-shake, then "done" both ways.
            expect(&mut s, &key_c);
            s.write_all(&key_s).unwrap();
            s.write_all(b"done\0").unwrap();
            expect(&mut s, b"done\0");
        });
        let sess = client(
            addr,
            &PerftestParams::default(),
            &cfg(),
            |n| {
                assert_eq!(n.remote_version, "6.09");
                assert_eq!(n.cache_line_size, 128);
                assert_eq!(n.mtu, 3);
                Ok::<_, String>(vec![cli])
            },
            |_, r| {
                assert_eq!(r[0], srv);
                Ok::<(), String>(())
            },
        )
        .unwrap();
        let r = BwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 2.5,
            msg_rate_avg: 0.5,
            ..Default::default()
        };
        assert_eq!(sess.finish_bw(&r).unwrap(), BwReport::default());
        script.join().unwrap();
    }

    #[test]
    fn old_peer_versions_change_the_formats() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let script = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut v = [0u8; 16];
            s.read_exact(&mut v).unwrap();
            let mut old = [0u8; 16];
            old[..4].copy_from_slice(b"5.20");
            s.write_all(&old).unwrap();
            // < 5.31: MTU in 4 bytes; < 5.32: no sys data.
            let mut m = [0u8; 4];
            s.read_exact(&mut m).unwrap();
            assert_eq!(&m, b"3\0\0\0");
            s.write_all(b"2\0\0\0").unwrap();
        });
        let mut c = PerftestConn::connect(addr, KeyFormat::Gid, &cfg()).unwrap();
        let n = c.negotiate(&PerftestParams::default()).unwrap();
        assert_eq!(n.mtu, 2);
        assert_eq!(n.cycle_buffer, 4096);
        script.join().unwrap();
    }

    #[test]
    fn gid_type_mismatch_is_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            let mut d = dest(1, 1);
            d.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
            super::server(
                &listener,
                &PerftestParams::default(),
                &cfg(),
                |_| Ok::<_, String>(vec![d]),
                |_, _| Ok::<(), String>(()),
            )
            .map(|_| ())
        });
        let err = client(
            addr,
            &PerftestParams::default(),
            &cfg(),
            |_| Ok::<_, String>(vec![dest(2, 2)]),
            |_, _| Ok::<(), String>(()),
        )
        .unwrap_err();
        assert!(
            matches!(err, ExchangeError::GidTypeMismatch { .. }),
            "{err}"
        );
        let e = server.join().unwrap().unwrap_err();
        assert!(matches!(e, ExchangeError::GidTypeMismatch { .. }), "{e}");
    }

    #[test]
    fn garbage_version_is_rejected_with_text() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let script = thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut v = [0u8; 16];
            s.read_exact(&mut v).unwrap();
            s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
            thread::sleep(Duration::from_millis(100));
        });
        let mut c = PerftestConn::connect(addr, KeyFormat::Gid, &cfg()).unwrap();
        let err = c.exchange_versions(DEFAULT_VERSION).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("exchange versions"), "{msg}");
        assert!(msg.contains("GET / HTTP/1.1\\x0d\\x0a"), "{msg}");
        script.join().unwrap();
    }

    #[test]
    fn server_times_out_waiting_for_keys() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let c = ExchangeConfig {
            io_timeout: Duration::from_millis(300),
            ..cfg()
        };
        let server = thread::spawn(move || {
            super::server(
                &listener,
                &PerftestParams::default(),
                &c,
                |_| Ok::<_, String>(vec![dest(1, 1)]),
                |_, _| Ok::<(), String>(()),
            )
            .map(|_| ())
        });
        // A client that sends a version and then goes silent.
        let mut s = TcpStream::connect(addr).unwrap();
        let mut v = [0u8; 16];
        v[..4].copy_from_slice(b"6.19");
        s.write_all(&v).unwrap();
        let err = server.join().unwrap().unwrap_err();
        match &err {
            ExchangeError::Timeout { step, .. } => assert!(step.contains("cycle buffer"), "{err}"),
            other => panic!("unexpected {other}"),
        }
        drop(s);
    }

    #[test]
    fn latency_style_finish_and_lid_format() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let params = PerftestParams {
            key_format: KeyFormat::Lid,
            layout: HandshakeLayout::OnePass,
            ..Default::default()
        };
        let p2 = params.clone();
        let server = thread::spawn(move || {
            let mut d = dest(7, 0);
            d.gid = [0; 16];
            d.lid = 0x1907;
            let s = super::server(
                &listener,
                &p2,
                &cfg(),
                |_| Ok::<_, String>(vec![d]),
                |_, _| Ok::<(), String>(()),
            )
            .unwrap();
            let r = s.remote_dests[0];
            s.finish().unwrap();
            r
        });
        let mut d = dest(9, 0);
        d.gid = [0; 16];
        d.lid = 0x1922;
        let s = client(
            addr,
            &params,
            &cfg(),
            |_| Ok::<_, String>(vec![d]),
            |_, _| Ok::<(), String>(()),
        )
        .unwrap();
        assert_eq!(s.remote_dests[0].lid, 0x1907);
        s.finish().unwrap();
        assert_eq!(server.join().unwrap().lid, 0x1922);
    }
}
