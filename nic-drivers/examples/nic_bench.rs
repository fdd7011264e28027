//! Frames/s and Gbit/s per backend between two network namespaces over veth
//! (MTU 9000), sender pinned to CPU 0 and receiver to CPU 1, against a plain
//! kernel UDP socket with sendmmsg/recvmmsg measured in the same run.
//!
//! `cargo run --release -p ferroce-nic --example nic_bench -- [secs] [backends] [sizes]`
//! e.g. `... -- 2 baseline,udp,afpacket,afxdp 64,1024,4096`. Needs root.

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce_nic::afpacket::{AfPacketConfig, AfPacketIo, RxRing};
use ferroce_nic::afxdp::{AfXdpConfig, AfXdpIo};
use ferroce_nic::frame::{build_udp_frame, header_len, HeaderSpec, ROCE_V2_PORT};
use ferroce_nic::netns::{Topology, TopologyConfig};
use ferroce_nic::{NicError, PacketIo, UdpConfig, UdpIo};

type Io = Box<dyn PacketIo>;

fn pin(cpu: usize) {
    // SAFETY: cpu_set_t is plain old data; sched_setaffinity(0) pins the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[derive(Debug, Default, Clone, Copy)]
struct Side {
    frames: u64,
    bytes: u64,
    cpu: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Result1 {
    tx: Side,
    rx: Side,
    secs: f64,
    drops: u64,
}

/// Sender/receiver loops over any PacketIo.
fn run_io(tx: Io, rx: Io, frame: Vec<u8>, secs: f64) -> Result1 {
    let stop = Arc::new(AtomicBool::new(false));
    let rx_frames = Arc::new(AtomicU64::new(0));
    let stop_r = stop.clone();
    let rxf = rx_frames.clone();
    let rxh = std::thread::spawn(move || {
        pin(1);
        let mut rx = rx;
        let c0 = thread_cpu();
        let mut s = Side::default();
        let mut idle_since: Option<Instant> = None;
        loop {
            let n = rx
                .recv(64, &mut |f: &[u8]| {
                    s.bytes += f.len() as u64;
                })
                .unwrap_or(0);
            s.frames += n as u64;
            rxf.store(s.frames, Ordering::Relaxed);
            if n == 0 {
                if stop_r.load(Ordering::Relaxed) {
                    let t = *idle_since.get_or_insert_with(Instant::now);
                    if t.elapsed() > Duration::from_millis(200) {
                        break;
                    }
                }
                let _ = rx.wait(Some(Duration::from_millis(5)));
            } else {
                idle_since = None;
            }
        }
        s.cpu = thread_cpu() - c0;
        (s, rx.stats().rx_dropped)
    });
    std::thread::sleep(Duration::from_millis(50));
    let txh = std::thread::spawn(move || {
        pin(0);
        let mut tx = tx;
        let c0 = thread_cpu();
        let t0 = Instant::now();
        let mut s = Side::default();
        let len = frame.len();
        while t0.elapsed().as_secs_f64() < secs {
            let mut k = 0;
            let n = tx
                .transmit(64, &mut |buf: &mut [u8]| {
                    if k == 64 {
                        return None;
                    }
                    k += 1;
                    buf[..len].copy_from_slice(&frame);
                    Some(len)
                })
                .unwrap_or(0);
            s.frames += n as u64;
            s.bytes += (n * len) as u64;
        }
        s.cpu = thread_cpu() - c0;
        (s, t0.elapsed().as_secs_f64())
    });
    let (txs, el) = txh.join().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let (rxs, drops) = rxh.join().unwrap_or_default();
    Result1 {
        tx: txs,
        rx: rxs,
        secs: el,
        drops,
    }
}

/// The baseline: plain UDP sockets, sendmmsg(64) / recvmmsg(64), no GSO/GRO.
fn run_baseline(t: &Topology, payload: usize, secs: f64) -> Result1 {
    let b_ip = t.host(1).ipv4;
    let a_ip = t.host(0).ipv4;
    let rx = t
        .run_in(1, move || UdpSocket::bind((b_ip, ROCE_V2_PORT)))
        .and_then(|r| {
            r.map_err(|e| NicError::Sys {
                op: "bind".into(),
                source: e,
            })
        })
        .expect("bind rx");
    let tx = t
        .run_in(0, move || UdpSocket::bind((a_ip, ROCE_V2_PORT)))
        .and_then(|r| {
            r.map_err(|e| NicError::Sys {
                op: "bind".into(),
                source: e,
            })
        })
        .expect("bind tx");
    tx.connect((b_ip, ROCE_V2_PORT)).expect("connect");
    let big: libc::c_int = 8 << 20;
    for s in [&rx, &tx] {
        // SAFETY: valid fd and int option (SO_RCVBUFFORCE 33 / SO_SNDBUFFORCE 32, asm-generic/socket.h).
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                33,
                (&big as *const libc::c_int).cast(),
                4,
            );
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                32,
                (&big as *const libc::c_int).cast(),
                4,
            );
        }
    }
    rx.set_nonblocking(true).ok();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_r = stop.clone();
    let rxh = std::thread::spawn(move || {
        pin(1);
        let c0 = thread_cpu();
        let mut s = Side::default();
        let mut bufs = vec![vec![0u8; 65536]; 64];
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: mmsghdr is plain old data.
        let mut hdrs: Vec<libc::mmsghdr> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
        for (h, iov) in hdrs.iter_mut().zip(iovs.iter_mut()) {
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        let mut idle_since: Option<Instant> = None;
        loop {
            // SAFETY: hdrs point to live iovecs/buffers.
            let r = unsafe {
                libc::recvmmsg(
                    rx.as_raw_fd(),
                    hdrs.as_mut_ptr(),
                    64,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r > 0 {
                idle_since = None;
                for h in &hdrs[..r as usize] {
                    s.frames += 1;
                    s.bytes += u64::from(h.msg_len) + 42;
                }
            } else {
                if stop_r.load(Ordering::Relaxed) {
                    let t = *idle_since.get_or_insert_with(Instant::now);
                    if t.elapsed() > Duration::from_millis(200) {
                        break;
                    }
                }
                let mut pfd = libc::pollfd {
                    fd: rx.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 5) };
            }
        }
        s.cpu = thread_cpu() - c0;
        s
    });
    std::thread::sleep(Duration::from_millis(50));
    let txh = std::thread::spawn(move || {
        pin(0);
        let c0 = thread_cpu();
        let t0 = Instant::now();
        let mut s = Side::default();
        let mut buf = vec![0xABu8; payload];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: payload,
        };
        // SAFETY: mmsghdr is plain old data.
        let mut hdrs: Vec<libc::mmsghdr> = (0..64).map(|_| unsafe { std::mem::zeroed() }).collect();
        for h in hdrs.iter_mut() {
            h.msg_hdr.msg_iov = &mut iov;
            h.msg_hdr.msg_iovlen = 1;
        }
        while t0.elapsed().as_secs_f64() < secs {
            // SAFETY: all headers point at the one live payload buffer.
            let r = unsafe { libc::sendmmsg(tx.as_raw_fd(), hdrs.as_mut_ptr(), 64, 0) };
            if r > 0 {
                s.frames += r as u64;
                s.bytes += r as u64 * (payload as u64 + 42);
            }
        }
        s.cpu = thread_cpu() - c0;
        (s, t0.elapsed().as_secs_f64())
    });
    let (txs, el) = txh.join().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let rxs = rxh.join().unwrap_or_default();
    Result1 {
        tx: txs,
        rx: rxs,
        secs: el,
        drops: txs.frames.saturating_sub(rxs.frames),
    }
}

