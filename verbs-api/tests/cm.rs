//! The connection manager (rdma_cm over QP1) between two devices on the
//! in-memory switch: connect / accept with private data both ways, SENDs
//! over the connection it set up, disconnect; a REQ for a port no one
//! listens on is rejected.

use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

use ferroce_verbs::cm::{CmAgent, ConnParam, REJ_INVALID_SERVICE_ID};
use ferroce_verbs::{
    AccessFlags, Context, EngineMode, Error, OpenOptions, QpType, RecvWr, SendOp, SendWr, WcStatus,
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
