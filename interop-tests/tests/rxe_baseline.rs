//! rxe ⇄ rxe baselines between two QEMU VMs on one bridge: the stock rdma-core and perftest tools
//! must work there before ferroce is compared with them. Each run is captured on vm0's tap; the
//! captures are checked (UDP 4791, opcodes expected, ICRC of every packet) and, with
//! `FERROCE_UPDATE_CAPTURES=1`, copied to `interop-tests/captures/` as golden files for `ferroce
//! decode`.
//!
//! Skips (passing, with a message) when not root, without QEMU, or when the image cannot be built.
//! TCG is slow: iteration counts are tiny; the tests check function, not speed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ferroce_interop::vm::{self, Output, RxeLab, RxeVm};

/// Largest committed capture.
const MAX_CAPTURE_BYTES: u64 = 200 * 1024;

fn lab_or_skip(n: usize) -> Option<RxeLab> {
    if let Some(why) = vm::skip_reason() {
        eprintln!("SKIP rxe VM test: {why}");
        return None;
    }
    let lab = RxeLab::new(n).unwrap();
    for vm in lab.vms() {
        eprintln!(
            "{} ready in {:.1} s",
            vm.name(),
            vm.boot_time().as_secs_f64()
        );
    }
    Some(lab)
}

fn captures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("captures")
}

/// Runs `server` in vm1 and `client` (with `{server}` replaced by vm1's address) in vm0, capturing
/// vm0's RoCE traffic into `capture` (a name like `rxe-rc-send`). Returns both outputs and the
/// opcodes seen.
fn pair(lab: &RxeLab, capture: &str, server: &str, client: &str) -> (Output, Output, BTreeSet<u8>) {
    let (c, s) = (lab.vm(0), lab.vm(1));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rxe-captures");
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join(format!("{capture}.pcap"));
    let cap = lab.capture(c.tap(), &pcap, "udp port 4791").unwrap();
    let started = Instant::now();
    let srv = s.spawn(server).unwrap();
    s.wait_listening(18515, Duration::from_secs(60)).unwrap();
    let client = client.replace("{server}", &s.ip().to_string());
    let cli_out = c.run_timeout(&client, Duration::from_secs(240)).unwrap();
    let srv_out = srv.wait_timeout(Duration::from_secs(60)).unwrap();
    // Let the last ACKs cross the tap before tcpdump stops.
    std::thread::sleep(Duration::from_millis(300));
    let stats = cap.stop().unwrap();
    eprintln!(
        "{capture}: {:.1} s, {} packets captured ({} dropped)",
        started.elapsed().as_secs_f64(),
        stats.captured,
        stats.dropped
    );
    assert!(srv_out.success(), "{}", srv_out.describe(server));
    assert!(cli_out.success(), "{}", cli_out.describe(&client));
    let opcodes = check_pcap(&pcap);
    if std::env::var_os("FERROCE_UPDATE_CAPTURES").is_some() {
        let size = std::fs::metadata(&pcap).unwrap().len();
        assert!(
            size <= MAX_CAPTURE_BYTES,
            "{capture}: {size} bytes is too big to commit"
        );
        std::fs::create_dir_all(captures_dir()).unwrap();
        std::fs::copy(&pcap, captures_dir().join(format!("{capture}.pcap"))).unwrap();
    }
    (srv_out, cli_out, opcodes)
}

fn assert_opcodes(seen: &BTreeSet<u8>, want: &[u8]) {
    for op in want {
        assert!(
            seen.contains(op),
            "opcode {op:#04x} missing; seen {seen:02x?}"
        );
    }
}

