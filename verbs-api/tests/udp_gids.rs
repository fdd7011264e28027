//! The UDP backend sends from the one address its socket is bound to: a path
//! from another GID of the table (index 0, the link-local one), or to a GID
//! of the other family, fails when it is set up with an error that says
//! which GID to use, instead of every frame being dropped and the QP
//! retrying for ever (ibv_rc_pingpong -g 0 hung so over the drop-in library).

use std::net::{Ipv6Addr, SocketAddr};

use ferroce_verbs::{Backend, Context, DeviceConfig, Error, OpenOptions};

fn udp_on_lo() -> Context {
    let mut cfg = DeviceConfig::new("lo", Backend::Udp);
    cfg.udp_bind = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    Context::open(&cfg, OpenOptions::default()).expect("UDP device on lo")
}

#[test]
fn only_the_bound_address_is_a_source_gid() {
    let ctx = udp_on_lo();
    let v4 = "::ffff:127.0.0.1".parse::<Ipv6Addr>().unwrap();
    assert_eq!(ctx.query_gid(1).unwrap(), v4);
    assert!(ctx.resolve_path(1, v4).is_ok());
    match ctx.resolve_path(0, v4) {
        Err(e @ Error::GidUnusable { index: 0, .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("use GID index 1"), "{msg}");
        }
        other => panic!("GID 0 on a UDP device bound to 127.0.0.1: {other:?}"),
    }
}

#[test]
fn an_ipv4_socket_cannot_reach_an_ipv6_gid() {
    let ctx = udp_on_lo();
    match ctx.resolve_path(1, Ipv6Addr::LOCALHOST) {
        Err(Error::GidUnusable {
            index: 1, reason, ..
        }) => {
            assert!(reason.contains("same family"), "{reason}")
        }
        other => panic!("IPv4 socket to ::1: {other:?}"),
    }
}
