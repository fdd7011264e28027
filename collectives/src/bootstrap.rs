//! Bootstrap: who am I (rank, size) and where is the master, from the
//! environment conventions launchers already set, and a TCP rendezvous at the
//! master that all-gathers one blob per rank (the QP numbers, PSNs, GIDs,
//! rkeys and buffer addresses of the transport).
//!
//! Environment, in the order tried:
//! 1. torchrun / torch.distributed: `RANK`, `WORLD_SIZE`
//! 2. Open MPI: `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`
//! 3. PMI (MPICH, Intel MPI, srun --mpi=pmi2): `PMI_RANK`, `PMI_SIZE`
//! 4. Slurm: `SLURM_PROCID`, `SLURM_NTASKS`
//!
//! The master is `MASTER_ADDR`:`MASTER_PORT` in every case (torchrun sets
//! them; under mpirun/srun export them, e.g. `MASTER_ADDR=$(hostname)`);
//! the port defaults to 29500 (torchrun's) and the address to 127.0.0.1 when
//! the job has a single rank. `FERROCE_BOOTSTRAP_TIMEOUT` (seconds) overrides
//! the rendezvous time-out (default 60 s).
//!
//! Rendezvous protocol (all integers big-endian u32): a worker connects and
//! sends `MAGIC, rank, size`; each round it sends `len, blob`; the master,
//! once it holds every rank's blob, answers each worker with `size` times
//! `len, blob` in rank order. Rank 0 is the master and listens.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const MAGIC: u32 = 0x4652_4331; // "FRC1"
/// Largest blob a peer may announce (a bound on what it can make us allocate).
const MAX_BLOB: u32 = 64 << 20;
/// torchrun's default master port.
pub const DEFAULT_PORT: u16 = 29500;
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Rank, size and master of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub rank: usize,
    pub size: usize,
    /// `host:port` of the master (rank 0 listens there).
    pub master: String,
    /// How long a rendezvous round may take before it fails.
    pub timeout: Duration,
    /// Which convention provided rank and size ("torchrun", "openmpi", "pmi", "slurm", "explicit").
    pub source: &'static str,
}

impl Bootstrap {
    /// An explicit job description (the builder; chain `with_timeout`).
    pub fn new(rank: usize, size: usize, master: impl Into<String>) -> Result<Bootstrap> {
        if size == 0 || rank >= size {
            return Err(Error::Env(format!(
                "rank {rank} is not in a job of size {size}"
            )));
        }
        Ok(Bootstrap {
            rank,
            size,
            master: master.into(),
            timeout: DEFAULT_TIMEOUT,
            source: "explicit",
        })
    }

    pub fn with_timeout(mut self, t: Duration) -> Bootstrap {
        self.timeout = t;
        self
    }

    /// From the process environment.
    pub fn from_env() -> Result<Bootstrap> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From any variable source (tests pass a map).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Bootstrap> {
        const CONVENTIONS: [(&str, &str, &str); 4] = [
            ("torchrun", "RANK", "WORLD_SIZE"),
            ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("pmi", "PMI_RANK", "PMI_SIZE"),
            ("slurm", "SLURM_PROCID", "SLURM_NTASKS"),
        ];
        let num =
            |k: &str| -> Result<Option<usize>> {
                match get(k) {
                    None => Ok(None),
                    Some(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
                        Error::Env(format!("{k}={v:?} is not a non-negative integer"))
                    }),
                }
            };
        let mut found = None;
        for (name, rk, sk) in CONVENTIONS {
            match (num(rk)?, num(sk)?) {
                (Some(r), Some(s)) => {
                    found = Some((name, r, s));
                    break;
                }
                (Some(_), None) => return Err(Error::Env(format!("{rk} is set but {sk} is not"))),
                (None, Some(_)) => return Err(Error::Env(format!("{sk} is set but {rk} is not"))),
                (None, None) => {}
            }
        }
        let (source, rank, size) = found.ok_or_else(|| {
            Error::Env(
                "no launcher environment found: set RANK/WORLD_SIZE (torchrun), \
                 OMPI_COMM_WORLD_RANK/_SIZE (mpirun), PMI_RANK/PMI_SIZE or \
                 SLURM_PROCID/SLURM_NTASKS, with MASTER_ADDR/MASTER_PORT"
                    .into(),
            )
        })?;
        if size == 0 || rank >= size {
            return Err(Error::Env(format!(
                "{source}: rank {rank} is not in a job of size {size}"
            )));
        }
        let addr = match get("MASTER_ADDR") {
            Some(a) if !a.trim().is_empty() => a.trim().to_string(),
            _ if size == 1 => "127.0.0.1".to_string(),
            _ => {
                return Err(Error::Env(format!(
                    "{source} gave rank {rank} of {size} but MASTER_ADDR is not set"
                )))
            }
        };
        let port = match get("MASTER_PORT") {
            None => DEFAULT_PORT,
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| Error::Env(format!("MASTER_PORT={p:?} is not a port number")))?,
        };
        let timeout = match get("FERROCE_BOOTSTRAP_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(t) => Duration::from_secs_f64(t.trim().parse::<f64>().map_err(|_| {
                Error::Env(format!("FERROCE_BOOTSTRAP_TIMEOUT={t:?} is not seconds"))
            })?),
        };
        let master = if addr.contains(':') && !addr.starts_with('[') {
            format!("[{addr}]:{port}")
        } else {
            format!("{addr}:{port}")
        };
        Ok(Bootstrap {
            rank,
            size,
            master,
            timeout,
            source,
        })
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::RendezvousIo { what, source }
}

