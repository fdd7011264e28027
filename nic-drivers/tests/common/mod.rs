//! Shared conformance suite: every backend runs the same checks.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce_nic::afpacket::{AfPacketConfig, AfPacketIo, RxRing};
use ferroce_nic::afxdp::{AfXdpConfig, AfXdpIo};
use ferroce_nic::frame::{build_udp_frame, header_len, parse_udp, HeaderSpec, ROCE_V2_PORT};
use ferroce_nic::netns::{Topology, TopologyConfig};
use ferroce_nic::PacketIo;

pub type Io = Box<dyn PacketIo>;

/// Addresses of one end.
#[derive(Debug, Clone, Copy)]
pub struct End {
    pub mac: [u8; 6],
    pub ip: IpAddr,
}

/// Two connected backends plus what is needed to address frames.
pub struct Pair {
    pub topo: Option<Topology>,
    pub a: Io,
    pub b: Io,
    pub ea: End,
    pub eb: End,
}

/// An AF_PACKET receiver with the default (V3) ring.
pub fn raw_afpacket(ifname: &str) -> Io {
    Box::new(AfPacketIo::open(AfPacketConfig::new(ifname)).unwrap())
}

/// The V2 ring (ferroce-verbs' choice): small slots, so GSO super-frames
/// come whole through the socket (PACKET_COPY_THRESH).
pub fn raw_afpacket_v2(ifname: &str) -> Io {
    let mut c = AfPacketConfig::new(ifname);
    c.rx_ring = RxRing::V2;
    Box::new(AfPacketIo::open(c).unwrap())
}

pub fn raw_afxdp(ifname: &str) -> Io {
    Box::new(AfXdpIo::open(AfXdpConfig::new(ifname)).unwrap())
}

pub fn root_or_skip(what: &str) -> bool {
    if ferroce_nic::is_root() {
        return true;
    }
    eprintln!("SKIP {what}: needs root (network namespaces, raw sockets)");
    false
}

pub fn topo() -> Topology {
    Topology::up(&TopologyConfig::default()).expect("netns topology")
}

/// Ends of a topology's two hosts.
pub fn ends(t: &Topology, v6: bool) -> (End, End) {
    let e = |i: usize| End {
        mac: t.host(i).mac,
        ip: t.host(i).ip(v6),
    };
    (e(0), e(1))
}

const MAGIC: u32 = 0xF0CE_0001;

/// Frame `seq` of `len` bytes from `from` to `to`.
pub fn frame(from: End, to: End, seq: u32, len: usize) -> Vec<u8> {
    let spec = HeaderSpec {
        dst_mac: to.mac,
        src_mac: from.mac,
        src: SocketAddr::new(from.ip, ROCE_V2_PORT),
        dst: SocketAddr::new(to.ip, ROCE_V2_PORT),
        tos: 0,
        ttl: 64,
    };
    let hl = header_len(from.ip.is_ipv6());
    let plen = len.max(hl + 8) - hl;
    let mut p: Vec<u8> = (0..plen)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seq) as u8)
        .collect();
    p[..4].copy_from_slice(&MAGIC.to_be_bytes());
    p[4..8].copy_from_slice(&seq.to_be_bytes());
    build_udp_frame(&spec, &p).unwrap()
}

/// Checks a received frame against what was sent; returns its sequence number.
pub fn check(got: &[u8], from: End, to: End) -> Option<u32> {
    let i = parse_udp(got).ok()?;
    let p = &got[i.payload_offset..i.payload_offset + i.payload_len];
    if p.len() < 8 || p[..4] != MAGIC.to_be_bytes() {
        return None;
    }
    let seq = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
    assert_eq!(i.src.ip(), from.ip, "source IP");
    assert_eq!(i.dst.ip(), to.ip, "destination IP");
    assert_eq!(i.dst.port(), ROCE_V2_PORT);
    let want = frame(from, to, seq, got.len());
    let wi = parse_udp(&want).unwrap();
    assert_eq!(p, &want[wi.payload_offset..], "payload of seq {seq}");
    Some(seq)
}

