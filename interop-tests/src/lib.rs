//! ferroce-interop: tests of ferroce against independent peers and oracles.
//!
//! Linux's soft-RoCE driver (rxe) booted in a QEMU VM with Debian's stock
//! rdma-core and perftest tools, and the independent dissectors and encoders
//! tshark and scapy. Tests here skip with a clear message when the tool they
//! need (root, QEMU, tshark, python3 with scapy) is missing.
//!
//! - [`image`]: the VM image cache (`vm/build-image.sh`).
//! - [`vm`]: [`vm::RxeVm`] and [`vm::RxeLab`], VMs with rxe on a bridge in a private namespace.
//! - [`capture`]: tcpdump on the lab's interfaces.
//! - [`host`]: the `ferroce` binary, host processes in the lab namespace, capture oracles.
//! - [`tshark`]: one tshark process for every capture a test checks.
//! - [`matrix`]: the generated results matrix (`RESULTS.md`).
//! - [`mitm`]: a perftest exchange relay that corrupts RKeys (error interop).
//! - [`speed`]: the speed comparison (`ferroce-interop speed`).
#![forbid(unsafe_code)]

pub mod capture;
pub mod host;
pub mod image;
pub mod matrix;
pub mod mitm;
pub mod speed;
pub mod tshark;
pub mod vm;

pub use capture::{Capture, CaptureStats};
pub use image::Image;
pub use vm::{Error, Output, RxeLab, RxeVm, VmConfig, VmJob};