fn read_u32(s: &mut TcpStream, what: &str) -> Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b).map_err(io_err(what))?;
    Ok(u32::from_be_bytes(b))
}

fn read_blob(s: &mut TcpStream, what: &str) -> Result<Vec<u8>> {
    let len = read_u32(s, what)?;
    if len > MAX_BLOB {
        return Err(Error::RendezvousProtocol(format!(
            "{what}: announced {len} bytes, more than the {MAX_BLOB}-byte limit"
        )));
    }
    let mut v = vec![0u8; len as usize];
    s.read_exact(&mut v).map_err(io_err(what))?;
    Ok(v)
}

fn write_blob(out: &mut Vec<u8>, blob: &[u8]) {
    out.extend_from_slice(&(blob.len() as u32).to_be_bytes());
    out.extend_from_slice(blob);
}

#[derive(Debug)]
enum Role {
    /// Rank 0: one stream per worker, indexed by rank (None for itself).
    Master(Vec<Option<TcpStream>>),
    Worker(TcpStream),
}

/// A connected rendezvous: call [`Rendezvous::allgather`] as many rounds as needed.
#[derive(Debug)]
pub struct Rendezvous {
    rank: usize,
    size: usize,
    master: String,
    timeout: Duration,
    role: Role,
}

impl Rendezvous {
    /// Rank 0 binds `MASTER_ADDR:MASTER_PORT` and waits for every rank;
    /// the others connect (retrying until the time-out while the master is
    /// not up yet).
    pub fn connect(b: &Bootstrap) -> Result<Rendezvous> {
        if b.rank == 0 && b.size > 1 {
            let listener = TcpListener::bind(&b.master)
                .map_err(io_err(format!("binding the master address {}", b.master)))?;
            Self::serve(b, listener)
        } else if b.rank == 0 {
            Ok(Rendezvous {
                rank: 0,
                size: 1,
                master: b.master.clone(),
                timeout: b.timeout,
                role: Role::Master(vec![None]),
            })
        } else {
            Self::join(b)
        }
    }

