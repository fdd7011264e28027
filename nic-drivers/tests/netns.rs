//! The namespace test network: links, MTU 9000, v4+v6, teardown after panic.

use ferroce_nic::netns::{self, Topology, TopologyConfig};

fn skip() -> bool {
    if !ferroce_nic::is_root() {
        eprintln!("SKIP: netns tests need root (CAP_NET_ADMIN)");
        return true;
    }
    false
}

fn ping(t: &Topology, from: usize, to: &str, size: &str) -> bool {
    t.command(from, "ping")
        .args(["-c", "1", "-W", "2", "-s", size, "-M", "do", to])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn pair_pings_at_mtu_9000_v4_and_v6() {
    if skip() {
        return;
    }
    let t = Topology::up(&TopologyConfig::default()).unwrap();
    let b4 = t.host(1).ipv4.to_string();
    let b6 = t.host(1).ipv6.to_string();
    assert!(ping(&t, 0, &b4, "8972"), "9000-byte IPv4 ping");
    assert!(!ping(&t, 0, &b4, "8973"), "9001 bytes must not fit");
    assert!(ping(&t, 0, &b6, "8952"), "9000-byte IPv6 ping");
    let names: Vec<String> = t.hosts().iter().map(|h| h.ns.clone()).collect();
    drop(t);
    let left = netns::list_namespaces().unwrap();
    assert!(names.iter().all(|n| !left.contains(n)), "removed on drop");
}

#[test]
fn bridge_of_three_with_netem() {
    if skip() {
        return;
    }
    let cfg = TopologyConfig {
        hosts: 3,
        netem: Some("delay 1ms".into()),
        ..TopologyConfig::default()
    };
    let t = match Topology::up(&cfg) {
        Err(ferroce_nic::NicError::Unsupported(why)) => {
            eprintln!("netem unavailable here ({why}); bridge without it");
            Topology::up(&TopologyConfig { netem: None, ..cfg }).unwrap()
        }
        r => r.unwrap(),
    };
    for (a, b) in [(0, 1), (1, 2), (2, 0)] {
        assert!(ping(&t, a, &t.host(b).ipv4.to_string(), "1000"), "{a}->{b}");
    }
    // setns on a thread: the interface seen there is the host's.
    let idx = t
        .run_in(1, || {
            let c = std::ffi::CString::new("veth0").unwrap();
            // SAFETY: valid C string.
            unsafe { libc::if_nametoindex(c.as_ptr()) }
        })
        .unwrap();
    assert_ne!(idx, 0, "veth0 exists inside the namespace");
}

#[test]
fn removed_after_panic() {
    if skip() {
        return;
    }
    let tag = format!("panic{}", std::process::id());
    let r = std::panic::catch_unwind(|| {
        let _t = Topology::up(&TopologyConfig {
            tag: Some(tag.clone()),
            ..TopologyConfig::default()
        })
        .unwrap();
        panic!("test body failed");
    });
    assert!(r.is_err());
    let left = netns::list_namespaces().unwrap();
    assert!(!left.iter().any(|n| n.contains(&tag)), "{left:?}");
}

#[test]
fn neighbour_resolution_with_and_without_static_entries() {
    if skip() {
        return;
    }
    use ferroce_nic::neigh;
    use std::time::Duration;
    for static_neighbours in [true, false] {
        let t = Topology::up(&TopologyConfig {
            static_neighbours,
            ..TopologyConfig::default()
        })
        .unwrap();
        let want = t.host(1).mac;
        for ip in [t.host(1).ipv4.into(), t.host(1).ipv6.into()] {
            let got = t
                .run_in(0, move || {
                    neigh::resolve(ip, "veth0", Duration::from_secs(3))
                })
                .unwrap()
                .unwrap();
            assert_eq!(got, want, "{ip} static={static_neighbours}");
            // The rtnetlink path itself (not the `ip neigh` fallback) finds it.
            let direct = t
                .run_in(0, move || {
                    let c = std::ffi::CString::new("veth0").unwrap();
                    // SAFETY: valid C string.
                    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
                    neigh::lookup_netlink(ip, idx)
                })
                .unwrap()
                .unwrap();
            assert_eq!(direct, Some(want));
        }
    }
}

#[test]
fn cli_up_persists_and_down_removes() {
    if skip() {
        return;
    }
    let name = format!("cli{}", std::process::id());
    let out = netns::cli(&["up".into(), "3".into(), name.clone()]).unwrap();
    assert_eq!(out.lines().count(), 3, "{out}");
    let ns = format!("frc-{name}-h0");
    assert!(
        netns::list_namespaces().unwrap().contains(&ns),
        "still there after the Topology dropped"
    );
    let gone = netns::down(Some(&format!("frc-{name}"))).unwrap();
    assert_eq!(gone.len(), 4, "3 hosts + bridge: {gone:?}");
    assert!(!netns::list_namespaces()
        .unwrap()
        .iter()
        .any(|n| n.contains(&name)));
}
