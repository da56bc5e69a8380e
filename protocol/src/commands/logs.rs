//! `logs.collect {since, sources, maxBytes}`: which logs to bundle, the bundle's `manifest.json`
//! and the command's result. The agent builds the bundle (a gzip-compressed tar, secrets redacted)
//! and uploads it over `Gateway.Upload`.

use serde::{Deserialize, Serialize};

/// `maxBytes` when not given, bytes (64 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// A log source (camelCase in JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// systemd's journal through `journalctl` (`--journalctl`).
    Journal,
    /// The kernel ring buffer, `/dev/kmsg` under the host root.
    Kernel,
    /// The agent's own log file (`--log-file`).
    Agent,
    /// `nvidia-bug-report.sh` (`--nvidia-bug-report`); opt-in, never in the default set.
    NvidiaBugReport,
}

impl Source {
    /// The file name inside the tar.
    pub fn file_name(self) -> &'static str {
        match self {
            Source::Journal => "journal.log",
            Source::Kernel => "kernel.log",
            Source::Agent => "agent.log",
            Source::NvidiaBugReport => "nvidia-bug-report.log.gz",
        }
    }

    /// The camelCase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Journal => "journal",
            Source::Kernel => "kernel",
            Source::Agent => "agent",
            Source::NvidiaBugReport => "nvidiaBugReport",
        }
    }
}

/// Sources collected when `sources` is not given.
pub const DEFAULT_SOURCES: &[Source] = &[Source::Journal, Source::Kernel, Source::Agent];

/// The args of logs.collect (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectArgs {
    /// A duration back from now (`"2h"`, humantime) or an RFC 3339 time.
    pub since: Option<String>,
    /// Which sources; default [`DEFAULT_SOURCES`].
    pub sources: Option<Vec<Source>>,
    /// Cap on the collected bytes (uncompressed, after redaction); default [`DEFAULT_MAX_BYTES`];
    /// 0 is refused.
    pub max_bytes: Option<u64>,
}

/// What happened to one source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SourceStatus {
    /// Collected in full.
    Collected,
    /// Collected up to the `maxBytes` budget.
    Truncated,
    /// Not there (no binary, no file, no permission): noted, not a failure.
    Missing,
    /// Ran but failed; what it wrote before failing is kept.
    Failed,
}

/// One source in the manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceReport {
    /// Which source.
    pub source: Source,
    /// Path inside the tar; `None` when nothing was collected.
    pub file: Option<String>,
    /// What happened to it.
    pub status: SourceStatus,
    /// Bytes in the tar, after redaction.
    pub bytes: u64,
    /// Secrets replaced.
    pub redactions: u64,
    /// Why it is missing, failed or truncated.
    pub reason: Option<String>,
}

/// `manifest.json`, the first entry of the tar and part of the command result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Format version, 1.
    pub version: u32,
    /// RFC 3339.
    pub created_at: String,
    /// The `since` bound applied (RFC 3339), if any. The kernel ring buffer is not filtered: its
    /// records carry time since boot, not wall time.
    pub since: Option<String>,
    /// The byte budget applied.
    pub max_bytes: u64,
    /// Whether any source was cut at `maxBytes`.
    pub truncated: bool,
    /// Every source asked for, in the order asked.
    pub sources: Vec<SourceReport>,
}

/// The result of `logs.collect` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CollectResult {
    /// Size of the uploaded `.tar.gz`, bytes (what the gateway stored).
    pub bundle_bytes: u64,
    /// The bundle's manifest.
    pub manifest: Manifest,
    /// SHA-256 of the `.tar.gz`, lowercase hex.
    pub sha256: String,
    /// Whether any source was cut at `maxBytes`.
    pub truncated: bool,
}
