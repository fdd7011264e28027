//! Out-of-band connection set-up over TCP, byte-compatible with the stock
//! tools, so a ferroce peer can meet an `ibv_*_pingpong` or perftest peer.
//!
//! * [`pingpong`]: rdma-core `libibverbs/examples/{rc,uc,ud,srq}_pingpong.c`
//!   (`pp_client_exch_dest` / `pp_server_exch_dest`): one 52-byte ASCII
//!   message per QP each way, then the client's `"done\0"`.
//! * [`perftest`]: perftest 4.5 (Debian 12) `src/perftest_communication.c`:
//!   version string, system data, MTU, per-QP 108-byte key messages, the
//!   bandwidth-report exchange and the closing hand-shake plus `"done\0"`.
//!
//! Both tools frame messages only by their fixed length and read each with a
//! single `read()`; so every message here is sent with one write, and every
//! read waits for the full length (a deadline bounds the wait).

pub mod perftest;
pub mod pingpong;
pub mod rdma_cm;

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

/// TCP port both tool families use unless told otherwise (`-p`).
pub const DEFAULT_PORT: u16 = 18515;

/// The closing token: `write(fd, "done", sizeof "done")`, so NUL included.
pub const DONE_MSG: &[u8; 5] = b"done\0";

/// Time limits of an exchange.
#[derive(Debug, Clone)]
pub struct ExchangeConfig {
    /// Bound on each connect attempt series and on each message read/write.
    pub io_timeout: Duration,
    /// How long a server waits for a client to connect; `None` waits forever,
    /// as the stock servers do ("Waiting for client to connect...").
    pub accept_timeout: Option<Duration>,
    /// How long a perftest server waits for the client to end its run (the
    /// client may measure for minutes); `None` waits forever.
    pub end_of_test_timeout: Option<Duration>,
}

impl Default for ExchangeConfig {
    fn default() -> Self {
        Self {
            io_timeout: Duration::from_secs(5),
            accept_timeout: None,
            end_of_test_timeout: None,
        }
    }
}

/// Why a message from the peer was rejected; carries what was received.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}; received {text}")]
pub struct ParseError {
    /// What was wrong.
    pub reason: String,
    /// The received bytes, printable (escaped where not ASCII).
    pub text: String,
}

impl ParseError {
    pub(crate) fn new(reason: impl Into<String>, raw: &[u8]) -> Self {
        Self {
            reason: reason.into(),
            text: show_bytes(raw),
        }
    }
}

