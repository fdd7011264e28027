//! Debian's ibverbs-utils, unmodified, over the ferroce libibverbs.so.1
//! between two network-namespace hosts. Needs root; skips without it.

mod common;

use std::time::Duration;

use common::{can_run, pair, tool, topology};

const T: Duration = Duration::from_secs(60);

#[test]
fn ibv_devinfo_lists_the_ferroce_device() {
    if !can_run("ibv_devinfo", &["ibv_devinfo", "ibv_devices"]) {
        return;
    }
    let topo = topology("cdev");
    let out = tool(&topo, 0, "ibv_devinfo", &["-v"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ibv_devinfo: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("hca_id:\tferroce_veth0"), "{text}");
    assert!(text.contains("PORT_ACTIVE"), "{text}");
    assert!(text.contains("link_layer:\t\tEthernet"), "{text}");
    assert!(text.contains("::ffff:198.18.0.1, RoCE v2"), "{text}");
    let out = tool(&topo, 0, "ibv_devices", &[]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("ferroce_veth0"),
        "{text}"
    );
}

#[test]
fn ibv_rc_pingpong_validates_data() {
    if !can_run("ibv_rc_pingpong", &["ibv_rc_pingpong"]) {
        return;
    }
    let topo = topology("crc");
    for extra in [&[][..], &["-e"][..], &["-s", "65536", "-m", "4096"][..]] {
        let mut args = vec!["-g", "1", "-c", "-n", "200"];
        args.extend_from_slice(extra);
        let (s, c) = pair(&topo, "ibv_rc_pingpong", &args, T);
        for t in [&s, &c] {
            assert!(t.contains("200 iters in"), "{args:?}: {t}");
        }
    }
}

#[test]
fn ibv_ud_pingpong() {
    if !can_run("ibv_ud_pingpong", &["ibv_ud_pingpong"]) {
        return;
    }
    let topo = topology("cud");
    for extra in [&[][..], &["-e"][..]] {
        let mut args = vec!["-g", "1", "-n", "200", "-s", "1024"];
        args.extend_from_slice(extra);
        let (s, c) = pair(&topo, "ibv_ud_pingpong", &args, T);
        for t in [&s, &c] {
            assert!(t.contains("200 iters in"), "{args:?}: {t}");
        }
    }
}

#[test]
fn ibv_srq_pingpong() {
    if !can_run("ibv_srq_pingpong", &["ibv_srq_pingpong"]) {
        return;
    }
    let topo = topology("csrq");
    for extra in [&[][..], &["-e"][..]] {
        let mut args = vec!["-g", "1", "-n", "200", "-q", "4"];
        args.extend_from_slice(extra);
        let (s, c) = pair(&topo, "ibv_srq_pingpong", &args, T);
        for t in [&s, &c] {
            assert!(t.contains("200 iters in"), "{args:?}: {t}");
        }
    }
}

#[test]
fn ibv_uc_pingpong() {
    if !can_run("ibv_uc_pingpong", &["ibv_uc_pingpong"]) {
        return;
    }
    let topo = topology("cuc");
    let args = ["-g", "1", "-n", "200", "-s", "2048"];
    let (s, c) = pair(&topo, "ibv_uc_pingpong", &args, T);
    for t in [&s, &c] {
        assert!(t.contains("200 iters in"), "{t}");
    }
}
