//! The TCP exchange of rdma-core's `ibv_{rc,uc,ud,srq}_pingpong`
//! (`pp_client_exch_dest` / `pp_server_exch_dest`).
//!
//! Order on the wire, one [`PingpongDest`] message (52 bytes) per QP:
//!
//! 1. client connects, writes its message(s);
//! 2. server reads them, **moves its QP(s) to RTR/RTS** (`pp_connect_ctx`),
//!    then writes its own message(s);
//! 3. client reads them and writes `"done\0"`, then closes (it connects its
//!    QP after the exchange);
//! 4. server reads `"done\0"` and closes.
//!
//! rc/uc/ud_pingpong exchange one message; srq_pingpong always exchanges
//! `MAX_QP` (256) messages each way, the unused ones all zero (its loops run
//! to `MAX_QP`, not `num_qp`) — see [`srq_padded`].

use std::fmt;
use std::net::{TcpListener, ToSocketAddrs};

use super::{ExchangeConfig, ExchangeError, PingpongDest, Wire, DONE_MSG};

/// srq_pingpong.c `MAX_QP`: number of messages it sends each way.
pub const SRQ_MAX_QP: usize = 256;

/// Pads a list of QP destinations with all-zero entries to [`SRQ_MAX_QP`],
/// which is what srq_pingpong sends (its `my_dest` array is zeroed).
pub fn srq_padded(dests: &[PingpongDest]) -> Result<Vec<PingpongDest>, ExchangeError> {
    if dests.len() > SRQ_MAX_QP {
        return Err(ExchangeError::Invalid(format!(
            "srq_pingpong carries at most {SRQ_MAX_QP} QPs, got {}",
            dests.len()
        )));
    }
    let mut v = dests.to_vec();
    v.resize(SRQ_MAX_QP, PingpongDest::default());
    Ok(v)
}

fn encode_all(dests: &[PingpongDest]) -> Result<Vec<u8>, ExchangeError> {
    if dests.is_empty() {
        return Err(ExchangeError::Invalid("no QP destination to send".into()));
    }
    let mut out = Vec::with_capacity(dests.len() * PingpongDest::WIRE_LEN);
    for d in dests {
        out.extend_from_slice(&d.to_wire()?);
    }
    Ok(out)
}

fn recv_all(
    wire: &mut Wire,
    step: &'static str,
    count: usize,
) -> Result<Vec<PingpongDest>, ExchangeError> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let mut msg = [0u8; PingpongDest::WIRE_LEN];
        wire.recv(step, &mut msg)?;
        out.push(PingpongDest::parse(&msg).map_err(|e| wire.malformed(step, e))?);
    }
    Ok(out)
}

/// Server side split in two steps, so the caller can connect its QP between
/// receiving the client's address and sending its own, as
/// `pp_server_exch_dest` does.
#[derive(Debug)]
pub struct PingpongServer {
    wire: Wire,
    peer_dests: Vec<PingpongDest>,
}

impl PingpongServer {
    /// Accepts one client and reads `count` messages from it (1 for
    /// rc/uc/ud_pingpong, [`SRQ_MAX_QP`] for srq_pingpong).
    pub fn accept(
        listener: &TcpListener,
        count: usize,
        cfg: &ExchangeConfig,
    ) -> Result<Self, ExchangeError> {
        if count == 0 {
            return Err(ExchangeError::Invalid("count must be at least 1".into()));
        }
        let mut wire = Wire::accept(listener, cfg, "pingpong server: accept")?;
        let peer_dests = recv_all(&mut wire, "pingpong server: read client address", count)?;
        Ok(Self { wire, peer_dests })
    }

    /// The client's destinations, in the order sent.
    pub fn peer_dests(&self) -> &[PingpongDest] {
        &self.peer_dests
    }

    /// Who connected.
    pub fn peer(&self) -> &str {
        self.wire.peer()
    }

