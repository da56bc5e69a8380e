//! XIDs from the kernel log (`/dev/kmsg`, read through the [`HostRoot`]).
//!
//! The NVIDIA driver logs every XID as `NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off
//! the bus.` (older drivers omit `PCI:`). `/dev/kmsg` returns one record per `read`, formatted
//! `<priority>,<seq>,<usec since boot>,<flags>;<message>` (kernel `Documentation/ABI/testing/
//! dev-kmsg`); continuation lines start with a space. Reading it from the start gives every
//! record still in the ring buffer, i.e. the XIDs since boot unless the buffer wrapped.
//!
//! The driver also reports a GPU that fell off the bus in its own words, without an Xid line:
//! at probe (`NVRM: The NVIDIA GPU 0000:b3:00.0` / `NVRM: (PCI ID: 10de:2330) installed in this
//! system has` / `NVRM: fallen off the bus and is not responding to commands.`, one record with
//! embedded newlines, which `/dev/kmsg` escapes as `\x0a` and `dmesg` prints as three lines) and
//! at run time (`NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.`). Such a message counts as
//! XID 79, the catalog's number for it ([`XidLine::driver_message`]); right after an Xid 79 line
//! of the same GPU it is the same failure and is not counted twice.
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
    /// The rest of the message after the XID number (for a driver message, the message).
    pub text: String,
    /// True when no Xid line was logged: the driver's own message said what happened, and
    /// `xid` is the catalog's number for it (79 for "fallen off the bus").
    pub driver_message: bool,
}

/// The XID NVIDIA's catalog gives a GPU that fell off the bus.
pub const FELL_OFF_THE_BUS: u64 = 79;

/// What a record means to bcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KmsgEvent {
    /// An XID.
    Xid(XidLine),
    /// bcd reset this GPU.
    Reset(PciAddr),
}

/// Parses one line in `/dev/kmsg` record form, `dmesg` form (`[  12.345678] msg`), `<N>msg` (as
/// written to `/dev/kmsg`) or plain text. `None` for continuation lines (`/dev/kmsg`'s
/// ` KEY=value` dictionary) and blank lines; an indented line that carries a driver message
/// (`dmesg` and `journalctl` indent the later lines of a multi-line record) is that message.
pub fn parse_record(line: &str) -> Option<KmsgRecord> {
    let line = line.trim_end_matches(['\n', '\r']);
    if line.trim().is_empty() {
        return None;
    }
    if line.starts_with(' ') {
        let t = line.trim_start();
        return t.starts_with("NVRM:").then(|| KmsgRecord {
            seq: None,
            usec: None,
            message: t.to_owned(),
        });
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
        driver_message: false,
    })
}

/// Classifies a message on its own (a multi-record driver message needs [`KmsgParser`]).
pub fn parse_event(message: &str) -> Option<KmsgEvent> {
    KmsgParser::default().feed(message)
}

