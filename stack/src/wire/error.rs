//! The one error type of the wire layer.
//!
//! Every reason a receiver drops a frame is its own variant, so a caller can
//! count them the way rxe's hw_counters do (see [`Error::counter_name`]).

use core::fmt;

/// The header (layer) an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Layer {
    Ethernet,
    Vlan,
    Ipv4,
    Ipv6,
    Udp,
    Bth,
    Reth,
    Aeth,
    AtomicEth,
    AtomicAckEth,
    ImmDt,
    Ieth,
    Deth,
    Cnp,
    Payload,
    Icrc,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Bth => "BTH",
            Layer::Reth => "RETH",
            Layer::Aeth => "AETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::Deth => "DETH",
            Layer::Cnp => "CNP",
            Layer::Payload => "payload",
            Layer::Icrc => "ICRC",
        };
        f.write_str(name)
    }
}

/// Why a frame or header was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A header or length field needs more bytes than the buffer holds.
    #[error("{layer}: truncated, needed {needed} bytes, have {have}")]
    Truncated {
        layer: Layer,
        needed: usize,
        have: usize,
    },
    /// The EtherType (after at most one 802.1Q tag) is not IPv4 or IPv6.
    #[error("not RoCE v2: EtherType {0:#06x}")]
    EtherType(u16),
    /// The IP version nibble disagrees with the EtherType.
    #[error("IP version {0} does not match the EtherType")]
    IpVersion(u8),
    /// IPv4 header with options (IHL other than 5): RoCE v2 senders never add them.
    #[error("IPv4 header length {0} bytes is not 20 (options are not supported)")]
    Ipv4Options(usize),
    /// IPv4 header checksum does not verify.
    #[error("IPv4 header checksum is wrong")]
    Ipv4Checksum,
    /// A fragment (MF set or offset non-zero): RoCE v2 is never fragmented.
    #[error("IPv4 fragment")]
    Ipv4Fragment,
    /// An IP or UDP length field disagrees with the bytes present.
    #[error("{layer}: length field says {declared} bytes, frame holds {actual}")]
    Length {
        layer: Layer,
        declared: usize,
        actual: usize,
    },
    /// IP next header / protocol is not UDP.
    #[error("not RoCE v2: IP protocol {0}")]
    NotUdp(u8),
    /// UDP destination port is not 4791.
    #[error("not RoCE v2: UDP destination port {0}")]
    UdpPort(u16),
    /// A non-zero UDP checksum that does not verify.
    #[error("UDP checksum is wrong")]
    UdpChecksum,
    /// BTH transport header version is not 0.
    #[error("BTH TVer {0} is not 0")]
    BthVersion(u8),
    /// An opcode that is reserved or belongs to a transport we do not speak (RD).
    #[error("unknown or unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// Pad count is inconsistent with the payload (payload + pad not a multiple of 4,
    /// or pad on an opcode that carries no payload).
    #[error("pad count {pad} inconsistent with {len} payload+pad bytes")]
    Pad { pad: u8, len: usize },
    /// Payload longer than the largest path MTU (4096).
    #[error("payload of {0} bytes exceeds 4096")]
    PayloadTooLong(usize),
    /// Payload bytes on an opcode that carries none (READ request, ACK, ...).
    #[error("opcode {opcode:#04x} carries no payload but has {len} bytes")]
    UnexpectedPayload { opcode: u8, len: usize },
    /// The invariant CRC does not match.
    #[error("ICRC {received:#010x} does not match computed {computed:#010x}")]
    Icrc { computed: u32, received: u32 },
    /// Emit was asked for extension headers other than those the opcode carries.
    #[error("extension headers do not match opcode {opcode:#04x}")]
    HeaderMismatch { opcode: u8 },
    /// The caller's buffer is too small to emit into.
    #[error("buffer of {have} bytes too small, need {needed}")]
    BufferTooSmall { needed: usize, have: usize },
}

impl Error {
    /// A stable, snake_case name for the counter this error increments.
    pub fn counter_name(&self) -> &'static str {
        match self {
            Error::Truncated { .. } => "rx_truncated",
            Error::EtherType(_) => "rx_not_ip",
            Error::IpVersion(_) => "rx_ip_version",
            Error::Ipv4Options(_) => "rx_ipv4_options",
            Error::Ipv4Checksum => "rx_ipv4_checksum",
            Error::Ipv4Fragment => "rx_ipv4_fragment",
            Error::Length { .. } => "rx_length_mismatch",
            Error::NotUdp(_) => "rx_not_udp",
            Error::UdpPort(_) => "rx_not_roce_port",
            Error::UdpChecksum => "rx_udp_checksum",
            Error::BthVersion(_) => "rx_bth_tver",
            Error::UnknownOpcode(_) => "rx_bad_opcode",
            Error::Pad { .. } => "rx_bad_pad",
            Error::PayloadTooLong(_) => "rx_oversize",
            Error::UnexpectedPayload { .. } => "rx_unexpected_payload",
            Error::Icrc { .. } => "rx_icrc_err",
            Error::HeaderMismatch { .. } => "tx_header_mismatch",
            Error::BufferTooSmall { .. } => "tx_buffer_too_small",
        }
    }

    /// True when the frame is simply not RoCE v2 traffic (another EtherType,
    /// protocol or port), as opposed to a malformed RoCE v2 frame.
    pub fn is_not_roce(&self) -> bool {
        matches!(
            self,
            Error::EtherType(_) | Error::NotUdp(_) | Error::UdpPort(_)
        )
    }
}

/// The wire layer's result type.
pub type Result<T> = core::result::Result<T, Error>;

/// Check that `buf` holds at least `needed` bytes for `layer`.
pub(crate) fn check_len(layer: Layer, buf: &[u8], needed: usize) -> Result<()> {
    if buf.len() < needed {
        Err(Error::Truncated {
            layer,
            needed,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}
