//! ferroce-fuzz: the bodies of ferroce's fuzz targets.
//!
//! Each function takes arbitrary bytes and must never panic; it asserts the
//! properties that must hold for any input (a frame that parses re-emits to
//! a frame that parses to the same thing). The libFuzzer entry points call
//! these, and plain `cargo test` replays seeds and every crash ever found
//! through the same functions.
#![forbid(unsafe_code)]

pub mod guard;
pub mod stateful;

pub use stateful::{requester, responder};

use core::net::{Ipv4Addr, Ipv6Addr};

use arbitrary::{Arbitrary, Unstructured};
use ferroce_stack::wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, ieth, immdt, reth, sample, IpHeader,
    ParsedPacket, VlanTag, MAX_PAYLOAD, OPCODES,
};

/// Whole-frame parser: never panics; whatever parses survives emit → parse.
pub fn frame_parse(data: &[u8]) {
    let strict = ParsedPacket::parse(data);
    let lenient = ParsedPacket::parse_report_icrc(data);
    match (&strict, &lenient) {
        (Ok(p), Ok((q, ok))) => {
            assert!(*ok, "strict parse accepted a frame the lenient one flags");
            assert_eq!(p, q);
        }
        (Ok(_), Err(e)) => panic!("lenient parse rejected what strict accepted: {e}"),
        _ => {}
    }
    let Ok(p) = strict else { return };
    let mut buf = vec![0u8; data.len() + 8];
    let n = p
        .repr
        .emit(&mut buf, p.payload)
        .unwrap_or_else(|e| panic!("a parsed frame must re-emit: {e}"));
    let again = ParsedPacket::parse(&buf[..n])
        .unwrap_or_else(|e| panic!("a re-emitted frame must parse: {e}"));
    assert_eq!(again.repr, p.repr);
    assert_eq!(again.payload, p.payload);
}

macro_rules! header_round_trip {
    ($data:expr, $module:ident) => {{
        if let Ok(pkt) = $module::Packet::new_checked($data) {
            if let Ok(repr) = $module::Repr::parse(&pkt) {
                let mut buf = [0u8; 64];
                let out = &mut buf[..repr.buffer_len()];
                repr.emit(&mut $module::Packet::new_unchecked(&mut *out));
                let again = $module::Repr::parse(&$module::Packet::new_unchecked(&*out))
                    .unwrap_or_else(|e| panic!("{} re-parse: {e}", stringify!($module)));
                assert_eq!(again, repr, "{} round trip", stringify!($module));
            }
        }
    }};
}

/// Every header parser on the same bytes: never panics; parse → emit → parse is stable.
pub fn header_parsers(data: &[u8]) {
    header_round_trip!(data, bth);
    header_round_trip!(data, reth);
    header_round_trip!(data, aeth);
    header_round_trip!(data, atomic_eth);
    header_round_trip!(data, atomic_ack_eth);
    header_round_trip!(data, immdt);
    header_round_trip!(data, ieth);
    header_round_trip!(data, deth);
    header_round_trip!(data, cnp);
    cm_mad(data);
}

/// A CM MAD (the payload of a UD SEND to QP1): parsed from any bytes without
/// panicking; what parses emits again to the same message.
fn cm_mad(data: &[u8]) {
    use ferroce_stack::wire::mad;
    let _ = mad::parse(data);
    let mut m = [0u8; mad::MAD_LEN];
    let n = data.len().min(mad::MAD_LEN);
    m[..n].copy_from_slice(&data[..n]);
    // Make the header a CM one often enough for the fuzzer to reach the bodies.
    m[..4].copy_from_slice(&[
        mad::BASE_VERSION,
        mad::CLASS_CM,
        mad::CM_CLASS_VERSION,
        mad::METHOD_SEND,
    ]);
    if let Ok((h, msg)) = mad::parse(&m) {
        let again = mad::emit(h.transaction_id, &msg);
        assert_eq!(mad::parse(&again).map(|(_, m)| m), Ok(msg));
    }
}

