//! Break-glass SSH: a managed block of keys in one user's `~/.ssh/authorized_keys`.
//!
//! # Background
//! The spec's `breakGlassSsh` gives operators emergency access to a node; each key carries an
//! `expiresAt` the agent enforces itself, even while disconnected from the control plane.
//! `authorized_keys` also holds the user's own keys, which must survive untouched.
//!
//! # Design
//! - The keys live between [`BEGIN_MARKER`] and [`END_MARKER`] lines. [`splice`] replaces only
//!   that block; every byte before and after it is kept. A file with a broken block (a BEGIN
//!   without END, two blocks) is refused rather than guessed at.
//! - The user comes from `<root>/etc/passwd` (falling back to NSS through `getpwnam` when the
//!   host root is `/`); the home directory is resolved under the host root.
//! - The agent runs as root in a directory the user owns, so every step goes through a
//!   directory fd opened with `O_NOFOLLOW`: a `.ssh` or `authorized_keys` that is a symlink is
//!   refused (it could point the write at `/etc/shadow`), and the write is a temp file created
//!   with `O_EXCL` in that directory, `fchown`/`fchmod` 0600, `fsync`, `renameat`, `fsync` of the
//!   directory. `.ssh` is made or fixed to 0700 and the user's ownership.
//! - Nothing is written when the file already has the wanted content, mode and owner.
//!
//! # Limitations
//! The home directory itself may be a symlink (common for `/home` on a data disk) and is
//! followed. SELinux labels of a new file are the directory's default.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use bc_protocol::spec::SshKey;
use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode, fchmod, fstat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

use bcd_probes::hostroot::HostRoot;

/// First line of the managed block.
pub const BEGIN_MARKER: &str =
    "# BEGIN bcd break-glass keys: managed by bcd, edits inside this block are overwritten";
/// Last line of the managed block.
pub const END_MARKER: &str = "# END bcd break-glass keys";

const FILE: &str = "authorized_keys";
const TEMP: &str = ".authorized_keys.bcd-tmp";

/// What went wrong converging `authorized_keys`.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// No such user in `/etc/passwd` (or NSS).
    #[error("break-glass user {0:?} does not exist")]
    UnknownUser(String),
    /// The user's home directory is missing.
    #[error("home {0} of the break-glass user does not exist")]
    NoHome(PathBuf),
    /// `.ssh` or `authorized_keys` is a symlink; the agent will not write through it.
    #[error("{0} is a symlink; refusing to write through it")]
    Symlink(PathBuf),
    /// `.ssh` is not a directory or `authorized_keys` not a regular file.
    #[error("{0} is not a {1}")]
    WrongType(PathBuf, &'static str),
    /// The managed block's markers are broken; the file is left alone.
    #[error("{path}: managed block is damaged ({what}); fix or remove it by hand")]
    DamagedBlock { path: PathBuf, what: &'static str },
    /// A key that cannot be written as an `authorized_keys` line.
    #[error("key {index}: {reason}")]
    BadKey { index: usize, reason: String },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SshError {
    /// CamelCase reason for `SpecStatus.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            SshError::UnknownUser(_) | SshError::NoHome(_) => "SshUserNotFound",
            SshError::Symlink(_) | SshError::WrongType(..) => "AuthorizedKeysUnsafe",
            SshError::DamagedBlock { .. } => "AuthorizedKeysDamaged",
            SshError::BadKey { .. } => "InvalidSpec",
            SshError::Io { .. } => "AuthorizedKeysWriteFailed",
        }
    }
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(Errno) -> SshError {
    let path = path.to_owned();
    move |e| SshError::Io {
        op,
        path,
        source: e.into(),
    }
}

/// A local account from `passwd`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Home directory as the host sees it (not yet under the host root).
    pub home: PathBuf,
}

/// Looks `name` up in `<root>/etc/passwd` (`name:x:uid:gid:gecos:home:shell`), then in NSS when
/// the root is `/`.
pub fn lookup_user(root: &HostRoot, name: &str) -> Result<Account, SshError> {
    if let Ok(text) = root.read_to_string("/etc/passwd") {
        for line in text.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if let [n, _, uid, gid, _, home, ..] = f.as_slice()
                && *n == name
                && let (Ok(uid), Ok(gid)) = (uid.parse(), gid.parse())
            {
                return Ok(Account {
                    name: name.to_owned(),
                    uid,
                    gid,
                    home: PathBuf::from(home),
                });
            }
        }
    }
    if root.root() == Path::new("/")
        && let Ok(Some(u)) = nix::unistd::User::from_name(name)
    {
        return Ok(Account {
            name: name.to_owned(),
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            home: u.dir,
        });
    }
    Err(SshError::UnknownUser(name.to_owned()))
}

