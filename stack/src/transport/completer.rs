//! The completer: ACKs, NAKs, READ responses and atomic ACKs against the
//! send queue, completions, retry and error handling (rxe: rxe_comp.c).

use crate::wire::aeth::{NakCode, Syndrome};
use crate::wire::{OpKind, ParsedPacket, Position};

use super::counters::HwCounter;
use super::device::{AsyncEvent, Ctx};
use super::dma;
use super::psn;
use super::qp::{Qp, QpState};
use super::timers::{local_ack_timeout, rnr_delay, Timer, TIMERS};
use super::wqe::{WcOpcode, WcStatus, WorkCompletion, WqeState};

impl Qp {
    /// A response packet (ACK, NAK, READ response, atomic ACK) for this requester.
    pub(crate) fn handle_response(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            ctx.stats.count("rx_response_bad_state");
            return;
        }
        let info = pkt.opcode_info();
        let p = pkt.repr.bth.psn;
        loop {
            if self.sq.is_empty() || self.sq.at(self.sq.head).state == WqeState::Posted {
                // Nothing outstanding: a late duplicate (a "ghost" in rxe's words).
                ctx.stats.count("rx_ghost_response");
                return;
            }
            let head = self.sq.head;
            let (op, first_psn, last_psn, state) = {
                let w = self.sq.at(head);
                (w.op, w.first_psn, w.last_psn, w.state)
            };
            if self.complete_implied(ctx) {
                continue;
            }
            // rxe: rxe_comp.c check_psn.
            if psn::diff(p, last_psn) > 0 {
                if op.is_read_or_atomic() && state != WqeState::Pending {
                    // Being asked for again already.
                    ctx.stats.count("rx_response_during_retry");
                    return;
                }
                if op.is_read_or_atomic() {
                    // An ACK beyond a READ/atomic whose response never came:
                    // the response was lost, ask again (implied NAK, C9-148).
                    self.retry_or_fail(ctx, false);
                    return;
                }
                // Coalesced ACK: this WQE is done, look at the next one.
                self.req.comp_psn = psn::add(last_psn, 1);
                self.complete_acked_head(ctx);
                continue;
            }
            let d = psn::diff(p, self.req.comp_psn);
            if d < 0 {
                ctx.stats.count("rx_duplicate_response");
                return;
            }
            if d > 0 && op.is_read_or_atomic() {
                // READ responses must come in order; wait for the retry.
                ctx.stats.count("rx_response_out_of_order");
                return;
            }
            match info.kind {
                OpKind::ReadResponse => self.read_response(pkt, head, first_psn, ctx),
                OpKind::AtomicAck => self.atomic_ack(pkt, head, ctx),
                OpKind::Acknowledge => self.acknowledge(pkt, head, ctx),
                _ => ctx.stats.count("rx_unexpected_opcode"),
            }
            return;
        }
    }

    fn read_response(
        &mut self,
        pkt: &ParsedPacket<'_>,
        head: u64,
        first_psn: u32,
        ctx: &mut Ctx<'_>,
    ) {
        let info = pkt.opcode_info();
        let mtu = self.mtu();
        let p = pkt.repr.bth.psn;
        let w = self.sq.at(head);
        if !w.op.is_read() {
            ctx.stats.count("rx_response_wrong_op");
            return;
        }
        let offset = psn::diff(p, first_psn) as u64 * mtu;
        let n = pkt.payload.len() as u64;
        let end = offset + n;
        let full = matches!(info.position, Position::First | Position::Middle);
        if end > w.len || (full && n != mtu) || (!full && end != w.len) {
            // rxe: a malformed response is a BAD_RESP error; we drop it and let
            // the retry fetch it again, which is kinder to a lossy path.
            ctx.stats.count("rx_read_response_length");
            return;
        }
        if dma::scatter(ctx.mrs, self.pd, &w.sges, offset, pkt.payload).is_err() {
            self.fail_send(head, WcStatus::LocProtErr, ctx);
            return;
        }
        self.req.comp_psn = psn::add(p, 1);
        self.progress(ctx);
        if !full {
            self.complete_head(WcStatus::Success, ctx);
        }
    }

    fn atomic_ack(&mut self, pkt: &ParsedPacket<'_>, head: u64, ctx: &mut Ctx<'_>) {
        let w = self.sq.at(head);
        let Some(ack) = pkt.repr.ext.atomic_ack_eth else {
            return;
        };
        if !w.op.is_atomic() {
            ctx.stats.count("rx_response_wrong_op");
            return;
        }
        // The original value lands in the first 8 bytes of the local SGE list, host order.
        if dma::scatter(ctx.mrs, self.pd, &w.sges, 0, &ack.orig_data.to_ne_bytes()).is_err() {
            self.fail_send(head, WcStatus::LocProtErr, ctx);
            return;
        }
        self.req.comp_psn = psn::add(pkt.repr.bth.psn, 1);
        self.progress(ctx);
        self.complete_head(WcStatus::Success, ctx);
    }

    fn acknowledge(&mut self, pkt: &ParsedPacket<'_>, head: u64, ctx: &mut Ctx<'_>) {
        let Some(aeth) = pkt.repr.ext.aeth else {
            return;
        };
        let p = pkt.repr.bth.psn;
        let (op, last_psn) = {
            let w = self.sq.at(head);
            (w.op, w.last_psn)
        };
        match aeth.kind() {
            Syndrome::Ack { .. } => {
                if op.is_read_or_atomic() {
                    ctx.stats.count("rx_ack_inside_read");
                    return;
                }
                self.req.comp_psn = psn::add(p, 1);
                if p == last_psn {
                    self.complete_acked_head(ctx);
                } else {
                    self.progress(ctx);
                }
            }
            Syndrome::RnrNak { timer } => {
                ctx.stats.rnr_naks_received += 1;
                ctx.stats.inc(HwCounter::RcvdRnrErr);
                // C9-128: packets before the NAKed PSN are acknowledged.
                self.req.comp_psn = p;
                while self.complete_implied(ctx) {}
                if self.req.rnr_retry == 0 {
                    ctx.stats.inc(HwCounter::RetryRnrExceededErr);
                    self.fail_send(head, WcStatus::RnrRetryExcErr, ctx);
                    return;
                }
                if self.attr.rnr_retry != 7 {
                    self.req.rnr_retry -= 1;
                }
                self.timers.stop(Timer::Retransmit);
                self.timers.set(Timer::Rnr, ctx.now + rnr_delay(timer));
                self.start_retry(ctx);
            }
            Syndrome::Nak(NakCode::PsnSequenceError) => {
                ctx.stats.naks_received += 1;
                ctx.stats.inc(HwCounter::RcvdSeqErr);
                self.req.comp_psn = p;
                while self.complete_implied(ctx) {}
                self.retry_or_fail(ctx, false);
            }
            Syndrome::Nak(code) => {
                ctx.stats.naks_received += 1;
                // Class B/C/D errors: the WQE fails, the QP goes to ERR (C9-140..).
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                    _ => WcStatus::BadRespErr,
                };
                self.fail_send(head, status, ctx);
            }
            Syndrome::Reserved(_) => ctx.stats.count("rx_reserved_syndrome"),
        }
    }

    /// Complete the head WQE if it is a SEND/WRITE whose every PSN lies before
    /// `comp_psn`: a NAK or RNR NAK acknowledges the PSNs before the one it
    /// names (C9-128), so no later ACK may name this WQE's last PSN. Without
    /// this, such an ACK would look like a duplicate and the WQE would wait
    /// forever. Returns whether it completed one.
    fn complete_implied(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.sq.is_empty() {
            return false;
        }
        let w = self.sq.at(self.sq.head);
        if w.state == WqeState::Pending
            && !w.op.is_read_or_atomic()
            && psn::diff(self.req.comp_psn, w.last_psn) > 0
        {
            self.complete_head(WcStatus::Success, ctx);
            self.progress(ctx);
            return true;
        }
        false
    }

    /// The responder has all of the oldest SEND/WRITE: complete it, even if a
    /// retry was resending it, and make sure the requester moves past it.
    fn complete_acked_head(&mut self, ctx: &mut Ctx<'_>) {
        let last = self.sq.at(self.sq.head).last_psn;
        let resending = self.req.next == self.sq.head;
        self.complete_head(WcStatus::Success, ctx);
        let after = psn::add(last, 1);
        if resending && psn::diff(self.req.psn, after) < 0 {
            self.req.psn = after;
            self.req.noack_pkts = 0;
        }
        self.progress(ctx);
    }

    /// The requester made progress: reset retry counters, rearm or stop the ACK timer.
    fn progress(&mut self, ctx: &mut Ctx<'_>) {
        self.req.retry_psn = None;
        self.req.retry_cnt = self.attr.retry_cnt;
        self.req.rnr_retry = self.attr.rnr_retry;
        if self.req.comp_psn != self.req.psn {
            if let Some(d) = local_ack_timeout(self.attr.timeout) {
                self.timers.set(Timer::Retransmit, ctx.now + d);
            }
        } else {
            self.timers.stop(Timer::Retransmit);
        }
    }

    /// Count a retry against retry_cnt (7 = forever) and go back, or fail
    /// with RETRY_EXC_ERR (rxe: COMPST_ERROR_RETRY).
    pub(crate) fn retry_or_fail(&mut self, ctx: &mut Ctx<'_>, timeout: bool) {
        // A NAK or implied NAK for the PSN a retry already restarted from is an
        // echo of packets sent before that retry: going back again would only
        // resend the window once more. The ACK timer covers a lost retry.
        if !timeout && self.req.retry_psn == Some(self.req.comp_psn) {
            ctx.stats.count("retry_suppressed");
            return;
        }
        if self.req.retry_cnt == 0 {
            let head = self.sq.head;
            ctx.stats.inc(HwCounter::RetryExceededErr);
            self.fail_send(head, WcStatus::RetryExcErr, ctx);
            return;
        }
        if self.attr.retry_cnt != 7 {
            self.req.retry_cnt -= 1;
        }
        // rxe_comp.c COMPST_ERROR_RETRY counts each go-back-N it starts.
        ctx.stats.inc(HwCounter::CompleterRetryErr);
        self.start_retry(ctx);
    }

    /// Local ACK timeout or RNR wait expired.
    pub(crate) fn on_timers(&mut self, fired: [bool; TIMERS], ctx: &mut Ctx<'_>) {
        // The responder's held-back ACK (it runs from RTR on).
        if fired[Timer::AckDelay as usize]
            && matches!(
                self.state,
                QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
            )
            && !self.resp.release_deferred()
        {
            ctx.stats.count("resp_queue_full");
        }
        if !matches!(self.state, QpState::Rts | QpState::Sqd) {
            return;
        }
        if fired[Timer::Rnr as usize] {
            self.start_retry(ctx);
        }
        if fired[Timer::Retransmit as usize]
            && !self.sq.is_empty()
            && self.sq.at(self.sq.head).state != WqeState::Posted
        {
            ctx.stats.timeouts += 1;
            self.retry_or_fail(ctx, true);
        }
    }

    /// Retire the oldest send WQE with `status`.
    pub(crate) fn complete_head(&mut self, status: WcStatus, ctx: &mut Ctx<'_>) {
        if self.sq.is_empty() {
            return;
        }
        let head = self.sq.head;
        let w = self.sq.at(head);
        let signaled = self.sq_sig_all || w.flags.signaled;
        if w.op.is_send() && status != WcStatus::WrFlushErr {
            // rxe_comp.c do_complete: every SEND WQE retired, signaled or not.
            ctx.stats.inc(HwCounter::RdmaSends);
        }
        if signaled || status != WcStatus::Success {
            let mut wc = WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), self.qpn);
            wc.byte_len = w.len as u32;
            ctx.complete(self.send_cq, wc);
        }
        if w.rd_counted {
            self.req.rd_atomic = self.req.rd_atomic.saturating_sub(1);
        }
        // A WQE a go-back-N was about to resend can complete first (a late
        // READ response or atomic ACK). Its PSNs are used: the next PSN to
        // hand out must lie past them, or a new WQE would reuse them and the
        // responder would take it for a duplicate (acknowledged, never
        // executed). Found by the verbs soak over a lossy link.
        let started = w.state != WqeState::Posted;
        let after = psn::add(w.last_psn, 1);
        if started && psn::diff(self.req.psn, after) < 0 {
            self.req.psn = after;
            self.req.noack_pkts = 0;
        }
        self.sq.pop();
        if self.req.next < self.sq.head {
            self.req.next = self.sq.head;
        }
    }

    /// Fail WQE `idx` with `status`: earlier WQEs and the rest are flushed, the QP goes to ERR.
    pub(crate) fn fail_send(&mut self, idx: u64, status: WcStatus, ctx: &mut Ctx<'_>) {
        // Earlier WQEs were sent but not acknowledged: they cannot be known good.
        while self.sq.head < idx {
            self.complete_head(WcStatus::WrFlushErr, ctx);
        }
        self.complete_head(status, ctx);
        self.enter_error(ctx);
    }

    /// Enter ERR: every remaining WR completes with WR_FLUSH_ERR (IBTA 10.3.1.2.5).
    pub(crate) fn enter_error(&mut self, ctx: &mut Ctx<'_>) {
        self.state = QpState::Err;
        self.attr.qp_state = QpState::Err;
        self.timers.stop_all();
        self.flush(ctx);
        self.resp.clear_out();
        if let Some(srq) = self.srq {
            ctx.events
                .push_back(AsyncEvent::QpLastWqeReached { qpn: self.qpn, srq });
        }
    }

    /// Complete everything queued with WR_FLUSH_ERR.
    pub(crate) fn flush(&mut self, ctx: &mut Ctx<'_>) {
        while !self.sq.is_empty() {
            self.complete_head(WcStatus::WrFlushErr, ctx);
        }
        self.req.rd_atomic = 0;
        if self.resp.has_cur {
            // The receive taken for a message in progress is the oldest one.
            self.resp.has_cur = false;
            let wc = WorkCompletion::new(
                self.resp.cur.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                self.qpn,
            );
            ctx.complete(self.recv_cq, wc);
        }
        while !self.rq.is_empty() {
            let wr_id = self.rq.at(self.rq.head).wr_id;
            self.rq.pop();
            ctx.complete(
                self.recv_cq,
                WorkCompletion::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, self.qpn),
            );
        }
    }
}
