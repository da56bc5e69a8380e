//! XIDs from the kernel log (`/dev/kmsg`, read through the [`HostRoot`]).
//!
//! The NVIDIA driver logs every XID as `NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off
//! the bus.` (older drivers omit `PCI:`). `/dev/kmsg` returns one record per `read`, formatted
//! `<priority>,<seq>,<usec since boot>,<flags>;<message>` (kernel `Documentation/ABI/testing/
//! dev-kmsg`); continuation lines start with a space. Reading it from the start gives every
//! record still in the ring buffer, i.e. the XIDs since boot unless the buffer wrapped.
//!
//! XIDs stay in the log after `gpu.reset` cleared them, so a successful reset writes a marker
//! record (`bcd: gpu.reset done PCI:0000:1a:00 ...`); XIDs of a GPU logged before its latest
//! marker count as cleared.

use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use crate::hostroot::HostRoot;

use super::busid::PciAddr;

/// The kernel log device, under the host root.
pub const KMSG: &str = "/dev/kmsg";
/// The start of bcd's reset marker message.
pub const RESET_MARKER: &str = "bcd: gpu.reset done ";

/// Reading or writing the kernel log failed.
#[derive(Debug, thiserror::Error)]
pub enum KmsgError {
    /// Opening, reading or writing `path` failed.
    #[error("{path}: {source}")]
    Io {
        /// The file under the host root.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// One kernel log record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgRecord {
    /// Sequence number, when the record came from `/dev/kmsg`.
    pub seq: Option<u64>,
    /// Microseconds since boot, when known.
    pub usec: Option<u64>,
    /// The message text.
    pub message: String,
}

/// An XID line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLine {
    /// The GPU.
    pub addr: PciAddr,
    /// The XID number.
    pub xid: u64,
    /// `pid=` when logged.
    pub pid: Option<u32>,
    /// `name=` (the process) when logged.
    pub process: Option<String>,
    /// The rest of the message after the XID number.
    pub text: String,
}

/// What a record means to bcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KmsgEvent {
    /// An XID.
    Xid(XidLine),
    /// bcd reset this GPU.
    Reset(PciAddr),
}

/// Parses one line in `/dev/kmsg` record form, `dmesg` form (`[  12.345678] msg`), `<N>msg` (as
/// written to `/dev/kmsg`) or plain text. `None` for continuation lines and blank lines.
pub fn parse_record(line: &str) -> Option<KmsgRecord> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() || line.starts_with(' ') {
        return None;
    }
    if let Some((head, msg)) = line.split_once(';') {
        let f: Vec<&str> = head.split(',').collect();
        if f.len() >= 3 && f[..3].iter().all(|x| x.parse::<u64>().is_ok()) {
            return Some(KmsgRecord {
                seq: f[1].parse().ok(),
                usec: f[2].parse().ok(),
                message: msg.to_owned(),
            });
        }
    }
    if let Some(rest) = line.strip_prefix('[')
        && let Some((ts, msg)) = rest.split_once(']')
        && let Ok(secs) = ts.trim().parse::<f64>()
    {
        return Some(KmsgRecord {
            seq: None,
            usec: Some((secs * 1e6) as u64),
            message: msg.trim_start().to_owned(),
        });
    }
    let msg = match line.strip_prefix('<').and_then(|r| r.split_once('>')) {
        Some((pri, msg)) if pri.parse::<u32>().is_ok() => msg,
        _ => line,
    };
    Some(KmsgRecord {
        seq: None,
        usec: None,
        message: msg.to_owned(),
    })
}

/// Parses `NVRM: Xid (PCI:0000:1a:00): 79, pid=0, name=x, text` from a message.
pub fn parse_xid(message: &str) -> Option<XidLine> {
    let at = message.find("NVRM: Xid (")?;
    let rest = &message[at + "NVRM: Xid (".len()..];
    let (addr, rest) = rest.split_once("):")?;
    let addr = PciAddr::parse(addr)?;
    let rest = rest.trim_start();
    let (num, mut text) = match rest.split_once(',') {
        Some((n, t)) => (n.trim(), t.trim()),
        None => (rest.trim(), ""),
    };
    let xid = num.parse().ok()?;
    let mut pid = None;
    let mut process = None;
    loop {
        if let Some(v) = text.strip_prefix("pid=") {
            let (p, t) = v.split_once(',').unwrap_or((v, ""));
            pid = p.trim().parse().ok();
            text = t.trim_start();
        } else if let Some(v) = text.strip_prefix("name=") {
            let (n, t) = v.split_once(',').unwrap_or((v, ""));
            process = Some(n.trim().to_owned());
            text = t.trim_start();
        } else {
            break;
        }
    }
    Some(XidLine {
        addr,
        xid,
        pid,
        process,
        text: text.to_owned(),
    })
}

