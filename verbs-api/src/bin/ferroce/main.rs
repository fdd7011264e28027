//! The `ferroce` command-line tool.
// The doc comments on the argument structs are clap's help text, written for a
// terminal: `[HOSTS]` and `<ifname>` there are not links or HTML.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod common;
mod demo;
mod devices;
mod mckey;
mod pingpong;
mod rdma_cm;
mod rping;
mod ucmatose;
mod ud_node;
mod udaddy;

use clap::{Parser, Subcommand};
use ferroce_verbs::decode::{decode_capture, Format};
use ferroce_verbs::Backend;

#[derive(Parser, Debug)]
#[command(name = "ferroce", version, about = "Userspace RoCE v2: tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// nccl-tests-style collective benchmark (runs `ferroce-coll-bench`,
    /// built by the ferroce-collectives crate, which sits above this one).
    #[command(name = "coll-bench", disable_help_flag = true)]
    CollBench {
        /// Arguments for ferroce-coll-bench (e.g. `allreduce -n 4 -b 8 -e 16M`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Test network of namespace hosts: `netns up [HOSTS] [NAME]` creates
    /// them (veth/bridge, MTU 9000, IPv4+IPv6) and prints one line per host;
    /// `netns down` removes every ferroce namespace. Needs root.
    Netns {
        /// up [HOSTS] [NAME] | down
        #[arg(num_args = 1.., required = true)]
        args: Vec<String>,
    },
    /// perftest-style bandwidth / latency: write, read, send or atomic
    /// (ib_write_bw, ib_read_lat, ...); a stock perftest can be the peer.
    Bench(bench::Args),
    /// Ping-pong like ibv_rc_pingpong (--uc, --ud for the other transports);
    /// interoperates with the stock tools.
    Pingpong(pingpong::Args),
    /// librdmacm's rdma_server: waits for an rdma_cm connection (REQ/REP/RTU
    /// over QP1), receives 16 bytes, answers 16, disconnects.
    #[command(name = "rdma-server")]
    RdmaServer(rdma_cm::Args),
    /// librdmacm's rdma_client: connects with rdma_cm to `-s` (port `-p`,
    /// 7471), sends 16 bytes, receives 16, disconnects.
    #[command(name = "rdma-client")]
    RdmaClient(rdma_cm::Args),
    /// librdmacm's rping over an rdma_cm connection: `-s` serves, `-c -a ADDR`
    /// pings (-C count, -S size, -v shows, -V checks the data).
    Rping(rping::Args),
    /// librdmacm's udaddy: UD QPs found by SIDR over QP1 (port 7174); the
    /// client (`-s ADDR`) sends `-C` messages of `-S` bytes, the server
    /// answers each.
    Udaddy(udaddy::Args),
    /// librdmacm's cmatose (Debian's ucmatose): RC connections by the CM
    /// over QP1 (port 7471); the server sends `-C` messages of `-S` bytes,
    /// the client sends as many back, the server disconnects.
    Ucmatose(ucmatose::Args),
    /// librdmacm's mckey: UD multicast. Each side joins `-c` UD QPs to the
    /// group `-m`; the sender (`-s`) sends `-C` messages of `-S` bytes from
    /// each to the group, the receiver waits for them.
    Mckey(mckey::Args),
    /// List usable interfaces, their backends, MTU and GID table (like ibv_devinfo).
    Devices {
        /// Also list interfaces that are down or have no usable backend.
        #[arg(long)]
        all: bool,
        /// Counters of every running ferroce device (rxe's hw_counters
        /// names first), as the engines publish them about once a second.
        #[arg(long)]
        stats: bool,
    },
    /// Two ferroce hosts: RC ping-pong, WRITE/READ/SEND/atomic bandwidth and
    /// latency, every byte verified, one table. Root: two network namespaces
    /// over AF_XDP (falling back to AF_PACKET, then UDP); otherwise UDP on loopback.
    Demo {
        /// Packet engine: auto, afxdp, afpacket or udp.
        #[arg(long, default_value = "auto")]
        backend: Backend,
    },
    /// Decode RoCE v2 packets in a pcap/pcapng file and check every ICRC.
    ///
    /// Exit status: 0 if every RoCE packet parses with a correct ICRC, 1 if
    /// any is malformed or has a bad ICRC, 2 if the file cannot be read.
    Decode {
        /// The capture (pcap or pcapng; Ethernet, Linux cooked or raw IP).
        file: PathBuf,
        /// One JSON object per packet instead of text.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    ferroce_nic::default_sigpipe();
    let cli = Cli::parse();
    match cli.command {
        Command::CollBench { args } => coll_bench(&args),
        Command::Netns { args } => match ferroce_nic::netns::cli(&args) {
            Ok(out) => {
                print!("{out}");
                if !out.is_empty() && !out.ends_with('\n') {
                    println!();
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ferroce netns: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Bench(a) => ExitCode::from(bench::run(a) as u8),
        Command::Pingpong(a) => ExitCode::from(pingpong::run(a) as u8),
        Command::RdmaServer(a) => ExitCode::from(rdma_cm::run(a, true) as u8),
        Command::RdmaClient(a) => ExitCode::from(rdma_cm::run(a, false) as u8),
        Command::Rping(a) => ExitCode::from(rping::run(a) as u8),
        Command::Udaddy(a) => ExitCode::from(udaddy::run(a) as u8),
        Command::Ucmatose(a) => ExitCode::from(ucmatose::run(a) as u8),
        Command::Mckey(a) => ExitCode::from(mckey::run(a) as u8),
        Command::Devices { stats: true, all } => ExitCode::from(devices::stats(all) as u8),
        Command::Devices { all, .. } => ExitCode::from(devices::run(all) as u8),
        Command::Demo { backend } => ExitCode::from(demo::run(backend) as u8),
        Command::Decode { file, json } => {
            let input = match std::fs::File::open(&file) {
                Ok(f) => std::io::BufReader::new(f),
                Err(e) => {
                    eprintln!("ferroce decode: {}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            let format = if json { Format::Json } else { Format::Text };
            let mut out = std::io::stdout().lock();
            match decode_capture(input, &mut out, format) {
                Ok(summary) => ExitCode::from(summary.exit_code() as u8),
                Err(e) => {
                    eprintln!("ferroce decode: {}: {e}", file.display());
                    ExitCode::from(2)
                }
            }
        }
    }
}

/// Runs the collectives bench that lives next to this binary. The collectives
/// crate depends on this one, so it cannot be linked in; it is executed.
fn coll_bench(args: &[String]) -> ExitCode {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("ferroce-coll-bench")));
    let Some(bin) = sibling.filter(|p| p.exists()) else {
        eprintln!(
            "ferroce coll-bench: ferroce-coll-bench not found next to this binary; \
             build it with `cargo build --release -p ferroce-collectives`"
        );
        return ExitCode::from(2);
    };
    match std::process::Command::new(&bin).args(args).status() {
        Ok(st) => ExitCode::from(st.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!("ferroce coll-bench: {}: {e}", bin.display());
            ExitCode::from(2)
        }
    }
}
