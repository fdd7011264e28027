//! The connection manager (rdma_cm over QP1) between two devices on the
//! in-memory switch: connect / accept with private data both ways, SENDs
//! over the connection it set up, disconnect; a REQ for a port no one
//! listens on is rejected; SIDR resolves a UD port to a QP and its Q_Key, and
//! a SIDR request no one serves is refused.

use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

use ferroce_stack::wire::mad::sidr_status;
use ferroce_verbs::cm::{init_ud_qp, CmAgent, ConnParam, RDMA_UDP_QKEY, REJ_INVALID_SERVICE_ID};
use ferroce_verbs::{
    AccessFlags, ConnectOptions, Context, EngineMode, Error, OpenOptions, QpType, RecvWr, SendOp,
    SendWr, UdDest, WcStatus,
};

const T: Duration = Duration::from_secs(10);

fn pair() -> (Context, Context) {
    let (a, b) = ferroce_nic::mem::pair().unwrap();
    let ga: Ipv6Addr = "::ffff:198.18.0.1".parse().unwrap();
    let gb: Ipv6Addr = "::ffff:198.18.0.2".parse().unwrap();
    let o = || OpenOptions {
        mode: EngineMode::Thread,
        ..Default::default()
    };
    (
        Context::with_io(Box::new(a), "mem0", vec![ga], 1, o()).unwrap(),
        Context::with_io(Box::new(b), "mem1", vec![gb], 2, o()).unwrap(),
    )
}

#[test]
fn connect_send_and_disconnect() {
    let (cs, cc) = pair();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let pd = cs.alloc_pd();
            let mut cm = CmAgent::new(&cs, &pd, 0).unwrap();
            let cq = cs.create_cq(8).unwrap();
            let qp = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
            let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
            let req = cm.get_request(7471, T).unwrap();
            assert_eq!(&req.private_data[..5], b"hello");
            assert_eq!(
                req.peer.ip(),
                "198.18.0.2".parse::<std::net::IpAddr>().unwrap()
            );
            qp.to_init(&Default::default()).unwrap();
            let sge = [mr.sge(0, 16)];
            qp.post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }])
            .unwrap();
            let param = ConnParam {
                private_data: b"welcome".to_vec(),
                ..ConnParam::default()
            };
            let conn = cm.accept(&req, &qp, &param).unwrap();
            let wc = cq.poll_n(1, T).unwrap();
            assert_eq!(wc[0].status, WcStatus::Success);
            let mut got = [0u8; 16];
            mr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"0123456789abcdef");
            mr.write(16, b"fedcba9876543210").unwrap();
            let sge = [mr.sge(16, 16)];
            qp.post_send(&[SendWr::new(2, SendOp::Send, &sge)]).unwrap();
            // The client disconnects once it has the answer.
            assert!(cm.wait_disconnect(&conn, &qp, T).unwrap());
            conn.remote_qpn
        });
        let pd = cc.alloc_pd();
        let mut cm = CmAgent::new(&cc, &pd, 0).unwrap();
        let cq = cc.create_cq(8).unwrap();
        let qp = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        qp.to_init(&Default::default()).unwrap();
        let sge = [mr.sge(0, 16)];
        qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &sge,
        }])
        .unwrap();
        let dst: SocketAddr = "198.18.0.1:7471".parse().unwrap();
        let param = ConnParam {
            private_data: b"hello".to_vec(),
            ..ConnParam::default()
        };
        let conn = cm.connect(&qp, dst, &param).unwrap();
        assert_eq!(&conn.private_data[..7], b"welcome");
        mr.write(16, b"0123456789abcdef").unwrap();
        let sge = [mr.sge(16, 16)];
        let mut wr = SendWr::new(2, SendOp::Send, &sge);
        wr.flags.signaled = true;
        qp.post_send(&[wr]).unwrap();
        let mut seen = 0;
        while seen < 2 {
            for wc in cq.poll_n(1, T).unwrap() {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                seen += 1;
            }
        }
        let mut got = [0u8; 16];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"fedcba9876543210");
        cm.disconnect(&conn, &qp).unwrap();
        assert_eq!(qp.qpn(), srv.join().unwrap());
    });
}