/// `ferroce decode` on arbitrary capture bytes: an error or a summary, never a panic.
pub fn decode(data: &[u8]) {
    let mut out = Vec::new();
    if let Ok(s) =
        ferroce_verbs::decode::decode_capture(data, &mut out, ferroce_verbs::decode::Format::Text)
    {
        assert!(s.roce <= s.packets);
        assert_eq!(s.roce, s.icrc_ok + s.icrc_bad + s.malformed);
    }
}

/// Every field of a frame, as the fuzzer picks them; [`RoundTrip::repr`]
/// folds it into a valid `PacketRepr` (opcode from the table, the headers
/// that opcode needs, fields cut to their widths).
#[derive(Debug, Clone, Arbitrary)]
pub struct RoundTrip {
    pub opcode: u8,
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub vlan: Option<(u8, bool, u16)>,
    pub v6: Option<([u8; 16], [u8; 16], u8, u32)>,
    pub v4: ([u8; 4], [u8; 4], u8, u8, u16),
    pub ttl: u8,
    pub udp_src_port: u16,
    pub solicited: bool,
    pub mig_req: bool,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
    pub reth: reth::Repr,
    pub aeth: aeth::Repr,
    pub atomic_eth: atomic_eth::Repr,
    pub atomic_ack_eth: atomic_ack_eth::Repr,
    pub immdt: immdt::Repr,
    pub ieth: ieth::Repr,
    pub deth: deth::Repr,
    pub payload: Vec<u8>,
}

impl RoundTrip {
    /// The frame description and its payload.
    pub fn repr(&self) -> Option<(ferroce_stack::wire::PacketRepr, Vec<u8>)> {
        let info = OPCODES.get(usize::from(self.opcode) % OPCODES.len())?;
        let mut r =
            sample::sample_repr(info.opcode, self.v6.is_some(), self.vlan.is_some(), 0).ok()?;
        r.eth.dst = self.dst;
        r.eth.src = self.src;
        r.eth.vlan = self.vlan.map(|(pcp, dei, vid)| VlanTag {
            pcp: pcp & 7,
            dei,
            vid: vid & 0x0fff,
        });
        r.ip = match self.v6 {
            Some((s, d, tc, fl)) => IpHeader::V6 {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class: tc,
                flow_label: fl & 0x000f_ffff,
                hop_limit: self.ttl,
            },
            None => IpHeader::V4 {
                src: Ipv4Addr::from(self.v4.0),
                dst: Ipv4Addr::from(self.v4.1),
                dscp: self.v4.2 & 0x3f,
                ecn: self.v4.3 & 3,
                ttl: self.ttl,
                ident: self.v4.4,
            },
        };
        r.udp_src_port = self.udp_src_port;
        r.bth.solicited = self.solicited;
        r.bth.mig_req = self.mig_req;
        r.bth.fecn = self.fecn;
        r.bth.becn = self.becn;
        r.bth.dest_qp = self.dest_qp & bth::MASK_24;
        r.bth.ack_req = self.ack_req;
        r.bth.psn = self.psn & bth::MASK_24;
        let e = &mut r.ext;
        e.reth = e.reth.map(|_| self.reth);
        e.aeth = e.aeth.map(|_| aeth::Repr {
            syndrome: self.aeth.syndrome,
            msn: self.aeth.msn & bth::MASK_24,
        });
        e.atomic_eth = e.atomic_eth.map(|_| self.atomic_eth);
        e.atomic_ack_eth = e.atomic_ack_eth.map(|_| self.atomic_ack_eth);
        e.immdt = e.immdt.map(|_| self.immdt);
        e.ieth = e.ieth.map(|_| self.ieth);
        e.deth = e.deth.map(|_| deth::Repr {
            qkey: self.deth.qkey,
            src_qp: self.deth.src_qp & bth::MASK_24,
        });
        let payload = if info.has_payload {
            self.payload[..self.payload.len().min(MAX_PAYLOAD)].to_vec()
        } else {
            Vec::new()
        };
        r.bth.pad_count = ferroce_stack::wire::pad_for(payload.len()) as u8;
        Some((r, payload))
    }
}

