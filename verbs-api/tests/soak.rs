//! The soak (issue 8): random work requests of every kind over links that
//! lose, duplicate, reorder and corrupt frames; every byte checked, no QP
//! stuck, resident memory flat after warm-up. The CI variant runs by
//! default (FERROCE_SOAK_SECS, default 45 s); the long one is `--ignored`.

use std::time::Duration;

use ferroce_verbs::soak::{self, SoakConfig, KINDS};

/// Resident memory may grow at most this much after warm-up (allocator
/// noise; a leak per operation would show as tens of MiB).
const RSS_BOUND_KIB: u64 = 8 * 1024;

fn soak_for(secs: u64) {
    soak_with(SoakConfig::new(Duration::from_secs(secs)));
}

fn soak_with(mut cfg: SoakConfig) {
    // FERROCE_SOAK_FAULTS=loss,dup,reorder,corrupt (probabilities) to vary the faults.
    if let Ok(v) = std::env::var("FERROCE_SOAK_FAULTS") {
        let p: Vec<f64> = v.split(',').filter_map(|x| x.parse().ok()).collect();
        if let [loss, dup, reorder, corrupt] = p[..] {
            cfg.faults.loss = loss;
            cfg.faults.dup = dup;
            cfg.faults.reorder = reorder;
            cfg.faults.corrupt = corrupt;
        }
    }
    let r = soak::run(&cfg).unwrap();
    let per_kind: Vec<String> = KINDS
        .iter()
        .zip(r.ops)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    eprintln!(
        "soak {:?}: {} ops ({}), {} bytes; RSS {} KiB after warm-up, {} KiB at the end (samples {:?}); \
         a: completer_retry_err {} retry_exceeded_err {} rcvd_seq_err {}; \
         b: duplicate_request {} out_of_seq_request {} rx_icrc_err {}",
        r.elapsed,
        r.total_ops(),
        per_kind.join(", "),
        r.bytes,
        r.rss_start_kib,
        r.rss_end_kib,
        r.rss_samples_kib,
        r.counter(0, "completer_retry_err"),
        r.counter(0, "retry_exceeded_err"),
        r.counter(0, "rcvd_seq_err"),
        r.counter(1, "duplicate_request"),
        r.counter(1, "out_of_seq_request"),
        r.counter(1, "rx_icrc_err"),
    );
    for (k, n) in KINDS.iter().zip(r.ops) {
        assert!(n > 0, "no {k} completed");
    }
    assert!(
        r.counter(0, "completer_retry_err") > 0 && r.counter(1, "duplicate_request") > 0,
        "the faults never bit"
    );
    assert!(
        r.rss_end_kib <= r.rss_start_kib + RSS_BOUND_KIB,
        "RSS grew from {} to {} KiB",
        r.rss_start_kib,
        r.rss_end_kib
    );
}

#[test]
fn soak_ci() {
    let secs = std::env::var("FERROCE_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(45);
    soak_for(secs);
}

#[test]
#[ignore = "ten minutes; run with --ignored"]
fn soak_ten_minutes() {
    soak_for(600);
}

#[test]
fn soak_between_namespace_hosts() {
    // The same soak across two network namespaces (veth, the default
    // backend: AF_XDP as root), with the faults injected in each receive path.
    if !ferroce_nic::is_root() {
        eprintln!("SKIP soak_between_namespace_hosts: needs root (network namespaces)");
        return;
    }
    let mut cfg = SoakConfig::new(Duration::from_secs(20));
    cfg.netns_backend = Some(ferroce_verbs::Backend::Auto);
    soak_with(cfg);
}