#[test]
fn rxe_to_rxe_baselines() {
    let Some(lab) = lab_or_skip(2) else { return };
    let started = Instant::now();

    // RC SEND, 3000 B at path MTU 1024: SEND_FIRST/MIDDLE/LAST and ACKs; -c checks the data.
    let (_, out, ops) = pair(
        &lab,
        "rxe-rc-send",
        "ibv_rc_pingpong -g 1 -m 1024 -s 3000 -n 4 -c",
        "ibv_rc_pingpong -g 1 -m 1024 -s 3000 -n 4 -c {server}",
    );
    assert!(out.stdout_str().contains("iters"), "{}", out.stdout_str());
    assert_opcodes(&ops, &[0x00, 0x01, 0x02, 0x11]);

    // The same over the IPv6 GID (RoCE v2 in IPv6: another ICRC mask), at path MTU 4096.
    let gid6 = ipv6_gid_index(lab.vm(1));
    assert_eq!(gid6, ipv6_gid_index(lab.vm(0)));
    // rxe looks the peer's MAC up when a QP goes to RTR and gives up if the neighbour is not
    // resolved within its wait; IPv6 neighbour discovery between two TCG guests on a loaded
    // host once took longer ("Failed to modify QP to RTR" in CI), so both entries come first.
    for (from, to) in [(0, 1), (1, 0)] {
        let ping = format!("ping -6 -c 1 -W 10 {}", lab.vm(to).ipv6());
        let out = lab.vm(from).run(&ping).expect("ping between the VMs");
        assert!(out.success(), "{}", out.describe(&ping));
    }
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-send-ipv6",
        &format!("ibv_rc_pingpong -g {gid6} -m 4096 -s 5000 -n 2 -c"),
        &format!("ibv_rc_pingpong -g {gid6} -m 4096 -s 5000 -n 2 -c {{server}}"),
    );
    assert_opcodes(&ops, &[0x00, 0x02, 0x11]);

    // UC: no ACKs.
    let (_, _, ops) = pair(
        &lab,
        "rxe-uc-send",
        "ibv_uc_pingpong -g 1 -s 2000 -n 3 -c",
        "ibv_uc_pingpong -g 1 -s 2000 -n 3 -c {server}",
    );
    assert_opcodes(&ops, &[0x20, 0x22]);

    // UD SEND_ONLY with DETH.
    let (_, _, ops) = pair(
        &lab,
        "rxe-ud-send",
        "ibv_ud_pingpong -g 1 -s 512 -n 4 -c",
        "ibv_ud_pingpong -g 1 -s 512 -n 4 -c {server}",
    );
    assert_opcodes(&ops, &[0x64]);

    // SRQ (RC on the wire; 16 QPs by default, so fewer here).
    let (_, _, ops) = pair(
        &lab,
        "rxe-srq-send",
        "ibv_srq_pingpong -g 1 -q 2 -s 256 -n 3 -c",
        "ibv_srq_pingpong -g 1 -q 2 -s 256 -n 3 -c {server}",
    );
    assert_opcodes(&ops, &[0x04, 0x11]);

    // RDMA WRITE 3000 B at MTU 1024: WRITE_FIRST/MIDDLE/LAST.
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-write",
        "ib_write_bw -x 1 -m 1024 -s 3000 -n 5 -F",
        "ib_write_bw -x 1 -m 1024 -s 3000 -n 5 -F {server}",
    );
    assert_opcodes(&ops, &[0x06, 0x07, 0x08, 0x11]);

    // RDMA READ 3000 B: READ_REQUEST, READ_RESPONSE_FIRST/MIDDLE/LAST.
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-read",
        "ib_read_bw -x 1 -m 1024 -s 3000 -n 5 -F",
        "ib_read_bw -x 1 -m 1024 -s 3000 -n 5 -F {server}",
    );
    assert_opcodes(&ops, &[0x0c, 0x0d, 0x0e, 0x0f]);

    // Single-packet WRITE and READ: WRITE_ONLY, READ_RESPONSE_ONLY.
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-write-lat",
        "ib_write_lat -x 1 -s 64 -n 10 -F",
        "ib_write_lat -x 1 -s 64 -n 10 -F {server}",
    );
    assert_opcodes(&ops, &[0x0a]);
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-read-lat",
        "ib_read_lat -x 1 -s 64 -n 10 -F",
        "ib_read_lat -x 1 -s 64 -n 10 -F {server}",
    );
    assert_opcodes(&ops, &[0x0c, 0x10]);

    // Atomics, both kinds: request and ATOMIC_ACKNOWLEDGE.
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-atomic-fadd",
        "ib_atomic_bw -x 1 -A FETCH_AND_ADD -n 5 -F",
        "ib_atomic_bw -x 1 -A FETCH_AND_ADD -n 5 -F {server}",
    );
    assert_opcodes(&ops, &[0x14, 0x12]);
    let (_, _, ops) = pair(
        &lab,
        "rxe-rc-atomic-cswap",
        "ib_atomic_bw -x 1 -A CMP_AND_SWAP -n 5 -F",
        "ib_atomic_bw -x 1 -A CMP_AND_SWAP -n 5 -F {server}",
    );
    assert_opcodes(&ops, &[0x13, 0x12]);

    // SEND latency, small (inline) messages.
    let (_, out, ops) = pair(
        &lab,
        "rxe-rc-send-lat",
        "ib_send_lat -x 1 -s 64 -n 10 -F",
        "ib_send_lat -x 1 -s 64 -n 10 -F {server}",
    );
    assert!(out.stdout_str().contains("t_avg"), "{}", out.stdout_str());
    assert_opcodes(&ops, &[0x04]);

    eprintln!("baselines took {:.1} s", started.elapsed().as_secs_f64());
}

