//! ferroce-nic: packet engines that move raw Ethernet frames between the
//! ferroce transport core and a network interface.
//!
//! Every backend (AF_XDP, AF_PACKET with TPACKET_V3 rings, a kernel UDP
//! socket on port 4791, and an in-memory pair for tests) sits behind one
//! batch receive/transmit trait, so the layers above never learn which one
//! carries their frames. The crate knows frames, not queue pairs: it does not
//! depend on `ferroce-stack`.
