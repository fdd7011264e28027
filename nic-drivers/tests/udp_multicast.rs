//! UDP backend multicast between two namespace hosts: frames to a group leave
//! through the device's own interface (as rxe's leave through its netdev),
//! not wherever the routing table points. A socket bound to an address of
//! the interface goes there anyway (the kernel routes a group send by its
//! source); one bound to the wildcard address did not: the test hosts have
//! no default route, and every send to the group failed (ENETUNREACH) and
//! was counted as dropped.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::*;
use ferroce_nic::frame::ROCE_V2_PORT;
use ferroce_nic::mcast::multicast_mac;
use ferroce_nic::{PacketIo, UdpConfig, UdpIo};

fn udp_device(ifname: &str, ip: IpAddr) -> Io {
    let mut c = UdpConfig::new(SocketAddr::new(ip, ROCE_V2_PORT));
    c.ifindex = ferroce_nic::ifaces::index(ifname).expect("interface index");
    Box::new(UdpIo::bind(c).expect("UDP device"))
}

#[test]
fn a_group_send_leaves_through_the_devices_interface() {
    if !root_or_skip("UDP multicast between namespaces") {
        return;
    }
    let t = topo();
    let (ea, eb) = ends(&t, false);
    let (ifa, ifb) = (t.host(0).ifname.clone(), t.host(1).ifname.clone());
    let any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let mut a: Io = t.run_in(0, move || udp_device(&ifa, any)).unwrap();
    let mut b: Io = t.run_in(1, move || udp_device(&ifb, eb.ip)).unwrap();
    let group = IpAddr::V4(Ipv4Addr::new(239, 9, 8, 7));
    b.join_multicast(group).expect("join");
    let to = End {
        mac: multicast_mac(group).unwrap(),
        ip: group,
    };
    const N: u32 = 20;
    let frames: Vec<Vec<u8>> = (0..N).map(|s| frame(ea, to, s, 600)).collect();
    send_all(&mut a, &frames);
    assert_eq!(a.stats().tx_dropped, 0, "sends to the group failed");
    let got = recv_until(&mut b, N as usize, ea, to, 5);
    let seqs: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert_eq!(seqs, (0..N).collect::<Vec<_>>());
}
