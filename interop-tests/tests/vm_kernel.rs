//! ferroce's own backends on the VM's kernel: Debian 12's Linux 6.1, older than the host's and
//! still the kernel of many machines ferroce runs on (Debian 12; Ubuntu 22.04 and RHEL 9 are
//! older still). Inside one VM, `ferroce netns up` makes two namespace hosts on a veth pair; a
//! UDP-backend device in one and an AF_PACKET (or AF_XDP) device in the other run WRITE and READ
//! benches both ways, every one checking its data at the end. (AF_XDP's program, in generic mode
//! on veth here, takes GSO off its veth peer, so frames reach it one by one.)
//!
//! What it guards: a UDP-backend device sends a run of same-size packets as one UDP GSO datagram,
//! which crosses veth whole. Before Linux 6.2 a packet socket's virtio-net header has no kind for
//! UDP GSO and the kernel drops such a frame rather than hand it over, so every message of more
//! than one packet from a UDP device to an AF_PACKET device on the same host was lost and the
//! transfer stalled (found in this VM); now the AF_PACKET backend takes such frames whole there
//! and cuts them itself. The host's own tests run on its newer kernel and cannot see this.
//!
//! Skips (passing, with a message) when not root, without QEMU, or when the image cannot be
//! built. TCG is slow: few iterations; this checks function, not speed.

use std::time::{Duration, Instant};

use ferroce_interop::host::ferroce_bin;
use ferroce_interop::vm::{self, RxeVm, VmConfig};

/// Per bench run under TCG (a few seconds each).
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[test]
fn udp_and_raw_devices_on_linux_6_1() {
    if let Some(why) = vm::skip_reason() {
        eprintln!("SKIP VM kernel test: {why}");
        return;
    }
    let bin = ferroce_bin().expect("ferroce binary");
    let vm = RxeVm::boot(&VmConfig::default()).expect("boot the VM");
    eprintln!(
        "{} ready in {:.1} s",
        vm.name(),
        vm.boot_time().as_secs_f64()
    );
    std::fs::copy(&bin, vm.share_dir().join("ferroce")).expect("share ferroce into the VM");
    let kernel = vm.run_ok("uname -r").expect("uname");
    eprintln!("VM kernel {}", kernel.stdout_str().trim());
    let up = vm
        .run_ok("/mnt/host/ferroce netns up 2 k")
        .expect("two namespace hosts on veth in the VM");
    eprintln!("{}", up.stdout_str());

    // A WRITE of 64 KiB messages (runs of MTU-sized packets go out as UDP GSO datagrams) and
    // READs of every size (a batch of requests goes out as one; responses come back in runs).
    let benches = ["write -s 65536 -n 50", "read -a -n 5"];
    let mut failures = Vec::new();
    for (server, client) in [
        ("afpacket", "udp"),
        ("udp", "afpacket"),
        ("afxdp", "udp"),
        ("udp", "afxdp"),
    ] {
        for bench in benches {
            let started = Instant::now();
            let srv = vm
                .spawn(&format!(
                    "ip netns exec frc-k-h0 /mnt/host/ferroce bench {bench} --backend {server}"
                ))
                .expect("start the server");
            vm.wait_listening_in("frc-k-h0", 18515, Duration::from_secs(30))
                .expect("the server listens");
            let cli = vm
                .run_timeout(
                    &format!(
                        "ip netns exec frc-k-h1 /mnt/host/ferroce bench {bench} --backend {client} 198.18.0.1"
                    ),
                    RUN_TIMEOUT,
                )
                .expect("run the client");
            let srv = srv.wait_timeout(RUN_TIMEOUT).expect("the server ends");
            let case = format!("{bench}: {client} client → {server} server");
            eprintln!(
                "{case}: client {}, server {} in {:.1} s",
                cli.status,
                srv.status,
                started.elapsed().as_secs_f64()
            );
            if cli.status != 0 || srv.status != 0 {
                failures.push(format!(
                    "{case}: client exit {} ({}), server exit {} ({})",
                    cli.status,
                    vm::tail(&cli.stderr_str(), 5),
                    srv.status,
                    vm::tail(&srv.stderr_str(), 5)
                ));
            }
        }
    }
    let _ = vm.run("/mnt/host/ferroce netns down k");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