/// rdma_cm's remote access (the kernel's cm_init_qp_init_attr): a connection whose requester
/// announced initiator depth 0 grants it RDMA WRITE but no READ (the READ draws a NAK and
/// fails with REM_INV_REQ_ERR, as against rxe); with depth 1, READ and atomics too.
#[test]
fn a_connection_grants_read_only_to_a_peer_that_said_it_would_read() {
    let (cs, cc) = pair();
    std::thread::scope(|s| {
        s.spawn(|| {
            let pd = cs.alloc_pd();
            let mut cm = CmAgent::new(&cs, &pd, 0).unwrap();
            let cq = cs.create_cq(8).unwrap();
            let mr = pd
                .reg_mr(
                    64,
                    AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_READ.0),
                )
                .unwrap();
            mr.write(0, b"readable").unwrap();
            for depth in [0u8, 1] {
                let req = cm.get_request(7471, T).unwrap();
                let qp = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
                // Everything at INIT: the CM narrows it to what the REQ asked for.
                qp.to_init(&ConnectOptions::default()).unwrap();
                let mut private = mr.addr().to_be_bytes().to_vec();
                private.extend_from_slice(&mr.rkey().to_be_bytes());
                let param = ConnParam {
                    private_data: private,
                    ..ConnParam::default()
                };
                let conn = cm.accept(&req, &qp, &param).unwrap();
                let want = if depth == 0 {
                    AccessFlags::REMOTE_WRITE
                } else {
                    AccessFlags(
                        AccessFlags::REMOTE_WRITE.0
                            | AccessFlags::REMOTE_READ.0
                            | AccessFlags::REMOTE_ATOMIC.0,
                    )
                };
                assert_eq!(qp.query().unwrap().qp_access_flags, want, "depth {depth}");
                assert!(cm.wait_disconnect(&conn, &qp, T).unwrap());
            }
        });
        let pd = cc.alloc_pd();
        let mut cm = CmAgent::new(&cc, &pd, 0).unwrap();
        let cq = cc.create_cq(8).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let dst: SocketAddr = "198.18.0.1:7471".parse().unwrap();
        for depth in [0u8, 1] {
            let qp = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
            qp.to_init(&ConnectOptions::default()).unwrap();
            let param = ConnParam {
                initiator_depth: depth,
                ..ConnParam::default()
            };
            let conn = cm.connect(&qp, dst, &param).unwrap();
            let addr = u64::from_be_bytes(conn.private_data[..8].try_into().unwrap());
            let rkey = u32::from_be_bytes(conn.private_data[8..12].try_into().unwrap());
            let sge = [mr.sge(0, 8)];
            let mut wr = SendWr::new(
                depth.into(),
                SendOp::RdmaRead {
                    remote_addr: addr,
                    rkey,
                },
                &sge,
            );
            wr.flags.signaled = true;
            qp.post_send(&[wr]).unwrap();
            let wc = cq.poll_n(1, T).unwrap();
            if depth == 0 {
                assert_eq!(wc[0].status, WcStatus::RemInvReqErr, "{wc:?}");
            } else {
                assert_eq!(wc[0].status, WcStatus::Success, "{wc:?}");
                let mut got = [0u8; 8];
                mr.read(0, &mut got).unwrap();
                assert_eq!(&got, b"readable");
            }
            cm.disconnect(&conn, &qp).unwrap();
        }
    });
}

#[test]
fn a_port_no_one_listens_on_is_rejected() {
    let (cs, cc) = pair();
    std::thread::scope(|s| {
        s.spawn(|| {
            let pd = cs.alloc_pd();
            let mut cm = CmAgent::new(&cs, &pd, 0).unwrap();
            // Listening on 7471 only; the REQ for 7000 gets a REJ meanwhile.
            assert!(cm.get_request(7471, Duration::from_secs(3)).is_err());
        });
        let pd = cc.alloc_pd();
        let mut cm = CmAgent::new(&cc, &pd, 0).unwrap();
        let cq = cc.create_cq(8).unwrap();
        let qp = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
        let dst: SocketAddr = "198.18.0.1:7000".parse().unwrap();
        match cm.connect(&qp, dst, &ConnParam::default()) {
            Err(Error::Rejected { reason }) => assert_eq!(reason, REJ_INVALID_SERVICE_ID),
            other => panic!("expected a REJ, got {other:?}"),
        }
    });
}