fn open(t: &Topology, host: usize, backend: &str) -> Result<Io, NicError> {
    let ip: IpAddr = t.host(host).ipv4.into();
    let ifname = t.host(host).ifname.clone();
    let backend = backend.to_string();
    t.run_in(host, move || -> Result<Io, NicError> {
        Ok(match backend.as_str() {
            "udp" => Box::new(UdpIo::bind(UdpConfig::new(SocketAddr::new(
                ip,
                ROCE_V2_PORT,
            )))?),
            "udp-nogso" => {
                let mut c = UdpConfig::new(SocketAddr::new(ip, ROCE_V2_PORT));
                c.gso = false;
                c.gro = false;
                Box::new(UdpIo::bind(c)?)
            }
            "udp-uring" => {
                let mut c = UdpConfig::new(SocketAddr::new(ip, ROCE_V2_PORT));
                c.uring = true;
                c.gso = false;
                c.gro = false;
                Box::new(UdpIo::bind(c)?)
            }
            "afpacket" => Box::new(AfPacketIo::open(AfPacketConfig::new(&ifname))?),
            "afpacket-v2" => {
                let mut c = AfPacketConfig::new(&ifname);
                c.rx_ring = RxRing::V2;
                c.rx_block_size = 64 << 10;
                c.rx_blocks = 256;
                Box::new(AfPacketIo::open(c)?)
            }
            "afxdp" => Box::new(AfXdpIo::open(AfXdpConfig::new(&ifname))?),
            other => return Err(NicError::Config(format!("unknown backend {other}"))),
        })
    })?
}

