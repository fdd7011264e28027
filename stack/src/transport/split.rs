//! Frames whose payload stays in its memory region: a backend that hands
//! the payload to the kernel where it lies (the UDP socket's gather send)
//! asks the core for frames in two parts around it, so the only copy of the
//! payload is the kernel's.

/// Where a split frame's payload lies: `len` bytes at `offset` in the
/// region whose local key is `lkey`. [`Core::tx_payload`](super::Core::tx_payload)
/// turns it into the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxPayload {
    pub lkey: u32,
    pub offset: u64,
    pub len: usize,
}

/// A frame from [`Core::poll_transmit_split`](super::Core::poll_transmit_split):
/// on the wire it is `buf[..head]`, then the payload, then
/// `buf[head..head + tail]` (pad and ICRC). Without a payload the whole
/// frame is `buf[..head]` and `tail` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxSplit {
    pub head: usize,
    pub tail: usize,
    pub payload: Option<TxPayload>,
}

/// The core's side of one transmit call: whether the frame may be split,
/// and the split it was written as.
#[derive(Debug, Default)]
pub(crate) struct SplitState {
    pub allowed: bool,
    pub out: Option<TxSplit>,
}
