//! An idle engine thread sleeps. Its own test binary: CPU time is read per
//! thread name, and other tests' busy engines in the same process (which
//! poll a while after traffic before they sleep) would count too.

use std::net::Ipv6Addr;
use std::time::Duration;

use ferroce_verbs::{Context, EngineMode, OpenOptions};

#[test]
fn idle_engine_sleeps() {
    let (a, b) = ferroce_nic::mem::pair().unwrap();
    let ga: Ipv6Addr = "::ffff:198.18.0.1".parse().unwrap();
    let gb: Ipv6Addr = "::ffff:198.18.0.2".parse().unwrap();
    let opts = || OpenOptions {
        mode: EngineMode::Thread,
        ..Default::default()
    };
    let ca = Context::with_io(Box::new(a), "mem0", vec![ga], 1, opts()).unwrap();
    let _cb = Context::with_io(Box::new(b), "mem1", vec![gb], 2, opts()).unwrap();
    // With nothing to do the engine threads must not spin: their CPU time
    // over half a second, through /proc (Linux).
    let before = thread_cpu_ticks("ferroce-engine");
    std::thread::sleep(Duration::from_millis(500));
    let after = thread_cpu_ticks("ferroce-engine");
    drop(ca);
    if let (Some(b), Some(a)) = (before, after) {
        // Clock ticks are 10 ms; a spinning thread would gain ~50.
        assert!(a - b <= 2, "idle engine used {} ticks in 0.5 s", a - b);
    }
}

/// utime+stime of this process's threads whose name starts with `prefix`.
fn thread_cpu_ticks(prefix: &str) -> Option<u64> {
    let mut total = 0;
    let mut found = false;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let dir = t.ok()?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim().starts_with(&prefix[..prefix.len().min(15)]) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
        let rest = stat.rsplit(')').next()?;
        let f: Vec<&str> = rest.split_whitespace().collect();
        total += f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        found = true;
    }
    found.then_some(total)
}
