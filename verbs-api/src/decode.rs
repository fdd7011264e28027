//! `ferroce decode`: read a pcap or pcapng capture and describe every RoCE v2
//! packet in it, checking each ICRC.
//!
//! Frames that are not RoCE v2 (another EtherType, protocol or UDP port) are
//! counted and skipped. A RoCE v2 frame that fails a receiver's checks is
//! reported as malformed with the reason.

use std::io::{Read, Write};

use ferroce_stack::wire::aeth::Syndrome;
use ferroce_stack::wire::{IpHeader, ParsedPacket};
use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::DataLink;
use serde_json::{json, Value};

/// Why a capture could not be read at all.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("cannot read capture: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a pcap or pcapng file: {0}")]
    Format(String),
    #[error("unsupported link type {0:?} (Ethernet, Linux cooked and raw IP are read)")]
    LinkType(DataLink),
    #[error("cannot write output: {0}")]
    Output(std::io::Error),
}

/// Counts for the summary line.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    pub packets: u64,
    pub roce: u64,
    pub icrc_ok: u64,
    pub icrc_bad: u64,
    pub malformed: u64,
}

impl Summary {
    /// Exit status of `ferroce decode`: 0 only if every RoCE packet parsed with a correct ICRC.
    pub fn exit_code(&self) -> i32 {
        if self.icrc_bad == 0 && self.malformed == 0 {
            0
        } else {
            1
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} packets, {} roce, {} icrc-ok, {} icrc-bad, {} malformed",
            self.packets, self.roce, self.icrc_ok, self.icrc_bad, self.malformed
        )
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// Decode a whole capture from `input`, writing one line per RoCE packet to `out`.
pub fn decode_capture(
    mut input: impl Read,
    out: &mut impl Write,
    format: Format,
) -> Result<Summary, DecodeError> {
    let mut bytes = Vec::new();
    input.read_to_end(&mut bytes)?;
    let mut dec = Decoder {
        out,
        format,
        summary: Summary::default(),
        scratch: Vec::new(),
    };
    // pcapng starts with a Section Header Block (type 0x0A0D0D0A).
    if bytes.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a]) {
        let mut r =
            PcapNgReader::new(&bytes[..]).map_err(|e| DecodeError::Format(e.to_string()))?;
        // Link types of the interfaces declared so far in this section.
        let mut links: Vec<DataLink> = Vec::new();
        while let Some(block) = r.next_block() {
            let block = block.map_err(|e| DecodeError::Format(e.to_string()))?;
            let (iface, data) = match block {
                Block::SectionHeader(_) => {
                    links.clear();
                    continue;
                }
                Block::InterfaceDescription(i) => {
                    links.push(i.linktype);
                    continue;
                }
                Block::EnhancedPacket(p) => (p.interface_id, p.data),
                Block::SimplePacket(p) => (0, p.data),
                _ => continue,
            };
            let link = links.get(iface as usize).copied().ok_or_else(|| {
                DecodeError::Format(format!("packet on undeclared interface {iface}"))
            })?;
            dec.frame(link, &data)?;
        }
    } else {
        let mut r = PcapReader::new(&bytes[..]).map_err(|e| DecodeError::Format(e.to_string()))?;
        let link = r.header().datalink;
        while let Some(pkt) = r.next_packet() {
            let pkt = pkt.map_err(|e| DecodeError::Format(e.to_string()))?;
            dec.frame(link, &pkt.data)?;
        }
    }
    let summary = dec.summary;
    match format {
        Format::Text => writeln!(out, "{summary}"),
        Format::Json => writeln!(out, "{}", json!({ "summary": summary })),
    }
    .map_err(DecodeError::Output)?;
    Ok(summary)
}

struct Decoder<'o, W: Write> {
    out: &'o mut W,
    format: Format,
    summary: Summary,
    scratch: Vec<u8>,
}

const ETHERTYPE_IPV4: [u8; 2] = [0x08, 0x00];
const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];

