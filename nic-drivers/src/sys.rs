//! Thin wrappers over the libc calls several backends share.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::NicError;

/// poll(2) one fd for `events`; `None` timeout waits forever.
pub(crate) fn poll_fd(fd: RawFd, events: i16, timeout: Option<Duration>) -> Result<bool, NicError> {
    poll_fds(&[fd], events, timeout)
}

/// poll(2) `fds` (at most two) for `events`: true when any is ready.
pub(crate) fn poll_fds(
    fds: &[RawFd],
    events: i16,
    timeout: Option<Duration>,
) -> Result<bool, NicError> {
    let ms: libc::c_int = match timeout {
        None => -1,
        // Round up so a 100 µs timeout does not become a 0 ms busy poll.
        Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
    };
    let mut pfds = [libc::pollfd {
        fd: -1,
        events,
        revents: 0,
    }; 2];
    let n = fds.len().min(pfds.len());
    for (p, &fd) in pfds.iter_mut().zip(fds) {
        p.fd = fd;
    }
    loop {
        // SAFETY: pfds holds `n` valid pollfds for the duration of the call.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
        if r >= 0 {
            return Ok(r > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(NicError::io("poll", e));
        }
    }
}

pub(crate) fn poll_readable(fd: RawFd, timeout: Option<Duration>) -> Result<bool, NicError> {
    poll_fd(fd, libc::POLLIN, timeout)
}

// asm-generic/socket.h: the buffer options that ignore net.core.[rw]mem_max.
pub(crate) const SO_SNDBUFFORCE: libc::c_int = 32;
pub(crate) const SO_RCVBUFFORCE: libc::c_int = 33;

/// Sets a socket buffer (`SO_SNDBUF`/`SO_RCVBUF`) to `bytes`: the FORCE
/// option first (needs CAP_NET_ADMIN, ignores net.core.[rw]mem_max), else the
/// plain one (capped by those limits). Best effort: either is fine.
pub(crate) fn set_socket_buffer(
    fd: RawFd,
    force: libc::c_int,
    plain: libc::c_int,
    bytes: usize,
    what: &str,
) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    if setsockopt(fd, libc::SOL_SOCKET, force, &v, what).is_err() {
        let _ = setsockopt(fd, libc::SOL_SOCKET, plain, &v, what);
    }
}

/// Turns a libc return value into a Result, naming the call.
pub(crate) fn cvt(r: libc::c_int, op: &str) -> Result<libc::c_int, NicError> {
    if r < 0 {
        Err(NicError::last_os(op))
    } else {
        Ok(r)
    }
}

/// Wraps a freshly created fd (checked for < 0) into an OwnedFd.
pub(crate) fn owned(fd: libc::c_int, op: &str) -> Result<OwnedFd, NicError> {
    let fd = cvt(fd, op)?;
    // SAFETY: fd was just returned by the kernel, is valid and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A non-blocking, close-on-exec UDP socket, IPv6 or IPv4.
pub(crate) fn udp_socket(v6: bool, op: &str) -> Result<OwnedFd, NicError> {
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain syscall with valid constants.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    owned(fd, op)
}

/// setsockopt with a plain value.
pub(crate) fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: &T,
    op: &str,
) -> Result<(), NicError> {
    // SAFETY: val points to size_of::<T>() readable bytes for the call.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(r, op).map(|_| ())
}

/// getsockopt into a plain value.
pub(crate) fn getsockopt<T: Default>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    op: &str,
) -> Result<T, NicError> {
    let mut val = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: val has room for len bytes; len is updated by the kernel.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut val as *mut T).cast(), &mut len) };
    cvt(r, op).map(|_| val)
}

/// Interface index by name (in the calling thread's namespace).
pub(crate) fn if_index(name: &str) -> Result<u32, NicError> {
    let c = std::ffi::CString::new(name).map_err(|_| NicError::NoSuchInterface(name.into()))?;
    // SAFETY: c is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        Err(NicError::NoSuchInterface(name.into()))
    } else {
        Ok(idx)
    }
}