/// The GID index of rxe0's fd77:: address.
fn ipv6_gid_index(vm: &RxeVm) -> u32 {
    for i in 0..8 {
        if let Ok(gid) = vm.gid(i) {
            if gid.segments()[0] == 0xfd77 {
                return i;
            }
        }
    }
    panic!("{}: no fd77:: GID", vm.name());
}

/// The control channel: exit statuses, stdout/stderr separation, background jobs, kill,
/// files both ways, GIDs.
#[test]
fn vm_control_channel() {
    let Some(lab) = lab_or_skip(1) else { return };
    let vm = lab.vm(0);
    let out = vm.run("echo out; echo err >&2; exit 7").unwrap();
    assert_eq!(out.status, 7);
    assert_eq!(out.stdout, b"out\n");
    assert_eq!(out.stderr, b"err\n");

    // Binary-safe, and no protocol confusion from output that looks like protocol lines.
    let out = vm.run("printf '@@F 1 END 0\\n\\000\\377'").unwrap();
    assert_eq!(out.stdout, b"@@F 1 END 0\n\x00\xff");

    let mut job = vm.spawn("sleep 1; echo done").unwrap();
    let long = vm.spawn("sleep 600").unwrap();
    assert!(job.try_wait().unwrap().is_none());
    let out = vm.run("ip -br link show eth0").unwrap();
    assert!(out.stdout_str().contains("UP"), "{}", out.stdout_str());
    let out = job.wait().unwrap();
    assert_eq!(out.stdout, b"done\n");
    let out = long.stop("TERM").unwrap();
    assert_eq!(out.status, 128 + 15);

    let err = vm
        .run_timeout("sleep 30", Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(err, vm::Error::Timeout { .. }), "{err}");

    let data: Vec<u8> = (0..=255u8).cycle().take(5000).collect();
    vm.write_file("/tmp/blob", &data).unwrap();
    assert_eq!(vm.read_file("/tmp/blob").unwrap(), data);
    std::fs::write(vm.share_dir().join("from-host"), b"hello").unwrap();
    assert_eq!(vm.read_file("/mnt/host/from-host").unwrap(), b"hello");

    assert_eq!(vm.gid(1).unwrap().to_ipv4_mapped(), Some(vm.ip()));
    let out = vm
        .run("cat /sys/class/infiniband/rxe0/ports/1/state; cat /sys/class/net/eth0/mtu")
        .unwrap();
    assert!(out.stdout_str().contains("ACTIVE"), "{}", out.stdout_str());
    assert!(out.stdout_str().contains("9000"), "{}", out.stdout_str());

    // The host side of the lab reaches the VM.
    let ping = lab
        .command("ping")
        .args(["-c", "1", "-W", "10", &vm.ip().to_string()])
        .output()
        .unwrap();
    assert!(ping.status.success(), "{ping:?}");

    // Nothing left behind.
    let ns = lab.netns().to_owned();
    drop(lab);
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&ns));
}