/// One frame A -> B, B answers, A waits (sleeping in poll, no busy loop):
/// round-trip times of `n` exchanges.
fn pingpong(a: Io, b: Io, ab: Vec<u8>, ba: Vec<u8>, n: usize) -> Vec<Duration> {
    let stop = Arc::new(AtomicBool::new(false));
    let stop_b = stop.clone();
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut b = b;
        while !stop_b.load(Ordering::Relaxed) {
            let _ = b.wait(Some(Duration::from_millis(20)));
            let mut got = 0;
            let _ = b.recv(64, &mut |_f: &[u8]| got += 1);
            for _ in 0..got {
                let _ = b.send_frames(&[&ba]);
            }
        }
    });
    let ping = std::thread::spawn(move || {
        pin(0);
        let mut a = a;
        let mut rtts = Vec::with_capacity(n);
        for _ in 0..n {
            let t0 = Instant::now();
            if a.send_frames(&[&ab]).unwrap_or(0) == 0 {
                continue;
            }
            let mut got = 0;
            while got == 0 && t0.elapsed() < Duration::from_millis(200) {
                let _ = a.wait(Some(Duration::from_millis(50)));
                got = a.recv(64, &mut |_f: &[u8]| {}).unwrap_or(0);
            }
            if got > 0 {
                rtts.push(t0.elapsed());
            }
        }
        rtts
    });
    let rtts = ping.join().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    rtts
}

