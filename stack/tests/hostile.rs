//! Hostile input (issue 8): crafted frames fed straight into a victim core.
//! Each case checks the answer IBTA and rxe give (NAK syndrome, QP state,
//! completion status), the named counter, and that no byte outside the
//! registered regions changed: the victim's regions sit in one arena with
//! guard bytes between them, and the region type checks only the arena's
//! bounds (as raw memory would), so only the core's own checks keep an
//! access inside its region.

use std::sync::{Arc, Mutex, MutexGuard};

use ferroce_stack::sim::{connect, ConnectCfg, LinkConfig, Network};
use ferroce_stack::transport::*;
use ferroce_stack::wire::aeth::{NakCode, Syndrome};
use ferroce_stack::wire::{
    atomic_eth, icrc, reth, ExtHeaders, OpKind, Opcode, ParsedPacket, MAX_PAYLOAD,
};

const GUARD: usize = 256;
const REGION: usize = 4096;
/// Both remote regions are known by the same address, so a lookup by
/// address instead of by key would show.
const IOVA: u64 = 0x1_0000_0000;
const RECV_IOVA: u64 = 0x2_0000_0000;
/// The PSN the victim expects first.
const EPSN: u32 = 1000;
const MTU: u32 = 1024;

/// Memory shared by the victim's regions, guards included.
type Arena = Arc<Mutex<Vec<u8>>>;

fn lock(a: &Arena) -> MutexGuard<'_, Vec<u8>> {
    a.lock().unwrap_or_else(|p| p.into_inner())
}

/// A region at `base` in the arena. It trusts the core for its own bounds
/// and stops only at the arena's end, like memory behind a raw pointer.
#[derive(Debug)]
struct ArenaRegion {
    arena: Arena,
    base: usize,
    len: usize,
}

impl MemoryRegion for ArenaRegion {
    fn len(&self) -> u64 {
        self.len as u64
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), OutOfBounds> {
        let a = lock(&self.arena);
        let oob = OutOfBounds {
            offset,
            len: dst.len(),
        };
        let start = self.base + usize::try_from(offset).map_err(|_| oob)?;
        let src = a.get(start..start + dst.len()).ok_or(oob)?;
        dst.copy_from_slice(src);
        Ok(())
    }
    fn write(&mut self, offset: u64, src: &[u8]) -> Result<(), OutOfBounds> {
        let mut a = lock(&self.arena);
        let oob = OutOfBounds {
            offset,
            len: src.len(),
        };
        let start = self.base + usize::try_from(offset).map_err(|_| oob)?;
        let dst = a.get_mut(start..start + src.len()).ok_or(oob)?;
        dst.copy_from_slice(src);
        Ok(())
    }
}

/// What the victim sent back, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    opcode: Opcode,
    psn: u32,
    syndrome: Option<Syndrome>,
    orig: Option<u64>,
    payload: Vec<u8>,
}

/// Node 0 is the peer whose frames we forge; node 1 is the victim.
struct Rig {
    net: Network,
    arena: Arena,
    /// Arena offsets of the regions: open (main PD, all rights), foreign
    /// (another PD, all rights), recv (main PD, local write only).
    open_at: usize,
    foreign_at: usize,
    recv_at: usize,
    rkey: u32,
    foreign_rkey: u32,
    recv_lkey: u32,
    pd: PdHandle,
    scq: CqHandle,
    rcq: CqHandle,
    /// The victim's connected RC QP, and the peer's.
    qp: u32,
    peer_qp: u32,
    /// The next PSN the forged peer sends.
    psn: u32,
}

impl Rig {
    fn new() -> Rig {
        Rig::with(ConnectCfg {
            path_mtu: MTU,
            ..ConnectCfg::default()
        })
    }

    fn with(cfg: ConnectCfg) -> Rig {
        let mut net = Network::new(2, LinkConfig::perfect(), 8);
        let open_at = GUARD;
        let foreign_at = open_at + REGION + GUARD;
        let recv_at = foreign_at + REGION + GUARD;
        let total = recv_at + REGION + GUARD;
        // A recognisable fill: guards 0xEE, regions a pattern.
        let mut bytes = vec![0xee; total];
        for at in [open_at, foreign_at, recv_at] {
            for (i, b) in bytes[at..at + REGION].iter_mut().enumerate() {
                *b = (i * 7 + at) as u8;
            }
        }
        let arena: Arena = Arc::new(Mutex::new(bytes));
        let region = |base| {
            Box::new(ArenaRegion {
                arena: Arc::clone(&arena),
                base,
                len: REGION,
            })
        };
        let v = &mut net.cores[1];
        let pd = v.alloc_pd();
        let other_pd = v.alloc_pd();
        let scq = v.create_cq(4096).unwrap();
        let rcq = v.create_cq(4096).unwrap();
        let (_, rkey) = v
            .reg_mr(pd, IOVA, AccessFlags::ALL, region(open_at))
            .unwrap();
        let (_, foreign_rkey) = v
            .reg_mr(other_pd, IOVA, AccessFlags::ALL, region(foreign_at))
            .unwrap();
        let (recv_lkey, _) = v
            .reg_mr(pd, RECV_IOVA, AccessFlags::LOCAL_WRITE, region(recv_at))
            .unwrap();
        let qp = v.create_qp(pd, &init(QpType::Rc, scq, rcq)).unwrap();
        let p = &mut net.cores[0];
        let ppd = p.alloc_pd();
        let pcq = p.create_cq(4096).unwrap();
        let peer_qp = p.create_qp(ppd, &init(QpType::Rc, pcq, pcq)).unwrap();
        connect(&mut net, 0, peer_qp, 1, qp, QpType::Rc, &cfg, EPSN, 7).unwrap();
        Rig {
            net,
            arena,
            open_at,
            foreign_at,
            recv_at,
            rkey,
            foreign_rkey,
            recv_lkey,
            pd,
            scq,
            rcq,
            qp,
            peer_qp,
            psn: EPSN,
        }
    }

