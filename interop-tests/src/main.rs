//! `ferroce-interop`: the rxe VM for humans.
//!
//! - `build [--force]`: build the VM image cache.
//! - `shell`: boot a VM with rxe0 and attach this terminal to its console (Ctrl-A X, or
//!   `poweroff -f` in the VM, to leave).
//! - `run <command>`: boot a VM, run one command, print its output, exit with its status.
//! - `speed`: the speed comparison of issue 6 (rxe ⇄ rxe against ferroce ⇄ ferroce on the same
//!   two VMs, and ferroce on the host ⇄ rxe); writes the `speed` section of `RESULTS.md`.
//! - `rkey-proxy`: relay one perftest exchange, corrupting one side's RKeys (error-interop tests
//!   run it inside the lab namespace).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferroce_interop::image::{build_script, default_cache_dir};
use ferroce_interop::vm::{Console, RxeVm, VmConfig};

#[derive(Parser, Debug)]
#[command(about = "Linux rxe in a QEMU VM, for interop tests of ferroce")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build the VM image cache (kernel, initramfs) if it is not complete.
    Build {
        /// Rebuild even when the cache is complete.
        #[arg(long)]
        force: bool,
    },
    /// Boot a VM and attach this terminal to its console shell.
    Shell,
    /// Boot a VM, run a shell command in it, print its output.
    Run {
        /// The command (a busybox sh script).
        command: Vec<String>,
    },
    /// Speed comparison: rxe ⇄ rxe against ferroce ⇄ ferroce inside the same two VMs.
    Speed {
        /// ferroce backends to run inside the VMs, each maybe with settings for its
        /// environment after `@`s (`udp@FERROCE_UDP_MULTISHOT=1`).
        #[arg(long, value_delimiter = ',', default_value = "afpacket,udp,afxdp")]
        backends: Vec<String>,
        /// Iterations: 64 KiB WRITE bw, 1 MiB WRITE bw, 8 B SEND lat. 100 MiB at 1 MiB:
        /// with 30 a run lasted a third of a second, too short for a steady figure.
        #[arg(long, value_delimiter = ',', default_value = "300,100,300")]
        iters: Vec<u64>,
        /// Run each bandwidth test this many seconds (perftest's `-D`; its margins, a quarter
        /// of it in whole seconds, are left out of the figure) instead of `--iters`.
        #[arg(long)]
        duration: Option<u64>,
        /// Runs per measurement (the best counts).
        #[arg(long, default_value_t = 2)]
        repeat: usize,
        /// QEMU CPU model of both VMs (default: QEMU's, or FERROCE_RXE_VM_CPU).
        #[arg(long)]
        cpu: Option<String>,
        /// Only these tests: write_bw_64k, write_bw_1m, send_lat (default: all).
        #[arg(long, value_delimiter = ',')]
        tests: Vec<String>,
        /// Skip ferroce on the host against rxe in a VM.
        #[arg(long)]
        no_host: bool,
        /// Don't rewrite the `speed` section of interop-tests/RESULTS.md.
        #[arg(long)]
        no_write: bool,
    },
    /// Relay one perftest TCP exchange, corrupting the RKey in one side's key messages.
    RkeyProxy {
        /// Address to accept the client on.
        #[arg(long)]
        listen: std::net::SocketAddr,
        /// The real server.
        #[arg(long)]
        connect: std::net::SocketAddr,
        /// Whose key messages to corrupt.
        #[arg(long, value_enum, default_value = "server")]
        corrupt: ferroce_interop::mitm::Side,
        /// XOR mask applied to the RKey.
        #[arg(long, default_value_t = 0x5a5a_0000)]
        mask: u32,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferroce-interop: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, ferroce_interop::Error> {
    match cli.cmd {
        Cmd::Build { force } => {
            let mut cmd = std::process::Command::new("bash");
            cmd.arg(build_script())
                .env("FERROCE_RXE_VM_CACHE", default_cache_dir());
            if force {
                cmd.arg("--force");
            }
            let status = cmd.status().map_err(|e| ferroce_interop::Error::Io {
                what: "running vm/build-image.sh".into(),
                source: e,
            })?;
            Ok(if status.success() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Shell => {
            eprintln!("booting the rxe VM (TCG; ~6 s)...");
            let config = VmConfig {
                console: Console::Interactive,
                ..VmConfig::default()
            };
            let vm = RxeVm::boot(&config)?;
            eprintln!(
                "\r\nready in {:.1} s: {} eth0 {} / {}, rxe0 GID[1] {}; namespace {} (tap {}); \
                 host veth-h 10.77.0.1; /mnt/host = {}\r\npress Enter for a shell; Ctrl-A X or \
                 `poweroff -f` to leave\r",
                vm.boot_time().as_secs_f64(),
                vm.name(),
                vm.ip(),
                vm.ipv6(),
                vm.gid(1).map(|g| g.to_string()).unwrap_or_default(),
                vm.netns(),
                vm.tap(),
                vm.share_dir().display(),
            );
            vm.wait_exit()?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Speed {
            backends,
            iters,
            duration,
            repeat,
            cpu,
            tests,
            no_host,
            no_write,
        } => {
            let [a, b, c] = iters[..] else {
                eprintln!("--iters takes three numbers");
                return Ok(ExitCode::FAILURE);
            };
            let mut vm = VmConfig::default();
            if cpu.is_some() {
                vm.cpu = cpu;
            }
            let opts = ferroce_interop::speed::SpeedOptions {
                ferroce: ferroce_interop::host::ferroce_bin()?,
                backends,
                iters: [a, b, c],
                duration,
                repeat: repeat.max(1),
                tests,
                host_pairs: !no_host,
                vm,
                dir: std::env::temp_dir().join(format!("ferroce-speed-{}", std::process::id())),
            };
            let report = ferroce_interop::speed::run(&opts)?;
            let _ = std::fs::remove_dir_all(&opts.dir);
            println!("{report}");
            if !no_write {
                let path = ferroce_interop::speed::results_path();
                ferroce_interop::matrix::write_raw_section(&path, "speed", &report).map_err(
                    |e| ferroce_interop::Error::Io {
                        what: format!("writing {}", path.display()),
                        source: e,
                    },
                )?;
                eprintln!("wrote the speed section of {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::RkeyProxy {
            listen,
            connect,
            corrupt,
            mask,
        } => match ferroce_interop::mitm::rkey_proxy(listen, connect, corrupt, mask) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("rkey-proxy: {e}");
                Ok(ExitCode::FAILURE)
            }
        },
        Cmd::Run { command } => {
            let vm = RxeVm::boot(&VmConfig::default())?;
            eprintln!(
                "booted {} in {:.1} s",
                vm.name(),
                vm.boot_time().as_secs_f64()
            );
            let out = vm.run(&command.join(" "))?;
            print!("{}", out.stdout_str());
            eprint!("{}", out.stderr_str());
            Ok(ExitCode::from(u8::try_from(out.status).unwrap_or(1)))
        }
    }
}