#[test]
fn sidr_resolves_a_ud_port_and_refuses_an_unserved_one() {
    let (cs, cc) = pair();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let pd = cs.alloc_pd();
            let mut cm = CmAgent::new(&cs, &pd, 0).unwrap();
            let cq = cs.create_cq(8).unwrap();
            let qp = pd.create_qp().qp_type(QpType::Ud).build(&cq, &cq).unwrap();
            let opts = ConnectOptions::default();
            init_ud_qp(&cs, &qp, &opts).unwrap();
            let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
            let sge = [mr.sge(0, 40 + 8)];
            qp.post_recv(&[RecvWr {
                wr_id: 1,
                sg_list: &sge,
            }])
            .unwrap();
            // The request for 7000 (not served) is refused meanwhile.
            let req = cm.get_ud_request(7471, T).unwrap();
            assert_eq!(&req.private_data[..3], b"udp");
            assert_eq!(req.port, 7471);
            cm.accept_ud(&req, &qp, b"ok").unwrap();
            // The client's first UD SEND reaches the QP SIDR named.
            let wc = cq.poll_n(1, T).unwrap();
            assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
            let mut got = [0u8; 8];
            mr.read(40, &mut got).unwrap();
            assert_eq!(&got, b"datagram");
            qp.qpn()
        });
        let pd = cc.alloc_pd();
        let mut cm = CmAgent::new(&cc, &pd, 0).unwrap();
        let unserved: SocketAddr = "198.18.0.1:7000".parse().unwrap();
        match cm.resolve_ud(unserved, b"udp", 0) {
            Err(Error::SidrRefused { status }) => assert_eq!(status, sidr_status::UNSUPPORTED),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let dst: SocketAddr = "198.18.0.1:7471".parse().unwrap();
        let peer = loop {
            match cm.resolve_ud(dst, b"udp", 0) {
                Err(Error::SidrRefused { .. }) => std::thread::sleep(Duration::from_millis(50)),
                other => break other.unwrap(),
            }
        };
        assert_eq!(peer.qkey, RDMA_UDP_QKEY);
        assert_eq!(&peer.private_data[..2], b"ok");
        let cq = cc.create_cq(8).unwrap();
        let qp = pd.create_qp().qp_type(QpType::Ud).build(&cq, &cq).unwrap();
        let opts = ConnectOptions::default();
        init_ud_qp(&cc, &qp, &opts).unwrap();
        let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        mr.write(0, b"datagram").unwrap();
        let sge = [mr.sge(0, 8)];
        let mut wr = SendWr::new(2, SendOp::Send, &sge);
        wr.flags.signaled = true;
        wr.ud = Some(UdDest {
            path: opts.path_to(&cc, peer.peer_gid).unwrap(),
            remote_qpn: peer.qpn,
            remote_qkey: peer.qkey,
        });
        qp.post_send(&[wr]).unwrap();
        assert_eq!(cq.poll_n(1, T).unwrap()[0].status, WcStatus::Success);
        assert_eq!(peer.qpn, srv.join().unwrap());
    });
}

/// A SIDR request repeated while the server is busy elsewhere waits once:
/// the server takes it once and answers it once (the repeat is not a
/// second requester).
#[test]
fn a_repeated_sidr_request_is_taken_once() {
    let (cs, cc) = pair();
    std::thread::scope(|s| {
        let srv = s.spawn(|| {
            let pd = cs.alloc_pd();
            let mut cm = CmAgent::new(&cs, &pd, 0).unwrap();
            cm.listen_ud(7471);
            // Busy with another port while the client sends (and, after
            // 1 s without an answer, sends again).
            assert!(cm
                .get_ud_request(7000, Duration::from_millis(2500))
                .is_err());
            let cq = cs.create_cq(8).unwrap();
            let qp = pd.create_qp().qp_type(QpType::Ud).build(&cq, &cq).unwrap();
            init_ud_qp(&cs, &qp, &ConnectOptions::default()).unwrap();
            let req = cm.get_ud_request(7471, T).unwrap();
            cm.accept_ud(&req, &qp, &[]).unwrap();
            let again = cm.get_ud_request(7471, Duration::from_millis(1500));
            assert!(
                again.is_err(),
                "the repeat came back as a request: {again:?}"
            );
        });
        let pd = cc.alloc_pd();
        let mut cm = CmAgent::new(&cc, &pd, 0).unwrap();
        let dst: SocketAddr = "198.18.0.1:7471".parse().unwrap();
        let peer = cm.resolve_ud(dst, &[], 0).unwrap();
        assert_eq!(peer.qkey, RDMA_UDP_QKEY);
        srv.join().unwrap();
    });
}