    fn victim(&mut self) -> &mut Core {
        &mut self.net.cores[1]
    }

    fn stats(&self) -> &Stats {
        self.net.cores[1].stats()
    }

    fn state(&self) -> QpState {
        self.net.cores[1].qp_state(self.qp).unwrap()
    }

    /// Post a receive of `len` bytes at `off` in the recv region.
    fn post_recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let sge = [Sge {
            addr: RECV_IOVA + off,
            length: len,
            lkey: self.recv_lkey,
        }];
        let qp = self.qp;
        self.victim()
            .post_recv(
                qp,
                &RecvWr {
                    wr_id,
                    sg_list: &sge,
                },
            )
            .unwrap();
    }

    /// A request from the peer to `dest_qp` (a well-formed frame).
    fn frame_to(
        &self,
        dest_qp: u32,
        op: Opcode,
        psn: u32,
        ext: ExtHeaders,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut r = self.net.path(0, 1).packet_template(self.peer_qp, dest_qp);
        r.bth.opcode = op;
        r.bth.psn = psn;
        r.bth.ack_req = true;
        r.ext = ext;
        let mut buf = vec![0; MAX_FRAME_LEN];
        let n = r.emit(&mut buf, payload).unwrap();
        buf.truncate(n);
        buf
    }

    fn frame(&self, op: Opcode, psn: u32, ext: ExtHeaders, payload: &[u8]) -> Vec<u8> {
        self.frame_to(self.qp, op, psn, ext, payload)
    }

    /// Hand a frame to the victim.
    fn inject(&mut self, f: &[u8]) {
        let now = self.net.now;
        self.victim().handle_frame(now, f);
    }

    /// Send the next request in sequence (the PSN moves by `psns` if accepted).
    fn request(&mut self, op: Opcode, ext: ExtHeaders, payload: &[u8]) {
        let f = self.frame(op, self.psn, ext, payload);
        self.inject(&f);
    }

    /// Everything the victim has to send now.
    fn answers(&mut self) -> Vec<Answer> {
        let now = self.net.now;
        let mut buf = vec![0; MAX_FRAME_LEN];
        let mut out = Vec::new();
        while let Some(n) = self.victim().poll_transmit(now, &mut buf) {
            let p = ParsedPacket::parse(&buf[..n]).expect("the victim emits valid frames");
            out.push(Answer {
                opcode: p.repr.bth.opcode,
                psn: p.repr.bth.psn,
                syndrome: p.repr.ext.aeth.map(|a| a.kind()),
                orig: p.repr.ext.atomic_ack_eth.map(|a| a.orig_data),
                payload: p.payload.to_vec(),
            });
            assert!(out.len() < 10_000, "the victim answers without end");
        }
        out
    }

    fn arena(&self) -> Vec<u8> {
        lock(&self.arena).clone()
    }

    /// Every byte of the arena is as in `before`, except `changed` (arena offset, len).
    fn assert_unchanged_except(&self, before: &[u8], changed: &[(usize, usize)]) {
        let now = self.arena();
        for (i, (a, b)) in before.iter().zip(&now).enumerate() {
            let allowed = changed.iter().any(|(at, n)| i >= *at && i < at + n);
            assert!(
                allowed || a == b,
                "byte {i} of the arena changed ({a:#x} -> {b:#x}); guards around \
                 [{}, {}), [{}, {}), [{}, {})",
                self.open_at,
                self.open_at + REGION,
                self.foreign_at,
                self.foreign_at + REGION,
                self.recv_at,
                self.recv_at + REGION,
            );
        }
    }

    fn recv_wcs(&mut self) -> Vec<WorkCompletion> {
        let cq = self.rcq;
        let mut v = Vec::new();
        while let Some(wc) = self.victim().poll_cq_one(cq) {
            v.push(wc);
        }
        v
    }
}

fn init(t: QpType, scq: CqHandle, rcq: CqHandle) -> QpInitAttr {
    QpInitAttr {
        qp_type: t,
        send_cq: scq,
        recv_cq: rcq,
        srq: None,
        cap: QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    }
}

fn write_ext(va: u64, rkey: u32, len: u32) -> ExtHeaders {
    ExtHeaders {
        reth: Some(reth::Repr {
            va,
            rkey,
            dma_len: len,
        }),
        ..ExtHeaders::default()
    }
}

fn atomic_ext(va: u64, rkey: u32, swap_add: u64, compare: u64) -> ExtHeaders {
    ExtHeaders {
        atomic_eth: Some(atomic_eth::Repr {
            va,
            rkey,
            swap_add,
            compare,
        }),
        ..ExtHeaders::default()
    }
}

