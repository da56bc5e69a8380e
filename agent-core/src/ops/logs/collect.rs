//! Running the sources into a staging dir and streaming the tar through gzip into a file.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::redact::Redactor;
use super::{
    CollectArgs, DEFAULT_MAX_BYTES, DEFAULT_SOURCES, LogsError, MAX_LINE_BYTES, Manifest, Source,
    SourceReport, SourceStatus,
};
use crate::ops::OpsConfig;

/// A finished bundle: a `.tar.gz` in a temp dir that is removed when the bundle is dropped.
#[derive(Debug)]
pub struct Bundle {
    _dir: tempfile::TempDir,
    /// The `.tar.gz`.
    pub path: PathBuf,
    /// Its size, bytes.
    pub bytes: u64,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    pub manifest: Manifest,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LogsError + 'a {
    move |source| LogsError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Bytes asked of a source per read. At least 8 KiB: `/dev/kmsg` returns one record per read and
/// refuses a buffer smaller than the record.
const READ_BYTES: usize = 64 * 1024;

/// Cuts redacted output into the lines the budget is spent on: up to and including a newline,
/// or [`MAX_LINE_BYTES`] when a line is longer. Cutting here is safe: secrets are gone already.
#[derive(Debug, Default)]
struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    /// The next whole line (or piece of a long line) in `pending`; at the end, whatever is left.
    fn next(&mut self, at_end: bool) -> Option<Vec<u8>> {
        let max = usize::try_from(MAX_LINE_BYTES).unwrap_or(usize::MAX);
        let window = &self.pending[..self.pending.len().min(max)];
        let n = match window.iter().position(|b| *b == b'\n') {
            Some(i) => i + 1,
            None if self.pending.len() >= max => max,
            None if at_end && !self.pending.is_empty() => self.pending.len(),
            None => return None,
        };
        Some(self.pending.drain(..n).collect())
    }
}

/// Writes one output line (newline normalised) if it fits `budget`; false when it does not.
fn put_line(
    line: &[u8],
    out: &mut impl Write,
    budget: &mut u64,
    written: &mut u64,
) -> std::io::Result<bool> {
    let text = String::from_utf8_lossy(line);
    let mut line = text.trim_end_matches(['\n', '\r']).to_owned();
    line.push('\n');
    let len = line.len() as u64;
    if len > *budget {
        return Ok(false);
    }
    out.write_all(line.as_bytes())?;
    *budget -= len;
    *written += len;
    Ok(true)
}

/// Copies `reader` through `redactor` (a stream: no read or line cut hides a secret) into `out`
/// line by line, spending `budget` bytes. Returns (bytes written, cut at the budget).
fn copy_lines(
    mut reader: impl Read,
    out: &mut impl Write,
    redactor: &mut Redactor,
    budget: &mut u64,
) -> std::io::Result<(u64, bool)> {
    let mut buf = vec![0u8; READ_BYTES];
    let mut lines = Lines::default();
    let mut written = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(n) => n,
            // A non-blocking /dev/kmsg has no more records; a record overwritten while we read
            // (EPIPE) is skipped.
            Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            redactor.finish(&mut lines.pending);
        } else {
            redactor.push(&buf[..n], &mut lines.pending);
        }
        while let Some(line) = lines.next(n == 0) {
            if !put_line(&line, out, budget, &mut written)? {
                return Ok((written, true));
            }
        }
        if n == 0 {
            return Ok((written, false));
        }
    }
}

struct Staged {
    report: SourceReport,
    path: Option<PathBuf>,
}

fn report(source: Source, status: SourceStatus, reason: Option<String>) -> SourceReport {
    SourceReport {
        source,
        file: None,
        status,
        bytes: 0,
        redactions: 0,
        reason,
    }
}

