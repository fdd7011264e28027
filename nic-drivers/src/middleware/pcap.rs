//! Records every frame a backend sends or receives into a pcap file
//! (LINKTYPE_ETHERNET), like smoltcp's `PcapWriter` middleware. Open the file
//! with tshark/wireshark: RoCE v2 on UDP 4791 dissects as InfiniBand.

use std::io::Write;
use std::os::fd::RawFd;
use std::time::{SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapPacket, PcapWriter};

use crate::{NicError, PacketIo, RxSink, Stats, TxFill};

/// Which directions to record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcapMode {
    /// Received and sent frames.
    Both,
    /// Received frames only.
    RxOnly,
    /// Sent frames only.
    TxOnly,
}

/// A [`PacketIo`] wrapper that copies every frame into a pcap stream.
pub struct PcapIo<I, W: Write> {
    inner: I,
    writer: PcapWriter<W>,
    mode: PcapMode,
    // First write error, reported on the next call (recv/transmit must not
    // lose frames because the capture disk is full).
    error: Option<String>,
}

impl<I: std::fmt::Debug, W: Write> std::fmt::Debug for PcapIo<I, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PcapIo")
            .field("inner", &self.inner)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

fn now() -> std::time::Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl<I: PacketIo, W: Write + Send> PcapIo<I, W> {
    /// Wraps `inner`, writing the pcap global header to `out` at once.
    pub fn new(inner: I, out: W, mode: PcapMode) -> Result<Self, NicError> {
        let writer = PcapWriter::new(out).map_err(|e| NicError::Pcap(e.to_string()))?;
        Ok(PcapIo {
            inner,
            writer,
            mode,
            error: None,
        })
    }

    /// The wrapped backend.
    pub fn inner(&mut self) -> &mut I {
        &mut self.inner
    }

    /// Returns the writer (flush it yourself if it buffers).
    pub fn into_writer(self) -> W {
        self.writer.into_writer()
    }

    fn take_error(&mut self) -> Result<(), NicError> {
        match self.error.take() {
            Some(e) => Err(NicError::Pcap(e)),
            None => Ok(()),
        }
    }
}

fn record<W: Write>(w: &mut PcapWriter<W>, err: &mut Option<String>, frame: &[u8]) {
    let p = PcapPacket::new(now(), frame.len() as u32, frame);
    if let Err(e) = w.write_packet(&p) {
        err.get_or_insert(e.to_string());
    }
}

impl<I: PacketIo, W: Write + Send> PacketIo for PcapIo<I, W> {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn max_frame_len(&self) -> usize {
        self.inner.max_frame_len()
    }
    fn mac(&self) -> [u8; 6] {
        self.inner.mac()
    }
    fn recv(&mut self, max: usize, sink: &mut RxSink<'_>) -> Result<usize, NicError> {
        self.take_error()?;
        if self.mode == PcapMode::TxOnly {
            return self.inner.recv(max, sink);
        }
        let (w, err) = (&mut self.writer, &mut self.error);
        self.inner.recv(max, &mut |f: &[u8]| {
            record(w, err, f);
            sink(f);
        })
    }
    fn transmit(&mut self, max: usize, fill: &mut TxFill<'_>) -> Result<usize, NicError> {
        self.take_error()?;
        if self.mode == PcapMode::RxOnly {
            return self.inner.transmit(max, fill);
        }
        let (w, err) = (&mut self.writer, &mut self.error);
        self.inner.transmit(max, &mut |buf: &mut [u8]| {
            let n = fill(buf)?;
            if let Some(f) = buf.get(..n) {
                record(w, err, f);
            }
            Some(n)
        })
    }
    fn poll_fd(&self) -> RawFd {
        self.inner.poll_fd()
    }
    fn second_poll_fd(&self) -> Option<RawFd> {
        self.inner.second_poll_fd()
    }
    fn set_busy_poll(&mut self, on: bool) -> Result<(), NicError> {
        self.inner.set_busy_poll(on)
    }
    fn qpn_prefix(&self) -> Option<u8> {
        self.inner.qpn_prefix()
    }
    fn leave_shared(&mut self) {
        self.inner.leave_shared()
    }
    fn join_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.inner.join_multicast(group)
    }
    fn leave_multicast(&mut self, group: std::net::IpAddr) -> Result<(), NicError> {
        self.inner.leave_multicast(group)
    }
    fn stats(&self) -> Stats {
        self.inner.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem;

    #[test]
    fn records_both_directions() {
        let (a, mut b) = mem::pair().unwrap();
        let mut a = PcapIo::new(a, Vec::new(), PcapMode::Both).unwrap();
        let mut f = vec![0u8; 60];
        f[0..6].copy_from_slice(&b.mac());
        a.send_frames(&[&f, &f]).unwrap();
        b.send_frames(&[&f[..]]).unwrap();
        let mut got = Vec::new();
        a.recv_owned(8, &mut got).unwrap();
        b.recv_owned(8, &mut got).unwrap();
        let bytes = a.into_writer();
        let mut r = pcap_file::pcap::PcapReader::new(&bytes[..]).unwrap();
        let mut n = 0;
        while let Some(p) = r.next_packet() {
            assert_eq!(p.unwrap().data.len(), 60);
            n += 1;
        }
        assert_eq!(n, 3, "2 sent + 1 received by a");
    }
}