/// Recompute the IPv4 header checksum, UDP length and ICRC of an IPv4 frame
/// without VLAN after its bytes were changed (so it gets past the parser's
/// integrity checks and tests what comes after). `ip_len` overrides the
/// IPv4 total length.
fn refit(f: &mut [u8], ip_len: Option<u16>) {
    let n = f.len();
    let total = ip_len.unwrap_or((n - 14) as u16);
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].fill(0);
    let mut sum: u32 = f[14..34]
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[24..26].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f[38..40].copy_from_slice(&((n - 34) as u16).to_be_bytes());
    let crc = icrc::compute(&f[14..n - 4], false).unwrap();
    f[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

fn nak(a: &Answer) -> Option<NakCode> {
    match a.syndrome {
        Some(Syndrome::Nak(c)) if a.opcode == Opcode::RC_ACKNOWLEDGE => Some(c),
        _ => None,
    }
}

/// The one answer must be a NAK with `code` for `psn`.
fn assert_one_nak(ans: &[Answer], code: NakCode, psn: u32) {
    assert_eq!(ans.len(), 1, "{ans:?}");
    assert_eq!(nak(&ans[0]), Some(code), "{ans:?}");
    assert_eq!(ans[0].psn, psn, "{ans:?}");
}

/// A class C error: NAK, QP in ERR, counter up, memory untouched.
fn assert_class_c(
    rig: &mut Rig,
    before: &[u8],
    code: NakCode,
    psn: u32,
    counter: &str,
) -> Vec<Answer> {
    let ans = rig.answers();
    assert_one_nak(&ans, code, psn);
    assert_eq!(rig.state(), QpState::Err);
    assert_eq!(rig.stats().get(counter), 1, "{counter}: {:?}", rig.stats());
    assert_eq!(rig.stats().naks_sent, 1);
    rig.assert_unchanged_except(before, &[]);
    ans
}

#[test]
fn guessed_rkey_is_remote_access_error() {
    let mut r = Rig::new();
    let before = r.arena();
    // A key in the right slot with a guessed random part, and one in a slot nobody has.
    let guess = r.rkey ^ 0x5a;
    r.request(
        Opcode::RC_RDMA_WRITE_ONLY,
        write_ext(IOVA, guess, 64),
        &[0xab; 64],
    );
    assert_class_c(
        &mut r,
        &before,
        NakCode::RemoteAccessError,
        EPSN,
        "rx_err_rkey_violation",
    );
    // The QP is in ERR now: later requests are dropped, counted, unanswered.
    r.request(
        Opcode::RC_RDMA_WRITE_ONLY,
        write_ext(IOVA, r.rkey, 8),
        &[1; 8],
    );
    assert!(r.answers().is_empty());
    assert_eq!(r.stats().get("rx_request_bad_state"), 1);
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn stale_rkey_after_dereg_is_remote_access_error() {
    let mut r = Rig::new();
    let pd = r.pd;
    let arena = Arc::clone(&r.arena);
    let (lkey, stale) = r
        .victim()
        .reg_mr(
            pd,
            0x3_0000_0000,
            AccessFlags::ALL,
            Box::new(ArenaRegion {
                arena,
                base: GUARD,
                len: 512,
            }),
        )
        .unwrap();
    r.victim().dereg_mr(lkey).unwrap();
    let before = r.arena();
    r.request(
        Opcode::RC_RDMA_READ_REQUEST,
        write_ext(0x3_0000_0000, stale, 64),
        &[],
    );
    assert_class_c(
        &mut r,
        &before,
        NakCode::RemoteAccessError,
        EPSN,
        "rx_err_rkey_violation",
    );
}

#[test]
fn reth_outside_the_region_or_overflowing_is_refused() {
    let rkey_violation = (NakCode::RemoteAccessError, "rx_err_rkey_violation");
    let cases = [
        // One byte past the end.
        (IOVA + REGION as u64 - 8, 9, rkey_violation),
        // Just before the start.
        (IOVA - 1, 4, rkey_violation),
        // va + len wraps past 2^64.
        (u64::MAX - 3, 8, rkey_violation),
        // Longer than any message may be (2^31): rxe check_length, Invalid Request.
        (IOVA, u32::MAX, (NakCode::InvalidRequest, "rx_err_length")),
    ];
    for (va, len, (code, counter)) in cases {
        // WRITE (FIRST, so the payload need not match a huge length) and READ.
        for op in [Opcode::RC_RDMA_WRITE_FIRST, Opcode::RC_RDMA_READ_REQUEST] {
            let mut r = Rig::new();
            let before = r.arena();
            let payload = if op == Opcode::RC_RDMA_READ_REQUEST {
                vec![]
            } else {
                vec![0x77; MTU as usize]
            };
            r.request(op, write_ext(va, r.rkey, len), &payload);
            let ans = r.answers();
            assert_one_nak(&ans, code, EPSN);
            assert_eq!(r.state(), QpState::Err, "{va:#x}+{len} {op:?}");
            assert_eq!(r.stats().get(counter), 1, "{va:#x}+{len} {op:?}");
            r.assert_unchanged_except(&before, &[]);
        }
    }
}

#[test]
fn write_length_disagreeing_with_the_packet_is_invalid_request() {
    // RETH says 100 bytes, the ONLY packet carries 64 (rxe check_length: RESPST_ERR_LENGTH).
    let mut r = Rig::new();
    let before = r.arena();
    r.request(
        Opcode::RC_RDMA_WRITE_ONLY,
        write_ext(IOVA, r.rkey, 100),
        &[0x42; 64],
    );
    assert_class_c(
        &mut r,
        &before,
        NakCode::InvalidRequest,
        EPSN,
        "rx_err_length",
    );

    // A FIRST shorter than the MTU.
    let mut r = Rig::new();
    let before = r.arena();
    r.request(
        Opcode::RC_RDMA_WRITE_FIRST,
        write_ext(IOVA, r.rkey, 3000),
        &[0x42; 512],
    );
    assert_class_c(
        &mut r,
        &before,
        NakCode::InvalidRequest,
        EPSN,
        "rx_err_length",
    );
}

#[test]
fn ip_length_disagreeing_with_the_frame_is_dropped() {
    let mut r = Rig::new();
    let before = r.arena();
    let mut f = r.frame(
        Opcode::RC_RDMA_WRITE_ONLY,
        EPSN,
        write_ext(IOVA, r.rkey, 64),
        &[0x42; 64],
    );
    // The IPv4 total length claims 8 bytes more than the frame holds.
    let claimed = (f.len() - 14 + 8) as u16;
    refit(&mut f, Some(claimed));
    r.inject(&f);
    // And 8 bytes fewer than the frame (so than the UDP length too).
    let mut g = f.clone();
    let shorter = (g.len() - 14 - 8) as u16;
    refit(&mut g, Some(shorter));
    r.inject(&g);
    assert!(r.answers().is_empty());
    let s = r.stats();
    assert_eq!(s.get("rx_length_mismatch"), 2, "{s:?}");
    assert_eq!(s.hw(HwCounter::RcvdPkts), 0);
    assert_eq!(r.state(), QpState::Rts);
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn misaligned_atomic_is_invalid_request() {
    let mut r = Rig::new();
    let before = r.arena();
    r.request(
        Opcode::RC_FETCH_ADD,
        atomic_ext(IOVA + 4, r.rkey, 1, 0),
        &[],
    );
    assert_class_c(
        &mut r,
        &before,
        NakCode::InvalidRequest,
        EPSN,
        "rx_err_misaligned_atomic",
    );
}

#[test]
fn region_of_another_pd_is_remote_access_error() {
    for op in [
        Opcode::RC_RDMA_WRITE_ONLY,
        Opcode::RC_RDMA_READ_REQUEST,
        Opcode::RC_COMPARE_SWAP,
    ] {
        let mut r = Rig::new();
        let before = r.arena();
        let k = r.foreign_rkey;
        let (ext, payload) = match op {
            Opcode::RC_COMPARE_SWAP => (atomic_ext(IOVA, k, 9, 0), vec![]),
            Opcode::RC_RDMA_READ_REQUEST => (write_ext(IOVA, k, 16), vec![]),
            _ => (write_ext(IOVA, k, 16), vec![0x99; 16]),
        };
        r.request(op, ext, &payload);
        let ans = assert_class_c(
            &mut r,
            &before,
            NakCode::RemoteAccessError,
            EPSN,
            "rx_err_rkey_violation",
        );
        assert!(ans[0].payload.is_empty(), "no data of the other PD leaks");
    }
}

#[test]
fn request_for_a_qp_not_ready_or_missing_is_dropped() {
    let mut r = Rig::new();
    let (pd, scq, rcq) = (r.pd, r.scq, r.rcq);
    let reset = r
        .victim()
        .create_qp(pd, &init(QpType::Rc, scq, rcq))
        .unwrap();
    let in_init = r
        .victim()
        .create_qp(pd, &init(QpType::Rc, scq, rcq))
        .unwrap();
    let attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: AccessFlags::ALL,
        port_num: 1,
        ..QpAttr::default()
    };
    r.victim()
        .modify_qp(
            in_init,
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .unwrap();
    let before = r.arena();
    let ext = write_ext(IOVA, r.rkey, 32);
    for dest in [reset, in_init] {
        let f = r.frame_to(dest, Opcode::RC_RDMA_WRITE_ONLY, 0, ext, &[5; 32]);
        r.inject(&f);
    }
    assert_eq!(r.stats().get("rx_request_bad_state"), 2);
    // No such QP: above every QPN in use, below the first; and 2^24 - 1, the multicast QPN,
    // whose group (the frame's IP destination) nobody here joined (rxe_rcv_mcast_pkt).
    for dest in [r.qp + 100, 1, 0xff_ffff] {
        let f = r.frame_to(dest, Opcode::RC_RDMA_WRITE_ONLY, EPSN, ext, &[5; 32]);
        r.inject(&f);
    }
    assert_eq!(r.stats().get("rx_unknown_qp"), 2);
    assert_eq!(r.stats().get("rx_mcast_unknown_group"), 1);
    assert!(r.answers().is_empty(), "silently dropped (rxe hdr_check)");
    assert_eq!(r.victim().qp_state(reset), Some(QpState::Reset));
    assert_eq!(r.victim().qp_state(in_init), Some(QpState::Init));
    assert_eq!(r.state(), QpState::Rts);
    assert_eq!(r.stats().hw(HwCounter::RcvdPkts), 0);
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn psn_far_outside_the_window() {
    let mut r = Rig::new();
    r.post_recv(1, 0, 256);
    let before = r.arena();
    // Far ahead (just inside the "ahead" half of the 24-bit space): one
    // PSN-sequence NAK per gap naming the expected PSN (IBTA C9-121, rxe check_psn).
    let ahead = psn::add(EPSN, 0x7f_fff0);
    for k in 0..3 {
        let f = r.frame(
            Opcode::RC_SEND_ONLY,
            psn::add(ahead, k),
            ExtHeaders::default(),
            &[1; 16],
        );
        r.inject(&f);
    }
    assert_one_nak(&r.answers(), NakCode::PsnSequenceError, EPSN);
    assert_eq!(r.stats().hw(HwCounter::OutOfSeqRequest), 1);
    // Far behind: a duplicate; a SEND is acknowledged again (C9-105), not executed.
    let behind = psn::add(EPSN, 0x80_0000);
    let f = r.frame(
        Opcode::RC_SEND_ONLY,
        behind,
        ExtHeaders::default(),
        &[2; 16],
    );
    r.inject(&f);
    let ans = r.answers();
    assert_eq!(ans.len(), 1);
    assert_eq!(
        ans[0].syndrome.map(|s| matches!(s, Syndrome::Ack { .. })),
        Some(true)
    );
    assert_eq!(
        ans[0].psn,
        psn::add(EPSN, psn::PSN_MASK),
        "the last PSN taken"
    );
    assert_eq!(r.stats().hw(HwCounter::DuplicateRequest), 1);
    // A duplicate READ with no saved resource is dropped, counted.
    let f = r.frame(
        Opcode::RC_RDMA_READ_REQUEST,
        behind,
        write_ext(IOVA, r.rkey, 64),
        &[],
    );
    r.inject(&f);
    assert!(r.answers().is_empty());
    assert_eq!(r.stats().get("rx_duplicate_read_no_resource"), 1);
    assert!(r.recv_wcs().is_empty());
    r.assert_unchanged_except(&before, &[]);
    // The QP is fine: the expected PSN still works.
    r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[3; 16]);
    let ans = r.answers();
    assert_eq!(ans.len(), 1);
    assert_eq!(ans[0].psn, EPSN);
    let wcs = r.recv_wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].status, wcs[0].byte_len), (WcStatus::Success, 16));
    assert_eq!(r.state(), QpState::Rts);
    let at = r.recv_at;
    assert_eq!(&r.arena()[at..at + 16], &[3; 16]);
}