/// Everything that can go wrong in an exchange. Every variant that involves
/// the peer names it and the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// No address could be connected to.
    #[error("{step}: cannot connect to {peer}: {source}")]
    Connect {
        peer: String,
        step: &'static str,
        source: io::Error,
    },
    /// No client connected in time.
    #[error("{step}: no client connected to {local} within {timeout:?}")]
    AcceptTimeout {
        local: String,
        step: &'static str,
        timeout: Duration,
    },
    /// The peer was silent past the deadline.
    #[error("{step}: {peer} did not answer within {timeout:?} (got {got} of {want} bytes)")]
    Timeout {
        peer: String,
        step: &'static str,
        timeout: Duration,
        got: usize,
        want: usize,
    },
    /// The peer closed the connection early.
    #[error("{step}: {peer} closed the connection after {got} of {want} bytes")]
    Closed {
        peer: String,
        step: &'static str,
        got: usize,
        want: usize,
    },
    /// Any other socket error.
    #[error("{step}: socket error with {peer}: {source}")]
    Io {
        peer: String,
        step: &'static str,
        source: io::Error,
    },
    /// The peer sent bytes that are not the expected message.
    #[error("{step}: malformed message from {peer}: {source}")]
    Malformed {
        peer: String,
        step: &'static str,
        source: ParseError,
    },
    /// A local value does not fit the fixed-width wire field.
    #[error("{field} = {value:#x} does not fit its wire field (max {max:#x})")]
    FieldRange {
        field: &'static str,
        value: u64,
        max: u64,
    },
    /// A local argument is unusable (e.g. an empty QP list).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// perftest's `ctx_check_gid_compatibility`: one side IPv4-mapped, the
    /// other not.
    #[error("{step}: GID type differs from {peer}'s (one IPv4-mapped, one not); use the same IP version on both sides")]
    GidTypeMismatch { peer: String, step: &'static str },
    /// The caller's callback (QP to RTR/RTS, resource set-up) failed.
    #[error("{step}: local callback failed: {message}")]
    Callback { step: &'static str, message: String },
}

/// Printable rendering of received bytes: ASCII as is, the rest escaped,
/// trailing NUL padding summarised.
pub(crate) fn show_bytes(raw: &[u8]) -> String {
    let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let mut s = String::from("\"");
    for &b in &raw[..end] {
        match b {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(b as char),
            _ => s.push_str(&format!("\\x{b:02x}")),
        }
    }
    s.push('"');
    if end < raw.len() {
        s.push_str(&format!(" + {} NUL", raw.len() - end));
    }
    s.push_str(&format!(" ({} bytes)", raw.len()));
    s
}

/// The text part of a C string message: bytes before the first NUL.
pub(crate) fn c_text(raw: &[u8]) -> Result<&str, ParseError> {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    std::str::from_utf8(&raw[..end])
        .ok()
        .filter(|s| s.is_ascii())
        .ok_or_else(|| ParseError::new("not ASCII text", raw))
}

/// One hexadecimal field, as `strtol(.., 16)` / `%x` would take it but
/// strict: non-empty, hex digits only, value at most `max`.
pub(crate) fn hex_field(field: &str, name: &str, max: u64, raw: &[u8]) -> Result<u64, ParseError> {
    if field.is_empty() || field.len() > 16 || !field.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseError::new(
            format!("{name} field {field:?} is not a hexadecimal number"),
            raw,
        ));
    }
    let v = u64::from_str_radix(field, 16)
        .map_err(|_| ParseError::new(format!("{name} field {field:?} is not hexadecimal"), raw))?;
    if v > max {
        return Err(ParseError::new(
            format!("{name} {v:#x} is larger than {max:#x}"),
            raw,
        ));
    }
    Ok(v)
}

pub(crate) fn check_range(field: &'static str, value: u64, max: u64) -> Result<(), ExchangeError> {
    if value > max {
        Err(ExchangeError::FieldRange { field, value, max })
    } else {
        Ok(())
    }
}

/// Largest 24-bit value: QPNs and PSNs.
pub(crate) const MAX_24: u64 = 0xff_ffff;

/// Destination of one QP in the `ibv_*_pingpong` examples (`struct
/// pingpong_dest` in rc_pingpong.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingpongDest {
    pub lid: u16,
    /// 24 bits on the wire (`%06x`).
    pub qpn: u32,
    /// 24 bits on the wire (`%06x`).
    pub psn: u32,
    /// Raw GID bytes; all zero when the tool runs without `-g`.
    pub gid: [u8; 16],
}

impl PingpongDest {
    /// `sizeof "0000:000000:000000:" + 32 GID digits` incl. NUL
    /// (rc_pingpong.c `pp_*_exch_dest`).
    pub const WIRE_LEN: usize = 52;

    /// The message `"%04x:%06x:%06x:%s"` + NUL, where the GID string is
    /// `gid_to_wire_gid` (pingpong.c): four `%08x` of `htonl` of each 32-bit
    /// word, i.e. the 16 raw bytes in order as 32 lowercase hex digits.
    pub fn to_wire(&self) -> Result<[u8; Self::WIRE_LEN], ExchangeError> {
        check_range("qpn", self.qpn.into(), MAX_24)?;
        check_range("psn", self.psn.into(), MAX_24)?;
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn,
            self.psn,
            hex_gid(&self.gid)
        );
        let mut out = [0u8; Self::WIRE_LEN];
        // 4+1+6+1+6+1+32 = 51 characters, the 52nd byte stays NUL.
        out[..text.len()].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// Parses one message. The text ends at the first NUL (or at the end of
    /// the slice); it must be `LID:QPN:PSN:GID` in hex, GID 32 digits (what
    /// `wire_gid_to_gid` reads).
    pub fn parse(raw: &[u8]) -> Result<Self, ParseError> {
        let text = c_text(raw)?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 4 {
            return Err(ParseError::new(
                format!(
                    "expected 4 ':'-separated fields LID:QPN:PSN:GID, found {}",
                    fields.len()
                ),
                raw,
            ));
        }
        let lid = hex_field(fields[0], "LID", 0xffff, raw)? as u16;
        let qpn = hex_field(fields[1], "QPN", MAX_24, raw)? as u32;
        let psn = hex_field(fields[2], "PSN", MAX_24, raw)? as u32;
        let gid = parse_hex_gid(fields[3], raw)?;
        Ok(Self { lid, qpn, psn, gid })
    }
}

