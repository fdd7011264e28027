//! ferroce-fuzz: the bodies of ferroce's fuzz targets.
//!
//! Each function takes arbitrary bytes and must never panic; it asserts the
//! properties that must hold for any input (a frame that parses re-emits to
//! a frame that parses to the same thing). The libFuzzer entry points call
//! these, and plain `cargo test` replays seeds and every crash ever found
//! through the same functions.
#![forbid(unsafe_code)]

use ferroce_stack::wire::{
    aeth, atomic_ack_eth, atomic_eth, bth, cnp, deth, ieth, immdt, reth, ParsedPacket,
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
