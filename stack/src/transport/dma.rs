//! Copies between a message and a scatter/gather list (rxe: rxe_mr.c copy_data).
//! Every element is checked against its region (lkey, PD, bounds, and
//! LOCAL_WRITE when the core writes) before a byte moves.

use super::mr::{AccessError, AccessFlags, MrTable, PdHandle};
use super::split::TxPayload;
use super::wqe::Sge;

/// Walk the SGEs covering `len` bytes at message offset `offset`, calling
/// `f(sge, offset_in_sge, n, offset_in_chunk)` for each piece.
fn walk(
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    mut f: impl FnMut(&Sge, u64, usize, usize) -> Result<(), AccessError>,
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let sl = u64::from(sge.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        let n = ((sl - offset) as usize).min(len - done);
        f(sge, offset, n, done)?;
        done += n;
        offset = 0;
    }
    if done < len {
        return Err(AccessError::Bounds);
    }
    Ok(())
}

/// Fill `dst` with the message bytes at `offset` gathered from `sges`.
pub fn gather(
    mrs: &MrTable,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), AccessError> {
    let len = dst.len();
    walk(sges, offset, len, |sge, off, n, at| {
        let va = sge.addr.checked_add(off).ok_or(AccessError::Bounds)?;
        let (mr, roff) = mrs.check_ref(sge.lkey, pd, va, n as u64, AccessFlags::NONE)?;
        mr.region
            .read(roff, &mut dst[at..at + n])
            .map_err(|_| AccessError::Bounds)
    })
}

/// Store `src` at message offset `offset` into `sges`.
pub fn scatter(
    mrs: &mut MrTable,
    pd: PdHandle,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), AccessError> {
    walk(sges, offset, src.len(), |sge, off, n, at| {
        let va = sge.addr.checked_add(off).ok_or(AccessError::Bounds)?;
        let (mr, roff) = mrs.check(sge.lkey, pd, va, n as u64, AccessFlags::LOCAL_WRITE)?;
        mr.region
            .write(roff, &src[at..at + n])
            .map_err(|_| AccessError::Bounds)
    })
}

/// The `len` message bytes at `offset` where they lie, when they are one
/// piece of one region that offers them in place
/// ([`MemoryRegion::as_slice`](super::mr::MemoryRegion::as_slice)) and the
/// access checks pass; `None` sends the caller to [`gather`], which also
/// reports any access error.
pub fn in_place<'m>(
    mrs: &'m MrTable,
    pd: PdHandle,
    sges: &[Sge],
    mut offset: u64,
    len: usize,
) -> Option<(TxPayload, &'m [u8])> {
    for sge in sges {
        let sl = u64::from(sge.length);
        if offset >= sl {
            offset -= sl;
            continue;
        }
        if sl - offset < len as u64 {
            return None;
        }
        let va = sge.addr.checked_add(offset)?;
        let (mr, roff) = mrs
            .check_ref(sge.lkey, pd, va, len as u64, AccessFlags::NONE)
            .ok()?;
        let bytes = mr.region.as_slice(roff, len)?;
        let at = TxPayload {
            lkey: sge.lkey,
            offset: roff,
            len,
        };
        return Some((at, bytes));
    }
    None
}
