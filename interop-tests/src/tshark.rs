//! tshark as the BTH-opcode oracle, started once per process.
//!
//! A test run checks a few hundred captures; starting tshark for each costs about a quarter of
//! a second of CPU (loading its dissectors), on a host whose other core runs the VM. So the
//! captures go through one `tshark -r -` reading a pcap stream from a pipe: each capture's
//! records, then a marker frame (an Ethernet frame of a local experimental EtherType, which no
//! capture filtered on `udp port 4791` holds); the lines up to the marker's are that capture's.
//! A capture the stream cannot carry (another link type or timestamp precision, a truncated
//! last record) and any trouble with the pipe fall back to one tshark for the file.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// IEEE 802 local experimental EtherType 1.
const MARKER_ETHERTYPE: u16 = 0x88b5;
/// How long one capture may take to come back through the pipe.
const PIPE_TIMEOUT: Duration = Duration::from_secs(60);
/// tshark keeps every frame it has read (about 10 KiB each): a new one after this many.
const PIPE_FRAMES: usize = 50_000;
/// The fields printed per frame: EtherType (to spot the marker), BTH opcode.
const FIELDS: [&str; 4] = ["-e", "eth.type", "-e", "infiniband.bth.opcode"];

/// One frame as tshark read it: its BTH opcode, `None` when it found no BTH.
pub type Opcodes = Vec<Option<u8>>;

/// The BTH opcode tshark reads in each frame of `pcap`, in order.
pub fn bth_opcodes(pcap: &Path) -> Result<Opcodes, String> {
    let bytes = std::fs::read(pcap).map_err(|e| format!("reading {}: {e}", pcap.display()))?;
    if let Some((header, records)) = split_pcap(&bytes) {
        static PIPE: Mutex<Option<Pipe>> = Mutex::new(None);
        let mut slot = PIPE.lock().unwrap_or_else(|p| p.into_inner());
        if slot
            .as_ref()
            .is_none_or(|p| p.header != header || p.frames > PIPE_FRAMES)
        {
            *slot = Pipe::start(header).ok();
        }
        if let Some(pipe) = slot.as_mut() {
            match pipe.dissect(records) {
                Ok(ops) => return Ok(ops),
                // A broken pipe is not the capture's fault: one tshark for the file instead.
                Err(_) => *slot = None,
            }
        }
    }
    one_shot(pcap)
}

/// tshark on one file.
fn one_shot(pcap: &Path) -> Result<Opcodes, String> {
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(pcap)
        .args(["-T", "fields"])
        .args(FIELDS)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running tshark: {e}"))?;
    if !out.status.success() {
        return Err(crate::vm::tail(&String::from_utf8_lossy(&out.stderr), 3));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| parse_line(l).1)
        .collect())
}

/// (EtherType, BTH opcode) of one output line; values are hex (`0x0a`) or decimal depending
/// on the tshark version, the first of several (VLAN tags, nested headers) counts.
fn parse_line(line: &str) -> (Option<u32>, Option<u8>) {
    let mut fields = line.split('\t');
    let number = |f: Option<&str>| {
        let v = f?.split(',').next()?.trim();
        match v.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).ok(),
            None => v.parse().ok(),
        }
    };
    let ethertype = number(fields.next());
    let opcode = number(fields.next()).and_then(|v| u8::try_from(v).ok());
    (ethertype, opcode)
}

/// A classic little-endian pcap's 24-byte header and its records, when the records end on a
/// record boundary (else the stream would lose its framing).
fn split_pcap(bytes: &[u8]) -> Option<([u8; 24], &[u8])> {
    let header: [u8; 24] = bytes.get(..24)?.try_into().ok()?;
    // Microsecond and nanosecond magic numbers, as written on a little-endian host.
    if !matches!(
        header[..4],
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1]
    ) {
        return None;
    }
    let records = &bytes[24..];
    let mut at = 0usize;
    while at < records.len() {
        let len = records.get(at + 8..at + 12)?;
        let len = u32::from_le_bytes(len.try_into().ok()?) as usize;
        at = at.checked_add(16)?.checked_add(len)?;
    }
    (at == records.len()).then_some((header, records))
}