/// The managed block for the keys not expired at `now_ms`, and the earliest expiry among them
/// (ms since the Unix epoch). An empty string when no key remains.
pub fn render_block(keys: &[SshKey], now_ms: i64) -> Result<(String, Option<i64>), SshError> {
    let mut lines = Vec::new();
    let mut next = None::<i64>;
    for (index, k) in keys.iter().enumerate() {
        if k.expired_at(now_ms) {
            continue;
        }
        let line = k.authorized_keys_line().map_err(|e| SshError::BadKey {
            index,
            reason: e.to_string(),
        })?;
        lines.push(line);
        if k.expires_at.is_some() {
            let at = k.expires_at_ms();
            next = Some(next.map_or(at, |n| n.min(at)));
        }
    }
    if lines.is_empty() {
        return Ok((String::new(), None));
    }
    let mut block = format!("{BEGIN_MARKER}\n");
    for l in lines {
        block.push_str(&l);
        block.push('\n');
    }
    block.push_str(END_MARKER);
    block.push('\n');
    Ok((block, next))
}

/// `existing` with its managed block replaced by `block` (removed when `block` is empty, appended
/// when there was none). Bytes outside the block are kept as they are; when appending to a file
/// whose last line has no newline, one is added so the block starts on its own line.
pub fn splice(existing: &[u8], block: &str, path: &Path) -> Result<Vec<u8>, SshError> {
    let damaged = |what| SshError::DamagedBlock {
        path: path.to_owned(),
        what,
    };
    let mut begin = None;
    let mut end = None;
    let mut offset = 0;
    for line in existing.split_inclusive(|b| *b == b'\n') {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text == BEGIN_MARKER.as_bytes() {
            if begin.is_some() {
                return Err(damaged("two BEGIN markers"));
            }
            begin = Some(offset);
        } else if text == END_MARKER.as_bytes() {
            if begin.is_none() || end.is_some() {
                return Err(damaged("END marker without BEGIN"));
            }
            end = Some(offset + line.len());
        }
        offset += line.len();
    }
    let (before, after) = match (begin, end) {
        (Some(b), Some(e)) => (&existing[..b], &existing[e..]),
        (None, None) => (existing, &existing[existing.len()..]),
        _ => return Err(damaged("BEGIN marker without END")),
    };
    let mut out = Vec::with_capacity(before.len() + block.len() + after.len() + 1);
    out.extend_from_slice(before);
    if !block.is_empty() && !before.is_empty() && !before.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(block.as_bytes());
    out.extend_from_slice(after);
    Ok(out)
}

/// What [`converge`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshOutcome {
    /// Whether anything on disk changed (content, mode or owner).
    pub changed: bool,
    /// Keys now in the block.
    pub installed: usize,
    /// Earliest `expiresAt` among them, ms since the Unix epoch: when to run again.
    pub next_expiry_ms: Option<i64>,
}

/// Makes `user`'s managed block hold exactly the `keys` not expired at `now_ms`. With no keys
/// left the block is removed (and no file or `.ssh` is created for nothing).
pub fn converge(
    root: &HostRoot,
    user: &str,
    keys: &[SshKey],
    now_ms: i64,
) -> Result<SshOutcome, SshError> {
    let account = lookup_user(root, user)?;
    let (block, next_expiry_ms) = render_block(keys, now_ms)?;
    let installed = block.lines().count().saturating_sub(2);
    let home = root.path(&account.home);
    if !home.is_dir() {
        return Err(SshError::NoHome(home));
    }
    let ssh_dir = home.join(".ssh");
    let mut changed = false;
    let dir = match open_dir(&ssh_dir)? {
        Some(d) => d,
        None if block.is_empty() => {
            return Ok(SshOutcome {
                changed,
                installed,
                next_expiry_ms,
            });
        }
        None => {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&ssh_dir)
                .map_err(|source| SshError::Io {
                    op: "mkdir",
                    path: ssh_dir.clone(),
                    source,
                })?;
            changed = true;
            open_dir(&ssh_dir)?.ok_or_else(|| SshError::Io {
                op: "open",
                path: ssh_dir.clone(),
                source: std::io::ErrorKind::NotFound.into(),
            })?
        }
    };
    changed |= fix_owner_mode(&dir, &account, 0o700, &ssh_dir)?;

    let path = ssh_dir.join(FILE);
    let existing = read_file(&dir, &path)?;
    let old = existing
        .as_ref()
        .map_or(&[][..], |(bytes, _)| bytes.as_slice());
    let new = splice(old, &block, &path)?;
    match existing {
        None if block.is_empty() => {}
        Some((bytes, file)) if bytes == new => {
            changed |= fix_owner_mode(&file, &account, 0o600, &path)?;
        }
        _ => {
            write_atomic(&dir, &ssh_dir, &new, &account)?;
            changed = true;
        }
    }
    Ok(SshOutcome {
        changed,
        installed,
        next_expiry_ms,
    })
}

