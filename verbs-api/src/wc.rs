//! Work-completion helpers: the status strings of `ibv_wc_status_str`.

use crate::WcStatus;

/// The text rdma-core's `ibv_wc_status_str` gives for a status
/// (libibverbs/verbs.c), so tools print what users already know.
pub fn status_str(s: WcStatus) -> &'static str {
    match s {
        WcStatus::Success => "success",
        WcStatus::LocLenErr => "local length error",
        WcStatus::LocQpOpErr => "local QP operation error",
        WcStatus::LocProtErr => "local protection error",
        WcStatus::WrFlushErr => "Work Request Flushed Error",
        WcStatus::BadRespErr => "bad response error",
        WcStatus::LocAccessErr => "local access error",
        WcStatus::RemInvReqErr => "remote invalid request error",
        WcStatus::RemAccessErr => "remote access error",
        WcStatus::RemOpErr => "remote operational error",
        WcStatus::RetryExcErr => "transport retry counter exceeded",
        WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
        WcStatus::RemInvRdReqErr => "remote invalid RD request",
        WcStatus::RemAbortErr => "operation aborted",
        WcStatus::FatalErr => "fatal error",
        WcStatus::GeneralErr => "general error",
    }
}
