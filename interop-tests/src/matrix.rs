//! The results matrix (`interop-tests/RESULTS.md`), written by the test run, never by hand.
//!
//! Each test owns a section between `<!-- section: NAME -->` and `<!-- end: NAME -->` and
//! rewrites only that, so running one test updates its rows and keeps the others'.

use std::path::Path;
use std::sync::Mutex;

/// Outcome of one case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Ran, data correct, captures clean.
    Pass,
    /// Ran and failed (see the note).
    Fail,
    /// Ran and failed because of a known ferroce bug (named in the note).
    KnownBug,
    /// Not supported by one side (see the note); not a failure of the test.
    Unsupported,
}

impl Verdict {
    fn cell(self) -> &'static str {
        match self {
            Verdict::Pass => "✅ pass",
            Verdict::Fail => "❌ FAIL",
            Verdict::KnownBug => "❌ FAIL (known bug)",
            Verdict::Unsupported => "➖ n/a",
        }
    }
}

/// One row: peer × operation × direction × result.
#[derive(Debug, Clone)]
pub struct Row {
    /// The stock tool in the rxe VM (`ibv_rc_pingpong`, `ib_write_bw`, ...).
    pub peer: String,
    /// What moved (e.g. `RC SEND 4096 B`, `WRITE bw 8 QPs`).
    pub operation: String,
    /// `ferroce → rxe` (ferroce is the client) or `rxe → ferroce` (ferroce is the server).
    pub direction: String,
    /// MTU, GID, backend and other parameters.
    pub params: String,
    /// The outcome.
    pub verdict: Verdict,
    /// Wall time of the case.
    pub seconds: f64,
    /// Capture summary or failure reason.
    pub note: String,
}

/// Rewrites section `name` of the markdown file at `path` with `intro` and a table of `rows`
/// (creating the file with a header when missing).
pub fn write_section(path: &Path, name: &str, intro: &str, rows: &[Row]) -> std::io::Result<()> {
    let mut body = String::new();
    body.push_str(intro.trim_end());
    body.push_str("\n\n");
    let pass = rows.iter().filter(|r| r.verdict == Verdict::Pass).count();
    let fail = rows.iter().filter(|r| r.verdict == Verdict::Fail).count();
    let known = rows
        .iter()
        .filter(|r| r.verdict == Verdict::KnownBug)
        .count();
    let na = rows.len() - pass - fail - known;
    body.push_str(&format!(
        "{pass} pass, {fail} fail, {known} fail from known ferroce bugs, {na} not applicable.\n\n"
    ));
    body.push_str(
        "| peer (rxe VM) | operation | direction | parameters | result | time | notes |\n",
    );
    body.push_str("|---|---|---|---|---|---:|---|\n");
    for r in rows {
        body.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {:.1} s | {} |\n",
            r.peer,
            cell(&r.operation),
            cell(&r.direction),
            cell(&r.params),
            r.verdict.cell(),
            r.seconds,
            cell(&r.note)
        ));
    }
    write_raw_section(path, name, &body)
}

/// Rewrites section `name` of the markdown file at `path` with `body` (any markdown; creating
/// the file with a header when missing).
pub fn write_raw_section(path: &Path, name: &str, body: &str) -> std::io::Result<()> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| HEADER.to_string());
    let begin = format!("<!-- section: {name} -->");
    let end = format!("<!-- end: {name} -->");
    let body = format!("{begin}\n{}\n{end}", body.trim_end());
    let new = match (old.find(&begin), old.find(&end)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{}{}", &old[..b], body, &old[e + end.len()..])
        }
        _ => {
            let mut s = old;
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s.push('\n');
            s.push_str(&body);
            s.push('\n');
            s
        }
    };
    std::fs::write(path, sort_sections(&new))
}

/// The order sections appear in, whatever order the tests finish in; unknown ones go last.
const ORDER: [&str; 7] = [
    "pingpong",
    "perftest-bw",
    "perftest-atomic-lat",
    "loss",
    "errors",
    "backends",
    "speed",
];

/// Reorders the `<!-- section: NAME -->` … `<!-- end: NAME -->` blocks by [`ORDER`], keeping the
/// text before the first block as the header.
fn sort_sections(text: &str) -> String {
    let Some(first) = text.find("<!-- section: ") else {
        return text.to_string();
    };
    let mut blocks: Vec<(usize, String, String)> = Vec::new();
    let mut rest = &text[first..];
    while let Some(b) = rest.find("<!-- section: ") {
        let after = &rest[b + "<!-- section: ".len()..];
        let Some(name_end) = after.find(" -->") else {
            break;
        };
        let name = after[..name_end].to_string();
        let end = format!("<!-- end: {name} -->");
        let Some(e) = rest[b..].find(&end) else {
            break;
        };
        let block = rest[b..b + e + end.len()].to_string();
        let rank = ORDER.iter().position(|n| *n == name).unwrap_or(ORDER.len());
        blocks.push((rank, name, block));
        rest = &rest[b + e + end.len()..];
    }
    blocks.sort_by(|x, y| x.0.cmp(&y.0).then_with(|| x.1.cmp(&y.1)));
    let mut out = text[..first].to_string();
    for (_, _, block) in blocks {
        out.push_str(&block);
        out.push_str("\n\n");
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// Table-safe text: no pipes or newlines.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

const HEADER: &str = "# ferroce ⇄ Linux rxe: interop results\n\n\
Generated by `cargo test -p ferroce-interop --test ferroce_rxe` (as root, with QEMU); do not edit \
by hand. Each section is rewritten by the test that owns it. The rxe side is Debian 12's kernel \
6.1 rdma_rxe with rdma-core 44 and perftest 4.5 (Debian's package; the tools announce version \
6.06 in their exchange) in a QEMU (TCG) VM; ferroce runs on the host side of the lab bridge \
(`veth-h`). **direction** `ferroce → rxe`: ferroce is the client (the side \
given a server name: the requester in perftest BW/READ/atomic tests), `rxe → ferroce`: the stock \
tool is the client. Every run is captured on `veth-b`, the bridge end of ferroce's veth; *decode ok* means `ferroce decode` found \
every ICRC right, the tshark list is the BTH opcodes tshark's InfiniBand dissector read (hex × \
count).\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_in_place_and_ordered() {
        let dir = std::env::temp_dir().join(format!("ferroce-matrix-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("RESULTS.md");
        let _ = std::fs::remove_file(&path);
        let row = |v| Row {
            peer: "t".into(),
            operation: "a|b".into(),
            direction: "d".into(),
            params: "p".into(),
            verdict: v,
            seconds: 1.0,
            note: "n".into(),
        };
        write_section(&path, "loss", "## L", &[row(Verdict::Pass)]).unwrap();
        write_section(&path, "pingpong", "## P", &[row(Verdict::Fail)]).unwrap();
        write_section(&path, "loss", "## L2", &[row(Verdict::KnownBug)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# ferroce"));
        let p = text.find("## P").unwrap();
        let l = text.find("## L2").unwrap();
        assert!(p < l, "{text}");
        assert!(!text.contains("## L\n"), "{text}");
        assert!(text.contains("a\\|b"), "{text}");
        assert_eq!(text.matches("<!-- section: loss -->").count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