/// The MAC of an interface, from sysfs (follows the calling thread's netns
/// only if sysfs was mounted there; the ioctl below is namespace-correct).
pub(crate) fn if_mac(fd: RawFd, name: &str) -> Result<[u8; 6], NicError> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    copy_ifname(&mut ifr, name)?;
    // SAFETY: SIOCGIFHWADDR reads ifr_name and writes ifr_hwaddr within the struct.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut ifr) };
    cvt(r, "ioctl SIOCGIFHWADDR")?;
    // SAFETY: the kernel filled the ifru_hwaddr arm of the union.
    let sa = unsafe { ifr.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(sa.sa_data.iter()) {
        *m = *b as u8;
    }
    Ok(mac)
}

/// The MTU of an interface.
pub(crate) fn if_mtu(fd: RawFd, name: &str) -> Result<usize, NicError> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    copy_ifname(&mut ifr, name)?;
    // SAFETY: SIOCGIFMTU reads ifr_name and writes ifru_mtu within the struct.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut ifr) };
    cvt(r, "ioctl SIOCGIFMTU")?;
    // SAFETY: the kernel filled the ifru_mtu arm of the union.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    Ok(mtu.max(0) as usize)
}

/// An ifreq naming the interface with index `index` (SIOCGIFNAME through
/// `fd`, so in `fd`'s network namespace); ENODEV when there is none.
pub(crate) fn ifreq_of_index(fd: RawFd, index: u32) -> std::io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    ifr.ifr_ifru.ifru_ifindex = libc::c_int::try_from(index)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::ENODEV))?;
    // SAFETY: SIOCGIFNAME reads ifru_ifindex and writes ifr_name within the struct.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFNAME, &mut ifr) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ifr)
}

/// The flags (IFF_UP, IFF_RUNNING, ...) of the interface with index
/// `index`, and whether it has a carrier (None: its driver does not say),
/// asked through `fd` (so in `fd`'s network namespace). None when there is
/// no such interface.
pub(crate) fn if_state_by_index(fd: RawFd, index: u32) -> Option<(libc::c_int, Option<bool>)> {
    // linux/ethtool.h: ETHTOOL_GLINK fills an ethtool_value {cmd, data}.
    const ETHTOOL_GLINK: u32 = 0x0000_000a;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut ifr = ifreq_of_index(fd, index).ok()?;
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifru_flags within the struct.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return None;
    }
    // SAFETY: the kernel filled the ifru_flags arm of the union.
    let flags = libc::c_int::from(unsafe { ifr.ifr_ifru.ifru_flags }) & 0xffff;
    let mut link = EthtoolValue {
        cmd: ETHTOOL_GLINK,
        data: 0,
    };
    ifr.ifr_ifru.ifru_data = (&mut link as *mut EthtoolValue).cast();
    // SAFETY: SIOCETHTOOL reads ifr_name and the command ifru_data points
    // at, and writes its `data`; `link` outlives the call.
    let carrier =
        (unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) } == 0).then_some(link.data != 0);
    Some((flags, carrier))
}

/// The name of the driver behind interface `name` ("veth", "virtio_net",
/// ...), asked through `fd`; None when the driver does not say.
pub(crate) fn if_driver(fd: RawFd, name: &str) -> Option<String> {
    // linux/ethtool.h: ETHTOOL_GDRVINFO fills a struct ethtool_drvinfo.
    const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        version: [u8; 32],
        fw_version: [u8; 32],
        bus_info: [u8; 32],
        erom_version: [u8; 32],
        reserved2: [u8; 12],
        counts: [u32; 5],
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        counts: [0; 5],
    };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    copy_ifname(&mut ifr, name).ok()?;
    ifr.ifr_ifru.ifru_data = (&mut info as *mut DrvInfo).cast();
    // SAFETY: SIOCETHTOOL reads ifr_name and the command ifru_data points
    // at, and writes the rest of `info` (its full size); `info` outlives the call.
    if unsafe { libc::ioctl(fd, libc::SIOCETHTOOL, &mut ifr) } < 0 {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    std::str::from_utf8(&info.driver[..end])
        .ok()
        .filter(|d| !d.is_empty())
        .map(str::to_string)
}

fn copy_ifname(ifr: &mut libc::ifreq, name: &str) -> Result<(), NicError> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= ifr.ifr_name.len() {
        return Err(NicError::NoSuchInterface(name.into()));
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Ok(())
}