use std::os::unix::fs::DirBuilderExt;

/// Opens `.ssh` without following a symlink; `None` when it does not exist.
fn open_dir(path: &Path) -> Result<Option<OwnedFd>, SshError> {
    match open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(Errno::ELOOP) => Err(SshError::Symlink(path.to_owned())),
        Err(Errno::ENOTDIR) => {
            // O_NOFOLLOW|O_DIRECTORY on a symlink to a directory gives ENOTDIR on some kernels.
            let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            Err(if is_link {
                SshError::Symlink(path.to_owned())
            } else {
                SshError::WrongType(path.to_owned(), "directory")
            })
        }
        Err(e) => Err(io("open", path)(e)),
    }
}

/// Reads `authorized_keys` in `dir` without following a symlink; `None` when absent.
fn read_file(dir: &OwnedFd, path: &Path) -> Result<Option<(Vec<u8>, File)>, SshError> {
    let fd = match openat(
        dir.as_fd(),
        FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(Errno::ELOOP) => return Err(SshError::Symlink(path.to_owned())),
        Err(e) => return Err(io("open", path)(e)),
    };
    let mut file = File::from(fd);
    let meta = file.metadata().map_err(|source| SshError::Io {
        op: "stat",
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        return Err(SshError::WrongType(path.to_owned(), "regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|source| SshError::Io {
            op: "read",
            path: path.to_owned(),
            source,
        })?;
    Ok(Some((bytes, file)))
}

/// Sets owner and permission bits of an open file or directory; true when something changed.
fn fix_owner_mode(
    fd: &impl AsFd,
    account: &Account,
    mode: u32,
    path: &Path,
) -> Result<bool, SshError> {
    let st = fstat(fd.as_fd()).map_err(io("stat", path))?;
    let mut changed = false;
    if st.st_uid != account.uid || st.st_gid != account.gid {
        fchown(
            fd.as_fd(),
            Some(Uid::from_raw(account.uid)),
            Some(Gid::from_raw(account.gid)),
        )
        .map_err(io("chown", path))?;
        changed = true;
    }
    if st.st_mode & 0o7777 != mode {
        fchmod(fd.as_fd(), Mode::from_bits_truncate(mode)).map_err(io("chmod", path))?;
        changed = true;
    }
    Ok(changed)
}

/// Temp file in `dir`, owner and 0600 set before any byte is visible, fsync, rename over
/// `authorized_keys`, fsync of the directory.
fn write_atomic(
    dir: &OwnedFd,
    dir_path: &Path,
    bytes: &[u8],
    account: &Account,
) -> Result<(), SshError> {
    let tmp_path = dir_path.join(TEMP);
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mode = Mode::from_bits_truncate(0o600);
    let fd = match openat(dir.as_fd(), TEMP, flags, mode) {
        Err(Errno::EEXIST) => {
            // Left over from a crash between create and rename.
            unlinkat(dir.as_fd(), TEMP, UnlinkatFlags::NoRemoveDir)
                .map_err(io("unlink", &tmp_path))?;
            openat(dir.as_fd(), TEMP, flags, mode)
        }
        other => other,
    }
    .map_err(io("create", &tmp_path))?;
    let mut file = File::from(fd);
    let result = (|| {
        fix_owner_mode(&file, account, 0o600, &tmp_path)?;
        file.write_all(bytes).map_err(|source| SshError::Io {
            op: "write",
            path: tmp_path.clone(),
            source,
        })?;
        file.sync_all().map_err(|source| SshError::Io {
            op: "fsync",
            path: tmp_path.clone(),
            source,
        })?;
        renameat(dir.as_fd(), TEMP, dir.as_fd(), FILE).map_err(io("rename", &tmp_path))?;
        nix::unistd::fsync(dir.as_fd()).map_err(io("fsync", dir_path))
    })();
    if result.is_err() {
        let _ = unlinkat(dir.as_fd(), TEMP, UnlinkatFlags::NoRemoveDir);
    }
    result
}

/// Owner uid and permission bits of a path (tests and diagnostics).
pub fn owner_and_mode(path: &Path) -> std::io::Result<(u32, u32, u32)> {
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.uid(), m.gid(), m.mode() & 0o7777))
}

#[cfg(test)]
#[path = "ssh_tests.rs"]
mod tests;