impl<W: Write> Decoder<'_, W> {
    fn frame(&mut self, link: DataLink, data: &[u8]) -> Result<(), DecodeError> {
        self.summary.packets += 1;
        let n = self.summary.packets;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.classify(n, link, data, &mut scratch);
        self.scratch = scratch;
        result
    }

    fn classify(
        &mut self,
        n: u64,
        link: DataLink,
        data: &[u8],
        scratch: &mut Vec<u8>,
    ) -> Result<(), DecodeError> {
        // The frame parser reads Ethernet; other link types get a synthetic
        // Ethernet header in front (the ICRC does not cover it).
        let frame: &[u8] = match link {
            DataLink::ETHERNET => data,
            DataLink::LINUX_SLL => with_ethernet(scratch, data.get(14..16), data.get(16..)),
            DataLink::LINUX_SLL2 => with_ethernet(scratch, data.get(0..2), data.get(20..)),
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => {
                let et = match data.first().map(|b| b >> 4) {
                    Some(6) => &ETHERTYPE_IPV6[..],
                    _ => &ETHERTYPE_IPV4[..],
                };
                with_ethernet(scratch, Some(et), Some(data))
            }
            other => return Err(DecodeError::LinkType(other)),
        };
        let line = match ParsedPacket::parse_report_icrc(frame) {
            Err(e) if e.is_not_roce() => return Ok(()),
            Err(e) => {
                self.summary.roce += 1;
                self.summary.malformed += 1;
                match self.format {
                    Format::Text => format!("{n} malformed: {e}"),
                    Format::Json => json!({"frame": n, "malformed": e.to_string(),
                        "counter": e.counter_name()})
                    .to_string(),
                }
            }
            Ok((p, icrc_ok)) => {
                self.summary.roce += 1;
                if icrc_ok {
                    self.summary.icrc_ok += 1;
                } else {
                    self.summary.icrc_bad += 1;
                }
                match self.format {
                    Format::Text => describe_text(n, &p, icrc_ok),
                    Format::Json => describe_json(n, &p, icrc_ok).to_string(),
                }
            }
        };
        writeln!(self.out, "{line}").map_err(DecodeError::Output)
    }
}

fn with_ethernet<'s>(
    scratch: &'s mut Vec<u8>,
    ethertype: Option<&[u8]>,
    l3: Option<&[u8]>,
) -> &'s [u8] {
    scratch.clear();
    scratch.extend_from_slice(&[0u8; 12]);
    scratch.extend_from_slice(ethertype.unwrap_or(&[0, 0]));
    scratch.extend_from_slice(l3.unwrap_or(&[]));
    scratch
}

fn addresses(ip: &IpHeader) -> (String, String) {
    match ip {
        IpHeader::V4 { src, dst, .. } => (src.to_string(), dst.to_string()),
        IpHeader::V6 { src, dst, .. } => (src.to_string(), dst.to_string()),
    }
}

fn syndrome_text(s: Syndrome) -> String {
    match s {
        Syndrome::Ack { credits } => format!("ACK credits={credits}"),
        Syndrome::RnrNak { timer } => format!("RNR-NAK timer={timer}"),
        Syndrome::Nak(code) => format!("NAK {}", code.name()),
        Syndrome::Reserved(b) => format!("reserved {b:#04x}"),
    }
}

