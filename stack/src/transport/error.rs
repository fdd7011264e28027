//! Errors of the verbs calls (what `ibv_*` return as errno, typed).

use super::qp::{QpState, QpType};

/// Why a `modify_qp` was refused (ibv_modify_qp(3) returns EINVAL for all of these).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    #[error("{qp_type:?} QP cannot go from {from:?} to {to:?}")]
    InvalidTransition {
        qp_type: QpType,
        from: QpState,
        to: QpState,
    },
    #[error("{from:?} -> {to:?} requires attribute {attr}")]
    MissingAttribute {
        from: QpState,
        to: QpState,
        attr: &'static str,
    },
    #[error("{from:?} -> {to:?} does not accept attribute {attr}")]
    UnexpectedAttribute {
        from: QpState,
        to: QpState,
        attr: &'static str,
    },
    #[error("attribute {attr} = {value} is out of range")]
    InvalidValue { attr: &'static str, value: u64 },
    #[error("cur_qp_state {given:?} does not match the QP's state {actual:?}")]
    CurStateMismatch { given: QpState, actual: QpState },
}

/// Errors of the verbs calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    #[error("no such {0}")]
    NotFound(&'static str),
    #[error("{0} is still in use")]
    Busy(&'static str),
    #[error("out of {0}")]
    Exhausted(&'static str),
    #[error("{what} = {value} exceeds the limit {max}")]
    OutOfRange {
        what: &'static str,
        value: u64,
        max: u64,
    },
    #[error("queue is full")]
    QueueFull,
    #[error("not allowed in QP state {0:?}")]
    InvalidState(QpState),
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    #[error(transparent)]
    Modify(#[from] ModifyError),
}
