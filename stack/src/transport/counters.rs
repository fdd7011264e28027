//! The counters Linux rxe exposes in
//! `/sys/class/infiniband/rxe0/ports/1/hw_counters` (rxe_hw_counters.c),
//! with the same names, in the same order, counting the same events.
//! ferroce's finer reasons (every drop by name) live next to them in
//! [`Stats::drops`](super::Stats).

/// One of rxe's hw counters. The discriminant is the position in rxe's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HwCounter {
    /// Every packet handed to the wire (rxe: rxe_xmit_packet).
    SentPkts,
    /// Every packet that passed the header checks and reached a QP (rxe: rxe_rcv).
    RcvdPkts,
    /// A request with a PSN the responder already passed (rxe_resp.c check_psn).
    DuplicateRequest,
    /// A request beyond the expected PSN that drew a PSN-sequence NAK: one per gap.
    OutOfSeqRequest,
    /// RNR NAKs the requester received (rxe_comp.c check_ack).
    RcvdRnrErr,
    /// RNR NAKs the responder sent (RC only).
    SendRnrErr,
    /// PSN-sequence NAKs the requester received.
    RcvdSeqErr,
    /// rxe: a response queued behind others for the completer task. ferroce's
    /// completer runs inline for every response, so this stays 0; the name is
    /// kept so tools reading rxe's list find it.
    AckDeferred,
    /// A WQE failed with RETRY_EXC_ERR (retry_cnt used up).
    RetryExceededErr,
    /// A WQE failed with RNR_RETRY_EXC_ERR (rnr_retry used up).
    RetryRnrExceededErr,
    /// The completer started a go-back-N retry (timeout, NAK or implied NAK).
    CompleterRetryErr,
    /// A packet could not be built or handed to the wire.
    SendErr,
    /// rxe: the netdev went down. ferroce does not watch link state: stays 0.
    LinkDowned,
    /// SEND WQEs the completer retired (rxe_comp.c do_complete).
    RdmaSends,
    /// Receive WQEs completed successfully (rxe_resp.c do_complete).
    RdmaRecvs,
}

impl HwCounter {
    pub const COUNT: usize = 15;
    /// rxe's order (enum rxe_counters).
    pub const ALL: [HwCounter; HwCounter::COUNT] = [
        HwCounter::SentPkts,
        HwCounter::RcvdPkts,
        HwCounter::DuplicateRequest,
        HwCounter::OutOfSeqRequest,
        HwCounter::RcvdRnrErr,
        HwCounter::SendRnrErr,
        HwCounter::RcvdSeqErr,
        HwCounter::AckDeferred,
        HwCounter::RetryExceededErr,
        HwCounter::RetryRnrExceededErr,
        HwCounter::CompleterRetryErr,
        HwCounter::SendErr,
        HwCounter::LinkDowned,
        HwCounter::RdmaSends,
        HwCounter::RdmaRecvs,
    ];

    /// The file name rxe gives it under hw_counters/.
    pub const fn name(self) -> &'static str {
        match self {
            HwCounter::SentPkts => "sent_pkts",
            HwCounter::RcvdPkts => "rcvd_pkts",
            HwCounter::DuplicateRequest => "duplicate_request",
            HwCounter::OutOfSeqRequest => "out_of_seq_request",
            HwCounter::RcvdRnrErr => "rcvd_rnr_err",
            HwCounter::SendRnrErr => "send_rnr_err",
            HwCounter::RcvdSeqErr => "rcvd_seq_err",
            HwCounter::AckDeferred => "ack_deferred",
            HwCounter::RetryExceededErr => "retry_exceeded_err",
            HwCounter::RetryRnrExceededErr => "retry_rnr_exceeded_err",
            HwCounter::CompleterRetryErr => "completer_retry_err",
            HwCounter::SendErr => "send_err",
            HwCounter::LinkDowned => "link_downed",
            HwCounter::RdmaSends => "rdma_sends",
            HwCounter::RdmaRecvs => "rdma_recvs",
        }
    }

    pub fn from_name(name: &str) -> Option<HwCounter> {
        HwCounter::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// The values of every [`HwCounter`], indexed by it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HwCounters(pub [u64; HwCounter::COUNT]);

impl HwCounters {
    pub fn inc(&mut self, c: HwCounter) {
        self.0[c as usize] += 1;
    }
    pub fn get(&self, c: HwCounter) -> u64 {
        self.0[c as usize]
    }
    /// `(name, value)` in rxe's order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        HwCounter::ALL.into_iter().map(|c| (c.name(), self.get(c)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order_are_rxes() {
        let names: Vec<_> = HwCounter::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(
            names.join(" "),
            "sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_rnr_err \
             send_rnr_err rcvd_seq_err ack_deferred retry_exceeded_err \
             retry_rnr_exceeded_err completer_retry_err send_err link_downed rdma_sends rdma_recvs"
        );
        for (i, c) in HwCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert_eq!(HwCounter::from_name(c.name()), Some(*c));
        }
    }
}
