//! A man in the middle of perftest's TCP exchange that corrupts the RKey of one side's key
//! messages: the other side then issues RDMA operations with a key the target never issued, so
//! stock tools that cannot be told to use a bad rkey still produce one (error interop).
//!
//! Run it inside the lab namespace (`ferroce-interop rkey-proxy ...` under `ip netns exec`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

/// Whose key messages get the bad rkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Side {
    /// The server's (the listening tool): the client then uses a bad rkey.
    Server,
    /// The client's: the server side then uses a bad rkey (READ/WRITE from a server never
    /// happens in perftest, so this is for bidirectional tests).
    Client,
}

/// `KEY_PRINT_FMT_GID` is `%04x:%04x:%06x:%06x:%08x:%016llx:` then GID bytes: the colons sit at
/// these offsets and the RKey is the 8 hex digits at 24..32.
const COLONS: [usize; 6] = [4, 9, 16, 23, 32, 49];
const KEY_LEN: usize = 108;
const RKEY: std::ops::Range<usize> = 24..32;

/// Where `buf` holds a perftest GID key message, patches its RKey (xor `mask`); returns the
/// (old, new) keys patched.
pub fn patch_rkeys(buf: &mut [u8], mask: u32) -> Vec<(u32, u32)> {
    let mut patched = Vec::new();
    let mut i = 0;
    while i + KEY_LEN <= buf.len() {
        if is_key_message(&buf[i..i + KEY_LEN]) {
            let field = &buf[i + RKEY.start..i + RKEY.end];
            let old = std::str::from_utf8(field)
                .ok()
                .and_then(|t| u32::from_str_radix(t, 16).ok());
            if let Some(old) = old {
                let new = old ^ mask;
                buf[i + RKEY.start..i + RKEY.end].copy_from_slice(format!("{new:08x}").as_bytes());
                patched.push((old, new));
            }
            i += KEY_LEN;
        } else {
            i += 1;
        }
    }
    patched
}

fn is_key_message(m: &[u8]) -> bool {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    (0..49).all(|k| {
        if COLONS.contains(&k) {
            m[k] == b':'
        } else {
            hex(m[k])
        }
    }) && m[KEY_LEN - 1] == 0
}

/// Accepts one connection on `listen`, connects to `upstream`, and relays both ways until
/// both close, patching the rkeys in key messages sent by `corrupt`. Logs patches to stderr.
pub fn rkey_proxy(
    listen: SocketAddr,
    upstream: SocketAddr,
    corrupt: Side,
    mask: u32,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(listen)?;
    eprintln!("rkey-proxy: listening on {listen}, relaying to {upstream}");
    let (client, peer) = listener.accept()?;
    eprintln!("rkey-proxy: client {peer}");
    let server = TcpStream::connect_timeout(&upstream, Duration::from_secs(30))?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (c2, s2) = (client.try_clone()?, server.try_clone()?);
    let up = std::thread::spawn(move || relay(client, s2, corrupt == Side::Client, mask, "c→s"));
    let down = relay(server, c2, corrupt == Side::Server, mask, "s→c");
    let up = up.join().unwrap_or(Ok(()));
    down.and(up)
}

fn relay(
    mut from: TcpStream,
    mut to: TcpStream,
    patch: bool,
    mask: u32,
    what: &str,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if patch {
            for (old, new) in patch_rkeys(&mut buf[..n], mask) {
                eprintln!("rkey-proxy: {what}: rkey {old:#010x} -> {new:#010x}");
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_only_key_messages() {
        let msg = "0000:0010:000011:a1b2c3:00001234:00007f0000001000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0a:00000000:";
        let mut wire = vec![0u8; 10];
        wire.extend_from_slice(msg.as_bytes());
        wire.resize(10 + KEY_LEN, 0);
        wire.extend_from_slice(b"done\0");
        let mut patched = wire.clone();
        let p = patch_rkeys(&mut patched, 0x00ff_0000);
        assert_eq!(p, vec![(0x1234, 0x00ff_1234)]);
        assert_eq!(&patched[10 + 24..10 + 32], b"00ff1234");
        assert_eq!(patched[..34], wire[..34]);
        assert_eq!(patched[42..], wire[42..]);
        // Not a key message: untouched.
        let mut other = b"6.19\0\0\0\0\0\0\0\0\0\0\0\0".to_vec();
        assert!(patch_rkeys(&mut other, 1).is_empty());
    }
}