fn hex_gid(gid: &[u8; 16]) -> String {
    gid.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex_gid(s: &str, raw: &[u8]) -> Result<[u8; 16], ParseError> {
    if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ParseError::new(
            format!("GID field {s:?} is not 32 hexadecimal digits"),
            raw,
        ));
    }
    let mut gid = [0u8; 16];
    for (i, byte) in gid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| ParseError::new("GID is not hexadecimal", raw))?;
    }
    Ok(gid)
}

/// Destination of one QP in perftest (`struct pingpong_dest` in
/// perftest_resources.h, the fields that travel in the key message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PerftestDest {
    pub lid: u16,
    /// Outstanding RDMA reads/atomics the sender allows (`%04x`).
    pub out_reads: u16,
    /// 24 bits on the wire.
    pub qpn: u32,
    /// 24 bits on the wire.
    pub psn: u32,
    pub rkey: u32,
    pub vaddr: u64,
    pub gid: [u8; 16],
    /// SRQ number (XRC/DC); 0 otherwise.
    pub srqn: u32,
}

impl PerftestDest {
    /// `KEY_MSG_SIZE_GID` (perftest_communication.h): 107 characters + NUL.
    pub const WIRE_LEN_GID: usize = 108;
    /// `KEY_MSG_SIZE` (perftest_communication.h): 58 characters + NUL.
    pub const WIRE_LEN_LID: usize = 59;
    /// `sizeof(struct pingpong_dest)` on x86-64 and arm64: the `-R` key message.
    pub const WIRE_LEN_BINARY: usize = 56;

    fn check(&self) -> Result<(), ExchangeError> {
        check_range("qpn", self.qpn.into(), MAX_24)?;
        check_range("psn", self.psn.into(), MAX_24)
    }

