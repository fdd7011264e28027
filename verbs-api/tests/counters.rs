//! Counters named like rxe's hw_counters: through the API, and from another
//! process through `ferroce devices --stats`, while traffic runs over the
//! in-memory switch; plus a hostile request end to end (a guessed rkey).

use std::net::Ipv6Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use ferroce_verbs::counters::Snapshot;
use ferroce_verbs::{
    CompletionQueue, ConnectOptions, Context, MemoryRegion, OpenOptions, ProtectionDomain,
    QueuePair, RecvWr, RemoteQp, SendOp, SendWr, WcStatus,
};

const T: Duration = Duration::from_secs(10);

const RXE_NAMES: [&str; 15] = [
    "sent_pkts",
    "rcvd_pkts",
    "duplicate_request",
    "out_of_seq_request",
    "rcvd_rnr_err",
    "send_rnr_err",
    "rcvd_seq_err",
    "ack_deferred",
    "retry_exceeded_err",
    "retry_rnr_exceeded_err",
    "completer_retry_err",
    "send_err",
    "link_downed",
    "rdma_sends",
    "rdma_recvs",
];

struct Dev {
    ctx: Context,
    pd: ProtectionDomain,
    cq: CompletionQueue,
}

struct Side<'a> {
    ctx: &'a Context,
    cq: &'a CompletionQueue,
    qp: QueuePair<'a>,
    mr: MemoryRegion<'a>,
}

/// Two devices on the in-memory switch.
fn devs(tag: u32) -> (Dev, Dev) {
    let (a, b) = ferroce_nic::mem::pair().unwrap();
    let ga: Ipv6Addr = "::ffff:198.18.0.1".parse().unwrap();
    let gb: Ipv6Addr = "::ffff:198.18.0.2".parse().unwrap();
    let open = |io, name: String, gid, seed| {
        let ctx =
            Context::with_io(Box::new(io), &name, vec![gid], seed, OpenOptions::default()).unwrap();
        let pd = ctx.alloc_pd();
        let cq = ctx.create_cq(256).unwrap();
        Dev { ctx, pd, cq }
    };
    (
        open(a, format!("cnt{tag}a"), ga, 1),
        open(b, format!("cnt{tag}b"), gb, 2),
    )
}

/// One connected RC QP on each device.
fn pair<'a>(da: &'a Dev, db: &'a Dev) -> (Side<'a>, Side<'a>) {
    let side = |d: &'a Dev| Side {
        ctx: &d.ctx,
        cq: &d.cq,
        qp: d.pd.create_qp().build(&d.cq, &d.cq).unwrap(),
        mr: d
            .pd
            .reg_mr(1 << 16, ConnectOptions::default().access)
            .unwrap(),
    };
    let (a, b) = (side(da), side(db));
    let opts = |psn| ConnectOptions {
        local_psn: psn,
        path_mtu: 1024,
        ..Default::default()
    };
    for (me, peer, lpsn, rpsn) in [(&a, &b, 100, 200), (&b, &a, 200, 100)] {
        me.qp.to_init(&opts(lpsn)).unwrap();
        me.qp
            .connect(
                me.ctx,
                &RemoteQp {
                    qpn: peer.qp.qpn(),
                    psn: rpsn,
                    gid: peer.ctx.query_gid(0).unwrap(),
                },
                &opts(lpsn),
            )
            .unwrap();
    }
    (a, b)
}

