//! Break-glass SSH: a managed block of keys in one user's `~/.ssh/authorized_keys`.
//!
//! # Background
//! The spec's `breakGlassSsh` gives operators emergency access to a node; each key carries an
//! `expiresAt` the agent enforces itself, even while disconnected from the control plane.
//! `authorized_keys` also holds the user's own keys, which must survive untouched.
//!
//! # Design
//! - The keys live between [`BEGIN_MARKER`] and [`END_MARKER`] lines ([`super::ssh_block`]).
//!   [`splice`] replaces only that block; every byte before and after it is kept. A file with a
//!   broken block (a BEGIN without END, two blocks) is refused rather than guessed at.
//! - Each key that expires carries its expiry in the file: sshd's `expiry-time` option and a
//!   `# bcd-expires-at` marker the agent reads, so [`sweep`] removes expired keys from what is on
//!   disk, with no spec, and sshd refuses them even if the agent never runs again.
//! - The user comes from `<root>/etc/passwd` (falling back to NSS through `getpwnam` when the
//!   host root is `/`); the home directory is resolved under the host root.
//! - The agent runs as root in a directory the user owns, so every file step follows
//!   [`bc_sys::userfile`]'s rule: `~` is reached without following any symlink a user could
//!   have made, `.ssh` and `authorized_keys` are opened by descriptor and never through a
//!   symlink, `authorized_keys` must be a regular file with one link, owned by the user or root,
//!   at most [`MAX_AUTHORIZED_KEYS_BYTES`]; anything else is refused as `AuthorizedKeysUnsafe`
//!   and left as it is. The write is a temp file with the user's ownership and mode 0600,
//!   `fsync`, `renameat`, `fsync` of the directory; `.ssh` is made or fixed to 0700 and the
//!   user's ownership.
//! - Nothing is written when the file already has the wanted content, mode and owner.
//!
//! # Limitations
//! A home directory reached through a symlink is used only when root made that symlink (it
//! sits in a directory only root can write, as `/home -> /data/home` does). SELinux labels of
//! a new file are the directory's default. sshd older than OpenSSH 7.7 does not know
//! `expiry-time` and ignores the whole key line.

use std::path::{Path, PathBuf};

use bc_protocol::spec::SshKey;
use bc_sys::userfile::{Owner, UserDir, UserFileError};

use bcd_probes::hostroot::HostRoot;

pub use super::ssh_block::{BEGIN_MARKER, END_MARKER, render_block, splice};
use super::ssh_block::{parse_block, render_entries};

/// Largest `authorized_keys` the agent reads, bytes (`st_size`; a sparse file counts in full).
/// About 5,000 RSA-4096 keys: far past any real file, and small enough to hold in memory.
pub const MAX_AUTHORIZED_KEYS_BYTES: u64 = 4 << 20;

const FILE: &str = "authorized_keys";

/// What went wrong converging `authorized_keys`.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// No such user in `/etc/passwd` (or NSS).
    #[error("break-glass user {0:?} does not exist")]
    UnknownUser(String),
    /// The user's home directory is missing.
    #[error("home {0} of the break-glass user does not exist")]
    NoHome(PathBuf),
    /// `~`, `.ssh` or `authorized_keys` is refused by the rule for user files (a symlink a user
    /// could have made, a hard link, a FIFO, another user's file, too large), or a system call
    /// on it failed.
    #[error(transparent)]
    File(#[from] UserFileError),
    /// The managed block's markers are broken; the file is left alone.
    #[error("{path}: managed block is damaged ({what}); fix or remove it by hand")]
    DamagedBlock { path: PathBuf, what: &'static str },
    /// A key that cannot be written as an `authorized_keys` line.
    #[error("key {index}: {reason}")]
    BadKey { index: usize, reason: String },
}

impl SshError {
    /// CamelCase reason for `SpecStatus.reason`.
    pub fn reason(&self) -> &'static str {
        match self {
            SshError::UnknownUser(_) | SshError::NoHome(_) => "SshUserNotFound",
            SshError::File(e) if e.is_unsafe() => "AuthorizedKeysUnsafe",
            SshError::File(_) => "AuthorizedKeysWriteFailed",
            SshError::DamagedBlock { .. } => "AuthorizedKeysDamaged",
            SshError::BadKey { .. } => "InvalidSpec",
        }
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

/// Every well-formed account of `<root>/etc/passwd` (`name:x:uid:gid:gecos:home:shell`), in
/// file order; an unreadable file gives none.
pub fn passwd_accounts(root: &HostRoot) -> Vec<Account> {
    let Ok(text) = root.read_to_string("/etc/passwd") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            match f.as_slice() {
                [n, _, uid, gid, _, home, ..] if !n.is_empty() => Some(Account {
                    name: (*n).to_owned(),
                    uid: uid.parse().ok()?,
                    gid: gid.parse().ok()?,
                    home: PathBuf::from(home),
                }),
                _ => None,
            }
        })
        .collect()
}

