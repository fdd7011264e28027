//! The responder: request packets in, data into memory, ACKs / NAKs / READ
//! responses / atomic ACKs out (rxe: rxe_resp.c). The steps keep rxe's names:
//! check_psn, check_op_seq, check_op_valid, get the receive WQE, check_length,
//! check_rkey, execute, acknowledge; duplicates go to `duplicate_request`.

use std::collections::VecDeque;

use crate::wire::aeth::{self, NakCode, Syndrome};
use crate::wire::{atomic_ack_eth, ExtHeaders, IpHeader, OpKind, Opcode, ParsedPacket, Position};

use super::counters::HwCounter;
use super::device::{AsyncEvent, Ctx, RXE_MAX_UNACKED_PSNS};
use super::dma;
use super::mr::{AccessError, AccessFlags};
use super::psn;
use super::qp::{Qp, QpState, QpType};
use super::requester::packets;
use super::timers::Timer;
use super::wqe::{RecvWqe, WcOpcode, WcStatus, WorkCompletion};

/// Bytes of GRH area at the head of a UD receive buffer (ibv_post_recv(3)).
pub const GRH_LEN: usize = 40;
/// Responder output entries kept at most per QP (ACKs, NAKs, READ
/// responses, atomic ACKs); beyond this an entry is dropped, counted as
/// `resp_queue_full`, and the requester's retry brings it back. READ/atomic
/// entries are further held to max_dest_rd_atomic first answers plus
/// max_dest_rd_atomic replays of duplicates.
pub const OUT_CAP: usize = 256;

/// One thing the responder has to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RespOut {
    Ack {
        psn: u32,
        syndrome: Syndrome,
        msn: u32,
    },
    Read {
        psn: u32,
        rkey: u32,
        va: u64,
        remaining: u32,
        first: bool,
        msn: u32,
        /// An answer to a duplicate request (from the saved resource).
        replay: bool,
    },
    AtomicAck {
        psn: u32,
        orig: u64,
        msn: u32,
        replay: bool,
    },
}