fn get(c: &[(&'static str, u64)], name: &str) -> u64 {
    c.iter().find(|(k, _)| *k == name).map_or(0, |(_, v)| *v)
}

/// Ten SENDs of 3000 bytes (three packets each) from a to b.
fn traffic(a: &Side<'_>, b: &Side<'_>) {
    let rsge = [b.mr.sge(0, 4096)];
    let recvs: Vec<_> = (0..10)
        .map(|i| RecvWr {
            wr_id: i,
            sg_list: &rsge,
        })
        .collect();
    b.qp.post_recv(&recvs).unwrap();
    let ssge = [a.mr.sge(0, 3000)];
    for i in 0..10 {
        let mut wr = SendWr::new(i, SendOp::Send, &ssge);
        wr.flags.signaled = true;
        a.qp.post_send(&[wr]).unwrap();
    }
    for wc in a.cq.poll_n(10, T).unwrap() {
        assert_eq!(wc.status, WcStatus::Success);
    }
    for wc in b.cq.poll_n(10, T).unwrap() {
        assert_eq!(wc.status, WcStatus::Success);
    }
}

#[test]
fn hw_counters_through_the_api() {
    let (da, db) = devs(1);
    let (a, b) = pair(&da, &db);
    traffic(&a, &b);
    let ca = a.ctx.hw_counters();
    let cb = b.ctx.hw_counters();
    let names: Vec<_> = ca.iter().take(15).map(|(k, _)| *k).collect();
    assert_eq!(names, RXE_NAMES, "rxe's names in rxe's order");
    assert!(get(&ca, "sent_pkts") >= 30, "{ca:?}");
    assert_eq!(get(&ca, "rdma_sends"), 10);
    assert_eq!(get(&cb, "rdma_recvs"), 10);
    assert!(get(&cb, "rcvd_pkts") >= 30);
    assert_eq!(get(&cb, "sent_pkts"), get(&ca, "rcvd_pkts"));
    // ferroce's own counters follow rxe's.
    assert!(ca.iter().any(|(k, _)| *k == "retransmits"));
}

fn devices_stats() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["devices", "--stats"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// This process's block for `device` in `ferroce devices --stats` output.
fn block_for(out: &str, device: &str) -> Option<Vec<(String, u64)>> {
    let me = format!("(pid {}", std::process::id());
    let mut lines = out.lines().skip_while(|l| {
        !(l.starts_with("hca_id:") && l.contains(&format!("\t{device}\t")) && l.contains(&me))
    });
    lines.next()?;
    Some(
        lines
            .take_while(|l| !l.starts_with("hca_id:"))
            .filter_map(|l| {
                let (k, v) = l.trim().split_once(": ")?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect(),
    )
}

#[test]
fn devices_stats_shows_a_running_process() {
    let (da, db) = devs(2);
    let (a, b) = pair(&da, &db);
    let Some(path) = a.ctx.stats_path() else {
        eprintln!("SKIP: no writable directory for counter snapshots");
        return;
    };
    traffic(&a, &b);
    let want = get(&a.ctx.hw_counters(), "rdma_sends");
    assert_eq!(want, 10);
    // The engine refreshes its file about once a second.
    let deadline = Instant::now() + Duration::from_secs(10);
    let block = loop {
        let out = devices_stats();
        if let Some(blk) = block_for(&out, "cnt2a") {
            if blk.iter().any(|(k, v)| k == "rdma_sends" && *v == want) {
                break blk;
            }
        }
        assert!(
            Instant::now() < deadline,
            "never saw our counters in:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let names: Vec<_> = block.iter().take(15).map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, RXE_NAMES);
    assert!(block.iter().any(|(k, v)| k == "sent_pkts" && *v >= 30));

    // A file left by a process that is gone is skipped and cleaned up.
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let dir = path.parent().unwrap();
    let ghost = dir.join(format!("departed.{dead}.0.stats"));
    let snap = Snapshot {
        device: "departed".into(),
        backend: "mem".into(),
        pid: dead,
        state: "open".into(),
        updated: 0,
        counters: vec![("sent_pkts".into(), 1)],
    };
    std::fs::write(&ghost, snap.to_text()).unwrap();
    let out = devices_stats();
    assert!(!out.contains("\tdeparted\t"), "{out}");
    assert!(!ghost.exists());

    // Closing the device writes its last counters, marked closed.
    drop(a);
    drop(b);
    drop(da);
    let text = std::fs::read_to_string(&path).unwrap();
    let s = Snapshot::parse(&text).unwrap();
    assert_eq!(
        (s.state.as_str(), s.get("rdma_sends")),
        ("closed", Some(10))
    );
}

#[test]
fn guessed_rkey_end_to_end() {
    let (da, db) = devs(3);
    let (a, b) = pair(&da, &db);
    let sge = [a.mr.sge(0, 64)];
    let mut wr = SendWr::new(
        1,
        SendOp::RdmaWrite {
            remote_addr: b.mr.addr(),
            rkey: b.mr.rkey() ^ 0x33,
        },
        &sge,
    );
    wr.flags.signaled = true;
    a.qp.post_send(&[wr]).unwrap();
    let wc = a.cq.poll_n(1, T).unwrap()[0];
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    let cb = b.ctx.hw_counters();
    assert_eq!(get(&cb, "rx_err_rkey_violation"), 1, "{cb:?}");
    assert_eq!(get(&cb, "naks_sent"), 1);
    assert_eq!(b.qp.query().unwrap().qp_state, ferroce_verbs::QpState::Err);
    let mut mem = vec![0u8; 1 << 16];
    b.mr.read(0, &mut mem).unwrap();
    assert!(mem.iter().all(|x| *x == 0), "nothing written");
}

#[test]
fn send_larger_than_the_receive_end_to_end() {
    let (da, db) = devs(4);
    let (a, b) = pair(&da, &db);
    let rsge = [b.mr.sge(0, 100)];
    b.qp.post_recv(&[RecvWr {
        wr_id: 9,
        sg_list: &rsge,
    }])
    .unwrap();
    let ssge = [a.mr.sge(0, 200)];
    let mut wr = SendWr::new(1, SendOp::Send, &ssge);
    wr.flags.signaled = true;
    a.qp.post_send(&[wr]).unwrap();
    assert_eq!(a.cq.poll_n(1, T).unwrap()[0].status, WcStatus::RemInvReqErr);
    let wc = b.cq.poll_n(1, T).unwrap()[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::LocLenErr));
    let cb = b.ctx.hw_counters();
    assert_eq!(get(&cb, "rx_err_length"), 1, "{cb:?}");
    assert_eq!(get(&cb, "rdma_recvs"), 0);
    assert_eq!(get(&a.ctx.hw_counters(), "rdma_sends"), 1);
}
