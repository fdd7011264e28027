//! Binding a rank to a CPU (`FERROCE_COLL_BIND=core`), as `mpirun --bind-to
//! core` binds its ranks: rank k of a host runs on the k-th CPU it may use
//! (modulo their number). Off by default.
//!
//! Ranks spin on their devices (yielding between polls) while they wait,
//! so where they run decides how long a message waits for its receiver. A
//! scheduler may keep them together: on the 2-vCPU machines these figures
//! come from (whose kernel packs runnable tasks onto few vCPUs,
//! `sched_vcpu_pack`), all 4 ranks of a job shared one vCPU, and an 8 B
//! allreduce over UDP took 76–188 µs where, bound two to a vCPU, it took
//! 75–106 µs (`scripts/coll-vs-mpi.sh`, 2026-12-07).

use crate::error::{Error, Result};

/// This process's index among its job's ranks on this host, as the
/// launcher gives it: Open MPI, torchrun, Slurm, MPICH (Hydra).
pub fn local_rank_from_vars(get: impl Fn(&str) -> Option<String>) -> Option<usize> {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "LOCAL_RANK",
        "SLURM_LOCALID",
        "MPI_LOCALRANKID",
    ]
    .iter()
    .find_map(|k| get(k).and_then(|v| v.trim().parse().ok()))
}

/// Whether `FERROCE_COLL_BIND` asks for binding (`core`; `none` or unset: no).
pub fn binding_from_env() -> Result<bool> {
    match std::env::var("FERROCE_COLL_BIND") {
        Err(_) => Ok(false),
        Ok(v) => match v.trim() {
            "" | "none" => Ok(false),
            "core" => Ok(true),
            o => Err(Error::Env(format!("FERROCE_COLL_BIND={o:?} (core, none)"))),
        },
    }
}

/// Binds the calling thread, and the threads it starts from now on, to the
/// `local`-th CPU (modulo their number) of those it may run on. Returns
/// that CPU.
pub fn bind_current_thread(local: usize) -> Result<usize> {
    let cpus = core_affinity::get_core_ids()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::Env("FERROCE_COLL_BIND: cannot read this thread's CPUs".into()))?;
    let cpu = cpus[local % cpus.len()];
    if !core_affinity::set_for_current(cpu) {
        return Err(Error::Env(format!(
            "FERROCE_COLL_BIND: cannot bind to CPU {}",
            cpu.id
        )));
    }
    Ok(cpu.id)
}

/// [`bind_current_thread`] if `FERROCE_COLL_BIND` asks for it, with the
/// launcher's local rank (else `rank`).
pub fn bind_from_env(rank: usize) -> Result<Option<usize>> {
    if !binding_from_env()? {
        return Ok(None);
    }
    let local = local_rank_from_vars(|k| std::env::var(k).ok()).unwrap_or(rank);
    bind_current_thread(local).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_rank_follows_the_launcher() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(local_rank_from_vars(vars(&[])), None);
        assert_eq!(
            local_rank_from_vars(vars(&[("OMPI_COMM_WORLD_LOCAL_RANK", "3")])),
            Some(3)
        );
        assert_eq!(local_rank_from_vars(vars(&[("LOCAL_RANK", "1")])), Some(1));
        assert_eq!(
            local_rank_from_vars(vars(&[("SLURM_LOCALID", "2")])),
            Some(2)
        );
        assert_eq!(local_rank_from_vars(vars(&[("LOCAL_RANK", "x")])), None);
    }

    /// A thread bound to its k-th CPU runs only there, and a thread it
    /// starts afterwards inherits the binding.
    #[test]
    fn binding_pins_the_thread_and_its_children() {
        std::thread::spawn(|| {
            let all = core_affinity::get_core_ids().unwrap();
            let cpu = bind_current_thread(all.len() + 1).unwrap();
            assert_eq!(cpu, all[1 % all.len()].id);
            let mine = core_affinity::get_core_ids().unwrap();
            assert_eq!(mine.iter().map(|c| c.id).collect::<Vec<_>>(), vec![cpu]);
            let child = std::thread::spawn(|| core_affinity::get_core_ids().unwrap())
                .join()
                .unwrap();
            assert_eq!(child.iter().map(|c| c.id).collect::<Vec<_>>(), vec![cpu]);
        })
        .join()
        .unwrap();
    }
}