/// Streams `reader` into `<stage>/<file>`; the report says collected or truncated.
fn stage_reader(
    source: Source,
    reader: impl Read,
    stage: &Path,
    budget: &mut u64,
) -> Result<Staged, LogsError> {
    let path = stage.join(source.file_name());
    let mut out = std::io::BufWriter::new(File::create(&path).map_err(io("creating", &path))?);
    let mut red = Redactor::default();
    let r = copy_lines(reader, &mut out, &mut red, budget);
    out.flush().map_err(io("writing", &path))?;
    let (bytes, cut, err) = match r {
        Ok((b, cut)) => (b, cut, None),
        Err(e) => (0, false, Some(e.to_string())),
    };
    let status = match (&err, cut) {
        (Some(_), _) => SourceStatus::Failed,
        (None, true) => SourceStatus::Truncated,
        (None, false) => SourceStatus::Collected,
    };
    Ok(Staged {
        report: SourceReport {
            source,
            file: Some(source.file_name().to_owned()),
            status,
            bytes,
            redactions: red.count,
            reason: err.or_else(|| cut.then(|| "cut at maxBytes".to_owned())),
        },
        path: Some(path),
    })
}

fn stage_process(
    source: Source,
    mut cmd: Command,
    stage: &Path,
    budget: &mut u64,
) -> Result<Staged, LogsError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = match cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            return Ok(Staged {
                report: report(
                    source,
                    SourceStatus::Missing,
                    Some(format!("{program}: {e}")),
                ),
                path: None,
            });
        }
    };
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Ok(Staged {
            report: report(
                source,
                SourceStatus::Failed,
                Some("no stdout pipe".to_owned()),
            ),
            path: None,
        });
    };
    // Drained on its own thread: a child that fills the stderr pipe while we read stdout would
    // otherwise block forever. The first 1 KiB is kept for the manifest.
    let stderr = child.stderr.take().map(|mut e| {
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut e).take(1024).read_to_end(&mut kept);
            let _ = std::io::copy(&mut e, &mut std::io::sink());
            String::from_utf8_lossy(&kept).into_owned()
        })
    });
    let mut staged = stage_reader(source, stdout, stage, budget)?;
    if staged.report.status == SourceStatus::Truncated {
        // We have what fits; the rest is not wanted.
        let _ = child.kill();
        let _ = child.wait();
        return Ok(staged);
    }
    let stderr = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    match child.wait() {
        Ok(st) if st.success() => {}
        Ok(st) => {
            staged.report.status = SourceStatus::Failed;
            staged.report.reason = Some(format!("{program} exited with {st}: {}", stderr.trim()));
        }
        Err(e) => {
            staged.report.status = SourceStatus::Failed;
            staged.report.reason = Some(format!("{program}: {e}"));
        }
    }
    Ok(staged)
}

fn stage_kernel(kmsg: &Path, stage: &Path, budget: &mut u64) -> Result<Staged, LogsError> {
    let path = kmsg.to_owned();
    // Non-blocking: reading /dev/kmsg blocks at the end of the buffer otherwise.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&path);
    match file {
        Ok(f) => stage_reader(Source::Kernel, f, stage, budget),
        Err(e) => Ok(Staged {
            report: report(
                Source::Kernel,
                SourceStatus::Missing,
                Some(format!("{}: {e}", path.display())),
            ),
            path: None,
        }),
    }
}

/// `nvidia-bug-report.sh --output-file <stage>/nvidia-bug-report.log` writes `...log.gz`; it is
/// taken as is (already compressed, not redacted: the manifest says so) when it fits the budget.
fn stage_bug_report(cfg: &OpsConfig, stage: &Path, budget: &mut u64) -> Staged {
    let base = stage.join("nvidia-bug-report.log");
    let out = stage.join(Source::NvidiaBugReport.file_name());
    let program = cfg.nvidia_bug_report.display().to_string();
    let status = Command::new(&cfg.nvidia_bug_report)
        .arg("--output-file")
        .arg(&base)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let fail = |status, reason: String| Staged {
        report: report(Source::NvidiaBugReport, status, Some(reason)),
        path: None,
    };
    match status {
        Err(e) => return fail(SourceStatus::Missing, format!("{program}: {e}")),
        Ok(st) if !st.success() => {
            return fail(SourceStatus::Failed, format!("{program} exited with {st}"));
        }
        Ok(_) => {}
    }
    let size = match std::fs::metadata(&out) {
        Ok(m) => m.len(),
        Err(e) => return fail(SourceStatus::Failed, format!("{}: {e}", out.display())),
    };
    if size > *budget {
        return fail(
            SourceStatus::Truncated,
            format!("{size} bytes do not fit in what is left of maxBytes; left out"),
        );
    }
    *budget -= size;
    Staged {
        report: SourceReport {
            source: Source::NvidiaBugReport,
            file: Some(Source::NvidiaBugReport.file_name().to_owned()),
            status: SourceStatus::Collected,
            bytes: size,
            redactions: 0,
            reason: Some("compressed by nvidia-bug-report.sh; not redacted".to_owned()),
        },
        path: Some(out),
    }
}