/// Sends every frame (retrying while the backend is full), within 5 s.
pub fn send_all(io: &mut Io, frames: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = frames.iter().map(|f| f.as_slice()).collect();
    let mut sent = 0;
    let t0 = Instant::now();
    while sent < refs.len() && t0.elapsed() < Duration::from_secs(5) {
        sent += io.send_frames(&refs[sent..]).unwrap();
    }
    assert_eq!(sent, refs.len(), "{}: every frame sent", io.kind());
}

pub fn recv_until(io: &mut Io, n: usize, from: End, to: End, secs: u64) -> Vec<(u32, usize)> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut out = Vec::new();
    while out.len() < n && Instant::now() < deadline {
        let got = io
            .recv(64, &mut |f: &[u8]| {
                if let Some(s) = check(f, from, to) {
                    out.push((s, f.len()));
                }
            })
            .unwrap();
        if got == 0 {
            io.wait(Some(Duration::from_millis(20))).unwrap();
        }
    }
    out
}

/// Batches of 1..64 frames, 60..9000 bytes, both directions, in order.
pub fn batches(p: &mut Pair, sizes: &[usize]) {
    let mut seq = 0u32;
    for batch in [1usize, 2, 3, 8, 31, 64] {
        for &len in sizes {
            for dir in 0..2 {
                let (tx, rx, from, to) = if dir == 0 {
                    (&mut p.a, &mut p.b, p.ea, p.eb)
                } else {
                    (&mut p.b, &mut p.a, p.eb, p.ea)
                };
                let frames: Vec<Vec<u8>> = (0..batch)
                    .map(|_| {
                        seq += 1;
                        frame(from, to, seq, len)
                    })
                    .collect();
                send_all(tx, &frames);
                let got = recv_until(rx, batch, from, to, 5);
                let want: Vec<(u32, usize)> = frames
                    .iter()
                    .map(|f| (check(f, from, to).unwrap(), f.len()))
                    .collect();
                assert_eq!(got, want, "{} batch {batch} len {len} dir {dir}", tx.kind());
            }
        }
    }
}

/// `n` frames of `len` bytes each way (or one way), flow-controlled by a
/// window so a correct backend loses nothing. Returns (elapsed, frames/s).
pub fn bulk(p: Pair, n: u64, len: usize, both: bool) -> (Pair, Duration) {
    let Pair { topo, a, b, ea, eb } = p;
    let rx_a = Arc::new(AtomicU64::new(0));
    let rx_b = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let side = |mut io: Io,
                me: End,
                peer: End,
                send: u64,
                expect: u64,
                my_rx: Arc<AtomicU64>,
                peer_rx: Arc<AtomicU64>| {
        std::thread::spawn(move || {
            let window = 512u64;
            let frames: Vec<Vec<u8>> = (0..64).map(|i| frame(me, peer, i, len)).collect();
            let mut sent = 0u64;
            let mut next_rx = 0u32;
            let mut received = 0u64;
            let deadline = Instant::now() + Duration::from_secs(60);
            while (sent < send || received < expect) && Instant::now() < deadline {
                let room = window.saturating_sub(sent - peer_rx.load(Ordering::Acquire));
                let k = room.min(send - sent).min(64) as usize;
                if k > 0 {
                    let mut i = 0usize;
                    let base = sent;
                    let took = io
                        .transmit(k, &mut |buf: &mut [u8]| {
                            if i >= k {
                                return None;
                            }
                            let seq = (base + i as u64) as u32;
                            let t = &frames[seq as usize % 64];
                            buf[..t.len()].copy_from_slice(t);
                            // Sequence number in the payload, at the same offset.
                            let off = header_len(me.ip.is_ipv6()) + 4;
                            buf[off..off + 4].copy_from_slice(&seq.to_be_bytes());
                            i += 1;
                            Some(t.len())
                        })
                        .unwrap();
                    sent += took as u64;
                }
                let mut bad = 0u64;
                io.recv(64, &mut |f: &[u8]| {
                    let Ok(info) = parse_udp(f) else { return };
                    let pl = &f[info.payload_offset..];
                    if pl.len() < 8 || pl[..4] != MAGIC.to_be_bytes() {
                        return;
                    }
                    let seq = u32::from_be_bytes([pl[4], pl[5], pl[6], pl[7]]);
                    if seq != next_rx {
                        bad += 1;
                    }
                    next_rx = seq.wrapping_add(1);
                    received += 1;
                })
                .unwrap();
                assert_eq!(bad, 0, "{}: out of order or lost at {next_rx}", io.kind());
                my_rx.store(received, Ordering::Release);
                if k == 0 && received < expect {
                    let _ = io.wait(Some(Duration::from_millis(1)));
                }
            }
            assert_eq!(sent, send, "{}: all sent", io.kind());
            assert_eq!(received, expect, "{}: all received", io.kind());
            io
        })
    };
    let nb = if both { n } else { 0 };
    let ha = side(a, ea, eb, n, nb, rx_a.clone(), rx_b.clone());
    let hb = side(b, eb, ea, nb, n, rx_b, rx_a);
    let a = ha.join().unwrap();
    let b = hb.join().unwrap();
    let el = t0.elapsed();
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.rx_dropped + sb.rx_dropped, 0, "{sa:?} {sb:?}");
    (Pair { topo, a, b, ea, eb }, el)
}

