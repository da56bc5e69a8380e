//! Atomic file replacement: a reader (another process, or this one after a crash or power loss)
//! sees the old content or the new, never a mix or an empty file.
//!
//! # Design
//! The temp file is made by `tempfile` in the target's own directory (a rename across file
//! systems is not atomic), named `.<file name>.<random>.tmp` so that two writers never share it
//! and a directory scan for `*.json` never picks one up. Its mode is set when it is created and
//! set again on the open descriptor, so a restrictive or permissive umask changes nothing and a
//! secret (0600) is never readable by others, not even for a moment. The file is fsynced before
//! the rename, and the directory after it: without the second fsync the rename itself may be lost
//! on power failure. On any error the temp file is removed and the target is untouched.
//!
//! # Limitations
//! A failed directory fsync is reported as an error although the new content is in place (the
//! rename may just not be durable yet); callers treat it like any failed write.

use std::fs::{File, Permissions};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A step of an atomic write failed; the target still holds its old content (or, for
/// [`Step::SyncDir`], already the new one).
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {source}")]
pub struct AtomicWriteError {
    /// What was being done.
    pub step: Step,
    /// The file (or, for [`Step::SyncDir`], the directory) it was done to.
    pub path: PathBuf,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}

/// The steps of [`write()`], for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating the temp file beside the target.
    Create,
    /// Writing the data (or setting the mode) on the temp file.
    Write,
    /// fsync of the temp file.
    SyncFile,
    /// Renaming the temp file over the target.
    Rename,
    /// fsync of the directory that holds the target.
    SyncDir,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Create => "creating a temp file for",
            Step::Write => "writing",
            Step::SyncFile => "syncing",
            Step::Rename => "replacing",
            Step::SyncDir => "syncing directory",
        })
    }
}

/// Replaces `path` with `data` atomically; the file gets permission bits `mode` (e.g. `0o600`
/// for a private key, `0o644` for a public file). The directory must exist.
pub fn write(path: &Path, data: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let err = |step, p: &Path| {
        let path = p.to_owned();
        move |source| AtomicWriteError { step, path, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().unwrap_or(path.as_os_str());
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)
        .map_err(err(Step::Create, path))?;
    // The create mode went through the umask; this sets exactly `mode`.
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))
        .map_err(err(Step::Write, tmp.path()))?;
    tmp.write_all(data).map_err(err(Step::Write, tmp.path()))?;
    tmp.as_file()
        .sync_all()
        .map_err(err(Step::SyncFile, tmp.path()))?;
    tmp.persist(path)
        .map_err(|e| err(Step::Rename, path)(e.error))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(Step::SyncDir, dir))
}

#[cfg(test)]
#[path = "atomic_tests.rs"]
mod tests;