/// A responder resource: what is needed to answer a duplicate READ or atomic
/// (IBTA 9.7.5.1.x, max_dest_rd_atomic of them; rxe: resp_res).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resource {
    Free,
    Read {
        first_psn: u32,
        last_psn: u32,
        rkey: u32,
        va: u64,
        len: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LastOp {
    None,
    Send,
    Write,
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WriteCtx {
    pub rkey: u32,
    pub va: u64,
    pub resid: u32,
    pub len: u32,
}

#[derive(Debug)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub psn: u32,
    pub msn: u32,
    /// A PSN-sequence or RNR NAK went out and the expected PSN has not come yet
    /// (send one NAK per gap, C9-121).
    pub nak_sent: bool,
    pub last_op: LastOp,
    /// `cur` holds the receive WQE of the message in progress.
    pub has_cur: bool,
    pub cur: RecvWqe,
    pub cur_offset: u64,
    pub write: WriteCtx,
    /// UC: drop packets until the next FIRST/ONLY.
    pub uc_drop: bool,
    pub resources: Vec<Resource>,
    pub res_next: usize,
    pub out: VecDeque<RespOut>,
    /// An ACK held back for coalescing (`Config::ack_delay`): (PSN, MSN),
    /// always newer than anything in `out`, and the ACK-requesting packets
    /// it covers.
    pub deferred: Option<(u32, u32)>,
    pub deferred_pkts: u32,
    /// The PSN the newest queued ACK acknowledges (before any, the one
    /// before the first expected PSN, set at RTR), to bound how many PSNs a
    /// held-back ACK leaves unacknowledged.
    pub acked: u32,
}

impl RespState {
    pub fn new(max_sge: usize) -> RespState {
        let mut cur = RecvWqe::default();
        cur.sges.reserve(max_sge);
        RespState {
            psn: 0,
            msn: 0,
            nak_sent: false,
            last_op: LastOp::None,
            has_cur: false,
            cur,
            cur_offset: 0,
            write: WriteCtx::default(),
            uc_drop: false,
            resources: vec![Resource::Free],
            res_next: 0,
            out: VecDeque::new(),
            deferred: None,
            deferred_pkts: 0,
            acked: 0,
        }
    }
    pub fn resize_resources(&mut self, n: usize) {
        self.resources.clear();
        self.resources.resize(n, Resource::Free);
        self.res_next = 0;
    }
    pub fn reset(&mut self) {
        self.psn = 0;
        self.msn = 0;
        self.nak_sent = false;
        self.last_op = LastOp::None;
        self.has_cur = false;
        self.cur_offset = 0;
        self.uc_drop = false;
        self.resources.fill(Resource::Free);
        self.clear_out();
        self.acked = 0;
    }
    /// Forget everything not yet sent (reset, error).
    pub fn clear_out(&mut self) {
        self.out.clear();
        self.deferred = None;
        self.deferred_pkts = 0;
    }
    fn store(&mut self, r: Resource) {
        if self.resources.is_empty() {
            self.resources.push(Resource::Free);
        }
        let i = self.res_next % self.resources.len();
        self.resources[i] = r;
        self.res_next = (i + 1) % self.resources.len();
    }
    /// Queue `o` behind a held-back ACK, which goes first (it is older).
    fn push_out(&mut self, o: RespOut) -> bool {
        self.release_deferred() & self.push_raw(o)
    }
    fn push_raw(&mut self, o: RespOut) -> bool {
        if self.out.len() >= OUT_CAP {
            return false;
        }
        self.out.push_back(o);
        true
    }
    /// Queue an ACK now (after any held back), folding it into a plain ACK
    /// already waiting (coalescing).
    fn push_ack(&mut self, psn: u32, msn: u32) -> bool {
        self.release_deferred() & self.coalesce_ack(psn, msn)
    }
    /// Move the held-back ACK, if any, into the queue.
    pub fn release_deferred(&mut self) -> bool {
        self.deferred_pkts = 0;
        match self.deferred.take() {
            Some((psn, msn)) => self.coalesce_ack(psn, msn),
            None => true,
        }
    }
    /// Hold back the ACK of an accepted request packet; true once it covers
    /// `max` of them or leaves `max_psns` PSNs unacknowledged (then it is
    /// queued and must go now).
    fn defer_ack(&mut self, psn: u32, msn: u32, max: u32, max_psns: u32) -> bool {
        self.deferred = Some((psn, msn));
        self.deferred_pkts += 1;
        self.deferred_pkts >= max || psn::diff(psn, self.acked) >= max_psns as i32
    }
    fn coalesce_ack(&mut self, psn: u32, msn: u32) -> bool {
        let ack = Syndrome::Ack {
            credits: aeth::CREDITS_UNLIMITED,
        };
        if let Some(RespOut::Ack {
            psn: p,
            syndrome,
            msn: m,
        }) = self.out.back_mut()
        {
            if *syndrome == ack && psn::diff(psn, *p) >= 0 {
                *p = psn;
                *m = msn;
                self.acked = psn;
                return true;
            }
        }
        let queued = self.push_raw(RespOut::Ack {
            psn,
            syndrome: ack,
            msn,
        });
        if queued {
            self.acked = psn;
        }
        queued
    }
}

/// The result of executing one request packet.
enum Outcome {
    /// Accepted: the expected PSN moves by `psns`; `end` = a SEND/WRITE message completed.
    Done { psns: u32, end: bool },
    /// No receive WQE: RNR NAK (RC) or drop (UC).
    Rnr,
    /// A class B/C/D error: NAK with the code, complete the receive with the
    /// status, QP to ERR (RC); UC drops the message.
    Fatal(NakCode, WcStatus, &'static str),
}

/// The RETH of a WRITE's first packet or of a READ request: present, and no
/// longer than 2^31 bytes (rxe check_length), else the Invalid Request NAK.
fn request_reth(pkt: &ParsedPacket<'_>) -> Result<crate::wire::reth::Repr, Outcome> {
    let fatal = |why| Outcome::Fatal(NakCode::InvalidRequest, WcStatus::RemInvReqErr, why);
    let reth = pkt.repr.ext.reth.ok_or_else(|| fatal("rx_err_malformed"))?;
    if reth.dma_len > 1 << 31 {
        return Err(fatal("rx_err_length"));
    }
    Ok(reth)
}

fn access_status(e: AccessError) -> (NakCode, WcStatus, &'static str) {
    match e {
        // rxe_resp.c: RESPST_ERR_MISALIGNED_ATOMIC is a class C Invalid Request.
        AccessError::Misaligned => (
            NakCode::InvalidRequest,
            WcStatus::RemInvReqErr,
            "rx_err_misaligned_atomic",
        ),
        // Bad or stale key, another PD, no right, or a range outside the
        // region: rxe's RESPST_ERR_RKEY_VIOLATION, NAK Remote Access Error.
        _ => (
            NakCode::RemoteAccessError,
            WcStatus::RemAccessErr,
            "rx_err_rkey_violation",
        ),
    }
}

/// The 40-byte GRH area of a UD receive: the IPv6 header, or for IPv4 twenty
/// zero bytes and then the IPv4 header (as rdma-core delivers RoCE v2 IPv4).
fn grh_bytes(ip: &IpHeader, payload_len: usize) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let udp_len = (payload_len + 8) as u16;
    match *ip {
        IpHeader::V6 {
            src,
            dst,
            traffic_class,
            flow_label,
            hop_limit,
        } => {
            let w0 = (6u32 << 28) | (u32::from(traffic_class) << 20) | (flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&w0.to_be_bytes());
            g[4..6].copy_from_slice(&udp_len.to_be_bytes());
            g[6] = 17;
            g[7] = hop_limit;
            g[8..24].copy_from_slice(&src.octets());
            g[24..40].copy_from_slice(&dst.octets());
        }
        IpHeader::V4 {
            src,
            dst,
            dscp,
            ecn,
            ttl,
            ident,
        } => {
            let h = &mut g[20..40];
            h[0] = 0x45;
            h[1] = (dscp << 2) | (ecn & 3);
            h[2..4].copy_from_slice(&(udp_len + 20).to_be_bytes());
            h[4..6].copy_from_slice(&ident.to_be_bytes());
            h[6] = 0x40;
            h[8] = ttl;
            h[9] = 17;
            h[12..16].copy_from_slice(&src.octets());
            h[16..20].copy_from_slice(&dst.octets());
        }
    }
    g
}

impl Qp {
    /// A request packet for this responder.
    pub(crate) fn handle_request(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) {
        if !matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        ) {
            ctx.stats.count("rx_request_bad_state");
            return;
        }
        match self.qp_type {
            QpType::Ud => self.ud_receive(pkt, ctx),
            QpType::Rc | QpType::Uc => self.rc_uc_receive(pkt, ctx),
        }
    }

    fn rc_uc_receive(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) {
        let info = pkt.opcode_info();
        let p = pkt.repr.bth.psn;
        let rc = self.qp_type == QpType::Rc;
        // check_psn
        let d = psn::diff(p, self.resp.psn);
        if rc {
            if d > 0 {
                ctx.stats.out_of_sequence += 1;
                if !self.resp.nak_sent {
                    // rxe_resp.c check_psn: counted with the one NAK per gap.
                    ctx.stats.inc(HwCounter::OutOfSeqRequest);
                    self.resp.nak_sent = true;
                    let (e, m) = (self.resp.psn, self.resp.msn);
                    self.push_nak(NakCode::PsnSequenceError, e, m, ctx);
                }
                return;
            }
            if d < 0 {
                self.duplicate_request(pkt, ctx);
                return;
            }
        } else {
            if d < 0 {
                ctx.stats.count("rx_uc_stale");
                return;
            }
            if d > 0 {
                // Packets were lost: the message in progress is gone (C9-?? UC, rxe drop_msg).
                ctx.stats.out_of_sequence += 1;
                self.abort_message();
            }
            self.resp.psn = p;
            if self.resp.uc_drop {
                if info.is_first_or_only() {
                    self.resp.uc_drop = false;
                } else {
                    self.resp.psn = psn::add(p, 1);
                    ctx.stats.count("rx_uc_dropped_rest_of_message");
                    return;
                }
            }
        }
        // check_op_seq: MIDDLE/LAST only inside a message of the same kind.
        let cont = matches!(info.position, Position::Middle | Position::Last);
        let seq_ok = match self.resp.last_op {
            LastOp::None => !cont,
            LastOp::Send => cont && info.kind == OpKind::Send,
            LastOp::Write => cont && info.kind == OpKind::Write,
        };
        let outcome = if !seq_ok {
            Outcome::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "rx_err_missing_opcode",
            )
        } else {
            // check_op_valid: the QP's remote access flags.
            let acc = self.attr.qp_access_flags;
            let allowed = match info.kind {
                OpKind::Write => acc.contains(AccessFlags::REMOTE_WRITE),
                OpKind::ReadRequest => acc.contains(AccessFlags::REMOTE_READ),
                OpKind::CompareSwap | OpKind::FetchAdd => acc.contains(AccessFlags::REMOTE_ATOMIC),
                _ => true,
            };
            if !allowed {
                Outcome::Fatal(
                    NakCode::InvalidRequest,
                    WcStatus::RemInvReqErr,
                    "rx_err_unsupported_opcode",
                )
            } else {
                match info.kind {
                    OpKind::Send => self.exec_send(pkt, ctx),
                    OpKind::Write => self.exec_write(pkt, ctx),
                    OpKind::ReadRequest => self.exec_read(pkt, ctx),
                    OpKind::CompareSwap | OpKind::FetchAdd => self.exec_atomic(pkt, ctx),
                    _ => Outcome::Fatal(
                        NakCode::InvalidRequest,
                        WcStatus::RemInvReqErr,
                        "rx_err_unsupported_opcode",
                    ),
                }
            }
        };
        self.finish(pkt, outcome, ctx);
    }

    fn finish(&mut self, pkt: &ParsedPacket<'_>, outcome: Outcome, ctx: &mut Ctx<'_>) {
        let p = pkt.repr.bth.psn;
        let rc = self.qp_type == QpType::Rc;
        match outcome {
            Outcome::Done { psns, end } => {
                self.resp.psn = psn::add(p, psns);
                self.resp.nak_sent = false;
                if end {
                    self.resp.msn = psn::add(self.resp.msn, 1);
                }
                let kind = pkt.opcode_info().kind;
                // acknowledge: READ/atomic answer with their responses.
                if rc && pkt.repr.bth.ack_req && matches!(kind, OpKind::Send | OpKind::Write) {
                    let m = self.resp.msn;
                    // Coalescing: hold the ACK back while nothing else is
                    // queued (a NAK or READ response releases it first).
                    let queued = match ctx.cfg.ack_delay {
                        Some(delay) if self.resp.out.is_empty() => {
                            // At most half the window a requester keeps
                            // unacknowledged (ours, and rxe's), so it never
                            // stops for this ACK.
                            let max_psns = ctx.cfg.max_unacked_psns.min(RXE_MAX_UNACKED_PSNS) / 2;
                            if self.resp.defer_ack(p, m, ctx.cfg.ack_coalesce, max_psns) {
                                self.timers.stop(Timer::AckDelay);
                                self.resp.release_deferred()
                            } else {
                                ctx.stats.count("ack_deferred");
                                if !self.timers.is_armed(Timer::AckDelay) {
                                    self.timers.set(Timer::AckDelay, ctx.now + delay);
                                }
                                true
                            }
                        }
                        _ => self.resp.push_ack(p, m),
                    };
                    if !queued {
                        ctx.stats.count("resp_queue_full");
                    }
                }
            }
            Outcome::Rnr => {
                if rc {
                    ctx.stats.rnr_naks_sent += 1;
                    ctx.stats.inc(HwCounter::SendRnrErr);
                    self.resp.nak_sent = true;
                    let syn = Syndrome::RnrNak {
                        timer: self.attr.min_rnr_timer,
                    };
                    let m = self.resp.msn;
                    if !self.resp.push_out(RespOut::Ack {
                        psn: p,
                        syndrome: syn,
                        msn: m,
                    }) {
                        ctx.stats.count("resp_queue_full");
                    }
                } else {
                    ctx.stats.count("rx_uc_no_recv_wqe");
                    self.abort_message();
                    self.resp.psn = psn::add(p, 1);
                }
            }
            Outcome::Fatal(code, status, why) => {
                ctx.stats.count(why);
                if rc {
                    if self.resp.has_cur {
                        self.complete_recv_error(status, ctx);
                    }
                    self.enter_error(ctx);
                    let m = self.resp.msn;
                    self.push_nak(code, p, m, ctx);
                } else {
                    if self.resp.has_cur && status == WcStatus::LocLenErr {
                        self.complete_recv_error(status, ctx);
                    }
                    ctx.stats.count("rx_uc_bad_message");
                    self.abort_message();
                    self.resp.psn = psn::add(p, 1);
                }
            }
        }
    }

    fn complete_recv_error(&mut self, status: WcStatus, ctx: &mut Ctx<'_>) {
        self.resp.has_cur = false;
        let wc = WorkCompletion::new(self.resp.cur.wr_id, status, WcOpcode::Recv, self.qpn);
        ctx.complete(self.recv_cq, wc);
    }

    fn push_nak(&mut self, code: NakCode, psn: u32, msn: u32, ctx: &mut Ctx<'_>) {
        ctx.stats.naks_sent += 1;
        let syndrome = Syndrome::Nak(code);
        if !self.resp.push_out(RespOut::Ack { psn, syndrome, msn }) {
            ctx.stats.count("resp_queue_full");
        }
    }

    /// UC: forget the message in progress (its receive WQE is reused by the next one).
    fn abort_message(&mut self) {
        self.resp.last_op = LastOp::None;
        self.resp.cur_offset = 0;
        self.resp.uc_drop = true;
    }

    /// Take the next receive WQE from the RQ or the SRQ into `resp.cur`.
    fn take_recv(&mut self, ctx: &mut Ctx<'_>) -> bool {
        if self.resp.has_cur {
            return true;
        }
        if let Some(h) = self.srq {
            let Some(Some(srq)) = ctx.srqs.get_mut(h.0 as usize) else {
                return false;
            };
            match srq.take(&mut self.resp.cur) {
                None => return false,
                Some(fire) => {
                    if fire {
                        ctx.events.push_back(AsyncEvent::SrqLimitReached { srq: h });
                    }
                }
            }
        } else {
            if self.rq.is_empty() {
                return false;
            }
            let h = self.rq.head;
            core::mem::swap(self.rq.at_mut(h), &mut self.resp.cur);
            self.rq.pop();
        }
        self.resp.has_cur = true;
        self.resp.cur_offset = 0;
        true
    }

    fn exec_send(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) -> Outcome {
        let info = pkt.opcode_info();
        let first = info.is_first_or_only();
        let last = info.is_last_or_only();
        if first {
            if !self.take_recv(ctx) {
                return Outcome::Rnr;
            }
            self.resp.cur_offset = 0;
        }
        let n = pkt.payload.len() as u64;
        let mtu = self.mtu();
        // check_length: FIRST/MIDDLE carry exactly one MTU (C9-?? / rxe check_length).
        if n > mtu || (!last && n != mtu) {
            return Outcome::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "rx_err_length",
            );
        }
        if self.resp.cur_offset + n > self.resp.cur.len {
            return Outcome::Fatal(
                NakCode::InvalidRequest,
                WcStatus::LocLenErr,
                "rx_err_length",
            );
        }
        let off = self.resp.cur_offset;
        if dma::scatter(ctx.mrs, self.pd, &self.resp.cur.sges, off, pkt.payload).is_err() {
            return Outcome::Fatal(
                NakCode::RemoteOperationalError,
                WcStatus::LocProtErr,
                "rx_err_malformed_wqe",
            );
        }
        self.resp.cur_offset += n;
        if !last {
            self.resp.last_op = LastOp::Send;
            return Outcome::Done {
                psns: 1,
                end: false,
            };
        }
        let mut wc = WorkCompletion::new(
            self.resp.cur.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            self.qpn,
        );
        wc.byte_len = self.resp.cur_offset as u32;
        wc.imm_data = pkt.repr.ext.immdt.map(|i| i.imm);
        wc.solicited = pkt.repr.bth.solicited;
        if let Some(ieth) = pkt.repr.ext.ieth {
            if ctx.mrs.invalidate(ieth.rkey, self.pd).is_err() {
                return Outcome::Fatal(
                    NakCode::InvalidRequest,
                    WcStatus::RemInvReqErr,
                    "rx_err_invalidate",
                );
            }
            wc.invalidated_rkey = Some(ieth.rkey);
        }
        ctx.complete(self.recv_cq, wc);
        self.resp.has_cur = false;
        self.resp.last_op = LastOp::None;
        Outcome::Done { psns: 1, end: true }
    }

    fn exec_write(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) -> Outcome {
        let info = pkt.opcode_info();
        let first = info.is_first_or_only();
        let last = info.is_last_or_only();
        if first {
            let reth = match request_reth(pkt) {
                Ok(r) => r,
                Err(o) => return o,
            };
            if let Some(o) = self.check_rkey(ctx, &reth, AccessFlags::REMOTE_WRITE) {
                return o;
            }
            self.resp.write = WriteCtx {
                rkey: reth.rkey,
                va: reth.va,
                resid: reth.dma_len,
                len: reth.dma_len,
            };
        }
        let n = pkt.payload.len() as u32;
        let mtu = self.attr.path_mtu;
        let w = self.resp.write;
        if n > mtu || (!last && n != mtu) || n > w.resid || (last && n != w.resid) {
            return Outcome::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "rx_err_length",
            );
        }
        let imm = pkt.repr.ext.immdt;
        if imm.is_some() && !self.take_recv(ctx) {
            return Outcome::Rnr;
        }
        if n > 0 {
            match ctx.mrs.check(
                w.rkey,
                self.pd,
                w.va,
                u64::from(n),
                AccessFlags::REMOTE_WRITE,
            ) {
                Ok((mr, off)) => {
                    if mr.region.write(off, pkt.payload).is_err() {
                        return Outcome::Fatal(
                            NakCode::RemoteAccessError,
                            WcStatus::RemAccessErr,
                            "rx_err_rkey_violation",
                        );
                    }
                }
                Err(e) => {
                    let (code, st, why) = access_status(e);
                    return Outcome::Fatal(code, st, why);
                }
            }
        }
        self.resp.write.va = w.va.wrapping_add(u64::from(n));
        self.resp.write.resid = w.resid - n;
        if !last {
            self.resp.last_op = LastOp::Write;
            return Outcome::Done {
                psns: 1,
                end: false,
            };
        }
        self.resp.last_op = LastOp::None;
        if let Some(i) = imm {
            let mut wc = WorkCompletion::new(
                self.resp.cur.wr_id,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                self.qpn,
            );
            wc.byte_len = w.len;
            wc.imm_data = Some(i.imm);
            wc.solicited = pkt.repr.bth.solicited;
            ctx.complete(self.recv_cq, wc);
            self.resp.has_cur = false;
        }
        Outcome::Done { psns: 1, end: true }
    }

    /// READ responses and atomic ACKs still to send, as (first answers,
    /// replays). Each first answer is a READ/atomic the requester still
    /// counts as outstanding (its last response has not even left), so
    /// their number never exceeds the requester's max_rd_atomic. Replays
    /// answer duplicates, which the network may deliver late, after the
    /// requester is done: they are bounded separately.
    fn rd_atomic_pending(&self) -> (usize, usize) {
        self.resp.out.iter().fold((0, 0), |(n, r), o| match *o {
            RespOut::Read { replay, .. } | RespOut::AtomicAck { replay, .. } => {
                if replay {
                    (n, r + 1)
                } else {
                    (n + 1, r)
                }
            }
            RespOut::Ack { .. } => (n, r),
        })
    }

    /// A new READ/atomic while max_dest_rd_atomic of them are still being
    /// answered: the requester broke its max_rd_atomic (which connection
    /// set-up keeps at most our max_dest_rd_atomic). IBTA lists "too many
    /// RDMA READ or ATOMIC requests" as an Invalid Request (rxe's
    /// RESPST_ERR_TOO_MANY_RDMA_ATM_REQ, class C). rxe itself recycles its
    /// oldest resource, but it answers READs inline; we queue, so we refuse:
    /// this keeps the queue bounded per QP.
    fn rd_atomic_backlog_full(&self) -> Option<Outcome> {
        let max = usize::from(self.attr.max_dest_rd_atomic);
        (max == 0 || self.rd_atomic_pending().0 >= max).then_some(Outcome::Fatal(
            NakCode::InvalidRequest,
            WcStatus::RemInvReqErr,
            "rx_err_too_many_rd_atomic",
        ))
    }

    /// Room for one more replay (at most max_dest_rd_atomic queued).
    fn replay_room(&self) -> bool {
        self.rd_atomic_pending().1 < usize::from(self.attr.max_dest_rd_atomic)
    }

    /// rxe's check_rkey for the range a RETH names: None when `access` to it
    /// is allowed, else the fatal outcome. A zero-length request touches no
    /// memory and is not checked (C9-88).
    fn check_rkey(
        &self,
        ctx: &mut Ctx<'_>,
        reth: &crate::wire::reth::Repr,
        access: AccessFlags,
    ) -> Option<Outcome> {
        if reth.dma_len == 0 {
            return None;
        }
        let len = u64::from(reth.dma_len);
        let e = ctx
            .mrs
            .check(reth.rkey, self.pd, reth.va, len, access)
            .err()?;
        let (code, st, why) = access_status(e);
        Some(Outcome::Fatal(code, st, why))
    }

    fn exec_read(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) -> Outcome {
        let reth = match request_reth(pkt) {
            Ok(r) => r,
            Err(o) => return o,
        };
        if let Some(o) = self.rd_atomic_backlog_full() {
            return o;
        }
        if let Some(o) = self.check_rkey(ctx, &reth, AccessFlags::REMOTE_READ) {
            return o;
        }
        let p = pkt.repr.bth.psn;
        let n = packets(u64::from(reth.dma_len), self.mtu());
        self.resp.store(Resource::Read {
            first_psn: p,
            last_psn: psn::add(p, n - 1),
            rkey: reth.rkey,
            va: reth.va,
            len: reth.dma_len,
        });
        self.resp.msn = psn::add(self.resp.msn, 1);
        let msn = self.resp.msn;
        let out = RespOut::Read {
            psn: p,
            rkey: reth.rkey,
            va: reth.va,
            remaining: reth.dma_len,
            first: true,
            msn,
            replay: false,
        };
        if !self.resp.push_out(out) {
            ctx.stats.count("resp_queue_full");
        }
        Outcome::Done {
            psns: n,
            end: false,
        }
    }

    fn exec_atomic(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) -> Outcome {
        let Some(a) = pkt.repr.ext.atomic_eth else {
            return Outcome::Fatal(
                NakCode::InvalidRequest,
                WcStatus::RemInvReqErr,
                "rx_err_malformed",
            );
        };
        if let Some(o) = self.rd_atomic_backlog_full() {
            return o;
        }
        let cas = pkt.repr.bth.opcode == Opcode::RC_COMPARE_SWAP;
        let orig = match ctx.mrs.check_atomic(a.rkey, self.pd, a.va) {
            Ok((mr, off)) => {
                let r = if cas {
                    mr.region.compare_swap(off, a.compare, a.swap_add)
                } else {
                    mr.region.fetch_add(off, a.swap_add)
                };
                match r {
                    Ok(v) => v,
                    Err(_) => {
                        return Outcome::Fatal(
                            NakCode::RemoteAccessError,
                            WcStatus::RemAccessErr,
                            "rx_err_rkey_violation",
                        )
                    }
                }
            }
            Err(e) => {
                let (code, st, why) = access_status(e);
                return Outcome::Fatal(code, st, why);
            }
        };
        let p = pkt.repr.bth.psn;
        // Saved so a duplicate gets the same answer and is not executed again (C9-?? / rxe).
        self.resp.store(Resource::Atomic { psn: p, orig });
        self.resp.msn = psn::add(self.resp.msn, 1);
        let msn = self.resp.msn;
        if !self.resp.push_out(RespOut::AtomicAck {
            psn: p,
            orig,
            msn,
            replay: false,
        }) {
            ctx.stats.count("resp_queue_full");
        }
        Outcome::Done {
            psns: 1,
            end: false,
        }
    }

    /// A request with a PSN we already passed (rxe: rxe_resp.c duplicate_request).
    fn duplicate_request(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) {
        ctx.stats.duplicates += 1;
        ctx.stats.inc(HwCounter::DuplicateRequest);
        let p = pkt.repr.bth.psn;
        let msn = self.resp.msn;
        let pushed = match pkt.opcode_info().kind {
            // C9-105: ACK again (the last PSN we took), do not execute again.
            OpKind::Send | OpKind::Write => self
                .resp
                .push_ack(psn::add(self.resp.psn, psn::PSN_MASK), msn),
            OpKind::ReadRequest => {
                let Some(reth) = pkt.repr.ext.reth else {
                    return;
                };
                let found = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Read {
                        first_psn,
                        last_psn,
                        rkey,
                        va,
                        len,
                    } if psn::diff(p, first_psn) >= 0 && psn::diff(p, last_psn) <= 0 => {
                        Some((first_psn, last_psn, rkey, va, len))
                    }
                    _ => None,
                });
                let Some((first_psn, last_psn, rkey, va, len)) = found else {
                    ctx.stats.count("rx_duplicate_read_no_resource");
                    return;
                };
                // A re-read must stay inside what was asked for the first time.
                let end = reth.va.checked_add(u64::from(reth.dma_len));
                let orig_end = va.checked_add(u64::from(len));
                if reth.va < va || end.is_none() || orig_end.is_none() || end > orig_end {
                    ctx.stats.count("rx_duplicate_read_mismatch");
                    return;
                }
                let mut answer = RespOut::Read {
                    psn: p,
                    rkey,
                    va: reth.va,
                    remaining: reth.dma_len,
                    first: true,
                    msn,
                    replay: true,
                };
                // Still answering this READ: restart that answer where the
                // requester now asks, rather than queue a second one (the
                // queue then holds one entry per READ the requester has out).
                let queued = self.resp.out.iter_mut().find(|o| {
                    matches!(**o, RespOut::Read { psn: q, .. }
                        if psn::diff(q, first_psn) >= 0 && psn::diff(q, last_psn) <= 0)
                });
                if let Some(o) = queued {
                    // It keeps its place, and whether it is a first answer.
                    if let (RespOut::Read { replay: was, .. }, RespOut::Read { replay, .. }) =
                        (&*o, &mut answer)
                    {
                        *replay = *was;
                    }
                    *o = answer;
                    true
                } else if !self.replay_room() {
                    // Answering it again would grow the queue past
                    // max_dest_rd_atomic; the requester asks again after its timeout.
                    ctx.stats.count("rx_duplicate_rd_atomic_backlog");
                    return;
                } else {
                    self.resp.push_out(answer)
                }
            }
            OpKind::CompareSwap | OpKind::FetchAdd => {
                let found = self.resp.resources.iter().find_map(|r| match *r {
                    Resource::Atomic { psn, orig } if psn == p => Some(orig),
                    _ => None,
                });
                let Some(orig) = found else {
                    ctx.stats.count("rx_duplicate_atomic_no_resource");
                    return;
                };
                let queued = self
                    .resp
                    .out
                    .iter()
                    .any(|o| matches!(*o, RespOut::AtomicAck { psn: q, .. } if q == p));
                if queued {
                    // Its ACK is about to go out anyway.
                    ctx.stats.count("rx_duplicate_atomic_queued");
                    return;
                }
                if !self.replay_room() {
                    ctx.stats.count("rx_duplicate_rd_atomic_backlog");
                    return;
                }
                self.resp.push_out(RespOut::AtomicAck {
                    psn: p,
                    orig,
                    msn,
                    replay: true,
                })
            }
            _ => true,
        };
        if !pushed {
            ctx.stats.count("resp_queue_full");
        }
    }

    fn ud_receive(&mut self, pkt: &ParsedPacket<'_>, ctx: &mut Ctx<'_>) {
        let Some(deth) = pkt.repr.ext.deth else {
            return;
        };
        // Q_Key check (IBTA C10-15; rxe: rxe_recv.c check_keys).
        if deth.qkey != self.attr.qkey {
            ctx.stats.count("rx_qkey_mismatch");
            return;
        }
        if !self.take_recv(ctx) {
            ctx.stats.count("rx_ud_no_recv_wqe");
            return;
        }
        let need = (GRH_LEN + pkt.payload.len()) as u64;
        if need > self.resp.cur.len {
            self.complete_recv_error(WcStatus::LocLenErr, ctx);
            return;
        }
        let grh = grh_bytes(&pkt.repr.ip, pkt.payload.len());
        let sges = &self.resp.cur.sges;
        if dma::scatter(ctx.mrs, self.pd, sges, 0, &grh).is_err()
            || dma::scatter(ctx.mrs, self.pd, sges, GRH_LEN as u64, pkt.payload).is_err()
        {
            self.complete_recv_error(WcStatus::LocProtErr, ctx);
            return;
        }
        let mut wc = WorkCompletion::new(
            self.resp.cur.wr_id,
            WcStatus::Success,
            WcOpcode::Recv,
            self.qpn,
        );
        wc.byte_len = need as u32;
        wc.imm_data = pkt.repr.ext.immdt.map(|i| i.imm);
        wc.src_qp = deth.src_qp;
        wc.grh = true;
        wc.ipv4 = matches!(pkt.repr.ip, IpHeader::V4 { .. });
        wc.solicited = pkt.repr.bth.solicited;
        ctx.complete(self.recv_cq, wc);
        self.resp.has_cur = false;
    }

    /// Whether the next response is a positive ACK (no data, no NAK).
    pub(crate) fn plain_ack_next(&self) -> bool {
        matches!(
            self.resp.out.front(),
            Some(RespOut::Ack {
                syndrome: Syndrome::Ack { .. },
                ..
            })
        )
    }

    /// Write the next responder packet (ACK/NAK, READ response, atomic ACK).
    pub(crate) fn poll_response(&mut self, buf: &mut [u8], ctx: &mut Ctx<'_>) -> Option<usize> {
        let front = *self.resp.out.front()?;
        let mut repr = self.hdr;
        repr.bth.ack_req = false;
        let mut ext = ExtHeaders::default();
        let ack = Syndrome::Ack {
            credits: aeth::CREDITS_UNLIMITED,
        };
        let emitted = match front {
            RespOut::Ack { psn, syndrome, msn } => {
                self.resp.out.pop_front();
                repr.bth.opcode = Opcode::RC_ACKNOWLEDGE;
                repr.bth.psn = psn;
                ext.aeth = Some(aeth::Repr::new(syndrome, msn));
                repr.ext = ext;
                repr.emit(buf, &[])
            }
            RespOut::AtomicAck { psn, orig, msn, .. } => {
                self.resp.out.pop_front();
                repr.bth.opcode = Opcode::RC_ATOMIC_ACKNOWLEDGE;
                repr.bth.psn = psn;
                ext.aeth = Some(aeth::Repr::new(ack, msn));
                ext.atomic_ack_eth = Some(atomic_ack_eth::Repr { orig_data: orig });
                repr.ext = ext;
                repr.emit(buf, &[])
            }
            RespOut::Read {
                psn,
                rkey,
                va,
                remaining,
                first,
                msn,
                ..
            } => {
                let n = remaining.min(self.attr.path_mtu);
                let last = n == remaining;
                repr.bth.opcode = match (first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                };
                repr.bth.psn = psn;
                if first || last {
                    ext.aeth = Some(aeth::Repr::new(ack, msn));
                }
                repr.ext = ext;
                let r = if n == 0 {
                    // A zero-length READ names no memory: its rkey was never
                    // checked (C9-88), and nothing is read.
                    repr.emit(buf, &[])
                } else {
                    let Ok((mr, off)) = ctx.mrs.check_ref(
                        rkey,
                        self.pd,
                        va,
                        u64::from(n),
                        AccessFlags::REMOTE_READ,
                    ) else {
                        // The region went away under a READ in progress.
                        self.resp.out.pop_front();
                        let m = self.resp.msn;
                        self.enter_error(ctx);
                        self.push_nak(NakCode::RemoteAccessError, psn, m, ctx);
                        return self.poll_response(buf, ctx);
                    };
                    let mut ok = true;
                    let r = repr
                        .emit_with(buf, n as usize, |dst| ok = mr.region.read(off, dst).is_ok());
                    if !ok {
                        ctx.stats.count("tx_read_response_copy");
                    }
                    r
                };
                if last {
                    self.resp.out.pop_front();
                } else if let Some(RespOut::Read {
                    psn: p,
                    va: v,
                    remaining: rem,
                    first: f,
                    ..
                }) = self.resp.out.front_mut()
                {
                    *p = psn::add(psn, 1);
                    *v = va.wrapping_add(u64::from(n));
                    *rem = remaining - n;
                    *f = false;
                }
                r
            }
        };
        match emitted {
            Ok(len) => {
                ctx.stats.tx_packets += 1;
                ctx.stats.inc(HwCounter::SentPkts);
                Some(len)
            }
            Err(_) => {
                ctx.stats.count("tx_emit_error");
                ctx.stats.inc(HwCounter::SendErr);
                None
            }
        }
    }
}