    /// Sends our destinations (same count as received) and waits for the
    /// client's `"done\0"`. Returns the client's destinations.
    pub fn reply(mut self, my_dests: &[PingpongDest]) -> Result<Vec<PingpongDest>, ExchangeError> {
        if my_dests.len() != self.peer_dests.len() {
            return Err(ExchangeError::Invalid(format!(
                "client sent {} addresses, replying with {}",
                self.peer_dests.len(),
                my_dests.len()
            )));
        }
        let out = encode_all(my_dests)?;
        // One write per message, like the tool, so each arrives whole.
        for chunk in out.chunks(PingpongDest::WIRE_LEN) {
            self.wire
                .send("pingpong server: send local address", chunk)?;
        }
        let step = "pingpong server: read \"done\"";
        let mut done = [0u8; DONE_MSG.len()];
        self.wire.recv(step, &mut done)?;
        if &done != DONE_MSG {
            return Err(self
                .wire
                .malformed(step, super::ParseError::new("expected \"done\\0\"", &done)));
        }
        Ok(self.peer_dests)
    }
}

/// One-QP server exchange: accept, read the client's address, run
/// `connect_qp` on it (move the QP to RTR/RTS, as the tool does before
/// answering), send `my_dest`, read `"done"`.
pub fn server_exchange<F, E>(
    listener: &TcpListener,
    my_dest: &PingpongDest,
    cfg: &ExchangeConfig,
    connect_qp: F,
) -> Result<PingpongDest, ExchangeError>
where
    F: FnOnce(&PingpongDest) -> Result<(), E>,
    E: fmt::Display,
{
    let mut v = server_exchange_multi(listener, std::slice::from_ref(my_dest), cfg, |d| {
        connect_qp(&d[0])
    })?;
    v.pop()
        .ok_or_else(|| ExchangeError::Invalid("no destination received".into()))
}

/// Multi-message server exchange (srq_pingpong: pass [`srq_padded`] lists).
/// Reads as many messages as `my_dests` holds.
pub fn server_exchange_multi<F, E>(
    listener: &TcpListener,
    my_dests: &[PingpongDest],
    cfg: &ExchangeConfig,
    connect_qps: F,
) -> Result<Vec<PingpongDest>, ExchangeError>
where
    F: FnOnce(&[PingpongDest]) -> Result<(), E>,
    E: fmt::Display,
{
    // Check our own messages before taking a client.
    encode_all(my_dests)?;
    let server = PingpongServer::accept(listener, my_dests.len(), cfg)?;
    connect_qps(server.peer_dests()).map_err(|e| ExchangeError::Callback {
        step: "pingpong server: connect QP to the client's address",
        message: e.to_string(),
    })?;
    server.reply(my_dests)
}

/// One-QP client exchange: connect, send `my_dest`, read the server's
/// address, send `"done\0"`, close. The caller connects its QP afterwards
/// (as `pp_client_exch_dest`'s caller does).
pub fn client_exchange<A: ToSocketAddrs + fmt::Debug>(
    addr: A,
    my_dest: &PingpongDest,
    cfg: &ExchangeConfig,
) -> Result<PingpongDest, ExchangeError> {
    let mut v = client_exchange_multi(addr, std::slice::from_ref(my_dest), cfg)?;
    v.pop()
        .ok_or_else(|| ExchangeError::Invalid("no destination received".into()))
}

