//! Files a root process writes on a user's behalf: the one rule for every such file
//! (`~/.ssh/authorized_keys` today, the bare-metal paths later), applied by descriptor so that
//! nothing a user plants can turn a root write or read against another file.
//!
//! # Background
//! The agent runs as root and writes into directories the user owns, where the user can put a
//! symlink or a hard link at the name the agent expects. With `authorized_keys` hard-linked to
//! `/etc/shadow` (possible where `fs.protected_hardlinks=0`, or where the user can write the
//! target), an earlier agent chowned shadow to the user (no key to install) or copied shadow's
//! bytes into the user's new file (one key). A FIFO at that name hangs a reader; a 2 GiB sparse
//! file fills its memory. A path check (`lstat`, then `open`) cannot help: the entry can change
//! between the two calls.
//!
//! # Design: the rule every caller gets
//! - **Directories** ([`UserDir::open`]) are walked from `/` one component at a time with
//!   `openat(2)` `O_NOFOLLOW|O_DIRECTORY`. A symlink on the way is followed only when the
//!   directory holding it is root's own (owner uid 0, not writable by group or others), so only
//!   root could have put it there (`/home -> /data/home`); any other symlink is refused
//!   ([`UserFileError::Symlink`]): a user who can write `/home` cannot point `~` at `/etc`. The
//!   directory reached must be owned by the user or root.
//! - **Entries inside a user's directory** ([`UserDir::subdir`], [`UserDir::read`],
//!   [`UserDir::replace`]) are one path component each, opened with `openat(2)` relative to the
//!   directory's descriptor and `O_NOFOLLOW`: never followed, whoever made them.
//! - **A file is accepted** only if `fstat(2)` on its open descriptor shows a regular file
//!   (`S_ISREG`), exactly one link (`st_nlink == 1`; a hard link to a root file has two), an owner
//!   that is the user or root, and a size (`st_size`, the apparent size, so a sparse file counts
//!   in full) within the caller's limit. A name that is not a regular file (FIFO, socket, device,
//!   directory) is refused from `fstatat(2)` before anything opens it, so a FIFO never blocks and
//!   a device is never opened. At most `limit` bytes are ever read, even from a file that grows.
//! - **A write** is a temp file beside the target made with `O_CREAT|O_EXCL|O_NOFOLLOW` (mode
//!   0600 from the start), given the user's ownership and the final mode with `fchown`/`fchmod`
//!   before any byte is written, `fsync`ed, renamed over the target with `renameat(2)`, then the
//!   directory is `fsync`ed. Owner and mode of entries that exist are fixed through their open
//!   descriptor, never by path. The target's old inode is never written to: a rename replaces
//!   the name only.
//!
//! # Limitations
//! Linux semantics (`O_PATH`, `st_nlink`). A user who owns a directory can still rename entries
//! in it while the agent works; that can only make the agent's write land under another name of
//! the user's own directory, never in a file the user could not already write. Extended
//! attributes and ACLs of a replaced file are not carried over; SELinux labels are the
//! directory's default.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, open, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, mkdirat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, unlinkat};

/// Symlinks followed at most while walking one path: Linux's own limit (path_resolution(7),
/// `MAXSYMLINKS`).
pub const MAX_SYMLINKS: u32 = 40;

/// The user on whose behalf files are written: their uid and primary gid (from `passwd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// Numeric user id.
    pub uid: u32,
    /// Numeric group id the files get.
    pub gid: u32,
}

/// Why a user's file or directory was refused or could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum UserFileError {
    /// A symlink the user could have planted (inside the user's directory, or in a directory
    /// that is not root's own).
    #[error("{0} is a symlink that a non-root user could have made; refusing to follow it")]
    Symlink(PathBuf),
    /// Not the kind of entry expected.
    #[error("{path} is {found}, not {wanted}")]
    WrongType {
        /// The entry.
        path: PathBuf,
        /// What it is (`a FIFO`, `a directory`, ...).
        found: &'static str,
        /// What it must be.
        wanted: &'static str,
    },
    /// A file with more than one name: another name could be a root file such as `/etc/shadow`.
    #[error(
        "{path} has {links} hard links; refusing it, since another name of the same file may be a file the user must not get (such as /etc/shadow)"
    )]
    HardLinked {
        /// The file.
        path: PathBuf,
        /// Its `st_nlink`.
        links: u64,
    },
    /// Owned by neither the user nor root.
    #[error("{path} is owned by uid {uid}, neither the user (uid {user}) nor root")]
    ForeignOwner {
        /// The entry.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The user it should belong to.
        user: u32,
    },
    /// Larger than the caller's limit (apparent size: sparse files count in full).
    #[error("{path} is {size} bytes, over the limit of {limit} bytes; refusing to read it")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes (`st_size`, or what was read past the limit).
        size: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A system call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`open`, `chown`, `rename`, ...).
        op: &'static str,
        /// The entry it was done to.
        path: PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
}