#[test]
fn oversize_payload_is_dropped_and_over_mtu_is_invalid_request() {
    // Beyond the largest RoCE payload: the parser drops it.
    let mut r = Rig::new();
    r.post_recv(1, 0, REGION as u32);
    let before = r.arena();
    let mut f = r.frame(
        Opcode::RC_SEND_ONLY,
        EPSN,
        ExtHeaders::default(),
        &vec![0x55; MAX_PAYLOAD],
    );
    let icrc_at = f.len() - 4;
    f.splice(icrc_at..icrc_at, [0x55u8; 8]);
    refit(&mut f, None);
    r.inject(&f);
    assert!(r.answers().is_empty());
    assert_eq!(r.stats().get("rx_oversize"), 1, "{:?}", r.stats());
    assert_eq!(r.state(), QpState::Rts);
    // Bigger than the path MTU (1024) but a legal RoCE payload: rxe
    // check_length, RESPST_ERR_LENGTH, NAK Invalid Request.
    r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[0x55; 2048]);
    assert_class_c(
        &mut r,
        &before,
        NakCode::InvalidRequest,
        EPSN,
        "rx_err_length",
    );
}

#[test]
fn truncated_frame_is_dropped() {
    let mut r = Rig::new();
    let before = r.arena();
    let f = r.frame(
        Opcode::RC_RDMA_WRITE_ONLY,
        EPSN,
        write_ext(IOVA, r.rkey, 256),
        &[0x11; 256],
    );
    for cut in [f.len() - 1, f.len() / 2, 50, 20, 3] {
        r.inject(&f[..cut]);
    }
    assert!(r.answers().is_empty());
    let s = r.stats();
    let parse_drops: u64 = s
        .drops
        .iter()
        .filter(|(k, _)| k.starts_with("rx_"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(parse_drops, 5, "{s:?}");
    assert!(
        s.get("rx_truncated") + s.get("rx_length_mismatch") >= 4,
        "{s:?}"
    );
    assert_eq!(s.hw(HwCounter::RcvdPkts), 0);
    assert_eq!(r.state(), QpState::Rts);
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn wrong_pad_is_dropped_or_refused() {
    let mut r = Rig::new();
    r.post_recv(1, 0, 256);
    let before = r.arena();
    // Pad count on a READ request, which carries no payload.
    let mut f = r.frame(
        Opcode::RC_RDMA_READ_REQUEST,
        EPSN,
        write_ext(IOVA, r.rkey, 8),
        &[],
    );
    f[43] |= 2 << 4;
    refit(&mut f, None);
    r.inject(&f);
    // A pad count larger than the (empty) payload.
    let mut g = r.frame(Opcode::RC_SEND_ONLY, EPSN, ExtHeaders::default(), &[]);
    g[43] |= 3 << 4;
    refit(&mut g, None);
    r.inject(&g);
    assert!(r.answers().is_empty());
    assert_eq!(r.stats().get("rx_bad_pad"), 2, "{:?}", r.stats());
    assert_eq!(r.state(), QpState::Rts);
    // A pad that parses but makes the WRITE's length disagree with its RETH
    // (rxe check_length compares payload and pad with the residual).
    let mut h = r.frame(
        Opcode::RC_RDMA_WRITE_ONLY,
        EPSN,
        write_ext(IOVA, r.rkey, 8),
        &[0x66; 8],
    );
    h[43] |= 1 << 4;
    refit(&mut h, None);
    r.inject(&h);
    assert_class_c(
        &mut r,
        &before,
        NakCode::InvalidRequest,
        EPSN,
        "rx_err_length",
    );
}

#[test]
fn duplicate_atomic_is_never_executed_twice() {
    let mut r = Rig::new();
    let at = r.open_at;
    lock(&r.arena)[at..at + 8].copy_from_slice(&100u64.to_ne_bytes());
    let before = r.arena();
    let fa = r.frame(
        Opcode::RC_FETCH_ADD,
        EPSN,
        atomic_ext(IOVA, r.rkey, 5, 0),
        &[],
    );
    let cas = r.frame(
        Opcode::RC_COMPARE_SWAP,
        EPSN + 1,
        atomic_ext(IOVA, r.rkey, 7, 105),
        &[],
    );
    r.inject(&fa);
    r.inject(&cas);
    let mut acks = Vec::new();
    // Each arrives four more times, in both orders, after its answer went out
    // (so each copy is answered again, from the saved result)...
    for _ in 0..5 {
        for a in r.answers() {
            assert_eq!(a.opcode, Opcode::RC_ATOMIC_ACKNOWLEDGE);
            acks.push((a.psn, a.orig));
        }
        r.inject(&cas);
        r.inject(&fa);
    }
    // ...and twice more while the answers are still queued (absorbed).
    r.inject(&fa);
    r.inject(&cas);
    assert_eq!(r.stats().get("rx_duplicate_atomic_queued"), 2);
    acks.extend(r.answers().iter().map(|a| (a.psn, a.orig)));
    assert_eq!(acks.len(), 12, "{acks:?}");
    for (psn, orig) in acks {
        let want = if psn == EPSN { 100 } else { 105 };
        assert_eq!(orig, Some(want), "the saved result, every time");
    }
    let v = u64::from_ne_bytes(r.arena()[at..at + 8].try_into().unwrap());
    assert_eq!(v, 7, "100 + 5 once, then swapped 105 -> 7 once");
    assert_eq!(r.stats().hw(HwCounter::DuplicateRequest), 12);
    assert_eq!(r.state(), QpState::Rts);
    r.assert_unchanged_except(&before, &[(at, 8)]);
}

#[test]
fn read_flood_beyond_max_dest_rd_atomic_is_refused() {
    let mut r = Rig::with(ConnectCfg {
        path_mtu: MTU,
        max_rd_atomic: 4,
        ..ConnectCfg::default()
    });
    let before = r.arena();
    // Four READs of 4 KiB (4 response packets each) are within the limit...
    for k in 0..4u32 {
        let f = r.frame(
            Opcode::RC_RDMA_READ_REQUEST,
            psn::add(EPSN, 4 * k),
            write_ext(IOVA, r.rkey, REGION as u32),
            &[],
        );
        r.inject(&f);
    }
    // ...then a flood the peer had no right to send before our answers went out.
    for k in 4..1000u32 {
        let f = r.frame(
            Opcode::RC_RDMA_READ_REQUEST,
            psn::add(EPSN, 4 * k),
            write_ext(IOVA, r.rkey, REGION as u32),
            &[],
        );
        r.inject(&f);
    }
    let ans = r.answers();
    // The NAK for the fifth READ; the QP is in ERR, so the queued responses
    // and the rest of the flood are gone (IBTA 10.3.1.2.5: ERR sends nothing but the NAK).
    assert_one_nak(&ans, NakCode::InvalidRequest, psn::add(EPSN, 16));
    assert_eq!(r.state(), QpState::Err);
    assert_eq!(r.stats().get("rx_err_too_many_rd_atomic"), 1);
    assert_eq!(r.stats().get("rx_request_bad_state"), 995);
    r.assert_unchanged_except(&before, &[]);

    // The same flood with the answers read in between is fine: each READ is
    // answered, and nothing piles up.
    let mut r = Rig::with(ConnectCfg {
        path_mtu: MTU,
        max_rd_atomic: 4,
        ..ConnectCfg::default()
    });
    for k in 0..100u32 {
        let f = r.frame(
            Opcode::RC_RDMA_READ_REQUEST,
            psn::add(EPSN, k),
            write_ext(IOVA, r.rkey, 64),
            &[],
        );
        r.inject(&f);
        let ans = r.answers();
        assert_eq!(ans.len(), 1);
        assert_eq!(ans[0].opcode, Opcode::RC_RDMA_READ_RESPONSE_ONLY);
        assert_eq!(ans[0].payload, r.arena()[r.open_at..r.open_at + 64]);
    }
    assert_eq!(r.state(), QpState::Rts);
}

#[test]
fn flood_of_qpn_probes_is_dropped_cheaply() {
    let mut r = Rig::new();
    r.post_recv(1, 0, 64);
    let before = r.arena();
    let drop_names = r.stats().drops.len();
    let ext = write_ext(IOVA, r.rkey, 8);
    let mut x: u32 = 0x1234_5678;
    let mut probes = 0u64;
    let real = [r.qp, r.peer_qp];
    for _ in 0..100_000 {
        // xorshift: spread over the 24-bit QPN space.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let dest = x & 0xff_ffff;
        if real.contains(&dest) {
            continue;
        }
        let f = r.frame_to(dest, Opcode::RC_RDMA_WRITE_ONLY, EPSN, ext, &[9; 8]);
        r.inject(&f);
        probes += 1;
    }
    assert!(r.answers().is_empty(), "no answer to a probe");
    let s = r.stats();
    assert_eq!(s.get("rx_unknown_qp"), probes);
    assert_eq!(
        s.drops.len(),
        drop_names + 1,
        "one counter, no per-probe state"
    );
    assert_eq!(s.hw(HwCounter::RcvdPkts), 0);
    r.assert_unchanged_except(&before, &[]);
    // The real QP still works.
    r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[4; 32]);
    assert_eq!(r.answers().len(), 1);
    assert_eq!(r.recv_wcs()[0].status, WcStatus::Success);
}

#[test]
fn send_larger_than_the_receive_is_loc_len_err_and_invalid_request_nak() {
    let mut r = Rig::new();
    r.post_recv(77, 0, 100);
    let before = r.arena();
    r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[0x31; 200]);
    let ans = r.answers();
    assert_one_nak(&ans, NakCode::InvalidRequest, EPSN);
    let wcs = r.recv_wcs();
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (77, WcStatus::LocLenErr));
    assert_eq!(r.state(), QpState::Err);
    assert_eq!(r.stats().get("rx_err_length"), 1);
    assert_eq!(r.stats().hw(HwCounter::RdmaRecvs), 0);
    // Nothing was written past the 100-byte receive (nothing at all: the
    // length is checked before the copy).
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn send_larger_than_the_receive_end_to_end() {
    // The same through a real requester: the sender sees REM_INV_REQ_ERR.
    let mut r = Rig::new();
    r.post_recv(5, 0, 100);
    let before = r.arena();
    let p = &mut r.net.cores[0];
    let pd = PdHandle(0);
    let (lkey, _) = p
        .reg_mr(
            pd,
            0x9000,
            AccessFlags::ALL,
            Box::new(VecRegion::zeroed(4096)),
        )
        .unwrap();
    let sge = [Sge {
        addr: 0x9000,
        length: 3000,
        lkey,
    }];
    let peer = r.peer_qp;
    r.net.cores[0]
        .post_send(peer, &SendWr::new(9, SendOp::Send, &sge))
        .unwrap();
    r.net.run_idle(std::time::Duration::from_secs(1));
    let wc = r.net.cores[0].poll_cq_one(CqHandle(0)).unwrap();
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RemInvReqErr));
    assert_eq!(r.net.cores[0].qp_state(peer), Some(QpState::Err));
    assert_eq!(r.recv_wcs()[0].status, WcStatus::LocLenErr);
    assert_eq!(r.state(), QpState::Err);
    assert_eq!(r.stats().get("rx_err_length"), 1);
    r.assert_unchanged_except(&before, &[]);
}

