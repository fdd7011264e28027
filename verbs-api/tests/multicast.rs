//! UD multicast through the verbs API over the in-memory switch
//! (ibv_attach_mcast / ibv_detach_mcast): what rxe does with packets to the
//! multicast QPN (rxe_rcv_mcast_pkt).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ferroce_stack::transport::{VerbsError, MULTICAST_QPN};
use ferroce_verbs::{
    AccessFlags, ConnectOptions, Context, EngineMode, Error, MemoryRegion, OpenOptions, QpType,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_millis(300);

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

fn ud_ready<'pd>(
    ctx: &Context,
    pd: &'pd ferroce_verbs::ProtectionDomain,
    cq: &'pd ferroce_verbs::CompletionQueue,
    qkey: u32,
) -> QueuePair<'pd> {
    let q = pd.create_qp().qp_type(QpType::Ud).build(cq, cq).unwrap();
    let opts = ConnectOptions {
        qkey,
        ..ConnectOptions::default()
    };
    q.to_init(&opts).unwrap();
    let me = RemoteQp {
        qpn: 0,
        psn: 0,
        gid: ctx.query_gid(0).unwrap(),
    };
    q.connect(ctx, &me, &opts).unwrap();
    q
}

fn post_recv(q: &QueuePair<'_>, mr: &MemoryRegion<'_>, at: u64, wr_id: u64) {
    let sge = [mr.sge(at, 40 + 256)];
    q.post_recv(&[RecvWr {
        wr_id,
        sg_list: &sge,
    }])
    .unwrap();
}

const QKEY: u32 = 0x0123_4567;

#[test]
fn a_send_to_a_group_reaches_every_attached_qp_and_no_other() {
    let (ca, cb) = pair();
    let (pa, pb) = (ca.alloc_pd(), cb.alloc_pd());
    let (cqa, cqb) = (ca.create_cq(64).unwrap(), cb.create_cq(64).unwrap());
    let sender = ud_ready(&ca, &pa, &cqa, QKEY);
    let (b1, b2, b3) = (
        ud_ready(&cb, &pb, &cqb, QKEY),
        ud_ready(&cb, &pb, &cqb, QKEY),
        ud_ready(&cb, &pb, &cqb, QKEY),
    );
    let group = Ipv4Addr::new(239, 1, 2, 3);
    let mgid = group.to_ipv6_mapped();
    b1.attach_mcast(mgid).unwrap();
    b2.attach_mcast(mgid).unwrap();
    b2.attach_mcast(mgid).unwrap(); // twice is once
    assert_eq!(b2.mcast_groups(), vec![mgid]);

    let ma = pa.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mb = pb.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    ma.write(0, b"to the group").unwrap();
    for (i, q) in [&b1, &b2, &b3].into_iter().enumerate() {
        for k in 0..4u64 {
            let slot = (i as u64 * 4 + k) * 512;
            post_recv(q, &mb, slot, u64::from(q.qpn()) << 8 | k);
        }
    }
    let path = ca.resolve_path(0, mgid).unwrap();
    assert_eq!(path.dst_mac, [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]);
    let send = |qkey: u32, to: Ipv6Addr| {
        let sge = [ma.sge(0, 12)];
        let mut wr = SendWr::new(1, SendOp::SendWithImm { imm: 0xabcd }, &sge);
        wr.flags.signaled = true;
        wr.ud = Some(ferroce_verbs::UdDest {
            path: ca.resolve_path(0, to).unwrap(),
            remote_qpn: MULTICAST_QPN,
            remote_qkey: qkey,
        });
        sender.post_send(&[wr]).unwrap();
        assert_eq!(cqa.poll_n(1, T).unwrap()[0].status, WcStatus::Success);
    };

    send(QKEY, mgid);
    let wcs = cqb.poll_n(2, T).unwrap();
    let mut qps: Vec<u32> = wcs.iter().map(|w| w.qp_num).collect();
    qps.sort_unstable();
    assert_eq!(qps, vec![b1.qpn(), b2.qpn()]);
    for wc in &wcs {
        assert_eq!(
            (wc.status, wc.byte_len, wc.src_qp, wc.imm_data, wc.grh),
            (WcStatus::Success, 40 + 12, sender.qpn(), Some(0xabcd), true)
        );
        // The GRH area holds the IPv4 header, whose destination is the group.
        let at = ((wc.wr_id & 0xff) + if wc.qp_num == b1.qpn() { 0 } else { 4 }) * 512;
        let mut grh = [0u8; 40];
        mb.read(at, &mut grh).unwrap();
        assert_eq!(&grh[36..40], &group.octets());
        let mut data = [0u8; 12];
        mb.read(at + 40, &mut data).unwrap();
        assert_eq!(&data, b"to the group");
    }
    assert!(cqb.poll_n(1, QUIET).is_err(), "b3 is not attached");

    // Another Q_Key: each attached QP drops it (check_keys).
    let before = cb.stats().core.get("rx_qkey_mismatch");
    send(QKEY ^ 1, mgid);
    std::thread::sleep(QUIET);
    assert_eq!(cb.stats().core.get("rx_qkey_mismatch"), before + 2);
    // A group nobody here joined.
    let other = Ipv4Addr::new(239, 9, 9, 9).to_ipv6_mapped();
    send(QKEY, other);
    std::thread::sleep(QUIET);
    assert_eq!(cb.stats().core.get("rx_mcast_unknown_group"), 1);
    assert!(cqb.poll_n(1, QUIET).is_err());

    // Detached, b2 hears nothing more.
    b2.detach_mcast(mgid).unwrap();
    send(QKEY, mgid);
    let wc = cqb.poll_n(1, T).unwrap()[0];
    assert_eq!(wc.qp_num, b1.qpn());
    assert!(cqb.poll_n(1, QUIET).is_err());
}

