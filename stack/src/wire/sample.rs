//! Well-formed example packets for every opcode, with fields drawn from a
//! seed. Tests, fuzz seed corpora, benches and oracles (tshark, scapy) all
//! build their frames here, so they exercise the same shapes.

use core::net::{Ipv4Addr, Ipv6Addr};

use super::error::Result;
use super::opcode::{Ext, Opcode};
use super::packet::{EthernetHeader, ExtHeaders, IpHeader, PacketRepr, VlanTag};
use super::{aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, ieth, immdt, reth};

/// SplitMix64: a tiny deterministic generator, enough to vary fields.
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A valid packet description for `opcode` (every header it needs filled
/// with seeded values; addresses in the 198.18.0.0/15 benchmarking range or
/// fd00::/8). Fails only for an opcode we do not speak.
pub fn sample_repr(opcode: Opcode, ipv6: bool, vlan: bool, seed: u64) -> Result<PacketRepr> {
    let info = opcode.info()?;
    let mut r = SplitMix::new(seed ^ u64::from(opcode.0) << 56);
    let ip = if ipv6 {
        IpHeader::V6 {
            src: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1),
            dst: Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2),
            traffic_class: (r.next_u32() & 0xff) as u8,
            flow_label: r.next_u32() & 0x000f_ffff,
            hop_limit: 64,
        }
    } else {
        IpHeader::V4 {
            src: Ipv4Addr::new(198, 18, 0, 1),
            dst: Ipv4Addr::new(198, 18, 0, 2),
            dscp: (r.next_u32() & 0x3f) as u8,
            ecn: (r.next_u32() & 3) as u8,
            ttl: 64,
            ident: r.next_u32() as u16,
        }
    };
    let mut ext = ExtHeaders::default();
    for e in info.headers {
        match e {
            Ext::Reth => {
                ext.reth = Some(reth::Repr {
                    va: r.next_u64(),
                    rkey: r.next_u32(),
                    dma_len: r.next_u32() & 0x7fff_ffff,
                })
            }
            Ext::Aeth => {
                // A valid syndrome of each kind in turn: ACK, RNR NAK, NAK.
                let low = (r.next_u32() & 0x1f) as u8;
                let syndrome = match r.next_u32() % 3 {
                    0 => aeth::Syndrome::Ack { credits: low },
                    1 => aeth::Syndrome::RnrNak { timer: low },
                    _ => aeth::Syndrome::Nak(aeth::NakCode::from_code(low % 5)),
                };
                ext.aeth = Some(aeth::Repr::new(syndrome, r.next_u32()))
            }
            Ext::AtomicEth => {
                ext.atomic_eth = Some(atomic_eth::Repr {
                    va: r.next_u64() & !7,
                    rkey: r.next_u32(),
                    swap_add: r.next_u64(),
                    compare: r.next_u64(),
                })
            }
            Ext::AtomicAckEth => {
                ext.atomic_ack_eth = Some(atomic_ack_eth::Repr {
                    orig_data: r.next_u64(),
                })
            }
            Ext::ImmDt => ext.immdt = Some(immdt::Repr { imm: r.next_u32() }),
            Ext::Ieth => ext.ieth = Some(ieth::Repr { rkey: r.next_u32() }),
            Ext::Deth => {
                ext.deth = Some(deth::Repr {
                    qkey: r.next_u32(),
                    src_qp: r.next_u32() & bth::MASK_24,
                })
            }
            Ext::Cnp => ext.cnp = Some(cnp::Repr),
        }
    }
    Ok(PacketRepr {
        eth: EthernetHeader {
            dst: [0x02, 0, 0, 0, 0, 0x02],
            src: [0x02, 0, 0, 0, 0, 0x01],
            vlan: vlan.then(|| VlanTag {
                pcp: 3,
                dei: false,
                vid: (r.next_u32() & 0x0fff) as u16,
            }),
        },
        ip,
        udp_src_port: 0xc000 | (r.next_u32() & 0x3fff) as u16,
        bth: bth::Repr {
            opcode,
            solicited: r.next_u32() & 1 == 1,
            mig_req: r.next_u32() & 1 == 1,
            pad_count: 0,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: r.next_u32() & bth::MASK_24,
            ack_req: r.next_u32() & 1 == 1,
            psn: r.next_u32() & bth::MASK_24,
        },
        ext,
    })
}

/// A whole frame for `opcode` with a seeded payload of `payload_len` bytes
/// (ignored for opcodes that carry none).
pub fn sample_frame(
    opcode: Opcode,
    ipv6: bool,
    vlan: bool,
    payload_len: usize,
    seed: u64,
) -> Result<Vec<u8>> {
    let repr = sample_repr(opcode, ipv6, vlan, seed)?;
    let len = if opcode.info()?.has_payload {
        payload_len
    } else {
        0
    };
    let mut payload = vec![0u8; len];
    SplitMix::new(seed).fill(&mut payload);
    let mut buf = vec![0u8; repr.buffer_len(len)?];
    let n = repr.emit(&mut buf, &payload)?;
    buf.truncate(n);
    Ok(buf)
}