/// Ping and a TCP connection between the namespaces still work while the
/// backends are open (they must leave non-RoCE traffic to the kernel).
pub fn other_traffic_reaches_kernel(t: &Topology) {
    for (ip, size) in [
        (t.host(1).ipv4.to_string(), "1000"),
        (t.host(1).ipv6.to_string(), "1000"),
    ] {
        let ok = t
            .command(0, "ping")
            .args(["-c", "2", "-i", "0.2", "-W", "2", "-s", size, &ip])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        assert!(ok, "ping {ip} while attached");
    }
    let b_ip = t.host(1).ipv4;
    let listener = t
        .run_in(1, move || {
            std::net::TcpListener::bind((b_ip, 5201)).unwrap()
        })
        .unwrap();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
    });
    let echoed = t
        .run_in(0, move || {
            use std::io::{Read, Write};
            let mut c =
                std::net::TcpStream::connect_timeout(&(b_ip, 5201).into(), Duration::from_secs(3))
                    .unwrap();
            c.write_all(b"hello").unwrap();
            let mut buf = [0u8; 5];
            c.read_exact(&mut buf).unwrap();
            buf
        })
        .unwrap();
    server.join().unwrap();
    assert_eq!(&echoed, b"hello", "TCP across the link while attached");
}

pub const SIZES: &[usize] = &[60, 64, 128, 1024, 1500, 4096, 4200, 8000, 9014];

/// Serves whole RoCE frames to `transmit_gather` in two parts around their
/// payload (every third one whole, as the core writes ACKs and copied frames).
struct Splitter<'a> {
    frames: &'a [Vec<u8>],
    next: usize,
}

impl ferroce_nic::TxSource for Splitter<'_> {
    fn fill(&mut self, buf: &mut [u8]) -> Option<ferroce_nic::GatherFrame> {
        let f = self.frames.get(self.next)?;
        let key = self.next as u32;
        self.next += 1;
        let head = ferroce_nic::frame::parse_udp(f).unwrap().payload_offset + 12;
        if key % 3 == 2 {
            buf[..f.len()].copy_from_slice(f);
            return Some(ferroce_nic::GatherFrame {
                head: f.len(),
                tail: 0,
                payload: None,
            });
        }
        let end = f.len() - 4;
        buf[..head].copy_from_slice(&f[..head]);
        buf[head..head + 4].copy_from_slice(&f[end..]);
        Some(ferroce_nic::GatherFrame {
            head,
            tail: 4,
            payload: Some(ferroce_nic::PayloadRef {
                key,
                offset: head as u64,
                len: end - head,
            }),
        })
    }

    fn payload(&self, p: &ferroce_nic::PayloadRef) -> Option<&[u8]> {
        let f = self.frames.get(p.key as usize)?;
        f.get(p.offset as usize..p.offset as usize + p.len)
    }
}

/// Sends whole RoCE frames through `transmit_gather`, split as [`Splitter`]
/// splits them, until every one is taken.
pub fn send_gathered<P: ferroce_nic::PacketIo + ?Sized>(io: &mut P, frames: &[Vec<u8>]) {
    let mut src = Splitter { frames, next: 0 };
    let mut sent = 0;
    while sent < frames.len() {
        let n = io.transmit_gather(64, &mut src).unwrap();
        assert!(n > 0);
        sent += n;
    }
}