/// Attaches the classic BPF program `prog` to socket `fd` with `option`
/// (`SO_ATTACH_FILTER`, `SO_ATTACH_REUSEPORT_CBPF`); `what` names it in an
/// error.
pub(crate) fn attach_cbpf(
    fd: RawFd,
    option: libc::c_int,
    prog: &[libc::sock_filter],
    what: &str,
) -> Result<(), NicError> {
    let len = u16::try_from(prog.len())
        .map_err(|_| NicError::Config(format!("{what}: {} BPF instructions", prog.len())))?;
    let fprog = libc::sock_fprog {
        len,
        // The kernel copies the program in; it only reads through this.
        filter: prog.as_ptr().cast_mut(),
    };
    setsockopt(fd, libc::SOL_SOCKET, option, &fprog, what)
}

/// An epoll set that polls readable when any of `fds` does: one fd a caller
/// can sleep on for several sources.
pub(crate) fn epoll_of(fds: &[RawFd]) -> Result<OwnedFd, NicError> {
    // SAFETY: plain syscall with a valid flag.
    let epoll = owned(
        unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) },
        "epoll_create1",
    )?;
    for &fd in fds {
        epoll_add(&epoll, fd)?;
    }
    Ok(epoll)
}

/// Adds `fd` (open, to be polled for reading) to the epoll set `epoll`.
pub(crate) fn epoll_add(epoll: &OwnedFd, fd: RawFd) -> Result<(), NicError> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: fd as u64,
    };
    // SAFETY: both fds are open; ev is a valid epoll_event.
    let r = unsafe { libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    cvt(r, "epoll_ctl ADD").map(drop)
}

/// A timerfd used as a level-triggered "something is due" flag.
#[derive(Debug)]
pub(crate) struct TimerFd(OwnedFd);

impl TimerFd {
    pub(crate) fn new() -> Result<Self, NicError> {
        // SAFETY: plain syscall, flags are valid.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        Ok(TimerFd(owned(fd, "timerfd_create")?))
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Arms the timer to fire after `d` (a zero duration fires at once);
    /// `None` disarms it.
    pub(crate) fn arm(&self, d: Option<Duration>) {
        let value = match d {
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            Some(d) => {
                // it_value 0 would disarm: fire "now" as 1 ns.
                let d = d.max(Duration::from_nanos(1));
                libc::timespec {
                    tv_sec: d.as_secs() as libc::time_t,
                    tv_nsec: d.subsec_nanos() as libc::c_long,
                }
            }
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: spec is a valid itimerspec; old value not requested. A
        // failure here (impossible with a valid fd) only costs a wake-up.
        unsafe { libc::timerfd_settime(self.raw(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Clears an expiry so the fd stops polling readable.
    pub(crate) fn clear(&self) {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into n; EAGAIN when not expired is fine.
        unsafe { libc::read(self.raw(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// Appends `len` bytes at `p` to a message's iovecs (those from `start`
/// on), extending the last one when they follow it (a tail and the next
/// frame's head).
fn push_iov(iov: &mut Vec<libc::iovec>, start: usize, p: *mut u8, len: usize) {
    if len == 0 {
        return;
    }
    if iov.len() > start {
        if let Some(last) = iov.last_mut() {
            if last.iov_base.cast::<u8>().wrapping_add(last.iov_len) == p {
                last.iov_len += len;
                return;
            }
        }
    }
    iov.push(libc::iovec {
        iov_base: p.cast(),
        iov_len: len,
    });
}

/// Appends one gathered frame's iovecs to a message's (those from `start`
/// on): `head` in place, its payload from `src`, then `tail` in place.
/// False, leaving the payload out, when `src` no longer has the payload.
pub(crate) fn push_gathered(
    iov: &mut Vec<libc::iovec>,
    start: usize,
    head: (*mut u8, usize),
    payload: Option<&crate::PayloadRef>,
    src: &dyn crate::TxSource,
    tail: (*mut u8, usize),
) -> bool {
    push_iov(iov, start, head.0, head.1);
    let mut ok = true;
    if let Some(pr) = payload {
        match src.payload(pr).filter(|b| b.len() == pr.len) {
            Some(b) => iov.push(libc::iovec {
                // The kernel only reads through it (sendmsg).
                iov_base: b.as_ptr().cast_mut().cast(),
                iov_len: b.len(),
            }),
            None => ok = false,
        }
    }
    push_iov(iov, start, tail.0, tail.1);
    ok
}