#[test]
fn hw_counters_follow_a_clean_exchange() {
    let mut r = Rig::new();
    r.post_recv(1, 0, 256);
    r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[1; 100]);
    r.psn += 1;
    r.request(
        Opcode::RC_RDMA_WRITE_ONLY,
        write_ext(IOVA, r.rkey, 10),
        &[2; 10],
    );
    r.psn += 1;
    r.request(
        Opcode::RC_RDMA_READ_REQUEST,
        write_ext(IOVA, r.rkey, 3000),
        &[],
    );
    let ans = r.answers();
    // One coalesced ACK for SEND + WRITE, then three READ response packets.
    assert_eq!(ans.len(), 4, "{ans:?}");
    let s = r.stats();
    assert_eq!(s.hw(HwCounter::RcvdPkts), 3);
    assert_eq!(s.hw(HwCounter::SentPkts), 4);
    assert_eq!(s.hw(HwCounter::RdmaRecvs), 1);
    let names: Vec<_> = s.named().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        &names[..3],
        &["sent_pkts", "rcvd_pkts", "duplicate_request"]
    );
    assert!(ans
        .iter()
        .all(|a| a.opcode.info().unwrap().kind != OpKind::Send));
}

#[test]
fn a_flooding_peer_is_bounded_and_only_its_qp_fails() {
    let mut r = Rig::with(ConnectCfg {
        path_mtu: MTU,
        max_rd_atomic: 4,
        ..ConnectCfg::default()
    });
    // A second, honest pair on the same cores: node 0's QP `good_peer` to the
    // victim's `good`, driven by node 0's real requester over the network.
    let (pd, scq, rcq) = (r.pd, r.scq, r.rcq);
    let good = r
        .victim()
        .create_qp(pd, &init(QpType::Rc, scq, rcq))
        .unwrap();
    let good_peer = r.net.cores[0]
        .create_qp(PdHandle(0), &init(QpType::Rc, CqHandle(0), CqHandle(0)))
        .unwrap();
    let cfg = ConnectCfg {
        path_mtu: MTU,
        max_rd_atomic: 4,
        ..ConnectCfg::default()
    };
    connect(&mut r.net, 0, good_peer, 1, good, QpType::Rc, &cfg, 50, 60).unwrap();
    let (plkey, _) = r.net.cores[0]
        .reg_mr(
            PdHandle(0),
            0x9000,
            AccessFlags::ALL,
            Box::new(VecRegion::zeroed(64 * 1024)),
        )
        .unwrap();

    // 1. RNR flood: SENDs at the expected PSN with no receive posted. Each
    //    draws an RNR NAK (rxe does the same), but what waits to go out stays bounded.
    for _ in 0..10_000 {
        r.request(Opcode::RC_SEND_ONLY, ExtHeaders::default(), &[1; 64]);
    }
    let backlog = r.net.cores[1].responder_backlog(r.qp).unwrap();
    assert!(backlog <= responder::OUT_CAP, "{backlog}");
    assert!(r.stats().get("resp_queue_full") >= 10_000 - responder::OUT_CAP as u64);
    assert_eq!(r.stats().hw(HwCounter::SendRnrErr), 10_000);
    assert_eq!(r.state(), QpState::Rts, "RNR is not an error");
    assert!(r.answers().len() <= responder::OUT_CAP);

    // 2. READ flood past max_dest_rd_atomic: the queue holds at most 4 READs,
    //    then the offender's QP goes to ERR.
    for k in 0..10_000u32 {
        let f = r.frame(
            Opcode::RC_RDMA_READ_REQUEST,
            psn::add(EPSN, 4 * k),
            write_ext(IOVA, r.rkey, REGION as u32),
            &[],
        );
        r.inject(&f);
        let backlog = r.net.cores[1].responder_backlog(r.qp).unwrap();
        assert!(backlog <= 4, "{backlog} after READ {k}");
    }
    assert_eq!(r.state(), QpState::Err);
    assert_eq!(r.stats().get("rx_err_too_many_rd_atomic"), 1);
    r.answers();

    // 3. The honest QP on the same core still works, every kind of request.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    r.net.cores[0]
        .mr_region_mut(plkey)
        .unwrap()
        .write(0, &data)
        .unwrap();
    let rl = r.recv_lkey;
    let sge = [Sge {
        addr: RECV_IOVA + 1024,
        length: 3000,
        lkey: rl,
    }];
    r.victim()
        .post_recv(
            good,
            &RecvWr {
                wr_id: 1,
                sg_list: &sge,
            },
        )
        .unwrap();
    let psge = |off: u64, len: u32| Sge {
        addr: 0x9000 + off,
        length: len,
        lkey: plkey,
    };
    let wrs = [
        (1, SendOp::Send, psge(0, 3000)),
        (
            2,
            SendOp::RdmaWrite {
                remote_addr: IOVA + 8,
                rkey: r.rkey,
            },
            psge(0, 2000),
        ),
        (
            3,
            SendOp::RdmaRead {
                remote_addr: IOVA + 8,
                rkey: r.rkey,
            },
            psge(10_000, 2000),
        ),
        (
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: IOVA + 2048,
                rkey: r.rkey,
                add: 1,
            },
            psge(20_000, 8),
        ),
    ];
    for (id, op, s) in wrs {
        let mut wr = SendWr::new(id, op, std::slice::from_ref(&s));
        wr.flags.signaled = true;
        r.net.cores[0].post_send(good_peer, &wr).unwrap();
    }
    r.net.run_idle(std::time::Duration::from_secs(2));
    let mut ids = Vec::new();
    while let Some(wc) = r.net.cores[0].poll_cq_one(CqHandle(0)) {
        if wc.qp_num == good_peer {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            ids.push(wc.wr_id);
        }
    }
    assert_eq!(ids, [1, 2, 3, 4]);
    assert_eq!(r.victim().qp_state(good), Some(QpState::Rts));
    let a = r.arena();
    assert_eq!(&a[r.recv_at + 1024..r.recv_at + 4024], &data[..]);
    assert_eq!(&a[r.open_at + 8..r.open_at + 2008], &data[..2000]);
    let back = r.net.cores[0].mr_region(plkey).unwrap();
    let mut got = vec![0; 2000];
    back.read(10_000, &mut got).unwrap();
    assert_eq!(got, data[..2000]);
}