    /// `KEY_PRINT_FMT_GID`, written by `ethernet_write_keys` whenever a GID
    /// index is in use (always over RoCE):
    /// `"%04x:%04x:%06x:%06x:%08x:%016llx:"` LID, out_reads, QPN, PSN, RKey,
    /// VAddr, then sixteen `"%02x:"` GID bytes, then `"%08x:"` SRQN, NUL.
    pub fn to_wire_gid(&self) -> Result<[u8; Self::WIRE_LEN_GID], ExchangeError> {
        self.check()?;
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            text.push_str(&format!("{b:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; Self::WIRE_LEN_GID];
        out[..text.len()].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// `KEY_PRINT_FMT`, used by perftest only without a GID index (IB link
    /// layer): `"%04x:%04x:%06x:%06x:%08x:%016llx:%08x"` + NUL.
    pub fn to_wire_lid(&self) -> Result<[u8; Self::WIRE_LEN_LID], ExchangeError> {
        self.check()?;
        let text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:{:08x}",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr, self.srqn
        );
        let mut out = [0u8; Self::WIRE_LEN_LID];
        out[..text.len()].copy_from_slice(text.as_bytes());
        Ok(out)
    }

    /// perftest's key message over its rdma_cm channel (`-R`,
    /// `rdma_write_keys`): `struct pingpong_dest` itself, 56 bytes: LID,
    /// out_reads, QPN, PSN, RKey as big-endian 32-bit ints, 4 bytes of
    /// padding, VAddr big-endian 64-bit, the 16 GID bytes, SRQN and the GID
    /// index big-endian 32-bit (seen between two perftest 4.5 peers on rxe).
    pub fn to_wire_binary(
        &self,
        gid_index: u32,
    ) -> Result<[u8; Self::WIRE_LEN_BINARY], ExchangeError> {
        self.check()?;
        let mut out = [0u8; Self::WIRE_LEN_BINARY];
        out[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        out[4..8].copy_from_slice(&u32::from(self.out_reads).to_be_bytes());
        out[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        out[12..16].copy_from_slice(&self.psn.to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        out[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        out[32..48].copy_from_slice(&self.gid);
        out[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        out[52..56].copy_from_slice(&gid_index.to_be_bytes());
        Ok(out)
    }

    /// Parses [`Self::to_wire_binary`]'s message (the padding and the GID
    /// index are not read, as perftest's `rdma_read_keys` does not).
    pub fn parse_binary(raw: &[u8]) -> Result<Self, ParseError> {
        let bytes: &[u8; Self::WIRE_LEN_BINARY] = raw
            .try_into()
            .map_err(|_| ParseError::new(format!("{} bytes, not 56", raw.len()), raw))?;
        let word = |at: usize| {
            u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let narrow = |at: usize, name: &str| {
            u16::try_from(word(at))
                .map_err(|_| ParseError::new(format!("{name} {} is out of range", word(at)), raw))
        };
        let mut vaddr = [0u8; 8];
        vaddr.copy_from_slice(&bytes[24..32]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[32..48]);
        let (qpn, psn) = (word(8), word(12));
        if u64::from(qpn) > MAX_24 || u64::from(psn) > MAX_24 {
            return Err(ParseError::new("QPN or PSN wider than 24 bits", raw));
        }
        Ok(Self {
            lid: narrow(0, "LID")?,
            out_reads: narrow(4, "out_reads")?,
            qpn,
            psn,
            rkey: word(16),
            vaddr: u64::from_be_bytes(vaddr),
            gid,
            srqn: word(48),
        })
    }

    /// Parses a `KEY_PRINT_FMT_GID` message (the trailing ':' is optional).
    pub fn parse_gid(raw: &[u8]) -> Result<Self, ParseError> {
        let text = c_text(raw)?;
        let mut fields: Vec<&str> = text.split(':').collect();
        if fields.last() == Some(&"") {
            fields.pop();
        }
        if fields.len() != 23 {
            return Err(ParseError::new(
                format!(
                    "expected 23 fields LID:OUT_READS:QPN:PSN:RKEY:VADDR:16 GID bytes:SRQN, found {}",
                    fields.len()
                ),
                raw,
            ));
        }
        let mut d = Self::parse_common(&fields, raw)?;
        for (i, byte) in d.gid.iter_mut().enumerate() {
            *byte = hex_field(fields[6 + i], "GID byte", 0xff, raw)? as u8;
        }
        d.srqn = hex_field(fields[22], "SRQN", u32::MAX.into(), raw)? as u32;
        Ok(d)
    }

    /// Parses a `KEY_PRINT_FMT` message (no GID).
    pub fn parse_lid(raw: &[u8]) -> Result<Self, ParseError> {
        let text = c_text(raw)?;
        let fields: Vec<&str> = text.split(':').collect();
        if fields.len() != 7 {
            return Err(ParseError::new(
                format!(
                    "expected 7 fields LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN, found {}",
                    fields.len()
                ),
                raw,
            ));
        }
        let mut d = Self::parse_common(&fields, raw)?;
        d.srqn = hex_field(fields[6], "SRQN", u32::MAX.into(), raw)? as u32;
        Ok(d)
    }

    fn parse_common(fields: &[&str], raw: &[u8]) -> Result<Self, ParseError> {
        Ok(Self {
            lid: hex_field(fields[0], "LID", 0xffff, raw)? as u16,
            out_reads: hex_field(fields[1], "OUT_READS", 0xffff, raw)? as u16,
            qpn: hex_field(fields[2], "QPN", MAX_24, raw)? as u32,
            psn: hex_field(fields[3], "PSN", MAX_24, raw)? as u32,
            rkey: hex_field(fields[4], "RKEY", u32::MAX.into(), raw)? as u32,
            vaddr: hex_field(fields[5], "VADDR", u64::MAX, raw)?,
            gid: [0; 16],
            srqn: 0,
        })
    }
}

/// Which side of the TCP connection we are; decides who writes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// A connected socket with the peer's name and deadlines, moving whole
/// fixed-size messages.
pub(crate) struct Wire {
    stream: TcpStream,
    peer: String,
    cfg: ExchangeConfig,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire").field("peer", &self.peer).finish()
    }
}

impl Wire {
    fn new(stream: TcpStream, cfg: &ExchangeConfig) -> Self {
        // Small messages each way: don't let Nagle + delayed ACK add 40 ms.
        let _ = stream.set_nodelay(true);
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "peer".to_string(), |a| a.to_string());
        Self {
            stream,
            peer,
            cfg: cfg.clone(),
        }
    }

    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Connects like the tools (every resolved address in turn), but retries
    /// a refused connection until the deadline, so a client may be started
    /// a moment before its server.
    pub(crate) fn connect<A: ToSocketAddrs + fmt::Debug>(
        addr: A,
        cfg: &ExchangeConfig,
        step: &'static str,
    ) -> Result<Self, ExchangeError> {
        let name = format!("{addr:?}");
        let addrs: Vec<SocketAddr> = addr
            .to_socket_addrs()
            .map_err(|e| ExchangeError::Connect {
                peer: name.clone(),
                step,
                source: e,
            })?
            .collect();
        if addrs.is_empty() {
            return Err(ExchangeError::Connect {
                peer: name,
                step,
                source: io::Error::new(io::ErrorKind::NotFound, "no address"),
            });
        }
        let deadline = Instant::now() + cfg.io_timeout;
        loop {
            let mut last = None;
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(a, left) {
                    Ok(s) => {
                        let w = Self::new(s, cfg);
                        return Ok(w);
                    }
                    Err(e) => last = Some((a, e)),
                }
            }
            let (a, e) = match last {
                Some(x) => x,
                None => {
                    return Err(ExchangeError::Connect {
                        peer: name,
                        step,
                        source: io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
                    })
                }
            };
            let retry = e.kind() == io::ErrorKind::ConnectionRefused
                && Instant::now() + Duration::from_millis(100) < deadline;
            if !retry {
                return Err(ExchangeError::Connect {
                    peer: a.to_string(),
                    step,
                    source: e,
                });
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Accepts one client (the tools `listen(fd, 1)` and take the first).
    pub(crate) fn accept(
        listener: &TcpListener,
        cfg: &ExchangeConfig,
        step: &'static str,
    ) -> Result<Self, ExchangeError> {
        let local = listener
            .local_addr()
            .map_or_else(|_| "listener".to_string(), |a| a.to_string());
        let io_err = |source| ExchangeError::Io {
            peer: local.clone(),
            step,
            source,
        };
        let Some(limit) = cfg.accept_timeout else {
            let (s, _) = listener.accept().map_err(io_err)?;
            return Self::prepare_accepted(s, cfg, &local, step);
        };
        // std has no accept timeout: poll a non-blocking listener.
        listener.set_nonblocking(true).map_err(io_err)?;
        let deadline = Instant::now() + limit;
        let res = loop {
            match listener.accept() {
                Ok((s, _)) => break Ok(s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        break Err(ExchangeError::AcceptTimeout {
                            local: local.clone(),
                            step,
                            timeout: limit,
                        });
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(io_err(e)),
            }
        };
        let _ = listener.set_nonblocking(false);
        Self::prepare_accepted(res?, cfg, &local, step)
    }

    fn prepare_accepted(
        s: TcpStream,
        cfg: &ExchangeConfig,
        local: &str,
        step: &'static str,
    ) -> Result<Self, ExchangeError> {
        // An accepted socket may inherit O_NONBLOCK on some systems.
        s.set_nonblocking(false)
            .map_err(|source| ExchangeError::Io {
                peer: local.to_string(),
                step,
                source,
            })?;
        Ok(Self::new(s, cfg))
    }

    fn io_err(&self, step: &'static str, source: io::Error) -> ExchangeError {
        ExchangeError::Io {
            peer: self.peer.clone(),
            step,
            source,
        }
    }

    /// Sends one whole message in a single write call (the peer reads it with
    /// a single `read()` of exactly its size).
    pub(crate) fn send(&mut self, step: &'static str, msg: &[u8]) -> Result<(), ExchangeError> {
        self.stream
            .set_write_timeout(Some(self.cfg.io_timeout))
            .map_err(|e| self.io_err(step, e))?;
        match self.stream.write_all(msg) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ExchangeError::Timeout {
                    peer: self.peer.clone(),
                    step,
                    timeout: self.cfg.io_timeout,
                    got: 0,
                    want: msg.len(),
                })
            }
            Err(e) => Err(self.io_err(step, e)),
        }
    }

    /// Fills `buf` completely, within the configured I/O deadline.
    pub(crate) fn recv(&mut self, step: &'static str, buf: &mut [u8]) -> Result<(), ExchangeError> {
        let t = self.cfg.io_timeout;
        self.recv_within(step, buf, Some(t))
    }

    /// Fills `buf` completely; `limit` bounds the whole message (`None`:
    /// wait as long as it takes).
    pub(crate) fn recv_within(
        &mut self,
        step: &'static str,
        buf: &mut [u8],
        limit: Option<Duration>,
    ) -> Result<(), ExchangeError> {
        let deadline = limit.map(|l| Instant::now() + l);
        let mut got = 0;
        while got < buf.len() {
            let left = match deadline {
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(self.timeout(step, limit, got, buf.len()));
                    }
                    Some(left)
                }
                None => None,
            };
            self.stream
                .set_read_timeout(left)
                .map_err(|e| self.io_err(step, e))?;
            match self.stream.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(ExchangeError::Closed {
                        peer: self.peer.clone(),
                        step,
                        got,
                        want: buf.len(),
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(self.timeout(step, limit, got, buf.len()))
                }
                Err(e) => return Err(self.io_err(step, e)),
            }
        }
        Ok(())
    }

    fn timeout(
        &self,
        step: &'static str,
        limit: Option<Duration>,
        got: usize,
        want: usize,
    ) -> ExchangeError {
        ExchangeError::Timeout {
            peer: self.peer.clone(),
            step,
            timeout: limit.unwrap_or(self.cfg.io_timeout),
            got,
            want,
        }
    }

    pub(crate) fn malformed(&self, step: &'static str, source: ParseError) -> ExchangeError {
        ExchangeError::Malformed {
            peer: self.peer.clone(),
            step,
            source,
        }
    }

    /// Waits up to `limit` (None: as long as it takes) until the peer closes
    /// the connection (what it sends meanwhile is read and dropped); true if
    /// it did.
    pub(crate) fn wait_closed_within(
        &mut self,
        step: &'static str,
        limit: Option<Duration>,
    ) -> Result<bool, ExchangeError> {
        self.stream
            .set_read_timeout(limit)
            .map_err(|e| self.io_err(step, e))?;
        let mut sink = [0u8; 64];
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => return Ok(true),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A reset is the peer gone too (killed with unread data).
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(true),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(false)
                }
                Err(e) => return Err(self.io_err(step, e)),
            }
        }
    }

    /// Says we are done (half-closes our side), then waits up to `limit`
    /// for the peer to close its side; true if it did.
    pub(crate) fn linger(
        &mut self,
        step: &'static str,
        limit: Duration,
    ) -> Result<bool, ExchangeError> {
        // Already shut or reset: the wait below sees that at once.
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        self.wait_closed_within(step, Some(limit))
    }

    /// Reads whatever the peer still sends (its `"done"`) until it closes or
    /// a short wait ends, so our close does not reset the connection under
    /// unread data. Failures are irrelevant here: the exchange is complete.
    pub(crate) fn drain_briefly(&mut self) {
        let _ = self
            .stream
            .set_read_timeout(Some(Duration::from_millis(200)));
        let mut sink = [0u8; 64];
        let mut total = 0;
        while total < 1024 {
            match self.stream.read(&mut sink) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    }
}

/// Binds the tools' default listening socket (`[::]`, dual-stack, falling
/// back to `0.0.0.0` where IPv6 is off). `std` sets `SO_REUSEADDR` as the
/// tools do.
pub fn listen(port: u16) -> io::Result<TcpListener> {
    TcpListener::bind(("::", port)).or_else(|_| TcpListener::bind(("0.0.0.0", port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid_v4(a: u8, b: u8, c: u8, d: u8) -> [u8; 16] {
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d]
    }

    #[test]
    fn pingpong_golden_bytes() {
        let d = PingpongDest {
            lid: 0,
            qpn: 0x11,
            psn: 0xabcdef,
            gid: gid_v4(192, 168, 1, 2),
        };
        let wire = d.to_wire().unwrap();
        // Built by hand: %04x of 0, %06x of 0x11, %06x of 0xabcdef, then the
        // raw GID bytes as hex, then the NUL that sizeof counts.
        let mut expect = b"0000:000011:abcdef:00000000000000000000ffffc0a80102".to_vec();
        expect.push(0);
        assert_eq!(expect.len(), 52);
        assert_eq!(wire.as_slice(), expect.as_slice());
        assert_eq!(PingpongDest::parse(&wire).unwrap(), d);
    }

    #[test]
    fn pingpong_zero_gid_and_max_fields() {
        let d = PingpongDest {
            lid: 0xffff,
            qpn: 0xff_ffff,
            psn: 0,
            gid: [0; 16],
        };
        let wire = d.to_wire().unwrap();
        let mut expect = b"ffff:ffffff:000000:00000000000000000000000000000000".to_vec();
        expect.push(0);
        assert_eq!(wire.as_slice(), expect.as_slice());
        assert_eq!(PingpongDest::parse(&wire).unwrap(), d);
    }

    #[test]
    fn pingpong_parse_tolerates_missing_nul_and_uppercase() {
        let d =
            PingpongDest::parse(b"00AB:000011:000002:FE800000000000000000000000000001").unwrap();
        assert_eq!(d.lid, 0xab);
        assert_eq!(d.gid[0], 0xfe);
        assert_eq!(d.gid[15], 1);
    }

    #[test]
    fn pingpong_out_of_range_is_rejected_locally() {
        let d = PingpongDest {
            qpn: 0x100_0000,
            ..Default::default()
        };
        assert!(matches!(
            d.to_wire(),
            Err(ExchangeError::FieldRange { field: "qpn", .. })
        ));
    }

    #[test]
    fn pingpong_malformed_inputs() {
        let cases: &[&[u8]] = &[
            b"",
            b"\0\0\0\0",
            b"hello world",
            b"0000:000011:abcdef",
            b"0000:000011:abcdef:0000:extra",
            b"0000:0000zz:abcdef:00000000000000000000ffffc0a80102",
            b"0000:000011:abcdef:00000000000000000000ffffc0a8010",
            b"0000:1000000:abcdef:00000000000000000000ffffc0a80102",
            b"10000:000011:abcdef:00000000000000000000ffffc0a80102",
            b"0000:000011:abcdef:00000000000000000000ffffc0a8010g",
            b"0000::abcdef:00000000000000000000ffffc0a80102",
            b"\xff\xfe:000011:abcdef:00000000000000000000ffffc0a80102",
        ];
        for c in cases {
            let e = PingpongDest::parse(c).unwrap_err();
            assert!(e.text.starts_with('"'), "{e}");
        }
        // The error shows what came in.
        let e = PingpongDest::parse(b"hello world\0\0").unwrap_err();
        assert!(
            e.to_string().contains("\"hello world\" + 2 NUL (13 bytes)"),
            "{e}"
        );
    }

    #[test]
    fn perftest_gid_golden_bytes() {
        let d = PerftestDest {
            lid: 0,
            out_reads: 16,
            qpn: 0x11,
            psn: 0x63ad7d,
            rkey: 0x17eedf,
            vaddr: 0x7f76_0c94_7000,
            gid: gid_v4(10, 0, 0, 5),
            srqn: 0,
        };
        let wire = d.to_wire_gid().unwrap();
        let mut expect = b"0000:0010:000011:63ad7d:0017eedf:00007f760c947000:\
00:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05:00000000:"
            .to_vec();
        expect.push(0);
        assert_eq!(expect.len(), 108);
        assert_eq!(wire.as_slice(), expect.as_slice());
        assert_eq!(PerftestDest::parse_gid(&wire).unwrap(), d);
    }

    #[test]
    fn perftest_binary_golden_bytes() {
        // ib_write_bw -R 4.5 on rxe, captured: QPN 0x12, PSN 0xd8e5cc, RKey 0x348,
        // VAddr 0x7f9e0a533000, GID ::ffff:10.77.0.11, GID index 1.
        let raw = hex_bytes(
            "00000000000000010000001200d8e5cc0000034800000000\
             00007f9e0a53300000000000000000000000ffff0a4d000b0000000000000001",
        );
        let d = PerftestDest::parse_binary(&raw).unwrap();
        assert_eq!(
            d,
            PerftestDest {
                lid: 0,
                out_reads: 1,
                qpn: 0x12,
                psn: 0xd8e5cc,
                rkey: 0x348,
                vaddr: 0x7f9e_0a53_3000,
                gid: gid_v4(10, 77, 0, 11),
                srqn: 0,
            }
        );
        assert_eq!(d.to_wire_binary(1).unwrap().as_slice(), raw.as_slice());
        // perftest leaves the padding uninitialised: not read.
        let mut padded = raw.clone();
        padded[20..24].copy_from_slice(&[0xb6, 0x55, 0, 0]);
        assert_eq!(PerftestDest::parse_binary(&padded).unwrap(), d);
        assert!(PerftestDest::parse_binary(&raw[..55]).is_err());
        let mut wide = raw.clone();
        wide[8] = 1; // QPN 0x01000012
        assert!(PerftestDest::parse_binary(&wide).is_err());
        wide = raw;
        wide[0] = 1; // LID 0x01000000
        assert!(PerftestDest::parse_binary(&wide).is_err());
    }

    fn hex_bytes(h: &str) -> Vec<u8> {
        (0..h.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn perftest_lid_golden_bytes() {
        let d = PerftestDest {
            lid: 0x1907,
            out_reads: 0,
            qpn: 0x867,
            psn: 0x6d058e,
            rkey: 0x1fffb9,
            vaddr: 0x7f58_a406_e000,
            gid: [0; 16],
            srqn: 0x12,
        };
        let wire = d.to_wire_lid().unwrap();
        let mut expect = b"1907:0000:000867:6d058e:001fffb9:00007f58a406e000:00000012".to_vec();
        expect.push(0);
        assert_eq!(expect.len(), 59);
        assert_eq!(wire.as_slice(), expect.as_slice());
        assert_eq!(PerftestDest::parse_lid(&wire).unwrap(), d);
    }

    #[test]
    fn perftest_malformed_inputs() {
        let good = PerftestDest::default().to_wire_gid().unwrap();
        let mut bad = good;
        bad[30] = b'x';
        assert!(PerftestDest::parse_gid(&bad).is_err());
        assert!(PerftestDest::parse_gid(b"").is_err());
        assert!(PerftestDest::parse_gid(b"0000:0010:000011").is_err());
        assert!(PerftestDest::parse_gid(&[0xff; 108]).is_err());
        // A pingpong message is not a perftest one.
        let pp = PingpongDest::default().to_wire().unwrap();
        let e = PerftestDest::parse_gid(&pp).unwrap_err();
        assert!(e.to_string().contains("0000:000000:000000:"), "{e}");
        assert!(PerftestDest::parse_lid(&good).is_err());
        // GID byte wider than 8 bits.
        let text = b"0000:0010:000011:63ad7d:0017eedf:00007f760c947000:\
100:00:00:00:00:00:00:00:00:00:ff:ff:0a:00:00:05:00000000:";
        assert!(PerftestDest::parse_gid(text).is_err());
    }

    #[test]
    fn show_bytes_escapes() {
        assert_eq!(show_bytes(b"a\"\x01\0"), "\"a\\\"\\x01\" + 1 NUL (4 bytes)");
    }
}