/// Classifies a message.
pub fn parse_event(message: &str) -> Option<KmsgEvent> {
    if let Some(x) = parse_xid(message) {
        return Some(KmsgEvent::Xid(x));
    }
    let rest = &message[message.find(RESET_MARKER)? + RESET_MARKER.len()..];
    let addr = rest.split_whitespace().next()?;
    PciAddr::parse(addr).map(KmsgEvent::Reset)
}

/// Splits complete lines off `pending` (bytes read so far) and leaves the partial tail.
pub(crate) fn drain_lines(pending: &mut Vec<u8>) -> Vec<String> {
    let Some(last_nl) = pending.iter().rposition(|b| *b == b'\n') else {
        return Vec::new();
    };
    let tail = pending.split_off(last_nl + 1);
    let done = std::mem::replace(pending, tail);
    String::from_utf8_lossy(&done)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The events in the complete lines of `pending`.
fn parse_lines(pending: &mut Vec<u8>) -> Vec<KmsgEvent> {
    drain_lines(pending)
        .iter()
        .filter_map(|l| parse_record(l))
        .filter_map(|r| parse_event(&r.message))
        .collect()
}

/// Opens `/dev/kmsg` under `root` for non-blocking reads.
pub(crate) fn open(root: &HostRoot) -> Result<std::fs::File, KmsgError> {
    let path = root.path(KMSG);
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path)
        .map_err(|source| KmsgError::Io { path, source })
}

/// Reads one chunk: `Ok(None)` when nothing is there now (end of a regular file, `EAGAIN` on
/// `/dev/kmsg`); `EPIPE` (records overwritten while we read) is skipped over.
pub(crate) fn read_chunk(
    f: &mut std::fs::File,
    buf: &mut [u8],
    root: &HostRoot,
) -> Result<Option<usize>, KmsgError> {
    loop {
        match f.read(buf) {
            Ok(0) => return Ok(None),
            Ok(n) => return Ok(Some(n)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::BrokenPipe || e.kind() == ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(KmsgError::Io {
                    path: root.path(KMSG),
                    source,
                });
            }
        }
    }
}

/// Every XID and reset marker still in the kernel log, oldest first.
pub fn read_since_boot(root: &HostRoot) -> Result<Vec<KmsgEvent>, KmsgError> {
    let mut f = open(root)?;
    let mut buf = vec![0u8; 8192];
    let mut pending = Vec::new();
    let mut events = Vec::new();
    while let Some(n) = read_chunk(&mut f, &mut buf, root)? {
        // A `/dev/kmsg` read is one record, newline-terminated.
        pending.extend_from_slice(&buf[..n]);
        events.extend(parse_lines(&mut pending));
    }
    // A regular file (a fixture) may end without a newline.
    pending.push(b'\n');
    events.extend(parse_lines(&mut pending));
    Ok(events)
}

/// Positions `f` after the last record (`SEEK_END` on `/dev/kmsg` skips the backlog).
pub(crate) fn seek_to_end(f: &mut std::fs::File) -> std::io::Result<()> {
    f.seek(SeekFrom::End(0)).map(|_| ())
}