#[test]
fn attach_refuses_what_rxe_refuses() {
    let (ca, _cb) = pair();
    let pd = ca.alloc_pd();
    let cq = ca.create_cq(16).unwrap();
    let ud = ud_ready(&ca, &pd, &cq, QKEY);
    let rc = pd.create_qp().qp_type(QpType::Rc).build(&cq, &cq).unwrap();
    let mgid = Ipv4Addr::new(239, 0, 0, 7).to_ipv6_mapped();
    let invalid = |r: Result<(), Error>| matches!(r, Err(Error::Verbs(VerbsError::Invalid(_))));
    assert!(invalid(rc.attach_mcast(mgid)), "UD QPs only");
    assert!(invalid(
        ud.attach_mcast(Ipv4Addr::new(198, 18, 0, 9).to_ipv6_mapped())
    ));
    assert!(invalid(ud.detach_mcast(mgid)), "not attached");
    // IPv6 groups are groups too.
    ud.attach_mcast("ff0e::db8:1".parse().unwrap()).unwrap();
    let attr = ca.query_device();
    assert_eq!(
        (
            attr.max_mcast_grp,
            attr.max_mcast_qp_attach,
            attr.max_total_mcast_qp_attach
        ),
        (8192, 56, 0x70000)
    );
    // Dropping an attached QP detaches it.
    drop(ud);
    let ud = ud_ready(&ca, &pd, &cq, QKEY);
    ud.attach_mcast(mgid).unwrap();
}

/// rxe hands a group's packets to the sending host's attached QPs too (the
/// kernel's IP loopback), the sender's own QP included; over a raw (here:
/// in-memory) port ferroce's core does the same.
#[test]
fn a_send_to_a_group_loops_back_to_this_devices_members() {
    let (ca, _cb) = pair();
    let pd = ca.alloc_pd();
    let cq = ca.create_cq(64).unwrap();
    let sender = ud_ready(&ca, &pd, &cq, QKEY);
    let member = ud_ready(&ca, &pd, &cq, QKEY);
    let outsider = ud_ready(&ca, &pd, &cq, QKEY);
    let mgid = Ipv4Addr::new(239, 3, 3, 3).to_ipv6_mapped();
    sender.attach_mcast(mgid).unwrap();
    member.attach_mcast(mgid).unwrap();
    let mr = pd.reg_mr(1 << 14, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write(8192, &[7u8; 3000]).unwrap();
    for (i, q) in [&sender, &member, &outsider].into_iter().enumerate() {
        let sge = [mr.sge(i as u64 * 2048, 40 + 1024)];
        q.post_recv(&[RecvWr {
            wr_id: 100 + i as u64,
            sg_list: &sge,
        }])
        .unwrap();
    }
    let sge = [mr.sge(8192, 1000)];
    let mut wr = SendWr::new(1, SendOp::Send, &sge);
    wr.flags.signaled = true;
    wr.ud = Some(ferroce_verbs::UdDest {
        path: ca.resolve_path(0, mgid).unwrap(),
        remote_qpn: MULTICAST_QPN,
        remote_qkey: QKEY,
    });
    sender.post_send(&[wr]).unwrap();
    let mut wcs = cq.poll_n(3, T).unwrap();
    wcs.sort_by_key(|w| w.wr_id);
    let got: Vec<(u64, WcStatus, u32)> = wcs
        .iter()
        .map(|w| (w.wr_id, w.status, w.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, 1000),
            (100, WcStatus::Success, 1040),
            (101, WcStatus::Success, 1040)
        ]
    );
    let mut data = [0u8; 1000];
    mr.read(2048 + 40, &mut data).unwrap();
    assert!(data.iter().all(|&b| b == 7));
    assert!(cq.poll_n(1, QUIET).is_err(), "the outsider hears nothing");
}
