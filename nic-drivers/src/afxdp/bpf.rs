//! The XDP program, assembled by hand, and the raw bpf(2) calls that load and
//! attach it. No libbpf, clang or ELF: 40-odd instructions do not need them.
//!
//! Program: Ethernet [+ one 802.1Q/802.1ad tag] / IPv4 (IHL 5, not a
//! fragment) or IPv6 / UDP dst `port` → `bpf_redirect_map(xskmap,
//! rx_queue_index, XDP_PASS)`; everything else → XDP_PASS, so ARP, ND, ping
//! and TCP keep reaching the kernel.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::sys;
use crate::NicError;

// linux/bpf.h commands, types and flags.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37; // enum bpf_attach_type
/// Program handles multi-buffer frames (needed for native XDP at MTU > ~3.5 KB).
pub(crate) const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_PSEUDO_MAP_FD: u8 = 1;
// linux/if_link.h
/// Generic (skb) XDP.
pub(crate) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// Native (driver) XDP.
pub(crate) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_PASS: i32 = 2;
// The size of union bpf_attr we pass; the kernel accepts any size as long as
// the bytes past what it knows are zero.
const ATTR_LEN: usize = 128;

/// One eBPF instruction (struct bpf_insn).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub(crate) struct Insn {
    code: u8,
    regs: u8, // dst_reg in the low nibble, src_reg in the high nibble
    off: i16,
    imm: i32,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (dst & 0xF) | (src << 4),
        off,
        imm,
    }
}

// Opcodes (linux/bpf_common.h, linux/bpf.h).
const MOV64_X: u8 = 0xbf;
const MOV64_K: u8 = 0xb7;
const ADD64_K: u8 = 0x07;
const AND64_K: u8 = 0x57;
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const JGT_X: u8 = 0x2d;
const JNE_K: u8 = 0x55;
const JEQ_K: u8 = 0x15;
const JA: u8 = 0x05;
const LD_DW_IMM: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