/// Frames a core has to send now.
fn drain_tx(c: &mut Core, now: Instant) -> Vec<Vec<u8>> {
    let mut buf = vec![0; MAX_FRAME_LEN];
    let mut v = Vec::new();
    while let Some(n) = c.poll_transmit(now, &mut buf) {
        v.push(buf[..n].to_vec());
    }
    v
}

/// A reordered and duplicated response stream: an atomic ACK overtakes the
/// READ response before it (an implied NAK: go back to the READ), then the
/// late READ response and a copy of the atomic ACK complete both WQEs before
/// anything was resent. The next WQE must get a fresh PSN; reusing the READ's
/// would make the responder take the SEND for a duplicate and acknowledge it
/// without delivering it (seen in the verbs soak before the fix).
#[test]
fn responses_completing_a_retry_early_do_not_recycle_psns() {
    let mut r = Rig::new();
    r.post_recv(1, 0, 64);
    let now = r.net.now;
    let p = &mut r.net.cores[0];
    let (lkey, _) = p
        .reg_mr(
            PdHandle(0),
            0x9000,
            AccessFlags::ALL,
            Box::new(VecRegion::zeroed(4096)),
        )
        .unwrap();
    let sge = |off: u64, len: u32| Sge {
        addr: 0x9000 + off,
        length: len,
        lkey,
    };
    let peer = r.peer_qp;
    let read = SendOp::RdmaRead {
        remote_addr: IOVA,
        rkey: r.rkey,
    };
    let faa = SendOp::AtomicFetchAdd {
        remote_addr: IOVA + 64,
        rkey: r.rkey,
        add: 1,
    };
    let (s1, s2, s3) = ([sge(0, 64)], [sge(128, 8)], [sge(256, 16)]);
    let mut wr1 = SendWr::new(1, read, &s1);
    wr1.flags.signaled = true;
    p.post_send(peer, &wr1).unwrap();
    let mut wr2 = SendWr::new(2, faa, &s2);
    wr2.flags.signaled = true;
    p.post_send(peer, &wr2).unwrap();
    for f in drain_tx(&mut r.net.cores[0], now) {
        r.net.cores[1].handle_frame(now, &f);
    }
    let resp = drain_tx(&mut r.net.cores[1], now);
    assert_eq!(resp.len(), 2, "READ response, atomic ACK");
    let (read_resp, atomic_ack) = (&resp[0], &resp[1]);
    for f in [atomic_ack, read_resp, atomic_ack] {
        r.net.cores[0].handle_frame(now, f);
    }
    let wcs: Vec<_> = std::iter::from_fn(|| r.net.cores[0].poll_cq_one(CqHandle(0))).collect();
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    // Now a SEND: it must reach the receive.
    let data = [0x5au8; 16];
    r.net.cores[0]
        .mr_region_mut(lkey)
        .unwrap()
        .write(256, &data)
        .unwrap();
    let mut wr3 = SendWr::new(3, SendOp::Send, &s3);
    wr3.flags.signaled = true;
    r.net.cores[0].post_send(peer, &wr3).unwrap();
    r.net.run_idle(std::time::Duration::from_millis(100));
    let recvs = r.recv_wcs();
    assert_eq!(recvs.len(), 1, "the SEND was delivered");
    assert_eq!(
        (recvs[0].status, recvs[0].byte_len),
        (WcStatus::Success, 16)
    );
    let at = r.recv_at;
    assert_eq!(&r.arena()[at..at + 16], &data);
}

