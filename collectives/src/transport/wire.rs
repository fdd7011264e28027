//! What the RDMA backends agree on, so ranks on different backends (ferroce
//! and rdma-core's libibverbs) join one job: the rendezvous blob that
//! carries each rank's GID and, per peer, the QP number, initial PSN, receive
//! ring address and rkey; the initial PSNs; and the immediate of a data chunk
//! (length in the low 24 bits, piggybacked credits in the top 8).
//!
//! Blob layout (big-endian): the rank's 16-byte GID, then one 20-byte entry
//! per world rank (its own is zero): QPN u32, PSN u32, ring address u64,
//! rkey u32.

use crate::error::{Error, Result};
use crate::transport::rdma::RdmaConfig;

/// Bytes of one per-peer entry of the blob.
const ENTRY: usize = 20;
/// The chunk length lives in the immediate's low 24 bits.
pub(crate) const MAX_CHUNK: usize = 8 << 20;
/// Piggybacked credits live in its top 8 bits.
pub(crate) const MAX_SLOTS: usize = 255;
pub(crate) const LEN_MASK: u32 = 0x00ff_ffff;
/// PSNs are 24 bits (IBTA BTH).
const PSN_MASK: u32 = 0x00ff_ffff;

/// The transport settings both backends accept.
pub(crate) fn check_config(cfg: &RdmaConfig) -> Result<()> {
    if cfg.chunk == 0 || cfg.chunk > MAX_CHUNK || cfg.slots < 2 || cfg.slots > MAX_SLOTS {
        return Err(Error::Invalid(format!(
            "RDMA transport needs chunk in 1..=8 MiB and 2..=255 slots, got {cfg:?}"
        )));
    }
    Ok(())
}

/// The initial PSN of the QP of rank `from` towards rank `to`.
pub(crate) fn psn_for(seed: u32, from: usize, to: usize) -> u32 {
    (seed
        .wrapping_mul(2_654_435_761)
        .wrapping_add((from as u32).wrapping_mul(7919))
        .wrapping_add((to as u32).wrapping_mul(104_729)))
        & PSN_MASK
}

/// The immediate of a data chunk of `len` bytes returning `credits`.
pub(crate) fn data_imm(len: usize, credits: u32) -> u32 {
    len as u32 | (credits << 24)
}

/// (chunk length, credits returned) of a data chunk's immediate.
pub(crate) fn split_imm(imm: u32) -> (u32, usize) {
    (imm & LEN_MASK, (imm >> 24) as usize)
}

/// One side of a connection, as announced to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpAddr {
    pub qpn: u32,
    pub psn: u32,
    /// Address and rkey of the receive ring the peer writes into.
    pub addr: u64,
    pub rkey: u32,
}

/// The blob of a rank with GID `gid`: `entries[j]` is its side of the connection to rank `j`.
pub(crate) fn encode(gid: [u8; 16], entries: &[Option<QpAddr>]) -> Vec<u8> {
    let mut blob = Vec::with_capacity(16 + ENTRY * entries.len());
    blob.extend_from_slice(&gid);
    for e in entries {
        let e = e.unwrap_or(QpAddr {
            qpn: 0,
            psn: 0,
            addr: 0,
            rkey: 0,
        });
        blob.extend_from_slice(&e.qpn.to_be_bytes());
        blob.extend_from_slice(&e.psn.to_be_bytes());
        blob.extend_from_slice(&e.addr.to_be_bytes());
        blob.extend_from_slice(&e.rkey.to_be_bytes());
    }
    blob
}

fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_be_bytes)
}
fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_be_bytes)
}

/// What rank `j` announced (in `all`, the rendezvous result) for its
/// connection to rank `me`: its GID and its side of the connection.
pub(crate) fn remote(
    all: &[Vec<u8>],
    j: usize,
    me: usize,
    size: usize,
) -> Result<([u8; 16], QpAddr)> {
    let theirs = all
        .get(j)
        .ok_or_else(|| Error::RendezvousProtocol(format!("no rendezvous blob from rank {j}")))?;
    let bad = || {
        Error::RendezvousProtocol(format!(
            "rank {j} sent a {}-byte address blob, {} expected",
            theirs.len(),
            16 + ENTRY * size
        ))
    };
    if theirs.len() != 16 + ENTRY * size {
        return Err(bad());
    }
    let gid: [u8; 16] = theirs
        .get(0..16)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(bad)?;
    let at = 16 + ENTRY * me;
    let a = QpAddr {
        qpn: be_u32(theirs, at).ok_or_else(bad)?,
        psn: be_u32(theirs, at + 4).ok_or_else(bad)?,
        addr: be_u64(theirs, at + 8).ok_or_else(bad)?,
        rkey: be_u32(theirs, at + 16).ok_or_else(bad)?,
    };
    if a.psn > PSN_MASK {
        return Err(Error::RendezvousProtocol(format!(
            "rank {j} announced PSN {:#x}, wider than 24 bits",
            a.psn
        )));
    }
    Ok((gid, a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trip() {
        let gid = std::net::Ipv4Addr::new(10, 77, 0, 1)
            .to_ipv6_mapped()
            .octets();
        let e = QpAddr {
            qpn: 0x11,
            psn: 0xabcdef,
            addr: 0x7f00_1234_5678,
            rkey: 0x1234,
        };
        let blob = encode(gid, &[Some(e), None, Some(e)]);
        assert_eq!(blob.len(), 16 + 3 * ENTRY);
        let all = vec![blob.clone(), vec![0; 16 + 3 * ENTRY], blob];
        assert_eq!(remote(&all, 0, 2, 3).unwrap(), (gid, e));
        assert!(remote(&all, 0, 2, 4).is_err(), "size mismatch is refused");
        let mut wide = encode(gid, &[Some(QpAddr { psn: 1 << 24, ..e })]);
        wide.truncate(16 + ENTRY);
        assert!(remote(&[wide], 0, 0, 1).is_err(), "PSN over 24 bits");
    }

    #[test]
    fn immediate() {
        assert_eq!(split_imm(data_imm(65536, 3)), (65536, 3));
        assert_eq!(split_imm(data_imm(MAX_CHUNK, 255)), (MAX_CHUNK as u32, 255));
    }
}
