//! Route netlink (NETLINK_ROUTE) for the neighbour lookup and the link
//! watch: the socket, one datagram in or out, and a walk over the messages
//! of a datagram. Layouts: linux/netlink.h (nlmsghdr: length, type, flags,
//! sequence, port id; 16 bytes; messages 4-byte aligned).

use std::os::fd::{AsRawFd, OwnedFd};

use crate::sys::{cvt, owned};
use crate::NicError;

/// Length of an nlmsghdr (NLMSG_HDRLEN).
pub(crate) const HEADER_LEN: usize = 16;
/// linux/netlink.h
pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLMSG_DONE: u16 = 3;

/// Rounds a message or attribute length up to the next 4-byte boundary
/// (NLMSG_ALIGN, RTA_ALIGN).
pub(crate) fn align4(n: usize) -> usize {
    n.next_multiple_of(4)
}

/// A route netlink socket of the calling thread's network namespace, in
/// the multicast `groups` (RTMGRP_* bits; 0 for requests only).
pub(crate) fn route_socket(groups: u32, nonblocking: bool) -> Result<OwnedFd, NicError> {
    let kind =
        libc::SOCK_RAW | libc::SOCK_CLOEXEC | if nonblocking { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain syscall with valid constants.
    let fd = owned(
        unsafe { libc::socket(libc::AF_NETLINK, kind, libc::NETLINK_ROUTE) },
        "socket(NETLINK_ROUTE)",
    )?;
    if groups != 0 {
        // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = groups;
        // SAFETY: addr is a sockaddr_nl of the length given, alive for the call.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        cvt(r, "bind netlink socket to its groups")?;
    }
    Ok(fd)
}

/// Sends one request to the kernel (no address needed: it is the default
/// destination of a netlink socket).
pub(crate) fn send(fd: &OwnedFd, req: &[u8], what: &str) -> Result<(), NicError> {
    // SAFETY: req is readable for its whole length during the call.
    let r = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if r < 0 {
        return Err(NicError::last_os(what));
    }
    Ok(())
}

/// One datagram into `buf`: its length, or the error (WouldBlock on a
/// non-blocking socket with nothing queued, ENOBUFS after messages were
/// lost to a full queue).
pub(crate) fn recv(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: buf is writable for its whole length during the call.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
}

/// A message's length field is below a header or runs past the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadLength;

/// The messages of one datagram, in order, as (type, body after the
/// header). A bad length ends the walk with one `Err`: what follows it
/// cannot be found. A few bytes too short for a header at the end are
/// padding and end it quietly.
pub(crate) fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

/// See [`messages`].
pub(crate) struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<(u16, &'a [u8]), BadLength>;

    fn next(&mut self) -> Option<Self::Item> {
        let h = self.rest.get(..HEADER_LEN)?;
        let len = u32::from_ne_bytes([h[0], h[1], h[2], h[3]]) as usize;
        let kind = u16::from_ne_bytes([h[4], h[5]]);
        let Some(body) = self.rest.get(HEADER_LEN..len).filter(|_| len >= HEADER_LEN) else {
            self.rest = &[];
            return Some(Err(BadLength));
        };
        self.rest = self.rest.get(align4(len)..).unwrap_or(&[]);
        Some(Ok((kind, body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = ((HEADER_LEN + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(body);
        m.resize(align4(m.len()), 0);
        m
    }

    #[test]
    fn walks_aligned_messages_and_stops_at_a_bad_length() {
        let mut d = msg(16, &[1, 2, 3]);
        d.extend(msg(NLMSG_DONE, &[]));
        let got: Vec<_> = messages(&d).collect();
        assert_eq!(got, [Ok((16, &[1u8, 2, 3][..])), Ok((NLMSG_DONE, &[][..]))]);

        // Past the end, below a header: one error, then nothing.
        for len in [(d.len() + 4) as u32, 8] {
            let mut bad = d.clone();
            bad[..4].copy_from_slice(&len.to_ne_bytes());
            let got: Vec<_> = messages(&bad).collect();
            assert_eq!(got, [Err(BadLength)]);
        }
        // A tail shorter than a header is no message.
        assert_eq!(messages(&d[..d.len() - 4]).count(), 1);
        assert_eq!(messages(&[0u8; 7]).count(), 0);
    }
}
