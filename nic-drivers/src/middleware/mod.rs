//! Wrappers around any [`crate::PacketIo`]: fault injection and pcap capture,
//! in the manner of smoltcp's `phy` middleware.

pub mod fault;
pub mod pcap;
