//! `logs.collect {since, sources, maxBytes}`: a gzip-compressed tar of the node's logs, with
//! secrets redacted ([`redact`]) and a `manifest.json` saying what was collected, what was missing
//! and why. Sources run as processes or are read as files, in 64 KiB reads, through the streaming
//! redactor (no read or line cut hides a secret) and then cut into lines for the budget, into a
//! staging dir; then the tar is streamed through gzip into a file while its SHA-256 is computed:
//! memory stays at a read, the redactor's bounded hold-back and one line, plus the compressor's
//! window, whatever the size of the logs.
//!
//! A missing `journalctl` or unreadable `/dev/kmsg` is noted in the manifest, not a failure. The
//! sum of the collected (uncompressed, redacted) bytes never passes `maxBytes`: a source that would
//! is cut there, and the manifest and the result say `truncated`.

mod collect;
pub mod redact;
pub mod upload;

pub use collect::{Bundle, collect};

use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use serde_json::Value;

use crate::executor::{CommandRun, to_result};
use crate::ops::OpsConfig;

/// Longest output line kept as one; longer lines are split (after redaction), bytes.
pub const MAX_LINE_BYTES: u64 = 64 * 1024;

pub use bc_protocol::commands::logs::{
    CollectArgs, CollectResult, DEFAULT_MAX_BYTES, DEFAULT_SOURCES, Manifest, Source, SourceReport,
    SourceStatus,
};

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
    pub fn code(&self) -> CommandErrorCode {
        match self {
            LogsError::BadArgs(_) => CommandErrorCode::InvalidArgument,
            LogsError::Io { .. } => CommandErrorCode::CollectFailed,
            LogsError::Upload(_) => CommandErrorCode::UploadFailed,
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

/// Runs logs.collect as `run`: collects on a blocking thread, reports progress 50, uploads (to
/// `ops.upload`, else the command's session), and returns the result.
pub async fn run_command(ops: &OpsConfig, run: &CommandRun) -> Result<CollectResult, LogsError> {
    let (a, since) = parse_args(&run.args, chrono::Utc::now())?;
    let up = ops
        .upload
        .clone()
        .or_else(|| run.upload.clone())
        .ok_or_else(|| LogsError::Upload("no control plane to upload to".to_owned()))?;
    let cfg = ops.clone();
    let bundle = tokio::task::spawn_blocking(move || collect(&cfg, &a, since))
        .await
        .map_err(|e| LogsError::Upload(format!("collector task: {e}")))??;
    tracing::info!(
        bytes = bundle.bytes,
        truncated = bundle.manifest.truncated,
        "log bundle built; uploading"
    );
    run.progress(50);
    let (bytes, sha) = upload::upload(&up, &run.id, &bundle).await?;
    if bytes != bundle.bytes || sha != bundle.sha256 {
        return Err(LogsError::Upload(format!(
            "the gateway stored {bytes} bytes with SHA-256 {sha}; sent {} with {}",
            bundle.bytes, bundle.sha256
        )));
    }
    Ok(CollectResult {
        bundle_bytes: bundle.bytes,
        truncated: bundle.manifest.truncated,
        sha256: bundle.sha256,
        manifest: bundle.manifest,
    })
}

/// The `logs.collect` handler: [`run_command`] with its error as a command failure.
pub async fn handle(ops: &OpsConfig, run: &CommandRun) -> Result<Value, CommandFailure> {
    let result = run_command(ops, run)
        .await
        .map_err(|e| CommandFailure::new(e.code(), e.to_string()))?;
    to_result(&result)
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
