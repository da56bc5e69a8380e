//! `logs.collect {since, sources, maxBytes}`: a gzip-compressed tar of the node's logs, with
//! secrets redacted ([`redact`]) and a `manifest.json` saying what was collected, what was missing
//! and why. Sources run as processes or are read as files, line by line, through the redactor into
//! a staging dir, then the tar is streamed through gzip into a file while its SHA-256 is computed:
//! memory stays at one line plus the compressor's window whatever the size of the logs.
//!
//! A missing `journalctl` or unreadable `/dev/kmsg` is noted in the manifest, not a failure. The
//! sum of the collected (uncompressed, redacted) bytes never passes `maxBytes`: a source that would
//! is cut there, and the manifest and the result say `truncated`.

mod collect;
pub mod redact;
pub mod upload;

pub use collect::{Bundle, collect};

use serde::{Deserialize, Serialize};

/// The command name.
pub const NAME: &str = "logs.collect";
/// `maxBytes` when not given, bytes (64 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Longest line kept as one; longer lines are split, bytes.
pub const MAX_LINE_BYTES: u64 = 64 * 1024;

/// A log source.
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

/// The args of logs.collect (camelCase JSON).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CollectArgs {
    /// A duration back from now (`"2h"`, humantime) or an RFC 3339 time.
    pub since: Option<String>,
    /// Which sources; default [`DEFAULT_SOURCES`].
    pub sources: Option<Vec<Source>>,
    /// Cap on the collected bytes (uncompressed, after redaction); default [`DEFAULT_MAX_BYTES`].
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
    pub source: Source,
    /// Path inside the tar; `None` when nothing was collected.
    pub file: Option<String>,
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
    pub max_bytes: u64,
    /// Whether any source was cut at `maxBytes`.
    pub truncated: bool,
    pub sources: Vec<SourceReport>,
}

/// Why logs.collect failed (a missing source is not a failure).
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("logs.collect args: {0}")]
    BadArgs(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("upload: {0}")]
    Upload(String),
}

impl LogsError {
    /// The command error code.
    pub fn code(&self) -> &'static str {
        match self {
            LogsError::BadArgs(_) => "INVALID_ARGUMENT",
            LogsError::Io { .. } => "COLLECT_FAILED",
            LogsError::Upload(_) => "UPLOAD_FAILED",
        }
    }
}

/// Parses the args; `since` becomes a UTC time.
pub fn parse_args(
    args: &serde_json::Value,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<(CollectArgs, Option<chrono::DateTime<chrono::Utc>>), LogsError> {
    let a: CollectArgs =
        serde_json::from_value(args.clone()).map_err(|e| LogsError::BadArgs(e.to_string()))?;
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(match humantime::parse_duration(s) {
            Ok(d) => {
                let d = chrono::Duration::from_std(d)
                    .map_err(|e| LogsError::BadArgs(format!("since {s}: {e}")))?;
                now - d
            }
            Err(_) => chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|e| {
                    LogsError::BadArgs(format!(
                        "since {s:?} is neither a duration (2h) nor an RFC 3339 time: {e}"
                    ))
                })?
                .to_utc(),
        }),
    };
    if a.max_bytes == Some(0) {
        return Err(LogsError::BadArgs("maxBytes must be over 0".to_owned()));
    }
    Ok((a, since))
}

/// Runs logs.collect for command `command_id`: collects on a blocking thread, reports progress 50,
/// uploads, and returns the result `{bundleBytes, sha256, truncated, manifest}`.
pub async fn run_command(
    ops: &crate::ops::OpsConfig,
    root: &crate::hostroot::HostRoot,
    command_id: &str,
    args: &serde_json::Value,
    out: &tokio::sync::mpsc::Sender<bc_protocol::pb::AgentMessage>,
    epoch: u64,
) -> Result<serde_json::Value, LogsError> {
    let (a, since) = parse_args(args, chrono::Utc::now())?;
    let up = ops
        .upload
        .clone()
        .ok_or_else(|| LogsError::Upload("no control plane to upload to".to_owned()))?;
    let (cfg, root) = (ops.clone(), root.clone());
    let bundle = tokio::task::spawn_blocking(move || collect(&cfg, &root, &a, since))
        .await
        .map_err(|e| LogsError::Upload(format!("collector task: {e}")))??;
    tracing::info!(
        command = command_id,
        bytes = bundle.bytes,
        truncated = bundle.manifest.truncated,
        "log bundle built; uploading"
    );
    let _ = out.try_send(bc_protocol::pb::AgentMessage {
        epoch,
        msg: Some(bc_protocol::pb::agent_message::Msg::CommandUpdate(
            bc_protocol::pb::CommandUpdate {
                id: command_id.to_owned(),
                state: bc_protocol::pb::CommandState::Running.into(),
                progress: 50,
                ..Default::default()
            },
        )),
    });
    let (bytes, sha) = upload::upload(&up, command_id, &bundle).await?;
    if bytes != bundle.bytes || sha != bundle.sha256 {
        return Err(LogsError::Upload(format!(
            "the gateway stored {bytes} bytes with SHA-256 {sha}; sent {} with {}",
            bundle.bytes, bundle.sha256
        )));
    }
    Ok(serde_json::json!({
        "bundleBytes": bundle.bytes,
        "sha256": bundle.sha256,
        "truncated": bundle.manifest.truncated,
        "manifest": bundle.manifest,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_parse_durations_times_and_sources() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:00:00Z")
            .map(|t| t.to_utc())
            .unwrap_or_default();
        let (a, since) = parse_args(
            &serde_json::json!({"since": "2h", "sources": ["journal", "nvidiaBugReport"], "maxBytes": 10}),
            now,
        )
        .unwrap_or_default();
        assert_eq!(
            since.map(|t| t.to_rfc3339()),
            Some("2026-01-02T01:00:00+00:00".into())
        );
        assert_eq!(
            a.sources,
            Some(vec![Source::Journal, Source::NvidiaBugReport])
        );
        assert_eq!(a.max_bytes, Some(10));
        let (_, since) = parse_args(&serde_json::json!({"since": "2026-01-01T00:00:00Z"}), now)
            .unwrap_or_default();
        assert!(since.is_some());
        assert!(parse_args(&serde_json::json!({"since": "yesterday-ish"}), now).is_err());
        assert!(parse_args(&serde_json::json!({"sources": ["syslog"]}), now).is_err());
        assert!(parse_args(&serde_json::json!({"maxBytes": 0}), now).is_err());
    }
}
