//! Running the sources into a staging dir and streaming the tar through gzip into a file.

use std::fs::File;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
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

/// Copies `reader` line by line through `redactor` into `out`, spending `budget` bytes. Returns
/// (bytes written, cut at the budget).
fn copy_lines(
    reader: impl Read,
    out: &mut impl Write,
    redactor: &mut Redactor,
    budget: &mut u64,
) -> std::io::Result<(u64, bool)> {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    let mut written = 0u64;
    loop {
        buf.clear();
        let n = match (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
        {
            Ok(n) => n,
            // A non-blocking /dev/kmsg has no more records; a record overwritten while we read
            // (EPIPE) is skipped.
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if n == 0 {
            break;
        }
        let text = String::from_utf8_lossy(&buf);
        let Some(mut line) = redactor.line(text.trim_end_matches(['\n', '\r'])) else {
            continue;
        };
        line.push('\n');
        let len = line.len() as u64;
        if len > *budget {
            return Ok((written, true));
        }
        out.write_all(line.as_bytes())?;
        *budget -= len;
        written += len;
    }
    Ok((written, false))
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
mod tests {
    use super::*;

    fn untar(path: &Path) -> Vec<(String, String)> {
        let Ok(f) = File::open(path) else {
            return Vec::new();
        };
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(f));
        let mut out = Vec::new();
        if let Ok(entries) = ar.entries() {
            for mut e in entries.flatten() {
                let name = e
                    .path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default();
                let mut s = String::new();
                let _ = e.read_to_string(&mut s);
                out.push((name, s));
            }
        }
        out
    }

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        let _ = std::fs::write(&p, format!("#!/bin/sh\n{body}\n"));
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
        p
    }

    /// `cfg` reading the kernel log of the host under `root`.
    fn at(cfg: &OpsConfig, root: &Path) -> OpsConfig {
        OpsConfig {
            kmsg: root.join("dev/kmsg"),
            ..cfg.clone()
        }
    }

    #[test]
    fn bundle_holds_redacted_sources_and_a_manifest() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        std::fs::create_dir_all(tmp.path().join("root/dev"))?;
        std::fs::write(
            tmp.path().join("root/dev/kmsg"),
            "6,1,100,-;NVRM: Xid (PCI:0000:1a:00): 79\n6,2,200,-;hello kernel\n",
        )?;
        let cfg = OpsConfig {
            journalctl: script(
                tmp.path(),
                "journalctl",
                "echo \"args: $*\"\necho 'join abc123.0123456789abcdef'\necho 'Authorization: Bearer sekrit'",
            ),
            ..OpsConfig::default()
        };
        let b = collect(
            &at(&cfg, &tmp.path().join("root")),
            &CollectArgs::default(),
            None,
        )?;
        let files = untar(&b.path);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["manifest.json", "journal.log", "kernel.log"]);
        let journal = &files[1].1;
        assert!(journal.contains("--no-pager"), "{journal}");
        assert!(
            !journal.contains("0123456789abcdef") && !journal.contains("sekrit"),
            "{journal}"
        );
        assert!(files[2].1.contains("hello kernel"));
        let m: Manifest = serde_json::from_str(&files[0].1)?;
        assert!(!m.truncated);
        assert_eq!(m.sources[0].redactions, 2);
        assert_eq!(m.sources[2].status, SourceStatus::Missing);
        assert_eq!(b.bytes, std::fs::metadata(&b.path)?.len());
        assert_eq!(
            b.sha256,
            hex::encode(Sha256::digest(std::fs::read(&b.path)?))
        );
        Ok(())
    }

    #[test]
    fn missing_sources_are_noted_and_max_bytes_cuts() -> Result<(), Box<dyn std::error::Error>> {
        let tmp = tempfile::tempdir()?;
        let cfg = OpsConfig {
            journalctl: script(
                tmp.path(),
                "journalctl",
                "i=0; while [ $i -lt 5000 ]; do echo line $i; i=$((i+1)); done",
            ),
            log_file: Some(tmp.path().join("nope.log")),
            ..OpsConfig::default()
        };
        let root = tmp.path().join("no-root");
        let args = CollectArgs {
            max_bytes: Some(1000),
            ..CollectArgs::default()
        };
        let b = collect(&at(&cfg, &root), &args, None)?;
        assert!(b.manifest.truncated);
        let j = &b.manifest.sources[0];
        assert_eq!(j.status, SourceStatus::Truncated);
        assert!(j.bytes <= 1000 && j.bytes > 900, "{j:?}");
        assert_eq!(b.manifest.sources[1].status, SourceStatus::Missing);
        assert_eq!(b.manifest.sources[2].status, SourceStatus::Missing);

        let cfg = OpsConfig {
            journalctl: tmp.path().join("no-journalctl"),
            ..OpsConfig::default()
        };
        let b = collect(&at(&cfg, &root), &CollectArgs::default(), None)?;
        let j = &b.manifest.sources[0];
        assert_eq!(j.status, SourceStatus::Missing);
        assert!(
            j.reason
                .as_deref()
                .is_some_and(|r| r.contains("no-journalctl")),
            "{j:?}"
        );

        // A failing journalctl that floods stderr neither hangs nor loses what it printed.
        let cfg = OpsConfig {
            journalctl: script(
                tmp.path(),
                "journalctl-bad",
                "echo kept line\nhead -c 300000 /dev/zero | tr '\\0' e >&2\nexit 2",
            ),
            ..OpsConfig::default()
        };
        let b = collect(&at(&cfg, &root), &CollectArgs::default(), None)?;
        let j = &b.manifest.sources[0];
        assert_eq!(j.status, SourceStatus::Failed, "{j:?}");
        assert_eq!(j.bytes, "kept line\n".len() as u64);
        assert!(
            j.reason.as_deref().is_some_and(|r| r.contains("exited")),
            "{j:?}"
        );
        Ok(())
    }

    #[test]
    fn the_real_kmsg_is_read_to_its_end_without_blocking() -> Result<(), Box<dyn std::error::Error>>
    {
        // Whatever this machine allows: collected (non-blocking read stops at the end of the
        // ring buffer) or missing (no permission), never a hang.
        let args = CollectArgs {
            sources: Some(vec![Source::Kernel]),
            ..CollectArgs::default()
        };
        let b = collect(&OpsConfig::default(), &args, None)?;
        let k = &b.manifest.sources[0];
        assert!(
            matches!(k.status, SourceStatus::Collected | SourceStatus::Missing),
            "{k:?}"
        );
        Ok(())
    }
}