/// A writer that counts and hashes what passes through.
struct HashWriter<W> {
    inner: W,
    hash: Sha256,
    bytes: u64,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Collects the sources into a `.tar.gz` (blocking: run it on a blocking thread).
pub fn collect(
    cfg: &OpsConfig,
    args: &CollectArgs,
    since: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Bundle, LogsError> {
    let parent = cfg.work_dir.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&parent).map_err(io("creating", &parent))?;
    let dir = tempfile::Builder::new()
        .prefix("bcd-logs-")
        .tempdir_in(&parent)
        .map_err(io("creating a temp dir in", &parent))?;
    let stage = dir.path().join("stage");
    std::fs::create_dir(&stage).map_err(io("creating", &stage))?;
    let max_bytes = args.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    let mut budget = max_bytes;
    let mut sources: Vec<Source> = args
        .sources
        .clone()
        .unwrap_or_else(|| DEFAULT_SOURCES.to_vec());
    let mut seen = std::collections::HashSet::new();
    sources.retain(|s| seen.insert(*s));
    let mut staged = Vec::new();
    for s in sources {
        let st = match s {
            Source::Journal => {
                let mut cmd = Command::new(&cfg.journalctl);
                cmd.args(["--no-pager", "--output=short-iso", "--utc"]);
                if let Some(t) = since {
                    cmd.arg(format!("--since=@{}", t.timestamp()));
                }
                stage_process(s, cmd, &stage, &mut budget)?
            }
            Source::Kernel => stage_kernel(&cfg.kmsg, &stage, &mut budget)?,
            Source::Agent => match &cfg.log_file {
                None => Staged {
                    report: report(
                        s,
                        SourceStatus::Missing,
                        Some("the agent runs without --log-file (its log goes to stderr)".into()),
                    ),
                    path: None,
                },
                Some(p) => match File::open(p) {
                    Ok(f) => stage_reader(s, f, &stage, &mut budget)?,
                    Err(e) => Staged {
                        report: report(
                            s,
                            SourceStatus::Missing,
                            Some(format!("{}: {e}", p.display())),
                        ),
                        path: None,
                    },
                },
            },
            Source::NvidiaBugReport => stage_bug_report(cfg, &stage, &mut budget),
        };
        staged.push(st);
    }
    let manifest = Manifest {
        version: 1,
        created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        since: since.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
        max_bytes,
        truncated: staged
            .iter()
            .any(|s| s.report.status == SourceStatus::Truncated),
        sources: staged.iter().map(|s| s.report.clone()).collect(),
    };
    let manifest_json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| LogsError::BadArgs(format!("manifest: {e}")))?;

    let path = dir.path().join("bundle.tar.gz");
    let file = File::create(&path).map_err(io("creating", &path))?;
    let hw = HashWriter {
        inner: std::io::BufWriter::new(file),
        hash: Sha256::new(),
        bytes: 0,
    };
    let gz = flate2::write::GzEncoder::new(hw, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    let mut header = tar::Header::new_gnu();
    header.set_size(manifest_json.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    header.set_cksum();
    tar.append_data(&mut header, "manifest.json", manifest_json.as_slice())
        .map_err(io("writing", &path))?;
    for s in &staged {
        if let (Some(p), Some(name)) = (&s.path, &s.report.file) {
            let mut f = File::open(p).map_err(io("reading", p))?;
            tar.append_file(name, &mut f)
                .map_err(io("writing", &path))?;
        }
    }
    let gz = tar.into_inner().map_err(io("writing", &path))?;
    let mut hw = gz.finish().map_err(io("writing", &path))?;
    hw.flush().map_err(io("writing", &path))?;
    let _ = std::fs::remove_dir_all(&stage);
    Ok(Bundle {
        path,
        bytes: hw.bytes,
        sha256: hex::encode(hw.hash.finalize()),
        manifest,
        _dir: dir,
    })
}

#[cfg(test)]
#[path = "collect_tests.rs"]
mod tests;