impl UserFileError {
    /// Whether this is a refusal of what is on disk (unsafe to touch) rather than a failed system
    /// call.
    pub fn is_unsafe(&self) -> bool {
        !matches!(self, UserFileError::Io { .. })
    }
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(Errno) -> UserFileError {
    let path = path.to_owned();
    move |e| UserFileError::Io {
        op,
        path,
        source: e.into(),
    }
}

/// What `st_mode` says an entry is, for messages.
fn kind(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        _ => "of an unknown type",
    }
}

fn is(st: &FileStat, t: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == t
}

/// Root's own directory: owned by uid 0 and writable by nobody else, so only root made what is
/// in it.
fn roots_own(st: &FileStat) -> bool {
    st.st_uid == 0 && st.st_mode & 0o022 == 0
}

fn check_owner(st: &FileStat, owner: Owner, path: &Path) -> Result<(), UserFileError> {
    if st.st_uid == owner.uid || st.st_uid == 0 {
        Ok(())
    } else {
        Err(UserFileError::ForeignOwner {
            path: path.to_owned(),
            uid: st.st_uid,
            user: owner.uid,
        })
    }
}

/// One component (no `/`, not `.` or `..`, not empty): what may be looked up inside a user's
/// directory.
fn one_component(name: &str, dir: &Path) -> Result<(), UserFileError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(UserFileError::Io {
            op: "look up",
            path: dir.join(name),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    Ok(())
}

/// Sets owner and permission bits of an open file or directory; true when something changed.
fn fix_owner_mode(
    fd: &impl AsFd,
    owner: Owner,
    mode: u32,
    path: &Path,
) -> Result<bool, UserFileError> {
    let st = fstat(fd.as_fd()).map_err(io("stat", path))?;
    let mut changed = false;
    if st.st_uid != owner.uid || st.st_gid != owner.gid {
        fchown(
            fd.as_fd(),
            Some(Uid::from_raw(owner.uid)),
            Some(Gid::from_raw(owner.gid)),
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

/// Walks absolute `path` from `/` (see the module docs); the last component is opened
/// `O_RDONLY|O_DIRECTORY`, the ones before `O_PATH`. `None` when some component is missing.
fn walk(path: &Path) -> Result<Option<OwnedFd>, UserFileError> {
    if !path.is_absolute() {
        return Err(UserFileError::Io {
            op: "open",
            path: path.to_owned(),
            source: std::io::ErrorKind::InvalidInput.into(),
        });
    }
    let open_root = || {
        open(
            "/",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io("open", Path::new("/")))
    };
    let mut cur = open_root()?;
    // Components still to walk, front first; a followed symlink's target goes in front.
    let mut todo: std::collections::VecDeque<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_owned()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect();
    let mut shown = PathBuf::from("/");
    let mut links = 0u32;
    // An empty walk (`/` itself) must still hand back a readable descriptor.
    if todo.is_empty() {
        todo.push_back(OsString::from("."));
    }
    while let Some(name) = todo.pop_front() {
        let last = todo.is_empty();
        let mut flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        flags |= if last { OFlag::O_RDONLY } else { OFlag::O_PATH };
        let here = if name == ".." {
            shown.parent().map_or_else(|| shown.clone(), Path::to_owned)
        } else {
            shown.join(&name)
        };
        match openat(cur.as_fd(), name.as_os_str(), flags, Mode::empty()) {
            Ok(fd) => {
                cur = fd;
                shown = here;
            }
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let st = fstatat(cur.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(io("stat", &here))?;
                if !is(&st, SFlag::S_IFLNK) {
                    return Err(UserFileError::WrongType {
                        path: here,
                        found: kind(&st),
                        wanted: "a directory",
                    });
                }
                let parent = fstat(cur.as_fd()).map_err(io("stat", &shown))?;
                if !roots_own(&parent) {
                    return Err(UserFileError::Symlink(here));
                }
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(io("resolve", path)(Errno::ELOOP));
                }
                let target =
                    readlinkat(cur.as_fd(), name.as_os_str()).map_err(io("readlink", &here))?;
                let target = Path::new(&target);
                if target.is_absolute() {
                    cur = open_root()?;
                    shown = PathBuf::from("/");
                }
                let mut parts: Vec<OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_owned()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                if parts.is_empty() {
                    parts.push(OsString::from("."));
                }
                for p in parts.into_iter().rev() {
                    todo.push_front(p);
                }
            }
            Err(e) => return Err(io("open", &here)(e)),
        }
    }
    Ok(Some(cur))
}

/// A directory that belongs to a user (or root), open by descriptor. Everything below it goes
/// through this descriptor.
#[derive(Debug)]
pub struct UserDir {
    fd: OwnedFd,
    path: PathBuf,
    owner: Owner,
}

impl UserDir {
    /// Opens the directory at absolute `path` for `owner`, following only symlinks that root
    /// made (module docs). `None` when it (or a directory on the way) does not exist. Refused:
    /// a symlink a user could have made, a component that is not a directory, a directory owned
    /// by someone other than `owner` or root.
    pub fn open(path: &Path, owner: Owner) -> Result<Option<Self>, UserFileError> {
        let Some(fd) = walk(path)? else {
            return Ok(None);
        };
        let st = fstat(fd.as_fd()).map_err(io("stat", path))?;
        check_owner(&st, owner, path)?;
        Ok(Some(Self {
            fd,
            path: path.to_owned(),
            owner,
        }))
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The subdirectory `name` (one component), never through a symlink, owned by the user or
    /// root; `None` when absent.
    pub fn subdir(&self, name: &str) -> Result<Option<Self>, UserFileError> {
        one_component(name, &self.path)?;
        let path = self.path.join(name);
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = match openat(self.fd.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                let st = fstatat(self.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(io("stat", &path))?;
                return Err(if is(&st, SFlag::S_IFLNK) {
                    UserFileError::Symlink(path)
                } else {
                    UserFileError::WrongType {
                        path,
                        found: kind(&st),
                        wanted: "a directory",
                    }
                });
            }
            Err(e) => return Err(io("open", &path)(e)),
        };
        let st = fstat(fd.as_fd()).map_err(io("stat", &path))?;
        check_owner(&st, self.owner, &path)?;
        Ok(Some(Self {
            fd,
            path,
            owner: self.owner,
        }))
    }

    /// The subdirectory `name`, created with `mode` and the user's ownership when absent (the
    /// owner and mode of one that exists are left to the caller: [`UserDir::set_owner_mode`]).
    pub fn create_subdir(&self, name: &str, mode: u32) -> Result<Self, UserFileError> {
        one_component(name, &self.path)?;
        let path = self.path.join(name);
        match mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(io("mkdir", &path)(e)),
        }
        let dir = self
            .subdir(name)?
            .ok_or_else(|| io("open", &path)(Errno::ENOENT))?;
        dir.set_owner_mode(mode)?;
        Ok(dir)
    }

    /// Gives this directory the user's ownership and `mode`; true when something changed.
    pub fn set_owner_mode(&self, mode: u32) -> Result<bool, UserFileError> {
        fix_owner_mode(&self.fd, self.owner, mode, &self.path)
    }

    /// Reads the file `name` (one component) under the rule of the module docs: never through a
    /// symlink, only a regular file with one link, owned by the user or root, at most
    /// `max_bytes` bytes. `None` when absent.
    pub fn read(&self, name: &str, max_bytes: u64) -> Result<Option<UserFile>, UserFileError> {
        one_component(name, &self.path)?;
        let path = self.path.join(name);
        // Classified before opening: a FIFO or device planted here is never opened.
        match fstatat(self.fd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if is(&st, SFlag::S_IFLNK) => return Err(UserFileError::Symlink(path)),
            Ok(st) if !is(&st, SFlag::S_IFREG) => {
                return Err(UserFileError::WrongType {
                    path,
                    found: kind(&st),
                    wanted: "a regular file",
                });
            }
            Ok(_) => {}
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(io("stat", &path)(e)),
        }
        // O_NONBLOCK and O_NOCTTY: harmless on a regular file, and the entry may have been
        // swapped for something else since the check above.
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = match openat(self.fd.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => return Err(UserFileError::Symlink(path)),
            Err(e) => return Err(io("open", &path)(e)),
        };
        // The descriptor is the truth from here on.
        let st = fstat(fd.as_fd()).map_err(io("stat", &path))?;
        if !is(&st, SFlag::S_IFREG) {
            return Err(UserFileError::WrongType {
                path,
                found: kind(&st),
                wanted: "a regular file",
            });
        }
        if st.st_nlink != 1 {
            return Err(UserFileError::HardLinked {
                path,
                links: st.st_nlink,
            });
        }
        check_owner(&st, self.owner, &path)?;
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size > max_bytes {
            return Err(UserFileError::TooLarge {
                path,
                size,
                limit: max_bytes,
            });
        }
        let mut file = File::from(fd);
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        (&mut file)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|source| UserFileError::Io {
                op: "read",
                path: path.clone(),
                source,
            })?;
        if bytes.len() as u64 > max_bytes {
            return Err(UserFileError::TooLarge {
                path,
                size: bytes.len() as u64,
                limit: max_bytes,
            });
        }
        Ok(Some(UserFile {
            bytes,
            file,
            path,
            owner: self.owner,
        }))
    }

    /// Replaces the file `name` (one component) with `bytes`, owned by the user with `mode`:
    /// temp file, `fchown`/`fchmod`, write, `fsync`, `renameat`, `fsync` of the directory.
    /// Whatever was at `name` (even a link to a root file) only loses the name.
    pub fn replace(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), UserFileError> {
        one_component(name, &self.path)?;
        let mut temp = OsString::from(".");
        temp.push(name);
        temp.push(".bcd-tmp");
        let temp: &OsStr = &temp;
        let tmp_path = self.path.join(temp);
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let create_mode = Mode::from_bits_truncate(0o600);
        let fd = match openat(self.fd.as_fd(), temp, flags, create_mode) {
            Err(Errno::EEXIST) => {
                // Left over from a crash between create and rename (or planted: unlinking a
                // name touches nothing it points to).
                unlinkat(self.fd.as_fd(), temp, UnlinkatFlags::NoRemoveDir)
                    .map_err(io("unlink", &tmp_path))?;
                openat(self.fd.as_fd(), temp, flags, create_mode)
            }
            other => other,
        }
        .map_err(io("create", &tmp_path))?;
        let mut file = File::from(fd);
        let result = (|| {
            fix_owner_mode(&file, self.owner, mode, &tmp_path)?;
            file.write_all(bytes).map_err(|source| UserFileError::Io {
                op: "write",
                path: tmp_path.clone(),
                source,
            })?;
            file.sync_all().map_err(|source| UserFileError::Io {
                op: "fsync",
                path: tmp_path.clone(),
                source,
            })?;
            renameat(self.fd.as_fd(), temp, self.fd.as_fd(), name)
                .map_err(io("rename", &tmp_path))?;
            nix::unistd::fsync(self.fd.as_fd()).map_err(io("fsync", &self.path))
        })();
        if result.is_err() {
            let _ = unlinkat(self.fd.as_fd(), temp, UnlinkatFlags::NoRemoveDir);
        }
        result
    }
}

/// A user's file read under the rule ([`UserDir::read`]), still open.
#[derive(Debug)]
pub struct UserFile {
    /// Its content (at most the limit it was read with).
    pub bytes: Vec<u8>,
    file: File,
    path: PathBuf,
    owner: Owner,
}

impl UserFile {
    /// Gives the file the user's ownership and `mode` through its descriptor; true when
    /// something changed. Safe because the file passed the rule: one link, the user's or root's.
    pub fn set_owner_mode(&self, mode: u32) -> Result<bool, UserFileError> {
        fix_owner_mode(&self.file, self.owner, mode, &self.path)
    }

    /// The file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
#[path = "userfile_tests.rs"]
mod tests;
