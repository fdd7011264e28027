//! The error type of the collectives layer: what failed, with which peer, and why.

use std::time::Duration;

/// Errors of bootstrap, rendezvous, transport and collectives.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The environment does not describe a job (or describes it wrongly).
    #[error("bootstrap: {0}")]
    Env(String),
    /// A rendezvous step failed (network error at the master or a worker).
    #[error("rendezvous: {what}: {source}")]
    RendezvousIo {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Not every rank reached the master in time.
    #[error("rendezvous at {master} timed out after {timeout:?}: {arrived} of {size} ranks arrived, missing ranks {missing:?}")]
    RendezvousTimeout {
        master: String,
        timeout: Duration,
        arrived: usize,
        size: usize,
        missing: Vec<usize>,
    },
    /// A peer sent something the rendezvous protocol does not allow.
    #[error("rendezvous protocol: {0}")]
    RendezvousProtocol(String),
    /// The verbs layer refused a call.
    #[error("verbs: {0}")]
    Verbs(#[from] ferroce_verbs::Error),
    /// rdma-core's libibverbs refused a call (rdma-core backend).
    #[error("libibverbs: {0}")]
    Ibverbs(String),
    /// A work request completed with an error status (the peer may be gone).
    #[error("work completion from rank {peer} failed: {status}")]
    Completion { peer: usize, status: &'static str },
    /// A peer broke the data protocol (wrong chunk length, too many credits, ...).
    #[error("protocol error with rank {peer}: {what}")]
    Protocol { peer: usize, what: String },
    /// Nothing moved for the whole time-out while waiting on these ranks.
    #[error(
        "no progress for {timeout:?} while waiting on ranks {waiting_on:?} (a rank may have died)"
    )]
    Timeout {
        timeout: Duration,
        waiting_on: Vec<usize>,
    },
    /// A peer of an in-process transport went away.
    #[error("rank {0} is gone")]
    PeerGone(usize),
    /// Buffers of the wrong size, a rank out of range, ...
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// The collectives' result type.
pub type Result<T> = std::result::Result<T, Error>;

/// A number from environment variable `key`: `None` when unset, an
/// [`Error::Env`] naming it when set to something else.
pub(crate) fn env_number<T: std::str::FromStr>(key: &str) -> Result<Option<T>> {
    match std::env::var(key) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Env(format!("{key}={v:?} is not a number"))),
    }
}