    /// Rank 0 with a listener bound by the caller (tests bind port 0).
    pub fn serve(b: &Bootstrap, listener: TcpListener) -> Result<Rendezvous> {
        let deadline = Instant::now() + b.timeout;
        listener
            .set_nonblocking(true)
            .map_err(io_err("listener non-blocking"))?;
        let mut conns: Vec<Option<TcpStream>> = (0..b.size).map(|_| None).collect();
        let mut arrived = 1;
        while arrived < b.size {
            match listener.accept() {
                Ok((mut s, from)) => {
                    s.set_nonblocking(false)
                        .map_err(io_err("stream blocking"))?;
                    s.set_read_timeout(Some(b.timeout))
                        .map_err(io_err("read time-out"))?;
                    let _ = s.set_nodelay(true);
                    let what = format!("hello from {from}");
                    let magic = read_u32(&mut s, &what)?;
                    let rank = read_u32(&mut s, &what)? as usize;
                    let size = read_u32(&mut s, &what)? as usize;
                    if magic != MAGIC {
                        // Not one of ours (a port scan, another job): ignore it.
                        continue;
                    }
                    if size != b.size {
                        return Err(Error::RendezvousProtocol(format!(
                            "rank {rank} at {from} says the job has {size} ranks, the master says {}",
                            b.size
                        )));
                    }
                    match conns.get_mut(rank) {
                        Some(slot @ None) if rank != 0 => {
                            *slot = Some(s);
                            arrived += 1;
                        }
                        Some(_) => {
                            return Err(Error::RendezvousProtocol(format!(
                                "rank {rank} (from {from}) joined twice"
                            )))
                        }
                        None => {
                            return Err(Error::RendezvousProtocol(format!(
                                "{from} claims rank {rank} in a job of {}",
                                b.size
                            )))
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing = conns
                            .iter()
                            .enumerate()
                            .skip(1)
                            .filter(|(_, c)| c.is_none())
                            .map(|(i, _)| i)
                            .collect();
                        return Err(Error::RendezvousTimeout {
                            master: b.master.clone(),
                            timeout: b.timeout,
                            arrived,
                            size: b.size,
                            missing,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(io_err("accepting a rank")(e)),
            }
        }
        Ok(Rendezvous {
            rank: 0,
            size: b.size,
            master: b.master.clone(),
            timeout: b.timeout,
            role: Role::Master(conns),
        })
    }

    fn join(b: &Bootstrap) -> Result<Rendezvous> {
        let deadline = Instant::now() + b.timeout;
        let addrs: Vec<SocketAddr> = b
            .master
            .to_socket_addrs()
            .map_err(io_err(format!("resolving the master {}", b.master)))?
            .collect();
        let mut last_err = None;
        let mut stream = None;
        'outer: while Instant::now() < deadline {
            for a in &addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))) {
                    Ok(s) => {
                        stream = Some(s);
                        break 'outer;
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut s = stream.ok_or_else(|| Error::RendezvousIo {
            what: format!(
                "rank {} could not reach the master at {} within {:?}",
                b.rank, b.master, b.timeout
            ),
            source: last_err.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::TimedOut)),
        })?;
        s.set_read_timeout(Some(b.timeout))
            .map_err(io_err("read time-out"))?;
        let _ = s.set_nodelay(true);
        let mut hello = Vec::with_capacity(12);
        for v in [MAGIC, b.rank as u32, b.size as u32] {
            hello.extend_from_slice(&v.to_be_bytes());
        }
        s.write_all(&hello).map_err(io_err("sending hello"))?;
        Ok(Rendezvous {
            rank: b.rank,
            size: b.size,
            master: b.master.clone(),
            timeout: b.timeout,
            role: Role::Worker(s),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }
    pub fn size(&self) -> usize {
        self.size
    }

    /// Every rank's blob, in rank order (ours included).
    pub fn allgather(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>> {
        let timeout = self.timeout;
        let master = self.master.clone();
        let size = self.size;
        match &mut self.role {
            Role::Master(conns) => {
                let mut all = Vec::with_capacity(self.size);
                for (r, c) in conns.iter_mut().enumerate() {
                    match c {
                        None => all.push(blob.to_vec()),
                        Some(s) => {
                            all.push(read_blob(s, &format!("round blob of rank {r}")).map_err(
                                |e| match e {
                                    Error::RendezvousIo { source, .. }
                                        if matches!(
                                            source.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) =>
                                    {
                                        Error::RendezvousTimeout {
                                            master: master.clone(),
                                            timeout,
                                            arrived: r,
                                            size,
                                            missing: vec![r],
                                        }
                                    }
                                    Error::RendezvousIo { source, .. } => Error::RendezvousIo {
                                        what: format!("rank {r} left the rendezvous"),
                                        source,
                                    },
                                    other => other,
                                },
                            )?)
                        }
                    }
                }
                let mut out = Vec::new();
                for b in &all {
                    write_blob(&mut out, b);
                }
                for (r, c) in conns.iter_mut().enumerate() {
                    if let Some(s) = c {
                        s.write_all(&out)
                            .map_err(io_err(format!("answering rank {r}")))?;
                    }
                }
                Ok(all)
            }
            Role::Worker(s) => {
                let mut out = Vec::new();
                write_blob(&mut out, blob);
                s.write_all(&out).map_err(io_err("sending a round blob"))?;
                let mut all = Vec::with_capacity(self.size);
                for r in 0..self.size {
                    let b = read_blob(s, &format!("blob of rank {r} from the master")).map_err(
                        |e| match e {
                            Error::RendezvousIo { source, .. }
                                if matches!(
                                    source.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                Error::RendezvousIo {
                                    what: format!(
                                        "the master at {master} did not answer within {timeout:?} \
                                         (another rank may never have shown up)"
                                    ),
                                    source,
                                }
                            }
                            other => other,
                        },
                    )?;
                    all.push(b);
                }
                Ok(all)
            }
        }
    }
}