/// One text line: frame, addresses, opcode, BTH fields, extension headers, payload, ICRC.
pub fn describe_text(n: u64, p: &ParsedPacket<'_>, icrc_ok: bool) -> String {
    use std::fmt::Write as _;
    let r = &p.repr;
    let (src, dst) = addresses(&r.ip);
    let b = &r.bth;
    let mut s = format!(
        "{n} {src} -> {dst} {} qp={:#x} psn={}",
        b.opcode.name(),
        b.dest_qp,
        b.psn
    );
    if b.ack_req {
        s.push_str(" ackreq");
    }
    if b.solicited {
        s.push_str(" se");
    }
    if b.fecn || b.becn {
        let _ = write!(s, " fecn={} becn={}", u8::from(b.fecn), u8::from(b.becn));
    }
    let e = &r.ext;
    if let Some(d) = e.deth {
        let _ = write!(s, " deth(qkey={:#x} srcqp={:#x})", d.qkey, d.src_qp);
    }
    if let Some(cm) = cm_text(p) {
        let _ = write!(s, " cm({cm})");
    }
    if let Some(h) = e.reth {
        let _ = write!(
            s,
            " reth(va={:#x} rkey={:#x} len={})",
            h.va, h.rkey, h.dma_len
        );
    }
    if let Some(a) = e.atomic_eth {
        let _ = write!(
            s,
            " atomic(va={:#x} rkey={:#x} swap_add={:#x} compare={:#x})",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = e.aeth {
        let _ = write!(s, " aeth({} msn={})", syndrome_text(a.kind()), a.msn);
    }
    if let Some(a) = e.atomic_ack_eth {
        let _ = write!(s, " atomicack(orig={:#x})", a.orig_data);
    }
    if let Some(i) = e.immdt {
        let _ = write!(s, " imm={:#010x}", i.imm);
    }
    if let Some(i) = e.ieth {
        let _ = write!(s, " inv_rkey={:#x}", i.rkey);
    }
    let _ = write!(
        s,
        " len={} icrc={}",
        p.payload.len(),
        if icrc_ok { "ok" } else { "BAD" }
    );
    s
}

/// A connection-manager MAD (a UD SEND to QP1) in a few words, as
/// Wireshark names the messages; `None` for any other packet.
pub fn cm_text(p: &ParsedPacket<'_>) -> Option<String> {
    use ferroce_stack::wire::mad::{self, CmMessage};
    if p.repr.bth.dest_qp != mad::GSI_QPN {
        return None;
    }
    let Ok((h, msg)) = mad::parse(p.payload) else {
        return Some("not a CM MAD".into());
    };
    let ids = format!(
        "comm={:#x} remote={:#x} tid={:#x}",
        msg.local_comm_id(),
        msg.remote_comm_id(),
        h.transaction_id
    );
    Some(match msg {
        CmMessage::Req(r) => format!(
            "ConnectRequest {ids} service={:#x} qpn={:#x} psn={:#x} mtu={}",
            r.service_id, r.local_qpn, r.starting_psn, r.path_mtu
        ),
        CmMessage::Rep(r) => format!(
            "ConnectReply {ids} qpn={:#x} psn={:#x}",
            r.local_qpn, r.starting_psn
        ),
        CmMessage::Rtu(_) => format!("ReadyToUse {ids}"),
        CmMessage::Rej(r) => format!("ConnectReject {ids} reason={}", r.reason),
        CmMessage::Mra(m) => format!("MsgRcptAck {ids} timeout={}", m.service_timeout),
        CmMessage::Dreq(d) => format!("DisconnectRequest {ids} qpn={:#x}", d.remote_qpn),
        CmMessage::Drep(_) => format!("DisconnectReply {ids}"),
        // Wireshark's names for the two.
        CmMessage::SidrReq(r) => format!(
            "ServiceIDResReq req={:#x} tid={:#x} service={:#x}",
            r.request_id, h.transaction_id, r.service_id
        ),
        CmMessage::SidrRep(r) => format!(
            "ServiceIDResReqResp req={:#x} tid={:#x} status={} qpn={:#x} qkey={:#x}",
            r.request_id,
            h.transaction_id,
            mad::sidr_status::name(r.status),
            r.qpn,
            r.qkey
        ),
    })
}

/// The same as [`describe_text`], as one JSON object.
pub fn describe_json(n: u64, p: &ParsedPacket<'_>, icrc_ok: bool) -> Value {
    let r = &p.repr;
    let (src, dst) = addresses(&r.ip);
    let b = &r.bth;
    let e = &r.ext;
    let mut v = json!({
        "frame": n,
        "src": src,
        "dst": dst,
        "udp_src_port": r.udp_src_port,
        "opcode": b.opcode.name(),
        "opcode_num": b.opcode.0,
        "dest_qp": b.dest_qp,
        "psn": b.psn,
        "ack_req": b.ack_req,
        "se": b.solicited,
        "pkey": b.pkey,
        "fecn": b.fecn,
        "becn": b.becn,
        "pad": b.pad_count,
        "payload_len": p.payload.len(),
        "icrc": if icrc_ok { "ok" } else { "BAD" },
        "icrc_value": p.icrc,
    });
    let obj = v.as_object_mut();
    if let Some(o) = obj {
        if let Some(cm) = cm_text(p) {
            o.insert("cm".into(), json!(cm));
        }
        if let Some(h) = e.reth {
            o.insert(
                "reth".into(),
                json!({"va": h.va, "rkey": h.rkey, "len": h.dma_len}),
            );
        }
        if let Some(a) = e.aeth {
            let (kind, value) = match a.kind() {
                Syndrome::Ack { credits } => ("ACK", credits),
                Syndrome::RnrNak { timer } => ("RNR-NAK", timer),
                Syndrome::Nak(c) => (c.name(), c.code()),
                Syndrome::Reserved(b) => ("reserved", b),
            };
            o.insert(
                "aeth".into(),
                json!({"syndrome": a.syndrome, "kind": kind, "value": value, "msn": a.msn}),
            );
        }
        if let Some(a) = e.atomic_eth {
            o.insert(
                "atomic_eth".into(),
                json!({"va": a.va, "rkey": a.rkey, "swap_add": a.swap_add, "compare": a.compare}),
            );
        }
        if let Some(a) = e.atomic_ack_eth {
            o.insert("atomic_ack_eth".into(), json!({"orig_data": a.orig_data}));
        }
        if let Some(d) = e.deth {
            o.insert("deth".into(), json!({"qkey": d.qkey, "src_qp": d.src_qp}));
        }
        if let Some(i) = e.immdt {
            o.insert("imm".into(), json!(i.imm));
        }
        if let Some(i) = e.ieth {
            o.insert("ieth_rkey".into(), json!(i.rkey));
        }
    }
    v
}