fn baseline_pingpong(t: &Topology, n: usize) -> Vec<Duration> {
    let (a_ip, b_ip) = (t.host(0).ipv4, t.host(1).ipv4);
    let b = t
        .run_in(1, move || UdpSocket::bind((b_ip, ROCE_V2_PORT)))
        .expect("ns")
        .expect("bind");
    let a = t
        .run_in(0, move || UdpSocket::bind((a_ip, ROCE_V2_PORT)))
        .expect("ns")
        .expect("bind");
    b.set_read_timeout(Some(Duration::from_millis(100))).ok();
    a.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_b = stop.clone();
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut buf = [0u8; 2048];
        while !stop_b.load(Ordering::Relaxed) {
            if let Ok((len, from)) = b.recv_from(&mut buf) {
                let _ = b.send_to(&buf[..len], from);
            }
        }
    });
    pin(0);
    let mut rtts = Vec::with_capacity(n);
    let msg = [0u8; 64 - 42];
    let mut buf = [0u8; 2048];
    for _ in 0..n {
        let t0 = Instant::now();
        let _ = a.send_to(&msg, (b_ip, ROCE_V2_PORT));
        if a.recv(&mut buf).is_ok() {
            rtts.push(t0.elapsed());
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    rtts
}

fn latency_table(t: &Topology, backends: &[String]) {
    let (a, b) = (t.host(0).clone(), t.host(1).clone());
    let n = 2000;
    println!();
    println!("ping-pong, 64-byte frames, {n} round trips, sleeping in poll (no busy loop)");
    println!(
        "{:<12} {:>10} {:>10} {:>10}",
        "backend", "p50 us", "p99 us", "answered"
    );
    for be in backends {
        let mut rtts = if be == "baseline" {
            baseline_pingpong(t, n)
        } else {
            let mk = |from: &ferroce_nic::netns::Host, to: &ferroce_nic::netns::Host| {
                let spec = HeaderSpec {
                    dst_mac: to.mac,
                    src_mac: from.mac,
                    src: SocketAddr::new(from.ipv4.into(), ROCE_V2_PORT),
                    dst: SocketAddr::new(to.ipv4.into(), ROCE_V2_PORT),
                    tos: 0,
                    ttl: 64,
                };
                build_udp_frame(&spec, &[0u8; 64 - 42]).expect("frame")
            };
            let (ta, tb) = match (open(t, 0, be), open(t, 1, be)) {
                (Ok(x), Ok(y)) => (x, y),
                (Err(e), _) | (_, Err(e)) => {
                    println!("{be:<12} unavailable: {e}");
                    continue;
                }
            };
            pingpong(ta, tb, mk(&a, &b), mk(&b, &a), n)
        };
        rtts.sort();
        let q = |p: f64| {
            rtts.get(((rtts.len() as f64 * p) as usize).min(rtts.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e6)
        };
        println!(
            "{:<12} {:>10.1} {:>10.1} {:>10}",
            be,
            q(0.5),
            q(0.99),
            rtts.len()
        );
    }
}

fn main() {
    if !ferroce_nic::is_root() {
        eprintln!("nic_bench needs root (network namespaces)");
        std::process::exit(2);
    }
    let args: Vec<String> = std::env::args().collect();
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let backends: Vec<String> = args
        .get(2)
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| {
            [
                "baseline",
                "udp",
                "udp-nogso",
                "udp-uring",
                "afpacket",
                "afpacket-v2",
                "afxdp",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        });
    let sizes: Vec<usize> = args
        .get(3)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 1024, 4096]);
    let t = Topology::up(&TopologyConfig::default()).expect("topology");
    if std::env::var_os("LATENCY_ONLY").is_some() {
        latency_table(&t, &backends);
        return;
    }
    let (a, b) = (t.host(0).clone(), t.host(1).clone());
    println!(
        "{:<10} {:>6} {:>10} {:>9} {:>8} {:>9} {:>10} {:>10} {:>8}",
        "backend", "frame", "rx Mpps", "Gbit/s", "x base", "loss %", "tx ns/f", "rx ns/f", "drops"
    );
    for &size in &sizes {
        let mut base_pps = None;
        for be in &backends {
            let r = if be == "baseline" {
                run_baseline(&t, size - header_len(false), secs)
            } else {
                let spec = HeaderSpec {
                    dst_mac: b.mac,
                    src_mac: a.mac,
                    src: SocketAddr::new(a.ipv4.into(), 0xC001),
                    dst: SocketAddr::new(b.ipv4.into(), ROCE_V2_PORT),
                    tos: 0,
                    ttl: 64,
                };
                let frame =
                    build_udp_frame(&spec, &vec![0xABu8; size - header_len(false)]).expect("frame");
                let (tx, rx) = match (open(&t, 0, be), open(&t, 1, be)) {
                    (Ok(tx), Ok(rx)) => (tx, rx),
                    (Err(e), _) | (_, Err(e)) => {
                        println!("{be:<10} {size:>6} unavailable: {e}");
                        continue;
                    }
                };
                run_io(tx, rx, frame, secs)
            };
            let pps = r.rx.frames as f64 / r.secs;
            if be == "baseline" {
                base_pps = Some(pps);
            }
            let ratio = base_pps.map_or("-".to_string(), |b| format!("{:.2}", pps / b));
            let loss = if r.tx.frames > 0 {
                100.0 * (r.tx.frames.saturating_sub(r.rx.frames)) as f64 / r.tx.frames as f64
            } else {
                0.0
            };
            let per = |s: &Side| {
                if s.frames == 0 {
                    0.0
                } else {
                    s.cpu.as_nanos() as f64 / s.frames as f64
                }
            };
            println!(
                "{:<10} {:>6} {:>10.3} {:>9.2} {:>8} {:>9.1} {:>10.0} {:>10.0} {:>8}",
                be,
                size,
                pps / 1e6,
                r.rx.bytes as f64 * 8.0 / r.secs / 1e9,
                ratio,
                loss,
                per(&r.tx),
                per(&r.rx),
                r.drops
            );
        }
    }
    if std::env::var_os("NO_LATENCY").is_none() {
        latency_table(&t, &backends);
    }
}
