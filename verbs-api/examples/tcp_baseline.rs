//! Kernel TCP baselines for `scripts/bench-verbs.sh`, measured the way the
//! ferroce benches measure: a stream for bandwidth and a one-message-at-a-time
//! ping-pong (TCP_NODELAY) for latency, reported as one JSON line.
//!
//! `tcp_baseline server PORT` / `tcp_baseline stream HOST PORT SIZE SECS` /
//! `tcp_baseline pingpong HOST PORT SIZE ITERS`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize, d: u64| arg(i).parse().unwrap_or(d);
    let r = match arg(1).as_str() {
        "server" => server(num(2, 18600) as u16),
        "stream" => stream(
            &arg(2),
            num(3, 18600) as u16,
            num(4, 65536) as usize,
            num(5, 3),
        ),
        "pingpong" => pingpong(
            &arg(2),
            num(3, 18600) as u16,
            num(4, 8) as usize,
            num(5, 10000),
        ),
        _ => {
            eprintln!("usage: tcp_baseline server PORT | stream HOST PORT SIZE SECS | pingpong HOST PORT SIZE ITERS");
            std::process::exit(2)
        }
    };
    if let Err(e) = r {
        eprintln!("tcp_baseline: {e}");
        std::process::exit(1);
    }
}

/// Serves one connection: the first byte says which test (b'S' stream, b'P' ping-pong).
fn server(port: u16) -> std::io::Result<()> {
    let l = TcpListener::bind(("0.0.0.0", port))?;
    for conn in l.incoming().take(2) {
        let mut c = conn?;
        c.set_nodelay(true)?;
        let mut kind = [0u8; 9];
        c.read_exact(&mut kind)?;
        let size = u64::from_be_bytes(kind[1..9].try_into().unwrap_or_default()) as usize;
        let mut buf = vec![0u8; size.max(1)];
        match kind[0] {
            b'S' => while c.read(&mut buf)? > 0 {},
            _ => loop {
                if c.read_exact(&mut buf).is_err() {
                    break;
                }
                c.write_all(&buf)?;
            },
        }
    }
    Ok(())
}

fn connect(host: &str, port: u16, kind: u8, size: usize) -> std::io::Result<TcpStream> {
    let mut c = TcpStream::connect((host, port))?;
    c.set_nodelay(true)?;
    let mut hdr = vec![kind];
    hdr.extend_from_slice(&(size as u64).to_be_bytes());
    c.write_all(&hdr)?;
    Ok(c)
}

fn stream(host: &str, port: u16, size: usize, secs: u64) -> std::io::Result<()> {
    let mut c = connect(host, port, b'S', size)?;
    let buf = vec![0x5au8; size];
    let t = Instant::now();
    let mut bytes = 0u64;
    while t.elapsed() < Duration::from_secs(secs) {
        c.write_all(&buf)?;
        bytes += size as u64;
    }
    c.shutdown(std::net::Shutdown::Write)?;
    let mut sink = [0u8; 1];
    let _ = c.read(&mut sink);
    let s = t.elapsed().as_secs_f64();
    println!(
        "{{\"test\":\"tcp_stream\",\"bytes\":{bytes},\"seconds\":{s},\"gbit_s\":{}}}",
        bytes as f64 * 8.0 / s / 1e9
    );
    Ok(())
}

fn pingpong(host: &str, port: u16, size: usize, iters: u64) -> std::io::Result<()> {
    let mut c = connect(host, port, b'P', size)?;
    let mut buf = vec![0x5au8; size];
    let mut lat = Vec::with_capacity(iters as usize);
    for _ in 0..iters {
        let t = Instant::now();
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let med = lat[lat.len() / 2];
    let avg = lat.iter().sum::<f64>() / lat.len() as f64;
    println!(
        "{{\"test\":\"tcp_pingpong\",\"size\":{size},\"iters\":{iters},\"rtt_median_us\":{med},\"rtt_avg_us\":{avg},\"half_rtt_median_us\":{}}}",
        med / 2.0
    );
    Ok(())
}
