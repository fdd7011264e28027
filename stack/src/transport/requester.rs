//! The requester: turns send queue entries into request packets (rxe: rxe_req.c).
//!
//! One packet per call. A WQE is started (PSNs assigned) when the fence, the
//! READ/atomic credit (max_rd_atomic) and the window of unacknowledged PSNs
//! allow; SEND/WRITE are cut into path-MTU packets with AckReq on the last,
//! every [`ACK_EVERY`] packets and on the one that fills the window, which
//! holds before every packet, inside a message too; a READ takes one request
//! packet and as many PSNs as it will have responses.

use crate::wire::{atomic_eth, deth, ieth, immdt, reth, ExtHeaders, Opcode, PacketRepr};

use super::counters::HwCounter;
use super::device::Ctx;
use super::dma;
use super::psn;
use super::qp::{Qp, QpState, QpType};
use super::split::TxSplit;
use super::timers::{local_ack_timeout, Timer};
use super::wqe::{SendOp, WcStatus, WqeState};

/// Ask for an ACK at least this often inside a long message (rxe: RXE_MAX_PKT_PER_ACK).
pub const ACK_EVERY: u32 = 64;

/// Packets a message of `len` bytes takes (a zero-byte message still takes one).
pub fn packets(len: u64, mtu: u64) -> u32 {
    if len == 0 {
        1
    } else {
        len.div_ceil(mtu) as u32
    }
}

enum Start {
    Go,
    Wait,
}

/// The request opcode for a packet of `op` at this position in its message.
fn request_opcode(t: QpType, op: &SendOp, first: bool, last: bool) -> Opcode {
    let base = match t {
        QpType::Rc => 0x00,
        QpType::Uc => 0x20,
        QpType::Ud => {
            return match op {
                SendOp::SendWithImm { .. } => Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                _ => Opcode::UD_SEND_ONLY,
            }
        }
    };
    // Offsets within the RC/UC opcode block (IBTA table 38).
    let code: u8 = match (op, first, last) {
        (SendOp::RdmaRead { .. }, _, _) => 0x0c,
        (SendOp::AtomicCmpSwp { .. }, _, _) => 0x13,
        (SendOp::AtomicFetchAdd { .. }, _, _) => 0x14,
        (SendOp::Send, true, true) => 0x04,
        (SendOp::SendWithImm { .. }, true, true) => 0x05,
        (SendOp::SendWithInv { .. }, true, true) => 0x17,
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, true, false) => {
            0x00
        }
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, false, false) => {
            0x01
        }
        (SendOp::Send, false, true) => 0x02,
        (SendOp::SendWithImm { .. }, false, true) => 0x03,
        (SendOp::SendWithInv { .. }, false, true) => 0x16,
        (SendOp::RdmaWrite { .. }, true, true) => 0x0a,
        (SendOp::RdmaWriteWithImm { .. }, true, true) => 0x0b,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, true, false) => 0x06,
        (SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }, false, false) => 0x07,
        (SendOp::RdmaWrite { .. }, false, true) => 0x08,
        (SendOp::RdmaWriteWithImm { .. }, false, true) => 0x09,
    };
    Opcode(base | code)
}