/// The event core: one thread drives both agents and sets up two
/// connections at once (nothing waits for the peer), then one side's DREQ
/// ends one and the other's the second; every step reports its event.
#[test]
fn events_set_up_two_connections_from_one_thread() {
    use ferroce_verbs::cm::CmEvent;
    let (cs, cc) = pair();
    let (ps, pc) = (cs.alloc_pd(), cc.alloc_pd());
    let mut srv = CmAgent::new(&cs, &ps, 0).unwrap();
    let mut cli = CmAgent::new(&cc, &pc, 0).unwrap();
    let (cqs, cqc) = (cs.create_cq(8).unwrap(), cc.create_cq(8).unwrap());
    let sq: Vec<_> = (0..2)
        .map(|_| {
            ps.create_qp()
                .qp_type(QpType::Rc)
                .build(&cqs, &cqs)
                .unwrap()
        })
        .collect();
    let cq: Vec<_> = (0..2)
        .map(|_| {
            pc.create_qp()
                .qp_type(QpType::Rc)
                .build(&cqc, &cqc)
                .unwrap()
        })
        .collect();
    srv.listen(7471);
    let dst: SocketAddr = "198.18.0.1:7471".parse().unwrap();
    let ids: Vec<u32> = cq
        .iter()
        .map(|qp| {
            qp.to_init(&Default::default()).unwrap();
            cli.start_connect(qp.qpn(), dst, &ConnParam::default())
                .unwrap()
        })
        .collect();
    // Turns both agents until `want` events have come, in order.
    let turn = |srv: &mut CmAgent<'_>, cli: &mut CmAgent<'_>, want: usize| {
        let mut got = (Vec::new(), Vec::new());
        let deadline = std::time::Instant::now() + T;
        while got.0.len() + got.1.len() < want {
            assert!(
                std::time::Instant::now() < deadline,
                "events so far: {got:?}"
            );
            srv.wait_and_progress(Duration::from_millis(5)).unwrap();
            cli.wait_and_progress(Duration::from_millis(5)).unwrap();
            got.0.extend(srv.take_events());
            got.1.extend(cli.take_events());
        }
        got
    };
    let (reqs, none) = turn(&mut srv, &mut cli, 2);
    assert!(none.is_empty());
    let mut server_conns = Vec::new();
    for (ev, qp) in reqs.into_iter().zip(&sq) {
        let CmEvent::Request(r) = ev else {
            panic!("{ev:?}")
        };
        assert!(cq.iter().any(|q| q.qpn() == r.remote_qpn), "{r:?}");
        server_conns.push(srv.start_accept(&r, qp, &ConnParam::default()).unwrap());
    }
    let (none, replies) = turn(&mut srv, &mut cli, 2);
    assert!(none.is_empty());
    let mut client_conns = Vec::new();
    for ev in replies {
        let CmEvent::Reply { id, rep } = ev else {
            panic!("{ev:?}")
        };
        let i = ids.iter().position(|x| *x == id).unwrap();
        client_conns.push(cli.finish_connect(id, &cq[i], &rep).unwrap());
    }
    let (est, none) = turn(&mut srv, &mut cli, 2);
    assert!(none.is_empty());
    for (ev, c) in est.iter().zip(&server_conns) {
        assert!(
            matches!(ev, CmEvent::Established { id } if *id == c.local_comm_id),
            "{ev:?}"
        );
    }
    // The client ends its first connection, the server the second.
    assert!(cli.start_disconnect(client_conns[0].local_comm_id).unwrap());
    let peer_of = |c: &ferroce_verbs::cm::Connection| {
        server_conns
            .iter()
            .find(|s| s.remote_comm_id == c.local_comm_id)
            .unwrap()
            .local_comm_id
    };
    assert!(srv.start_disconnect(peer_of(&client_conns[1])).unwrap());
    let (s, c) = turn(&mut srv, &mut cli, 4);
    let ids_of = |v: &[CmEvent]| {
        let mut ids: Vec<u32> = v
            .iter()
            .map(|e| match e {
                CmEvent::Disconnected { id } => *id,
                other => panic!("{other:?}"),
            })
            .collect();
        ids.sort();
        ids
    };
    let mut want_s = vec![peer_of(&client_conns[0]), peer_of(&client_conns[1])];
    want_s.sort();
    let mut want_c: Vec<u32> = client_conns.iter().map(|c| c.local_comm_id).collect();
    want_c.sort();
    assert_eq!(ids_of(&s), want_s);
    assert_eq!(ids_of(&c), want_c);
    // Ended: another DREQ is nothing to do.
    assert!(!cli.start_disconnect(client_conns[0].local_comm_id).unwrap());
}
