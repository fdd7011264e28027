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