/// A tiny assembler: jumps name labels, resolved at the end.
struct Asm {
    code: Vec<Insn>,
    fixups: Vec<(usize, &'static str)>,
    labels: Vec<(&'static str, usize)>,
}

impl Asm {
    fn i(&mut self, x: Insn) {
        self.code.push(x);
    }
    fn jmp(&mut self, code: u8, dst: u8, src: u8, imm: i32, label: &'static str) {
        self.fixups.push((self.code.len(), label));
        self.code.push(insn(code, dst, src, 0, imm));
    }
    /// With the UDP payload at `bth` bytes into the frame (`r2`): too short
    /// for byte 5 of the BTH -> "redirect"; that byte (the top of the
    /// destination QP) other than `prefix` or the multicast QPN's 0xFF ->
    /// "pass". (A frame can be redirected or passed, not both: multicast
    /// reaches this device, not the other processes' AF_PACKET devices.)
    fn qpn_check(&mut self, bth: i16, prefix: u8) {
        let (r2, r3, r4, r5) = (2u8, 3u8, 4u8, 5u8);
        self.i(insn(MOV64_X, r4, r2, 0, 0));
        self.i(insn(ADD64_K, r4, 0, 0, i32::from(bth) + 6));
        self.jmp(JGT_X, r4, r3, 0, "redirect");
        self.i(insn(LDX_B, r5, r2, bth + 5, 0));
        self.jmp(JEQ_K, r5, 0, 0xFF, "redirect");
        self.jmp(JNE_K, r5, 0, i32::from(prefix), "pass");
    }
    fn label(&mut self, l: &'static str) {
        self.labels.push((l, self.code.len()));
    }
    fn finish(mut self) -> Result<Vec<Insn>, NicError> {
        for (at, l) in &self.fixups {
            let target = self
                .labels
                .iter()
                .find(|(n, _)| n == l)
                .map(|(_, t)| *t)
                .ok_or(NicError::Malformed("XDP program: unknown label"))?;
            let off = target as i64 - (*at as i64 + 1);
            if let Some(x) = self.code.get_mut(*at) {
                x.off = off as i16;
            }
        }
        Ok(self.code)
    }
}

/// Network-order u16 as the little-endian load sees it.
fn be16(v: u16) -> i32 {
    i32::from(u16::from_le_bytes(v.to_be_bytes()))
}

/// The redirect program for `port`, referring to the XSKMAP `map_fd`. With
/// `qpn_prefix`, a datagram whose BTH destination QP has another top byte
/// goes on to the kernel (another process's AF_PACKET device takes it there,
/// see `raw_share`); one too short to hold that byte is redirected, for the
/// stack to count.
pub(crate) fn redirect_program(
    map_fd: RawFd,
    port: u16,
    qpn_prefix: Option<u8>,
) -> Result<Vec<Insn>, NicError> {
    let (r0, r1, r2, r3, r4, r5, r6) = (0u8, 1u8, 2u8, 3u8, 4u8, 5u8, 6u8);
    let mut a = Asm {
        code: Vec::new(),
        fixups: Vec::new(),
        labels: Vec::new(),
    };
    let p = be16(port);
    a.i(insn(MOV64_X, r6, r1, 0, 0)); // r6 = ctx
    a.i(insn(LDX_W, r2, r1, 0, 0)); // r2 = ctx->data
    a.i(insn(LDX_W, r3, r1, 4, 0)); // r3 = ctx->data_end
    a.i(insn(MOV64_X, r4, r2, 0, 0));
    a.i(insn(ADD64_K, r4, 0, 0, 14));
    a.jmp(JGT_X, r4, r3, 0, "pass"); // no Ethernet header
    a.i(insn(LDX_H, r5, r2, 12, 0)); // r5 = EtherType
    a.jmp(JEQ_K, r5, 0, be16(0x8100), "vlan");
    a.jmp(JEQ_K, r5, 0, be16(0x88A8), "vlan");
    a.jmp(JA, 0, 0, 0, "l3");
    a.label("vlan");
    a.i(insn(MOV64_X, r4, r2, 0, 0));
    a.i(insn(ADD64_K, r4, 0, 0, 18));
    a.jmp(JGT_X, r4, r3, 0, "pass");
    a.i(insn(LDX_H, r5, r2, 16, 0)); // inner EtherType
    a.i(insn(ADD64_K, r2, 0, 0, 4)); // from here on, as if untagged
    a.label("l3");
    a.jmp(JEQ_K, r5, 0, be16(0x0800), "v4");
    a.jmp(JEQ_K, r5, 0, be16(0x86DD), "v6");
    a.jmp(JA, 0, 0, 0, "pass");
    a.label("v4");
    a.i(insn(MOV64_X, r4, r2, 0, 0));
    a.i(insn(ADD64_K, r4, 0, 0, 14 + 20 + 8));
    a.jmp(JGT_X, r4, r3, 0, "pass");
    a.i(insn(LDX_B, r5, r2, 14, 0)); // version + IHL
    a.jmp(JNE_K, r5, 0, 0x45, "pass");
    a.i(insn(LDX_B, r5, r2, 23, 0)); // protocol
    a.jmp(JNE_K, r5, 0, 17, "pass");
    a.i(insn(LDX_H, r5, r2, 20, 0)); // flags + fragment offset
    a.i(insn(AND64_K, r5, 0, 0, be16(0x3FFF))); // MF | offset
    a.jmp(JNE_K, r5, 0, 0, "pass");
    a.i(insn(LDX_H, r5, r2, 14 + 20 + 2, 0)); // UDP dst port
    a.jmp(JNE_K, r5, 0, p, "pass");
    if let Some(q) = qpn_prefix {
        a.qpn_check(14 + 20 + 8, q);
    }
    a.jmp(JA, 0, 0, 0, "redirect");
    a.label("v6");
    a.i(insn(MOV64_X, r4, r2, 0, 0));
    a.i(insn(ADD64_K, r4, 0, 0, 14 + 40 + 8));
    a.jmp(JGT_X, r4, r3, 0, "pass");
    a.i(insn(LDX_B, r5, r2, 14 + 6, 0)); // next header
    a.jmp(JNE_K, r5, 0, 17, "pass");
    a.i(insn(LDX_H, r5, r2, 14 + 40 + 2, 0)); // UDP dst port
    a.jmp(JNE_K, r5, 0, p, "pass");
    if let Some(q) = qpn_prefix {
        a.qpn_check(14 + 40 + 8, q);
    }
    a.label("redirect");
    a.i(insn(LDX_W, r2, r6, 16, 0)); // key = ctx->rx_queue_index
    a.i(insn(LD_DW_IMM, r1, BPF_PSEUDO_MAP_FD, 0, map_fd)); // r1 = &xskmap
    a.i(insn(0, 0, 0, 0, 0));
    a.i(insn(MOV64_K, r3, 0, 0, XDP_PASS)); // no socket on this queue: pass
    a.i(insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP));
    a.i(insn(EXIT, 0, 0, 0, 0));
    a.label("pass");
    a.i(insn(MOV64_K, r0, 0, 0, XDP_PASS));
    a.i(insn(EXIT, 0, 0, 0, 0));
    a.finish()
}

fn put_u32(attr: &mut [u8; ATTR_LEN], off: usize, v: u32) {
    attr[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(attr: &mut [u8; ATTR_LEN], off: usize, v: u64) {
    attr[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_LEN], what: &str) -> Result<libc::c_int, NicError> {
    // SAFETY: attr is a zero-padded union bpf_attr of ATTR_LEN bytes; any
    // pointers stored in it point to memory that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            ATTR_LEN as libc::c_uint,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Err(NicError::NeedsPrivilege("bpf()"));
        }
        return Err(NicError::io(what, e));
    }
    Ok(r as libc::c_int)
}

/// BPF_MAP_CREATE of an XSKMAP with `entries` slots (one per queue).
pub(crate) fn create_xskmap(entries: u32) -> Result<OwnedFd, NicError> {
    let mut attr = [0u8; ATTR_LEN];
    put_u32(&mut attr, 0, BPF_MAP_TYPE_XSKMAP); // map_type
    put_u32(&mut attr, 4, 4); // key_size
    put_u32(&mut attr, 8, 4); // value_size
    put_u32(&mut attr, 12, entries.max(1)); // max_entries
    attr[28..36].copy_from_slice(b"ferroce\0"); // map_name
    let fd = bpf(BPF_MAP_CREATE, &mut attr, "bpf(BPF_MAP_CREATE XSKMAP)")?;
    sys::owned(fd, "bpf map fd")
}

/// xskmap[queue] = xsk_fd.
pub(crate) fn xskmap_set(map: &OwnedFd, queue: u32, xsk_fd: RawFd) -> Result<(), NicError> {
    let key = queue;
    let val = xsk_fd as u32;
    let mut attr = [0u8; ATTR_LEN];
    put_u32(&mut attr, 0, map.as_raw_fd() as u32); // map_fd
    put_u64(&mut attr, 8, &key as *const u32 as u64); // key
    put_u64(&mut attr, 16, &val as *const u32 as u64); // value
    bpf(
        BPF_MAP_UPDATE_ELEM,
        &mut attr,
        "bpf(BPF_MAP_UPDATE_ELEM xskmap)",
    )
    .map(|_| ())
}

/// BPF_PROG_LOAD as an XDP program; on failure, reloads with the verifier
/// log on and puts it in the error.
pub(crate) fn load_xdp(prog: &[Insn], flags: u32) -> Result<OwnedFd, NicError> {
    let license = b"Dual MIT/GPL\0";
    let mut log = vec![0u8; 1 << 16];
    for with_log in [false, true] {
        let mut attr = [0u8; ATTR_LEN];
        put_u32(&mut attr, 0, BPF_PROG_TYPE_XDP);
        put_u32(&mut attr, 4, prog.len() as u32); // insn_cnt
        put_u64(&mut attr, 8, prog.as_ptr() as u64); // insns
        put_u64(&mut attr, 16, license.as_ptr() as u64); // license
        if with_log {
            put_u32(&mut attr, 24, 1); // log_level
            put_u32(&mut attr, 28, log.len() as u32); // log_size
            put_u64(&mut attr, 32, log.as_mut_ptr() as u64); // log_buf
        }
        put_u32(&mut attr, 44, flags); // prog_flags
        attr[48..56].copy_from_slice(b"frc_xsk\0"); // prog_name
        put_u32(&mut attr, 68, BPF_XDP); // expected_attach_type
        match bpf(BPF_PROG_LOAD, &mut attr, "bpf(BPF_PROG_LOAD xdp)") {
            Ok(fd) => return sys::owned(fd, "bpf prog fd"),
            Err(e) if !with_log => tracing::debug!("XDP load failed, retrying with log: {e}"),
            Err(e) => {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                return Err(NicError::Unsupported(format!("{e}; verifier: {text}")));
            }
        }
    }
    Err(NicError::Unsupported("XDP program load".into()))
}

/// BPF_LINK_CREATE: attaches `prog` to `ifindex`. The attachment lives as
/// long as the returned fd, so it goes away with the process, crash or not.
pub(crate) fn attach_xdp(
    prog: &OwnedFd,
    ifindex: u32,
    mode_flags: u32,
) -> Result<OwnedFd, NicError> {
    let mut attr = [0u8; ATTR_LEN];
    put_u32(&mut attr, 0, prog.as_raw_fd() as u32); // prog_fd
    put_u32(&mut attr, 4, ifindex); // target_ifindex
    put_u32(&mut attr, 8, BPF_XDP); // attach_type
    put_u32(&mut attr, 12, mode_flags); // flags
    let fd = bpf(BPF_LINK_CREATE, &mut attr, "bpf(BPF_LINK_CREATE xdp)")?;
    sys::owned(fd, "bpf link fd")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_assembles_with_all_jumps_forward() {
        for prefix in [None, Some(7)] {
            let p = redirect_program(3, 4791, prefix).unwrap();
            assert!(p.len() < 64);
            for (i, x) in p.iter().enumerate() {
                if matches!(x.code, JGT_X | JNE_K | JEQ_K | JA) {
                    assert!(x.off >= 0, "insn {i} jumps back");
                    assert!(i + 1 + (x.off as usize) < p.len(), "insn {i} jumps out");
                }
            }
        }
        assert_eq!(be16(4791), 0xB712);
    }
}