/// Looks `name` up in `<root>/etc/passwd`, then in NSS when the root is `/`.
pub fn lookup_user(root: &HostRoot, name: &str) -> Result<Account, SshError> {
    if let Some(a) = passwd_accounts(root).into_iter().find(|a| a.name == name) {
        return Ok(a);
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

/// The user's home directory, opened under [`bc_sys::userfile`]'s rule.
fn open_home(root: &HostRoot, account: &Account) -> Result<UserDir, SshError> {
    let home = root.path(&account.home);
    let owner = Owner {
        uid: account.uid,
        gid: account.gid,
    };
    match UserDir::open(&home, owner) {
        Ok(Some(d)) => Ok(d),
        Ok(None) | Err(UserFileError::WrongType { .. }) => Err(SshError::NoHome(home)),
        Err(e) => Err(e.into()),
    }
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
    let block = render_block(keys, now_ms)?;
    let outcome = |changed| SshOutcome {
        changed,
        installed: block.installed,
        next_expiry_ms: block.next_expiry_ms,
    };
    let home = open_home(root, &account)?;
    let mut changed = false;
    let dir = match home.subdir(".ssh")? {
        Some(d) => d,
        None if block.text.is_empty() => return Ok(outcome(false)),
        None => {
            changed = true;
            home.create_subdir(".ssh", 0o700)?
        }
    };
    changed |= dir.set_owner_mode(0o700)?;

    let existing = dir.read(FILE, MAX_AUTHORIZED_KEYS_BYTES)?;
    let path = dir.path().join(FILE);
    let old = existing.as_ref().map_or(&[][..], |f| f.bytes.as_slice());
    let new = splice(old, &block.text, &path)?;
    match existing {
        None if block.text.is_empty() => {}
        Some(file) if file.bytes == new => changed |= file.set_owner_mode(0o600)?,
        _ => {
            dir.replace(FILE, &new, 0o600)?;
            changed = true;
        }
    }
    Ok(outcome(changed))
}

/// What [`sweep`] found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Whether the user's file has a managed block (before the sweep).
    pub had_block: bool,
    /// Keys removed because their on-disk expiry passed.
    pub removed: usize,
    /// Keys left in the block.
    pub remaining: usize,
    /// Earliest expiry among them, ms since the Unix epoch.
    pub next_expiry_ms: Option<i64>,
}

/// Removes from `user`'s managed block every key whose expiry written in the block
/// (`# bcd-expires-at`) has passed at `now_ms`, from the file alone: no spec needed. The block
/// goes when no key is left. Nothing is written when nothing expired.
pub fn sweep(root: &HostRoot, user: &str, now_ms: i64) -> Result<SweepOutcome, SshError> {
    let account = lookup_user(root, user)?;
    let home = open_home(root, &account)?;
    let Some(dir) = home.subdir(".ssh")? else {
        return Ok(SweepOutcome::default());
    };
    let Some(file) = dir.read(FILE, MAX_AUTHORIZED_KEYS_BYTES)? else {
        return Ok(SweepOutcome::default());
    };
    let path = dir.path().join(FILE);
    let Some(keys) = parse_block(&file.bytes, &path)? else {
        return Ok(SweepOutcome::default());
    };
    let (expired, kept): (Vec<_>, Vec<_>) = keys.into_iter().partition(|k| k.expired_at(now_ms));
    let block = render_entries(&kept);
    if !expired.is_empty() {
        let new = splice(&file.bytes, &block.text, &path)?;
        dir.replace(FILE, &new, 0o600)?;
    }
    Ok(SweepOutcome {
        had_block: true,
        removed: expired.len(),
        remaining: block.installed,
        next_expiry_ms: block.next_expiry_ms,
    })
}

/// Whether `user`'s `authorized_keys` holds a managed block (read under the same rule; any
/// refusal or error counts as no). For finding managed users when the agent's record is lost.
pub fn has_block(root: &HostRoot, account: &Account) -> bool {
    let Ok(home) = open_home(root, account) else {
        return false;
    };
    let Ok(Some(dir)) = home.subdir(".ssh") else {
        return false;
    };
    let Ok(Some(file)) = dir.read(FILE, MAX_AUTHORIZED_KEYS_BYTES) else {
        return false;
    };
    matches!(parse_block(&file.bytes, Path::new(FILE)), Ok(Some(_)))
}

/// Owner uid, gid and permission bits of a path (tests and diagnostics).
pub fn owner_and_mode(path: &Path) -> std::io::Result<(u32, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path)?;
    Ok((m.uid(), m.gid(), m.mode() & 0o7777))
}

#[cfg(test)]
#[path = "ssh_tests.rs"]
mod tests;