impl Qp {
    /// Write the next request packet into `buf`; `None` when there is nothing to send now.
    pub(crate) fn poll_request(&mut self, buf: &mut [u8], ctx: &mut Ctx<'_>) -> Option<usize> {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) || self.timers.is_armed(Timer::Rnr) {
            return None;
        }
        loop {
            let idx = self.req.next;
            if idx >= self.sq.tail {
                return None;
            }
            match self.sq.at(idx).state {
                WqeState::Pending => {
                    self.req.next += 1;
                    continue;
                }
                WqeState::Posted => {
                    // SQD: finish what is started, start nothing new (IBTA 10.3.1.2.3).
                    if self.state == QpState::Sqd {
                        return None;
                    }
                    match self.start_wqe(idx, ctx) {
                        Some(Start::Go) => {}
                        Some(Start::Wait) => return None,
                        None => return None,
                    }
                }
                WqeState::Processing => {
                    // The window holds inside a message too, as rxe checks it
                    // before every packet: an 8 MiB WRITE sent whole into a
                    // TCG VM overflowed its receive queue and went out ~3 times.
                    if self.window_full(ctx) {
                        return None;
                    }
                }
            }
            return self.emit_request(idx, buf, ctx);
        }
    }

    /// Assign PSNs to a posted WQE if nothing holds it back. `None` = it failed.
    fn start_wqe(&mut self, idx: u64, ctx: &mut Ctx<'_>) -> Option<Start> {
        let (op, fence, len) = {
            let w = self.sq.at(idx);
            (w.op, w.flags.fence, w.len)
        };
        if fence {
            // IBV_SEND_FENCE: wait for every earlier READ/atomic to complete.
            let blocked = (self.sq.head..idx).any(|i| self.sq.at(i).op.is_read_or_atomic());
            if blocked {
                return Some(Start::Wait);
            }
        }
        if self.qp_type == QpType::Rc {
            if op.is_read_or_atomic() && self.req.rd_atomic >= self.attr.max_rd_atomic {
                return Some(Start::Wait);
            }
            if self.window_full(ctx) {
                return Some(Start::Wait);
            }
        }
        if self.qp_type == QpType::Ud && len > self.mtu() {
            // One MTU per UD message (IBTA C10-4); rxe fails the WR locally.
            self.fail_send(idx, WcStatus::LocLenErr, ctx);
            return None;
        }
        let n = if op.is_atomic() {
            1
        } else {
            packets(len, self.mtu())
        };
        let first = self.req.psn;
        let w = self.sq.at_mut(idx);
        w.first_psn = first;
        w.last_psn = psn::add(first, n - 1);
        w.state = WqeState::Processing;
        w.sent = 0;
        if op.is_read_or_atomic() && !w.rd_counted {
            w.rd_counted = true;
            self.req.rd_atomic += 1;
        }
        Some(Start::Go)
    }

    /// An RC requester has as many PSNs out unacknowledged as it may
    /// (rxe: RXE_MAX_UNACKED_PSNS).
    fn window_full(&self, ctx: &Ctx<'_>) -> bool {
        self.window_full_at(self.req.psn, ctx)
    }

    /// The window would be full with `next_psn` the next PSN to send.
    fn window_full_at(&self, next_psn: u32, ctx: &Ctx<'_>) -> bool {
        self.qp_type == QpType::Rc
            && psn::diff(next_psn, self.req.comp_psn) >= ctx.cfg.max_unacked_psns as i32
    }

    fn emit_request(&mut self, idx: u64, buf: &mut [u8], ctx: &mut Ctx<'_>) -> Option<usize> {
        let mtu = self.mtu();
        let (op, len, sent, flags, ud) = {
            let w = self.sq.at(idx);
            (w.op, w.len, w.sent, w.flags, w.ud)
        };
        let mut repr: PacketRepr = match ud {
            Some(d) if self.qp_type == QpType::Ud => {
                let mut r = d.path.packet_template(self.qpn, d.remote_qpn);
                if d.path.udp_sport.is_none() {
                    r.udp_src_port = super::qp::ud_udp_sport(self.qpn);
                }
                r
            }
            _ => self.hdr,
        };
        // The PSN follows from the WQE and the offset, so header and data
        // always agree whatever path led here (first send or any retry).
        let first_psn = self.sq.at(idx).first_psn;
        let psn_now = psn::add(first_psn, (sent / mtu) as u32);
        repr.bth.psn = psn_now;
        let mut ext = ExtHeaders::default();
        let (payload_len, first, last, consumed) = match op {
            SendOp::RdmaRead { remote_addr, rkey } => {
                let remaining = len - sent;
                ext.reth = Some(reth::Repr {
                    va: remote_addr.wrapping_add(sent),
                    rkey,
                    dma_len: remaining as u32,
                });
                (0usize, true, true, packets(remaining, mtu))
            }
            SendOp::AtomicCmpSwp {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                (0, true, true, 1)
            }
            SendOp::AtomicFetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                (0, true, true, 1)
            }
            _ => {
                let n = (len - sent).min(mtu) as usize;
                let first = sent == 0;
                let last = sent + n as u64 == len;
                if first {
                    if let SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } = op
                    {
                        ext.reth = Some(reth::Repr {
                            va: remote_addr,
                            rkey,
                            dma_len: len as u32,
                        });
                    }
                }
                if last {
                    match op {
                        SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                            ext.immdt = Some(immdt::Repr { imm })
                        }
                        SendOp::SendWithInv { invalidate_rkey } => {
                            ext.ieth = Some(ieth::Repr {
                                rkey: invalidate_rkey,
                            })
                        }
                        _ => {}
                    }
                }
                (n, first, last, 1)
            }
        };
        if let Some(d) = ud {
            let qkey = if d.remote_qkey & 0x8000_0000 != 0 {
                self.attr.qkey
            } else {
                d.remote_qkey
            };
            ext.deth = Some(deth::Repr {
                qkey,
                src_qp: self.qpn,
            });
        }
        repr.bth.opcode = request_opcode(self.qp_type, &op, first, last);
        repr.bth.solicited = last && flags.solicited;
        // The packet that fills the window asks too, else with a window
        // that is no multiple of ACK_EVERY the requester would wait for its
        // ACK time-out.
        let fills_window = self.window_full_at(psn::add(psn_now, consumed), ctx);
        let want_ack = (last && self.ack_wanted(&op, flags.signaled, ctx))
            || self.req.noack_pkts + 1 >= ACK_EVERY
            || fills_window;
        repr.bth.ack_req = self.qp_type == QpType::Rc && want_ack;
        repr.ext = ext;

        let mut copy_err = None;
        let w = self.sq.at(idx);
        let in_place = if ctx.split.allowed && !flags.inline && payload_len > 0 {
            dma::in_place(ctx.mrs, self.pd, &w.sges, sent, payload_len)
        } else {
            None
        };
        let emitted = if let Some((at, bytes)) = in_place {
            repr.emit_split(buf, bytes).map(|(head, tail)| {
                ctx.split.out = Some(TxSplit {
                    head,
                    tail,
                    payload: Some(at),
                });
                head + tail
            })
        } else {
            repr.emit_with(buf, payload_len, |dst| {
                let r = if flags.inline {
                    match w.inline.get(sent as usize..sent as usize + dst.len()) {
                        Some(src) => {
                            dst.copy_from_slice(src);
                            Ok(())
                        }
                        None => Err(super::mr::AccessError::Bounds),
                    }
                } else {
                    dma::gather(ctx.mrs, self.pd, &w.sges, sent, dst)
                };
                copy_err = r.err();
            })
        };
        let frame_len = match emitted {
            Ok(n) => n,
            Err(_) => {
                ctx.stats.count("tx_emit_error");
                ctx.stats.inc(HwCounter::SendErr);
                return None;
            }
        };
        if copy_err.is_some() {
            // rxe: a bad lkey is a local protection error; the QP goes to ERR.
            self.fail_send(idx, WcStatus::LocProtErr, ctx);
            return None;
        }
        ctx.stats.tx_packets += 1;
        ctx.stats.inc(HwCounter::SentPkts);
        if repr.bth.ack_req {
            self.req.noack_pkts = 0;
            self.req.unrequested_since = None;
        } else {
            self.req.noack_pkts += 1;
            self.req.unrequested_since.get_or_insert(ctx.now);
        }
        self.req.psn = psn::add(psn_now, consumed);
        let w = self.sq.at_mut(idx);
        if op.is_read_or_atomic() {
            w.sent = len;
        } else {
            w.sent = sent + payload_len as u64;
        }
        if last {
            w.state = WqeState::Pending;
            self.req.next = idx + 1;
        }
        match self.qp_type {
            QpType::Rc => {
                if !self.timers.is_armed(Timer::Retransmit) {
                    if let Some(d) = local_ack_timeout(self.attr.timeout) {
                        self.timers.set(Timer::Retransmit, ctx.now + d);
                    }
                }
            }
            // Unreliable: done once the last packet is out.
            QpType::Uc | QpType::Ud => {
                if last {
                    self.complete_head(WcStatus::Success, ctx);
                }
            }
        }
        Some(frame_len)
    }

    /// Whether a message's last packet asks for an ACK (AckReq). Always for
    /// READ and atomic requests, a signaled SEND or WRITE (the application
    /// waits for its completion), and every message of a go-back-N. An
    /// unsignaled SEND or WRITE completes unseen, so its ACK can wait for a
    /// later one (an ACK covers every earlier PSN): a ping-pong that moderates
    /// its send completions, as perftest's `ib_send_lat` does, then moves one
    /// frame each way per round instead of two (rxe asks on every message).
    /// It asks all the same once the oldest packet sent without AckReq has
    /// waited a quarter of the local ACK time-out, so the ACK comes before
    /// that time-out would resend it. An unsignaled message followed by no
    /// other leaves its ACK to that time-out (a resend the responder answers
    /// as a duplicate, C9-105), so a QP allowed no retry asks every time.
    fn ack_wanted(&self, op: &SendOp, signaled: bool, ctx: &Ctx<'_>) -> bool {
        if signaled
            || self.sq_sig_all
            || op.is_read_or_atomic()
            || self.req.retry_psn.is_some()
            || self.attr.retry_cnt == 0
        {
            return true;
        }
        match (
            self.req.unrequested_since,
            local_ack_timeout(self.attr.timeout),
        ) {
            (Some(since), Some(t)) => ctx.now >= since + t / 4,
            // Nothing waiting, or no time-out (0: wait for ever) to beat.
            _ => false,
        }
    }

    /// Go back to the oldest unacknowledged PSN and resend from there
    /// (rxe: rxe_req.c req_retry). A WQE cut in the middle restarts at the
    /// packet holding that PSN; a READ restarts as a shorter READ.
    pub(crate) fn start_retry(&mut self, ctx: &mut Ctx<'_>) {
        let mtu = self.mtu();
        let comp = self.req.comp_psn;
        self.req.psn = comp;
        self.req.retry_psn = Some(comp);
        self.req.noack_pkts = 0;
        self.req.unrequested_since = None;
        let mut i = self.sq.head;
        let mut first = None;
        while i < self.sq.tail {
            let w = self.sq.at_mut(i);
            if w.state == WqeState::Posted {
                break;
            }
            let total = if w.op.is_atomic() {
                1
            } else {
                packets(w.len, mtu)
            };
            // Only the oldest WQE resumes mid-message; the PSNs of the ones
            // after it follow on from there, so they restart from their start.
            let done = if first.is_none() {
                psn::diff(comp, w.first_psn).clamp(0, total as i32 - 1) as u64
            } else {
                0
            };
            w.sent = if w.op.is_atomic() {
                0
            } else {
                (done * mtu).min(w.len)
            };
            w.state = WqeState::Processing;
            if first.is_none() {
                first = Some(i);
                // The first WQE restarts at comp; later ones keep their PSNs.
                self.req.psn = psn::add(w.first_psn, done as u32);
            }
            i += 1;
        }
        if let Some(f) = first {
            self.req.next = f;
            ctx.stats.retransmits += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opcodes_per_position() {
        let w = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 0,
        };
        assert_eq!(
            request_opcode(QpType::Rc, &w, true, true),
            Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
        );
        assert_eq!(
            request_opcode(QpType::Rc, &w, false, true),
            Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
        );
        assert_eq!(
            request_opcode(QpType::Uc, &SendOp::Send, false, false),
            Opcode::UC_SEND_MIDDLE
        );
        assert_eq!(
            request_opcode(
                QpType::Rc,
                &SendOp::SendWithInv { invalidate_rkey: 1 },
                false,
                true
            ),
            Opcode::RC_SEND_LAST_WITH_INVALIDATE
        );
        assert_eq!(packets(0, 1024), 1);
        assert_eq!(packets(1025, 1024), 2);
    }
}