#[test]
fn duplicate_read_storm_is_bounded_and_new_reads_still_served() {
    let mut r = Rig::with(ConnectCfg {
        path_mtu: MTU,
        max_rd_atomic: 4,
        ..ConnectCfg::default()
    });
    let read = |r: &Rig, k: u32| {
        r.frame(
            Opcode::RC_RDMA_READ_REQUEST,
            psn::add(EPSN, 4 * k),
            write_ext(IOVA, r.rkey, REGION as u32),
            &[],
        )
    };
    // Four READs (4 PSNs each), answered.
    for k in 0..4 {
        let f = read(&r, k);
        r.inject(&f);
    }
    assert_eq!(r.answers().len(), 16);
    // The network replays them a thousand times before we send anything.
    for i in 0..1000 {
        let f = read(&r, i % 4);
        r.inject(&f);
        let backlog = r.net.cores[1].responder_backlog(r.qp).unwrap();
        assert!(backlog <= 4, "{backlog} after duplicate {i}");
    }
    assert_eq!(r.stats().hw(HwCounter::DuplicateRequest), 1000);
    // Each copy restarts the one queued replay of its READ instead of adding one.
    // Replays do not count against new READs: the next one is served.
    let f = read(&r, 4);
    r.inject(&f);
    assert_eq!(r.state(), QpState::Rts);
    let ans = r.answers();
    assert_eq!(ans.len(), 5 * 4, "four replays and the new READ");
    assert_eq!(r.stats().get("rx_err_too_many_rd_atomic"), 0);
}