/// Emit → parse round trip of an arbitrary valid frame description: the
/// emitter accepts it, the parser (ICRC included) accepts the result and
/// gives back exactly the description and the payload.
pub fn frame_roundtrip(data: &[u8]) {
    let Ok(rt) = RoundTrip::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let Some((repr, payload)) = rt.repr() else {
        return;
    };
    let len = repr
        .buffer_len(payload.len())
        .unwrap_or_else(|e| panic!("buffer_len of a valid repr: {e}: {repr:?}"));
    let mut buf = vec![0u8; len];
    let n = repr
        .emit(&mut buf, &payload)
        .unwrap_or_else(|e| panic!("emit of a valid repr: {e}: {repr:?}"));
    assert_eq!(n, len, "emit length vs buffer_len");
    let p = ParsedPacket::parse(&buf[..n])
        .unwrap_or_else(|e| panic!("parse of an emitted frame: {e}: {repr:?}"));
    assert_eq!(p.repr, repr);
    assert_eq!(p.payload, &payload[..]);
    // The lenient parser and the whole-frame target agree on it too.
    frame_parse(&buf[..n]);
}

/// What a raw receiver does to a frame the kernel left for a NIC
/// (`ferroce_nic::offload`: cutting a UDP GSO super-frame in place, clearing
/// or finishing a partial checksum) and the GSO run builder
/// (`ferroce_nic::gso`), on arbitrary frames: never panics; a super-frame
/// that is cut comes out as frames that parse as UDP and carry its payload in
/// order; a finished checksum verifies. The first two bytes choose the
/// segment size and whether the checksum is partial.
pub fn raw_offload(data: &[u8]) {
    use ferroce_nic::{frame, gso, offload};
    let [a, b, rest @ ..] = data else { return };
    let gso_size = usize::from(u16::from_le_bytes([*a, *b]) >> 1);
    let partial = a & 1 == 1;
    let payload = frame::parse_udp(rest)
        .ok()
        .and_then(|i| rest.get(i.payload_offset..i.payload_offset + i.payload_len))
        .map(<[u8]>::to_vec);
    let mut f = rest.to_vec();
    let mut joined = Vec::new();
    let mut count = 0;
    let n = offload::segment_udp(&mut f, gso_size, partial, &mut |seg| {
        count += 1;
        let i = frame::parse_udp(seg).unwrap_or_else(|e| panic!("a cut frame must parse: {e}"));
        assert!(
            i.payload_len <= gso_size,
            "segment longer than the segment size"
        );
        joined.extend_from_slice(&seg[i.payload_offset..i.payload_offset + i.payload_len]);
    });
    if let Some(n) = n {
        assert_eq!(n, count);
        if let Some(p) = payload {
            assert_eq!(
                joined, p,
                "the segments carry the super-frame's payload in order"
            );
        }
    }
    let mut g = rest.to_vec();
    offload::clear_partial(&mut g);
    assert_eq!(g.len(), rest.len());
    if let Some(fin) = offload::partial_finish(rest) {
        let mut h = rest.to_vec();
        assert!(fin.apply(&mut h));
        assert!(offload::udp_checksum_ok(&h), "a finished checksum verifies");
    }
    if let Some(mut run) = gso::Run::start(rest) {
        let cap = 65494;
        if run.admits(rest, cap) {
            run.push(rest.len() - run.header_len());
        }
        let mut sup = rest.to_vec();
        sup.extend_from_slice(&rest[run.header_len().min(rest.len())..]);
        sup.truncate(run.frame_len());
        let mut vnet = [0u8; gso::VNET_HDR_LEN];
        run.finish(&mut vnet, &mut sup);
    }
}