/// Logs bcd's reset marker for `addr` (and `uuid`) to the kernel log under `root`.
pub fn write_reset_marker(root: &HostRoot, addr: PciAddr, uuid: &str) -> Result<(), KmsgError> {
    use std::io::Write;
    let path = root.path(KMSG);
    let io = |source| KmsgError::Io {
        path: path.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(io)?;
    // <5> is KERN_NOTICE; the kernel turns the written line into one record.
    f.write_all(format!("<5>{RESET_MARKER}PCI:{addr} {uuid}\n").as_bytes())
        .map_err(io)
}

/// The XIDs of `addr` logged after its latest reset marker, and how many earlier ones the
/// markers cleared.
pub fn active_xids(events: &[KmsgEvent], addr: PciAddr) -> (Vec<XidLine>, usize) {
    let mut active = Vec::new();
    let mut cleared = 0;
    for e in events {
        match e {
            KmsgEvent::Xid(x) if x.addr == addr => active.push(x.clone()),
            KmsgEvent::Reset(a) if *a == addr => cleared += std::mem::take(&mut active).len(),
            _ => {}
        }
    }
    (active, cleared)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const A: PciAddr = PciAddr {
        domain: 0,
        bus: 0x1a,
        device: 0,
    };

    #[test]
    fn kmsg_records_and_dmesg_lines_parse() {
        let r = parse_record(
            "3,1234,5678901,-;NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.",
        )
        .unwrap();
        assert_eq!((r.seq, r.usec), (Some(1234), Some(5678901)));
        let x = parse_xid(&r.message).unwrap();
        assert_eq!((x.addr, x.xid, x.pid), (A, 79, Some(0)));
        assert_eq!(x.text, "GPU has fallen off the bus.");

        let r = parse_record("[  812.345678] NVRM: Xid (PCI:0000:ca:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)").unwrap();
        let x = parse_xid(&r.message).unwrap();
        assert_eq!((x.xid, x.pid), (13, Some(4242)));
        assert_eq!(x.process.as_deref(), Some("python3"));
        assert_eq!(x.addr.bus, 0xca);

        // Older drivers: no `PCI:` prefix.
        let x = parse_xid("NVRM: Xid (0000:03:00): 31, Ch 00000001").unwrap();
        assert_eq!((x.addr.bus, x.xid), (3, 31));

        assert_eq!(parse_record(" SUBSYSTEM=pci"), None);
        assert!(parse_xid("usb 1-1: new device").is_none());
        assert!(parse_xid("NVRM: Xid (PCI:0000:1a:00): abc, pid=1").is_none());
    }

    #[test]
    fn a_reset_marker_clears_earlier_xids_of_that_gpu_only() {
        let other = PciAddr { bus: 0x1b, ..A };
        let lines = [
            "6,1,100,-;NVRM: Xid (PCI:0000:1a:00): 119, pid=1, GSP timeout",
            "6,2,101,-;NVRM: Xid (PCI:0000:1b:00): 95, pid=1, uncontained",
            "<5>bcd: gpu.reset done PCI:0000:1a:00 GPU-1",
            "6,3,102,-;NVRM: Xid (PCI:0000:1a:00): 13, pid=1, app",
        ];
        let events: Vec<_> = lines
            .iter()
            .filter_map(|l| parse_record(l))
            .filter_map(|r| parse_event(&r.message))
            .collect();
        let (active, cleared) = active_xids(&events, A);
        assert_eq!(active.iter().map(|x| x.xid).collect::<Vec<_>>(), vec![13]);
        assert_eq!(cleared, 1);
        let (active, cleared) = active_xids(&events, other);
        assert_eq!((active.len(), cleared), (1, 0));
    }

    #[test]
    fn markers_written_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(
            dir.path().join("dev/kmsg"),
            "4,7,99,-;NVRM: Xid (PCI:0000:1a:00): 95, pid=0, x\n",
        )
        .unwrap();
        let root = HostRoot::new(dir.path());
        assert_eq!(active_xids(&read_since_boot(&root).unwrap(), A).0.len(), 1);
        write_reset_marker(&root, A, "GPU-1").unwrap();
        assert_eq!(
            active_xids(&read_since_boot(&root).unwrap(), A),
            (vec![], 1)
        );
    }

    #[test]
    fn partial_lines_wait_for_their_newline() {
        let mut p = b"one\ntw".to_vec();
        assert_eq!(drain_lines(&mut p), vec!["one".to_owned()]);
        assert_eq!(p, b"tw");
        p.extend_from_slice(b"o\n");
        assert_eq!(drain_lines(&mut p), vec!["two".to_owned()]);
    }
}
