//! The rest of librdmacm's ABI, which ferroce does not back: rsockets (a
//! socket-like protocol of its own over RDMA) and ECE (enhanced connection
//! establishment, which rxe does not offer either). They exist so the
//! dynamic loader resolves every import; called, they fail with -1 and
//! errno EOPNOTSUPP. Arguments are not declared: on x86-64 System V the
//! caller owns its arguments, so a function that ignores them may omit them.

macro_rules! fail_minus_one {
    ($($name:ident),* $(,)?) => {$(
        /// Unsupported by ferroce: -1, errno EOPNOTSUPP.
        #[no_mangle]
        pub extern "C" fn $name() -> isize {
            crate::handles::set_errno(libc::EOPNOTSUPP);
            -1
        }
    )*};
}

fail_minus_one!(
    rdma_get_remote_ece,
    rdma_set_local_ece,
    rdma_reject_ece,
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rsend,
    rsendto,
    rsendmsg,
    rread,
    rreadv,
    rwrite,
    rwritev,
    rpoll,
    rselect,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riomap,
    riounmap,
    riowrite,
);
