//! The interface listing (getifaddrs + ioctl) agrees with iproute2's view of
//! the same namespace: names and indexes in order, up flags, MTUs, MACs, and addresses
//! in `ip -o addr`'s order (GID tables are built from that order).

use std::net::IpAddr;
use std::process::Command;

use ferroce_nic::ifaces;

fn ip(args: &[&str]) -> Option<String> {
    let out = Command::new("ip").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn links_agree_with_iproute2() {
    let (Some(links), Some(addrs)) = (ip(&["-o", "link", "show"]), ip(&["-o", "addr", "show"]))
    else {
        eprintln!("SKIP links_agree_with_iproute2: no `ip` (iproute2) to compare with");
        return;
    };
    let mine = ifaces::links().unwrap();
    let names: Vec<String> = links
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|n| {
            n.trim_end_matches(':')
                .split('@')
                .next()
                .unwrap_or(n)
                .to_string()
        })
        .collect();
    let my_names: Vec<&str> = mine.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(my_names, names, "{links}");
    for (l, line) in mine.iter().zip(links.lines()) {
        let index = line.split(':').next().and_then(|i| i.trim().parse().ok());
        assert_eq!(Some(l.index), index, "{line}");
        let toks: Vec<&str> = line.split_whitespace().collect();
        let after = |k: &str| {
            toks.iter()
                .position(|t| *t == k)
                .and_then(|i| toks.get(i + 1))
        };
        assert_eq!(
            Some(l.mtu.to_string().as_str()),
            after("mtu").copied(),
            "{line}"
        );
        let up = line
            .split('<')
            .nth(1)
            .and_then(|f| f.split('>').next())
            .unwrap_or("");
        assert_eq!(l.up, up.split(',').any(|x| x == "UP"), "{line}");
        if let Some(mac) = after("link/ether") {
            let m: Vec<String> = l.mac.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(m.join(":"), *mac, "{line}");
        }
        let theirs: Vec<(IpAddr, u8)> = addrs
            .lines()
            .filter(|a| a.split_whitespace().nth(1) == Some(l.name.as_str()))
            .filter_map(|a| {
                let cidr = a.split_whitespace().nth(3)?;
                let (ip, len) = cidr.split_once('/')?;
                Some((ip.parse().ok()?, len.parse().ok()?))
            })
            .collect();
        assert_eq!(l.addrs, theirs, "{}: {addrs}", l.name);
    }
}
