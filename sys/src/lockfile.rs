//! One process per directory: an exclusive `flock(2)` on a lock file in it, held for the
//! process's life, with the holder's pid written in the file so a second process can say who
//! holds it.
//!
//! # Design
//! - The file is opened `O_RDWR|O_CREAT|O_CLOEXEC` (mode 0600) without truncating, then locked
//!   with `LOCK_EX|LOCK_NB`: a second process gets `EWOULDBLOCK` at once instead of waiting, reads
//!   the holder's pid from the file and reports it ([`LockError::Held`]). Only the holder,
//!   once locked, truncates the file and writes its own pid.
//! - The kernel drops the lock when the last descriptor of the open file closes: at exit, on
//!   `kill -9`, on a crash. A stale file never blocks a restart; its old pid is overwritten.
//! - Keep the returned [`DirLock`] alive as long as the directory is in use (in practice, the
//!   process's life). `O_CLOEXEC` keeps it out of child processes (the reboot command, journalctl).
//!
//! # Limitations
//! `flock(2)` locks are advisory: they stop the processes that take them, nothing else. On NFS
//! they are emulated with byte-range locks (Linux 2.6.12+) and may not hold across clients.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "{path} is locked by {}: another process already uses this directory",
        holder.map_or_else(|| "another process (pid unknown)".to_owned(), |p| format!("pid {p}"))
    )]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid as it wrote it in the file; `None` when it has not written it yet or
        /// the file does not hold one.
        holder: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

/// A held lock; released when dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub struct DirLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid written in a lock file, if any.
pub fn holder(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Takes the exclusive lock on `path` (created 0600 if absent) without waiting, and writes this
/// process's pid into it.
pub fn lock(path: &Path) -> Result<DirLock, LockError> {
    let io = |op| {
        let path = path.to_owned();
        move |source| LockError::Io { op, path, source }
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(io("open"))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(LockError::Held {
                path: path.to_owned(),
                holder: text.trim().parse().ok(),
            });
        }
        Err((_, e)) => return Err(io("lock")(e.into())),
    };
    lock.set_len(0).map_err(io("truncate"))?;
    lock.rewind().map_err(io("seek"))?;
    writeln!(lock, "{}", std::process::id()).map_err(io("write"))?;
    Ok(DirLock {
        _lock: lock,
        path: path.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_free_after_drop()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("agent.lock");
        let held = lock(&path)?;
        assert_eq!(holder(&path), Some(std::process::id()));
        // flock(2) locks belong to the open file: a second open in this process is refused too.
        match lock(&path) {
            Err(LockError::Held { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("second lock: {other:?}"),
        }
        assert_eq!(holder(&path), Some(std::process::id()), "the pid survived");
        drop(held);
        let again = lock(&path)?;
        assert_eq!(again.path(), path);
        Ok(())
    }
}
