//! Several raw-frame devices (AF_PACKET, AF_XDP) on one interface: two
//! processes of one host that each open a ferroce device on the same NIC.
//! rxe has one device in the kernel, whose QPNs are unique on the host; here
//! each process has its own core numbering QPNs from 0x11, and every raw
//! socket on the interface sees every RoCE frame, so without more the
//! processes would take each other's packets for their own QPs.
//!
//! So each raw device takes a QPN prefix, the top byte of all its QPNs (the
//! core's `Config::qpn_prefix`), from a table of the interface's devices in
//! a file under `/dev/shm`, changed under `flock(2)` (the table format of
//! [`port_share`](crate::port_share), positions unused); the first device
//! takes 0, so a lone process keeps the QPNs it always had. Its receive
//! filter keeps only frames whose BTH destination QP carries that prefix:
//! the AF_PACKET socket filter drops the rest, the XDP program passes them
//! on to the kernel, where the other processes' AF_PACKET sockets see them.
//! The prefixes UDP-backend devices of the same namespace hold are skipped
//! too, since a raw socket also sees the datagrams of a UDP socket on its
//! interface. A dead process's line is dropped by the next device that
//! reads the table; the last device out removes the file.
//!
//! Frames between two processes of one host never cross the interface, so
//! they still need the UDP backend (`neigh` says so at once).

use std::path::PathBuf;

use crate::port_share::{
    new_nonce, prefixes_in_other_tables, remove_if_unused, sweep_dead_tables, table_dir,
    table_stem, Member, Table, MAX_PREFIX, RAW_TABLE, UDP_TABLE,
};
use crate::NicError;

/// This device's line in its interface's table; removed on drop.
#[derive(Debug)]
pub struct RawShare {
    path: PathBuf,
    nonce: u64,
    prefix: u8,
}

impl RawShare {
    /// Takes the lowest prefix free on interface `ifindex` of the calling
    /// thread's network namespace.
    pub fn join(ifindex: u32) -> Result<RawShare, NicError> {
        sweep_dead_tables();
        let path = table_dir().join(format!("{}{ifindex}.members", table_stem(RAW_TABLE)));
        let mut table = Table::lock(&path)?;
        let mut members = table.read();
        let udp = prefixes_in_other_tables(UDP_TABLE);
        let taken = |p: u8| members.iter().any(|m| m.prefix == p) || udp.contains(&p);
        let Some(prefix) = (0..=MAX_PREFIX).find(|p| !taken(*p)) else {
            remove_if_unused(&path, &members);
            return Err(NicError::Config(format!(
                "interface {ifindex}: {} ferroce devices use it already, the most there can be",
                members.len() + udp.len()
            )));
        };
        let me = RawShare {
            path,
            nonce: new_nonce(),
            prefix,
        };
        members.push(Member {
            prefix,
            position: 0,
            pid: std::process::id(),
            nonce: me.nonce,
            gro: false,
        });
        table.write(&members)?;
        Ok(me)
    }

    /// The top byte of this device's QPNs.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }
}

impl Drop for RawShare {
    fn drop(&mut self) {
        let Ok(mut table) = Table::lock(&self.path) else {
            return;
        };
        let mut members = table.read();
        members.retain(|m| m.nonce != self.nonce);
        let _ = table.store(&self.path, &members);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An interface index no real interface has, so the test's table is its own.
    const IFINDEX: u32 = 0x7FFF_FF01;

    #[test]
    fn devices_on_one_interface_take_distinct_prefixes_and_give_them_back() {
        let a = RawShare::join(IFINDEX).unwrap();
        let b = RawShare::join(IFINDEX).unwrap();
        assert_ne!(a.prefix(), b.prefix());
        let path = a.path.clone();
        assert!(path.exists());
        drop(a);
        // (Which prefix: the lowest free one, unless a UDP device of another
        // test in this namespace took it meanwhile.)
        let c = RawShare::join(IFINDEX).unwrap();
        assert_ne!(c.prefix(), b.prefix());
        drop(b);
        drop(c);
        assert!(!path.exists(), "the last device out removes the table");
    }

    #[test]
    fn tables_left_by_killed_processes_are_swept() {
        use crate::port_share::owner_stem;
        let path = |i: u32| {
            table_dir().join(format!(
                "{}{}.members",
                table_stem(RAW_TABLE),
                IFINDEX + 10 + i
            ))
        };
        // A PID past pid_max: no such process.
        std::fs::write(path(0), "0 0 4194305 00000000000000aa\n").unwrap();
        // The same in a network namespace that is gone (no inode is 1).
        let gone = table_dir().join(format!("{}1-{IFINDEX}.members", owner_stem(RAW_TABLE)));
        std::fs::write(&gone, "0 0 4194305 00000000000000aa\n").unwrap();
        std::fs::write(
            path(1),
            format!(
                "0 0 4194305 00000000000000aa\n1 0 {} 00000000000000bb\n",
                std::process::id()
            ),
        )
        .unwrap();
        sweep_dead_tables();
        assert!(!path(0).exists(), "every member dead: removed");
        assert!(!gone.exists(), "also in another network namespace");
        assert!(path(1).exists(), "a live member: kept");
        std::fs::remove_file(path(1)).unwrap();
    }

    #[test]
    fn a_dead_process_line_is_dropped() {
        let path = table_dir().join(format!("{}{}.members", table_stem(RAW_TABLE), IFINDEX + 1));
        // A PID past pid_max: no such process.
        std::fs::write(&path, "0 0 4194305 00000000000000aa\n").unwrap();
        let a = RawShare::join(IFINDEX + 1).unwrap();
        drop(a);
        assert!(!path.exists(), "the dead line would have kept the table");
    }
}
