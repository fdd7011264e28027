//! ferroce-interop: tests of ferroce against independent peers and oracles.
//!
//! Linux's soft-RoCE driver (rxe) booted in a QEMU VM with Debian's stock
//! rdma-core and perftest tools, and the independent dissectors and encoders
//! tshark and scapy. Tests here skip with a clear message when the tool they
//! need (root, QEMU, tshark, python3 with scapy) is missing.
#![forbid(unsafe_code)]