/// Undoes `/dev/kmsg`'s escaping of unprintable bytes (`\x0a` for a newline inside a record;
/// kernel `Documentation/ABI/testing/dev-kmsg`).
pub fn unescape(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(i) = rest.find("\\x") {
        out.push_str(&rest[..i]);
        let hex = rest
            .get(i + 2..i + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The first full PCI address (`0000:b3:00.0`, `PCI:0000:1a:00`; a domain is required, so a
/// `PCI ID: 10de:2330` or a time is not taken for one) among the words of `text`.
fn address_in(text: &str) -> Option<PciAddr> {
    text.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ',')
        .map(|w| w.trim_end_matches([':', '.', ';']))
        .filter(|w| {
            // The driver prints the domain with four digits or more (`%04x`).
            let w = w.trim_start_matches("PCI:");
            w.matches(':').count() == 2 && w.find(':').is_some_and(|d| d >= 4)
        })
        .find_map(PciAddr::parse)
}

/// What the driver writes when a GPU stopped answering on PCIe (`osHandleGpuLost`, the probe's
/// `pmc_boot_0` check, `NV_ERR_GPU_IS_LOST`'s text), lowercase.
const GONE_FROM_THE_BUS: [&str; 2] = ["fallen off the bus", "lost from the bus"];

/// Records a driver message may span (its probe message is three lines).
const DRIVER_MESSAGE_SPAN: u8 = 3;

/// Turns kernel log messages into [`KmsgEvent`]s, keeping what a message split over several
/// records needs: the GPU a `The NVIDIA GPU <addr>` line named, and the last Xid 79 seen.
#[derive(Debug, Default)]
pub struct KmsgParser {
    /// A GPU named by the first line of a probe message, and how many more records may finish it.
    pending: Option<(PciAddr, u8)>,
    /// The GPU of an Xid 79 in the previous record.
    last_xid79: Option<PciAddr>,
}

impl KmsgParser {
    /// The event in one record's message, if any.
    pub fn feed(&mut self, message: &str) -> Option<KmsgEvent> {
        let message = unescape(message);
        let last_xid79 = self.last_xid79.take();
        if let Some(x) = parse_xid(&message) {
            if x.xid == FELL_OFF_THE_BUS {
                self.last_xid79 = Some(x.addr);
            }
            return Some(KmsgEvent::Xid(x));
        }
        if let Some(at) = message.find(RESET_MARKER) {
            let rest = &message[at + RESET_MARKER.len()..];
            return rest
                .split_whitespace()
                .next()
                .and_then(PciAddr::parse)
                .map(KmsgEvent::Reset);
        }
        if !message.contains("NVRM") {
            self.pending = self
                .pending
                .and_then(|(a, n)| n.checked_sub(1).map(|n| (a, n)));
            return None;
        }
        let lower = message.to_ascii_lowercase();
        let named = address_in(&message);
        if !GONE_FROM_THE_BUS.iter().any(|p| lower.contains(p)) {
            self.pending = match (named, lower.contains("the nvidia gpu")) {
                (Some(a), true) => Some((a, DRIVER_MESSAGE_SPAN)),
                _ => self
                    .pending
                    .and_then(|(a, n)| n.checked_sub(1).map(|n| (a, n))),
            };
            return None;
        }
        let addr = named.or(self.pending.map(|(a, _)| a))?;
        self.pending = None;
        if last_xid79 == Some(addr) {
            return None;
        }
        Some(KmsgEvent::Xid(XidLine {
            addr,
            xid: FELL_OFF_THE_BUS,
            pid: None,
            process: None,
            text: message
                .split('\n')
                .map(|l| l.trim().trim_start_matches("NVRM:").trim())
                .collect::<Vec<_>>()
                .join(" "),
            driver_message: true,
        }))
    }
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
fn parse_lines(pending: &mut Vec<u8>, parser: &mut KmsgParser) -> Vec<KmsgEvent> {
    drain_lines(pending)
        .iter()
        .filter_map(|l| parse_record(l))
        .filter_map(|r| parser.feed(&r.message))
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
    let mut parser = KmsgParser::default();
    while let Some(n) = read_chunk(&mut f, &mut buf, root)? {
        // A `/dev/kmsg` read is one record, newline-terminated.
        pending.extend_from_slice(&buf[..n]);
        events.extend(parse_lines(&mut pending, &mut parser));
    }
    // A regular file (a fixture) may end without a newline.
    pending.push(b'\n');
    events.extend(parse_lines(&mut pending, &mut parser));
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
    fn the_drivers_own_fell_off_the_bus_messages_count_as_xid_79() {
        let b3 = PciAddr { bus: 0xb3, ..A };
        let feed = |lines: &[&str]| -> Vec<KmsgEvent> {
            let mut p = KmsgParser::default();
            lines
                .iter()
                .filter_map(|l| parse_record(l))
                .filter_map(|r| p.feed(&r.message))
                .collect()
        };
        let fell = |events: &[KmsgEvent]| -> Vec<(PciAddr, u64, bool)> {
            events
                .iter()
                .filter_map(|e| match e {
                    KmsgEvent::Xid(x) => Some((x.addr, x.xid, x.driver_message)),
                    KmsgEvent::Reset(_) => None,
                })
                .collect()
        };
        let ev = feed(&[
            "3,2201,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.",
        ]);
        assert_eq!(fell(&ev), vec![(b3, 79, true)]);
        if let Some(KmsgEvent::Xid(x)) = ev.first() {
            assert!(
                x.text.starts_with("The NVIDIA GPU 0000:b3:00.0 (PCI ID"),
                "{}",
                x.text
            );
        }
        // Split over records, with an unrelated record in between.
        let ev = feed(&[
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
            "[ 1843.308146] usb 1-1: new device",
            "               NVRM: fallen off the bus and is not responding to commands.",
        ]);
        assert_eq!(fell(&ev), vec![(b3, 79, true)]);
        // Too far from the line that named the GPU: nobody to blame.
        let ev = feed(&[
            "NVRM: The NVIDIA GPU 0000:b3:00.0",
            "a",
            "b",
            "c",
            "d",
            "NVRM: fallen off the bus and is not responding to commands.",
        ]);
        assert!(fell(&ev).is_empty());
        // A time is not a PCI address; an Xid 79 and its companion message are one event.
        let ev = feed(&[
            "NVRM: loading NVIDIA UNIX Open Kernel Module  Mon Jun  2 13:13:04 UTC 2025",
            "3,1,1,-;NVRM: Xid (PCI:0000:1a:00): 79, pid=0, GPU has fallen off the bus.",
            "3,2,2,-;NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.",
            "3,3,3,-;NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.",
        ]);
        assert_eq!(fell(&ev), vec![(A, 79, false), (A, 79, true)]);
        assert_eq!(unescape("a\\x0ab\\x5cc\\xzz"), "a\nb\\c\\xzz");
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