/// The committed golden captures: small, RoCE v2 only, and every ICRC right (needs no VM).
#[test]
fn committed_captures_are_valid() {
    let Ok(entries) = std::fs::read_dir(captures_dir()) else {
        eprintln!("no captures committed yet");
        return;
    };
    let mut n = 0;
    for entry in entries {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pcap") {
            let size = std::fs::metadata(&path).unwrap().len();
            assert!(
                size <= MAX_CAPTURE_BYTES,
                "{}: {size} bytes",
                path.display()
            );
            let ops = check_pcap(&path);
            assert!(!ops.is_empty(), "{}", path.display());
            n += 1;
        }
    }
    eprintln!("{n} captures valid");
}

/// Reads a pcap of RoCE v2 frames; asserts every frame is UDP 4791 with a correct ICRC; returns
/// the BTH opcodes seen.
fn check_pcap(path: &Path) -> BTreeSet<u8> {
    let file = std::fs::File::open(path).unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
    let mut opcodes = BTreeSet::new();
    let mut count = 0;
    while let Some(pkt) = reader.next_packet() {
        let pkt = pkt.unwrap();
        count += 1;
        let (op, ok) = roce_icrc(&pkt.data)
            .unwrap_or_else(|| panic!("{}: packet {count} is not RoCE v2", path.display()));
        assert!(
            ok,
            "{}: packet {count} (opcode {op:#04x}) has a bad ICRC",
            path.display()
        );
        opcodes.insert(op);
    }
    assert!(count > 0, "{}: empty capture", path.display());
    opcodes
}

/// (BTH opcode, ICRC correct) of an Ethernet/IPv4-or-IPv6/UDP 4791 frame. An independent
/// implementation of the rule in DESIGN.md: CRC-32 over 8 × 0xFF, the IP header with its variant
/// fields set to ones, the UDP header with checksum ones, the BTH with byte 4 ones, the rest.
fn roce_icrc(frame: &[u8]) -> Option<(u8, bool)> {
    let mut off = 14;
    let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype == 0x8100 {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        off = 18;
    }
    let mut masked = vec![0xffu8; 8];
    let (ip_len, total) = match ethertype {
        0x0800 => {
            let ihl = usize::from(frame.get(off)? & 0x0f) * 4;
            let total = usize::from(u16::from_be_bytes([
                *frame.get(off + 2)?,
                *frame.get(off + 3)?,
            ]));
            if *frame.get(off + 9)? != 17 {
                return None;
            }
            let mut ip = frame.get(off..off + ihl)?.to_vec();
            ip[1] = 0xff; // DSCP/ECN
            ip[8] = 0xff; // TTL
            ip[10] = 0xff; // header checksum
            ip[11] = 0xff;
            masked.extend_from_slice(&ip);
            (ihl, total)
        }
        0x86dd => {
            let payload = usize::from(u16::from_be_bytes([
                *frame.get(off + 4)?,
                *frame.get(off + 5)?,
            ]));
            if *frame.get(off + 6)? != 17 {
                return None;
            }
            let mut ip = frame.get(off..off + 40)?.to_vec();
            ip[0] |= 0x0f; // traffic class (high half), flow label
            ip[1] = 0xff;
            ip[2] = 0xff;
            ip[3] = 0xff;
            ip[7] = 0xff; // hop limit
            masked.extend_from_slice(&ip);
            (40, 40 + payload)
        }
        _ => return None,
    };
    // The IP length, not the frame's, bounds the packet: short frames carry Ethernet padding.
    let end = off + total;
    let udp = off + ip_len;
    if u16::from_be_bytes([*frame.get(udp + 2)?, *frame.get(udp + 3)?]) != 4791
        || end < udp + 8 + 12 + 4
    {
        return None;
    }
    let mut udp_hdr = frame.get(udp..udp + 8)?.to_vec();
    udp_hdr[6] = 0xff;
    udp_hdr[7] = 0xff;
    masked.extend_from_slice(&udp_hdr);
    let bth = udp + 8;
    let mut rest = frame.get(bth..end - 4)?.to_vec();
    rest[4] = 0xff;
    masked.extend_from_slice(&rest);
    let want = u32::from_le_bytes(frame.get(end - 4..end)?.try_into().ok()?);
    Some((frame[bth], crc32fast::hash(&masked) == want))
}