#[test]
fn frame_for_another_host_is_dropped() {
    // A switch that floods (or the mem backend) can hand us a frame for the
    // QP with our number on another host: rxe's check_addr drops it, and so
    // must we, or we would acknowledge data never meant for us.
    let mut r = Rig::new();
    let before = r.arena();
    let mut t = r.net.path(0, 1).packet_template(r.peer_qp, r.qp);
    if let ferroce_stack::wire::IpHeader::V4 { dst, .. } = &mut t.ip {
        *dst = std::net::Ipv4Addr::new(198, 18, 0, 99);
    } else {
        panic!("the sim rig speaks IPv4");
    }
    t.bth.opcode = Opcode::RC_RDMA_WRITE_ONLY;
    t.bth.psn = EPSN;
    t.bth.ack_req = true;
    t.ext = write_ext(IOVA, r.rkey, 32);
    let mut buf = vec![0; MAX_FRAME_LEN];
    let n = t.emit(&mut buf, &[5; 32]).unwrap();
    r.inject(&buf[..n]);
    assert_eq!(r.stats().get("rx_wrong_destination"), 1);
    assert!(r.answers().is_empty(), "silently dropped (rxe check_addr)");
    assert_eq!(r.state(), QpState::Rts);
    assert_eq!(r.stats().hw(HwCounter::RcvdPkts), 0);
    r.assert_unchanged_except(&before, &[]);
    // The same frame to our own address is executed.
    let f = r.frame(
        Opcode::RC_RDMA_WRITE_ONLY,
        EPSN,
        write_ext(IOVA, r.rkey, 32),
        &[5; 32],
    );
    r.inject(&f);
    assert_eq!(r.stats().hw(HwCounter::RcvdPkts), 1);
}
