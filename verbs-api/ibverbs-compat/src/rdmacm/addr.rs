//! Socket addresses between C and Rust, `rdma_getaddrinfo`, and the route
//! lookup rdma_resolve_addr makes for a source address.

use std::ffi::{c_char, c_int};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::ptr;

use crate::ffi;
use crate::handles::set_errno;

/// A C socket address (IPv4 or IPv6) as Rust's; None for NULL or another family.
///
/// # Safety
/// `sa` is NULL or points to a socket address of its family's size.
pub unsafe fn from_c(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller passes a readable socket address; the family says
    // which of the two layouts it has.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// `a` written into a `sockaddr_storage`-sized slot.
pub fn to_storage(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero bytes are a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { ptr::write(ptr::addr_of_mut!(st) as *mut libc::sockaddr_in, s) };
        }
        SocketAddr::V6(v6) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe { ptr::write(ptr::addr_of_mut!(st) as *mut libc::sockaddr_in6, s) };
        }
    }
    st
}

/// The length of `a` as a C socket address.
pub fn c_len(a: &SocketAddr) -> libc::socklen_t {
    (match a {
        SocketAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
        SocketAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
    }) as libc::socklen_t
}

/// The source address the kernel's routing table picks towards `dst`
/// (rdma_resolve_addr without a source): a UDP socket connected to it,
/// which sends nothing.
pub fn route_source(dst: IpAddr) -> std::io::Result<IpAddr> {
    let bind: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(bind)?;
    // The RoCE v2 port; connect() only looks the route up.
    s.connect(SocketAddr::new(dst, 4791))?;
    Ok(s.local_addr()?.ip())
}

/// A malloc'd copy of `a` (freed by rdma_freeaddrinfo).
fn malloc_addr(a: SocketAddr) -> *mut ffi::sockaddr {
    let len = c_len(&a) as usize;
    // SAFETY: plain allocation, checked below.
    let p = unsafe { libc::calloc(1, std::mem::size_of::<libc::sockaddr_storage>()) };
    if !p.is_null() {
        let st = to_storage(a);
        // SAFETY: `len` bytes of a storage-sized source into a storage-sized block.
        unsafe { ptr::copy_nonoverlapping(ptr::addr_of!(st) as *const u8, p as *mut u8, len) };
    }
    p as *mut ffi::sockaddr
}

/// rdma_getaddrinfo: the addresses of `node` / `service` (getaddrinfo's),
/// as the source (RAI_PASSIVE) or destination of an rdma_cm ID, with the
/// port space and QP type of `hints` (default: TCP port space, RC).
///
/// # Safety
/// `node` and `service` are NULL or C strings; `hints` NULL or readable;
/// `res` writable.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const ffi::rdma_addrinfo,
    res: *mut *mut ffi::rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null()) {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller passes NULL or a readable hints struct.
    let h = unsafe { hints.as_ref() }.copied().unwrap_or_default();
    let passive = h.ai_flags & ffi::RAI_PASSIVE as c_int != 0;
    // SAFETY: all-zero bytes are a valid addrinfo.
    let mut ghints: libc::addrinfo = unsafe { std::mem::zeroed() };
    ghints.ai_family = h.ai_family;
    ghints.ai_socktype = libc::SOCK_STREAM;
    if passive {
        ghints.ai_flags |= libc::AI_PASSIVE;
    }
    if h.ai_flags & ffi::RAI_NUMERICHOST as c_int != 0 {
        ghints.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut list: *mut libc::addrinfo = ptr::null_mut();
    // SAFETY: C strings or NULL from the caller; our hints; `list` written.
    let rc = unsafe { libc::getaddrinfo(node, service, &ghints, &mut list) };
    if rc != 0 {
        // librdmacm passes getaddrinfo's (negative) code through.
        set_errno(libc::ENOENT);
        return rc;
    }
    let ps = if h.ai_port_space != 0 {
        h.ai_port_space
    } else {
        ffi::RDMA_PS_TCP as c_int
    };
    let qp_type = if h.ai_qp_type != 0 {
        h.ai_qp_type
    } else if ps == ffi::RDMA_PS_UDP as c_int {
        ffi::IBV_QPT_UD as c_int
    } else {
        ffi::IBV_QPT_RC as c_int
    };
    let mut head: *mut ffi::rdma_addrinfo = ptr::null_mut();
    let mut tail: *mut *mut ffi::rdma_addrinfo = &mut head;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: a node of getaddrinfo's list.
        let ai = unsafe { &*cur };
        cur = ai.ai_next;
        // SAFETY: getaddrinfo's address of its family.
        let Some(addr) = (unsafe { from_c(ai.ai_addr) }) else {
            continue;
        };
        // SAFETY: plain allocation, checked.
        let r = unsafe { libc::calloc(1, std::mem::size_of::<ffi::rdma_addrinfo>()) }
            as *mut ffi::rdma_addrinfo;
        if r.is_null() {
            break;
        }
        let mut v = ffi::rdma_addrinfo {
            ai_flags: h.ai_flags,
            ai_family: ai.ai_family,
            ai_qp_type: qp_type,
            ai_port_space: ps,
            ..Default::default()
        };
        if passive {
            v.ai_src_addr = malloc_addr(addr);
            v.ai_src_len = c_len(&addr);
        } else {
            v.ai_dst_addr = malloc_addr(addr);
            v.ai_dst_len = c_len(&addr);
            // A source given in the hints goes along (librdmacm's ucma_set_src_addr).
            // SAFETY: the hints' source address, if any, is readable.
            if let Some(src) = unsafe { from_c(h.ai_src_addr as *const libc::sockaddr) } {
                v.ai_src_addr = malloc_addr(src);
                v.ai_src_len = c_len(&src);
            }
        }
        // SAFETY: r is a fresh allocation of the struct's size; tail points
        // at the last next-pointer of our list.
        unsafe {
            ptr::write(r, v);
            *tail = r;
            tail = ptr::addr_of_mut!((*r).ai_next);
        }
    }
    // SAFETY: getaddrinfo's list.
    unsafe { libc::freeaddrinfo(list) };
    if head.is_null() {
        set_errno(libc::ENODEV);
        return -1;
    }
    // SAFETY: the caller's out pointer.
    unsafe { *res = head };
    0
}

/// rdma_freeaddrinfo: frees a list from [`rdma_getaddrinfo`].
///
/// # Safety
/// `res` is NULL or came from rdma_getaddrinfo.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut ffi::rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: nodes and their members were allocated by rdma_getaddrinfo with calloc.
        unsafe {
            let next = (*cur).ai_next;
            for p in [
                (*cur).ai_src_addr as *mut libc::c_void,
                (*cur).ai_dst_addr as *mut libc::c_void,
                (*cur).ai_src_canonname as *mut libc::c_void,
                (*cur).ai_dst_canonname as *mut libc::c_void,
                (*cur).ai_route,
                (*cur).ai_connect,
            ] {
                libc::free(p);
            }
            libc::free(cur as *mut libc::c_void);
            cur = next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_c() {
        for a in ["198.18.0.1:7471", "[fe80::1]:20079", "[::ffff:10.0.0.1]:1"] {
            let a: SocketAddr = a.parse().unwrap();
            let st = to_storage(a);
            // SAFETY: a storage written by to_storage.
            let back = unsafe { from_c(ptr::addr_of!(st) as *const libc::sockaddr) };
            assert_eq!(back, Some(a));
        }
        assert_eq!(
            route_source("127.0.0.1".parse().unwrap())
                .unwrap()
                .to_string(),
            "127.0.0.1"
        );
    }
}