/// Multi-message client exchange (srq_pingpong: pass [`srq_padded`]).
pub fn client_exchange_multi<A: ToSocketAddrs + fmt::Debug>(
    addr: A,
    my_dests: &[PingpongDest],
    cfg: &ExchangeConfig,
) -> Result<Vec<PingpongDest>, ExchangeError> {
    let out = encode_all(my_dests)?;
    let mut wire = Wire::connect(addr, cfg, "pingpong client: connect")?;
    for chunk in out.chunks(PingpongDest::WIRE_LEN) {
        wire.send("pingpong client: send local address", chunk)?;
    }
    let peer = recv_all(
        &mut wire,
        "pingpong client: read server address",
        my_dests.len(),
    )?;
    wire.send("pingpong client: send \"done\"", DONE_MSG)?;
    Ok(peer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    fn cfg() -> ExchangeConfig {
        ExchangeConfig {
            io_timeout: Duration::from_secs(5),
            accept_timeout: Some(Duration::from_secs(5)),
            end_of_test_timeout: Some(Duration::from_secs(5)),
        }
    }

    fn dest(qpn: u32) -> PingpongDest {
        PingpongDest {
            lid: 0,
            qpn,
            psn: 0x123456 ^ qpn,
            gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
        }
    }

    #[test]
    fn loopback_rc_exchange_connects_before_replying() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        let server = thread::spawn(move || {
            server_exchange(&listener, &dest(0x11), &cfg(), |peer| {
                // The client must still be waiting for our reply here.
                tx.send(*peer).unwrap();
                Ok::<(), String>(())
            })
        });
        let got = client_exchange(addr, &dest(0x12), &cfg()).unwrap();
        assert_eq!(got, dest(0x11));
        assert_eq!(rx.recv().unwrap(), dest(0x12));
        assert_eq!(server.join().unwrap().unwrap(), dest(0x12));
    }

    #[test]
    fn loopback_srq_exchange_of_256_messages() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mine = srq_padded(&[dest(1), dest(2)]).unwrap();
        let theirs = srq_padded(&[dest(3), dest(4), dest(5)]).unwrap();
        let m2 = mine.clone();
        let server = thread::spawn(move || {
            server_exchange_multi(&listener, &m2, &cfg(), |_| Ok::<(), String>(()))
        });
        let got = client_exchange_multi(addr, &theirs, &cfg()).unwrap();
        assert_eq!(got, mine);
        assert_eq!(server.join().unwrap().unwrap(), theirs);
    }

    /// A raw peer speaking exactly the C tool's bytes.
    #[test]
    fn server_against_byte_level_client() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            server_exchange(&listener, &dest(0x11), &cfg(), |_| Ok::<(), String>(()))
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"0000:000012:00aaaa:00000000000000000000ffff7f000001\0")
            .unwrap();
        let mut reply = [0u8; 52];
        s.read_exact(&mut reply).unwrap();
        assert_eq!(&reply[..], &dest(0x11).to_wire().unwrap()[..]);
        s.write_all(b"done\0").unwrap();
        let peer = server.join().unwrap().unwrap();
        assert_eq!(peer.qpn, 0x12);
        assert_eq!(peer.psn, 0xaaaa);
    }

    #[test]
    fn server_rejects_garbage_with_the_text() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            server_exchange(&listener, &dest(1), &cfg(), |_| Ok::<(), String>(()))
        });
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&[b'G'; 52]).unwrap();
        let err = server.join().unwrap().unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("read client address"), "{msg}");
        assert!(msg.contains("GGGG"), "{msg}");
        assert!(msg.contains("127.0.0.1"), "{msg}");
    }

    #[test]
    fn client_times_out_on_a_silent_server() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and hold the connection without answering.
        let holder = thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            thread::sleep(Duration::from_millis(800));
            drop(s);
        });
        let c = ExchangeConfig {
            io_timeout: Duration::from_millis(300),
            ..cfg()
        };
        let t0 = std::time::Instant::now();
        let err = client_exchange(addr, &dest(1), &c).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3));
        match &err {
            ExchangeError::Timeout {
                step, got, want, ..
            } => {
                assert!(step.contains("read server address"));
                assert_eq!((*got, *want), (0, 52));
            }
            other => panic!("unexpected {other}"),
        }
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
        holder.join().unwrap();
    }

    #[test]
    fn server_accept_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = ExchangeConfig {
            accept_timeout: Some(Duration::from_millis(100)),
            ..cfg()
        };
        let err = server_exchange(&listener, &dest(1), &c, |_| Ok::<(), String>(())).unwrap_err();
        assert!(matches!(err, ExchangeError::AcceptTimeout { .. }), "{err}");
    }

    #[test]
    fn callback_failure_is_reported() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = thread::spawn(move || {
            server_exchange(&listener, &dest(1), &cfg(), |_| Err("RTR refused"))
        });
        let c = ExchangeConfig {
            io_timeout: Duration::from_secs(2),
            ..cfg()
        };
        // The server drops the connection: the client sees a close.
        let err = client_exchange(addr, &dest(2), &c).unwrap_err();
        assert!(matches!(err, ExchangeError::Closed { .. }), "{err}");
        let e = server.join().unwrap().unwrap_err();
        assert!(e.to_string().contains("RTR refused"), "{e}");
    }

    #[test]
    fn client_connect_refused_names_the_peer() {
        // Bind then drop to get a (very likely) closed port.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let c = ExchangeConfig {
            io_timeout: Duration::from_millis(300),
            ..cfg()
        };
        let err = client_exchange(("127.0.0.1", port), &dest(1), &c).unwrap_err();
        assert!(matches!(err, ExchangeError::Connect { .. }), "{err}");
        assert!(err.to_string().contains(&port.to_string()), "{err}");
    }
}