/// The marker record: a minimal Ethernet frame of [`MARKER_ETHERTYPE`].
fn marker_record() -> Vec<u8> {
    let mut frame = vec![0u8; 60];
    frame[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    frame[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x02]);
    frame[12..14].copy_from_slice(&MARKER_ETHERTYPE.to_be_bytes());
    let mut record = Vec::with_capacity(16 + frame.len());
    record.extend_from_slice(&[0u8; 8]);
    let len = (frame.len() as u32).to_le_bytes();
    record.extend_from_slice(&len);
    record.extend_from_slice(&len);
    record.extend_from_slice(&frame);
    record
}

/// A running `tshark -r -` and its output lines (read by a thread, so a large capture cannot
/// fill the pipe while it is being written).
struct Pipe {
    header: [u8; 24],
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Frames read so far.
    frames: usize,
}

impl Pipe {
    fn start(header: [u8; 24]) -> Result<Pipe, String> {
        let mut child = Command::new("tshark")
            .args(["-n", "-l", "-r", "-", "-T", "fields"])
            .args(FIELDS)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("running tshark: {e}"))?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("tshark without pipes".into());
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        stdin
            .write_all(&header)
            .map_err(|e| format!("writing to tshark: {e}"))?;
        Ok(Pipe {
            header,
            child,
            stdin,
            lines,
            frames: 0,
        })
    }

    fn dissect(&mut self, records: &[u8]) -> Result<Opcodes, String> {
        self.stdin
            .write_all(records)
            .and_then(|()| self.stdin.write_all(&marker_record()))
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("writing to tshark: {e}"))?;
        let deadline = Instant::now() + PIPE_TIMEOUT;
        let mut ops = Vec::new();
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(wait) {
                Ok(l) => l,
                Err(RecvTimeoutError::Timeout) => return Err("tshark did not answer".into()),
                Err(RecvTimeoutError::Disconnected) => return Err("tshark exited".into()),
            };
            match parse_line(&line) {
                (Some(t), _) if t == u32::from(MARKER_ETHERTYPE) => {
                    self.frames += ops.len() + 1;
                    return Ok(ops);
                }
                (_, op) => ops.push(op),
            }
        }
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_pcap_keeps_record_framing() {
        let mut file = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        file.extend_from_slice(&[0; 12]);
        file.extend_from_slice(&1u32.to_le_bytes());
        let record = marker_record();
        file.extend_from_slice(&record);
        let (header, records) = split_pcap(&file).unwrap();
        assert_eq!(header[..4], [0xd4, 0xc3, 0xb2, 0xa1]);
        assert_eq!(records, &record[..]);
        // A cut last record, and a pcapng file, are not streamed.
        assert!(split_pcap(&file[..file.len() - 1]).is_none());
        assert!(split_pcap(&[0x0a, 0x0d, 0x0d, 0x0a].repeat(8)).is_none());
    }

    /// The pipe reads each committed capture as tshark reads the file alone, also when the
    /// same capture goes through it again (no state carried from one capture to the next).
    #[test]
    fn pipe_agrees_with_one_tshark_per_file() {
        if crate::vm::which("tshark").is_none() {
            eprintln!("SKIP pipe_agrees_with_one_tshark_per_file: tshark not installed");
            return;
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("captures");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "pcap"))
            .collect();
        files.sort();
        assert!(files.len() >= 2, "captures in {}", dir.display());
        let alone: Vec<Opcodes> = files.iter().map(|f| one_shot(f).unwrap()).collect();
        for round in 0..2 {
            for (f, alone) in files.iter().zip(&alone) {
                assert!(alone.iter().any(Option::is_some), "{}: no BTH", f.display());
                assert_eq!(
                    &bth_opcodes(f).unwrap(),
                    alone,
                    "{} round {round}",
                    f.display()
                );
            }
        }
    }

    #[test]
    fn parse_line_reads_hex_and_decimal() {
        assert_eq!(parse_line("0x0800\t0x0a"), (Some(0x0800), Some(0x0a)));
        assert_eq!(parse_line("2048\t17"), (Some(2048), Some(17)));
        assert_eq!(parse_line("0x8100,0x0800\t6"), (Some(0x8100), Some(6)));
        assert_eq!(parse_line("0x88b5\t"), (Some(0x88b5), None));
        assert_eq!(parse_line(""), (None, None));
    }
}
