//! Two rxe VMs on one bridge, driven by a script on stdin (for measuring by hand):
//! `N cmd` runs `cmd` in VM N and prints its output, `N& cmd` starts it in the background,
//! `listen N` waits for TCP 18515 in VM N, `wait` collects the background jobs.
//! `h cmd` / `h& cmd` run `cmd` (through `sh -c`) on the host side, in the lab's namespace
//! (`{host}` is its address on the bridge, `{hostif}` its interface).
//! `capture FILE` / `stop` capture RoCE v2 on the bridge. `{ip0}` in a command is VM 0's IPv4 address.
//! Files named in `LAB_FILES` (colon-separated) are shared into both VMs at /mnt/host.

use std::io::BufRead;
use std::time::{Duration, Instant};

use ferroce_interop::vm::{RxeLab, VmConfig, VmJob};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lab = RxeLab::with_config(2, &VmConfig::default())?;
    let files = std::env::var("LAB_FILES").unwrap_or_default();
    for f in files.split(':').filter(|f| !f.is_empty()) {
        let name = std::path::Path::new(f)
            .file_name()
            .ok_or("LAB_FILES: bad name")?;
        for vm in lab.vms() {
            std::fs::copy(f, vm.share_dir().join(name))?;
        }
    }
    eprintln!("lab ready: vm0 {} vm1 {}", lab.vm(0).ip(), lab.vm(1).ip());
    let mut jobs: Vec<(usize, VmJob)> = Vec::new();
    let mut host_jobs: Vec<(String, std::process::Child)> = Vec::new();
    let mut capture = None;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let started = Instant::now();
        if line == "wait" {
            for (i, job) in jobs.drain(..) {
                let out = job.wait_timeout(Duration::from_secs(120))?;
                println!(
                    "[vm{i} bg, status {}]\n{}{}",
                    out.status,
                    out.stdout_str(),
                    out.stderr_str()
                );
            }
            for (cmd, child) in host_jobs.drain(..) {
                let out = child.wait_with_output()?;
                println!(
                    "[host bg `{cmd}`, {}]\n{}{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            continue;
        }
        if let Some(path) = line.strip_prefix("capture ") {
            let c = lab.capture(
                lab.bridge(),
                std::path::Path::new(path.trim()),
                "udp port 4791",
            )?;
            capture = Some(c);
            continue;
        }
        if line == "stop" {
            if let Some(c) = capture.take() {
                c.stop()?;
            }
            continue;
        }
        if let Some(n) = line.strip_prefix("listen ") {
            let i: usize = n.trim().parse()?;
            lab.vm(i).wait_listening(18515, Duration::from_secs(30))?;
            continue;
        }
        let line = line
            .replace("{ip0}", &lab.vm(0).ip().to_string())
            .replace("{host}", &lab.host_ipv4().to_string())
            .replace("{hostif}", lab.host_iface());
        if let Some((head, cmd)) = line
            .split_once(' ')
            .filter(|(h, _)| *h == "h" || *h == "h&")
        {
            let mut c = lab.command("sh");
            c.args(["-c", cmd]);
            if head == "h&" {
                let child = c
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()?;
                host_jobs.push((cmd.to_owned(), child));
            } else {
                let out = c.output()?;
                println!(
                    "[host `{cmd}` {} in {:.1} s]\n{}{}",
                    out.status,
                    started.elapsed().as_secs_f64(),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            continue;
        }
        let (head, cmd) = line.split_once(' ').ok_or("expected `N cmd`")?;
        let bg = head.ends_with('&');
        let i: usize = head.trim_end_matches('&').parse()?;
        if bg {
            jobs.push((i, lab.vm(i).spawn(cmd)?));
        } else {
            let out = lab.vm(i).run_timeout(cmd, Duration::from_secs(300))?;
            println!(
                "[vm{i} `{cmd}` status {} in {:.1} s]\n{}{}",
                out.status,
                started.elapsed().as_secs_f64(),
                out.stdout_str(),
                out.stderr_str()
            );
        }
    }
    Ok(())
}
