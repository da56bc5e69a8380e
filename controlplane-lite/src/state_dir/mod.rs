//! The state dir of `bcctl serve`: who may use it (an exclusive lock for the process's life,
//! issue 19.6) and whether it is whole (issue 19.5).
//!
//! # Design
//! - **Private**: the dir is made 0700 whatever the umask, an existing one too, before anything
//!   is read or written in it.
//! - **Lock**: `serve.lock` in the dir, `flock(LOCK_EX | LOCK_NB)`, held until the process ends
//!   (the kernel drops it with the process, so a `kill -9` leaves no stale lock). The holder writes
//!   its pid into the file; a second `bcctl serve` on the dir exits naming that pid, before it
//!   touches anything (it neither rewrites nor deletes the first one's `endpoints.json`).
//! - **Ever initialised**: the dir holds the marker `state-dir.json` (written once the CA, the
//!   store and the API token exist, with the CA pin), or any of `state.db`, `ca.key`, `ca.crt`
//!   (a dir from before the marker existed; it gets the marker at its next good start). Such a dir
//!   must hold all three, each a non-empty readable regular file (`state.db` a SQLite file,
//!   `ca.key` and `ca.crt` a key and a certificate that belong together, with the pin the marker
//!   recorded), or the start is refused naming the file and the recovery. Nothing is ever
//!   re-created in it: a new CA would cut off every enrolled agent, an empty store would forget
//!   every node.
//! - **Initialising**: only a dir that was never initialised. Without `--init` only an empty one
//!   (absent, or holding nothing but the lock file): a typo in `--state-dir` pointing at some
//!   other directory is refused instead of filled. `--init` says it explicitly: it initialises a
//!   never-initialised dir whatever else is in it (logs), and is refused on an initialised one.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The lock file.
pub const LOCK_FILE: &str = "serve.lock";
/// The marker of an initialised dir.
pub const MARKER_FILE: &str = "state-dir.json";
/// The store.
pub const STORE_FILE: &str = "state.db";
/// The CA's private key (0600).
pub const CA_KEY_FILE: &str = "ca.key";
/// The CA's certificate.
pub const CA_CERT_FILE: &str = "ca.crt";
/// The key BMC credentials are sealed under (0600, hex): made at initialisation.
pub const BMC_KEY_FILE: &str = "bmc-credentials.key";

/// What another replica's state dir must hold, copied from the first replica's, to serve the
/// same PostgreSQL store: the CA that node certificates chain to, the operator token, the key
/// sealed BMC credentials open with, and the marker (docs/operator-guide.md "Several replicas
/// on one database"). The store refuses a replica with another CA or BMC key at start.
pub const REPLICA_FILES: [&str; 5] = [
    CA_KEY_FILE,
    CA_CERT_FILE,
    crate::server::API_TOKEN_FILE,
    BMC_KEY_FILE,
    MARKER_FILE,
];

/// The files an initialised dir must hold.
const REQUIRED: [&str; 3] = [STORE_FILE, CA_KEY_FILE, CA_CERT_FILE];

/// What is wrong with the state dir.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// A file of the dir could not be made, read or written.
    #[error("state dir {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another process holds the dir.
    #[error(
        "state dir {dir} is in use by another bcctl serve (pid {pid}; lock file {lock}): stop that one first, or give this one another --state-dir"
    )]
    Locked {
        dir: PathBuf,
        pid: String,
        lock: PathBuf,
    },
    /// An initialised dir lacks a file or holds a broken one.
    #[error(
        "state dir {dir} was initialised ({evidence}) but {file} {problem}. bcctl serve will not start on it, and never makes a new CA or an empty store in its place (that would cut off every enrolled agent or forget every node): restore {file} from a backup of this state dir. To start over instead (every node must join again with a new token and CA pin), move the whole dir aside and run bcctl serve --init on an empty one"
    )]
    Damaged {
        dir: PathBuf,
        file: PathBuf,
        problem: String,
        evidence: String,
    },
    /// A never-initialised dir that is not empty, without `--init`.
    #[error(
        "state dir {dir} was never initialised by bcctl serve but is not empty (it holds {found}): give a new or empty dir, or run bcctl serve --init to initialise this one"
    )]
    NotEmpty { dir: PathBuf, found: String },
    /// `--init` on an initialised dir.
    #[error(
        "state dir {dir} is already initialised ({evidence}); --init only initialises a new dir: start without --init"
    )]
    AlreadyInitialised { dir: PathBuf, evidence: String },
    /// A secret file (the BMC credentials key) may be read by the group or others.
    #[error(
        "{file} is readable by its group or others (mode {mode:o}): it is the key every BMC password in the store is sealed under. bcctl serve will not start until it is private: chmod 600 {file} (and check who may have read it; rotate the BMC credentials if in doubt)"
    )]
    Exposed { file: PathBuf, mode: u32 },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateDirError + '_ {
    move |source| StateDirError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Creates `dir` 0700 (whatever the umask) and makes an existing one 0700: it holds the CA key,
/// the API token and every node record.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
}

/// How `bcctl serve` may initialise a dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Init {
    /// Without `--init`: an empty (or absent) dir only.
    #[default]
    IfEmpty,
    /// `--init`: a never-initialised dir, whatever else it holds; an initialised one is refused.
    Explicit,
}

/// What the marker records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// RFC 3339.
    pub initialised_at: String,
    /// The CA pin the dir was initialised with.
    pub ca_pin: String,
    /// Whether `bmc-credentials.key` was made in this dir: from then on it must be there (the
    /// sealed BMC credentials in the store open with it alone).
    #[serde(default)]
    pub bmc_credentials_key: bool,
}

/// A locked state dir; the lock lasts as long as this value (and at most the process).
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    _lock: Flock<File>,
}

impl StateDir {
    /// Creates `path` (0700) if needed and takes its lock, writing this process's pid into the
    /// lock file. Errors: [`StateDirError::Locked`] naming the holder's pid.
    pub fn lock(path: &Path) -> Result<Self, StateDirError> {
        private_dir(path).map_err(io(path))?;
        let lock_path = path.join(LOCK_FILE);
        // Not truncated before the lock is ours: the holder's pid must stay readable.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&lock_path)
            .map_err(io(&lock_path))?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(StateDirError::Locked {
                    dir: path.to_owned(),
                    pid: if pid.is_empty() {
                        "unknown".to_owned()
                    } else {
                        pid.to_owned()
                    },
                    lock: lock_path,
                });
            }
            Err((_, errno)) => return Err(io(&lock_path)(std::io::Error::from(errno))),
        };
        lock.set_len(0).map_err(io(&lock_path))?;
        lock.rewind().map_err(io(&lock_path))?;
        writeln!(lock, "{}", std::process::id()).map_err(io(&lock_path))?;
        lock.sync_all().map_err(io(&lock_path))?;
        Ok(Self {
            path: path.to_owned(),
            _lock: lock,
        })
    }

    /// The dir.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks the dir against `init`: `Ok(true)` when it must be initialised now, `Ok(false)`
    /// when it is initialised and whole. The CA files are checked further when they are loaded
    /// ([`crate::ca::CertificateAuthority::load`]); their pin against the marker's by
    /// [`StateDir::check_pin`].
    pub fn check(&self, init: Init) -> Result<bool, StateDirError> {
        self.check_with(init, false)
    }

    /// [`StateDir::check`] for a control plane whose store is a database server
    /// (`--store postgres://…`): the dir holds the CA and keys but no `state.db`.
    pub fn check_with(&self, init: Init, external_store: bool) -> Result<bool, StateDirError> {
        let dir = &self.path;
        let evidence = self.evidence();
        match (evidence, init) {
            (Some(evidence), Init::Explicit) => Err(StateDirError::AlreadyInitialised {
                dir: dir.clone(),
                evidence,
            }),
            (Some(evidence), Init::IfEmpty) => {
                for name in REQUIRED {
                    if external_store && name == STORE_FILE {
                        continue;
                    }
                    self.check_file(name, &evidence)?;
                }
                Ok(false)
            }
            (None, Init::Explicit) => Ok(true),
            (None, Init::IfEmpty) => {
                let mut found: Vec<String> = fs::read_dir(dir)
                    .map_err(io(dir))?
                    .filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n != LOCK_FILE)
                    .collect();
                if found.is_empty() {
                    return Ok(true);
                }
                found.sort();
                found.truncate(5);
                Err(StateDirError::NotEmpty {
                    dir: dir.clone(),
                    found: found.join(", "),
                })
            }
        }
    }

    /// What shows the dir was initialised, or `None`.
    fn evidence(&self) -> Option<String> {
        let present = |n: &str| fs::symlink_metadata(self.path.join(n)).is_ok();
        if present(MARKER_FILE) {
            return Some(format!("it has {MARKER_FILE}"));
        }
        REQUIRED
            .iter()
            .find(|n| present(n))
            .map(|n| format!("it has {n}"))
    }

    fn check_file(&self, name: &str, evidence: &str) -> Result<(), StateDirError> {
        let path = self.path.join(name);
        let damaged = |problem: String| StateDirError::Damaged {
            dir: self.path.clone(),
            file: path.clone(),
            problem,
            evidence: evidence.to_owned(),
        };
        let meta = match fs::metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(damaged("is missing".to_owned()));
            }
            Err(e) => return Err(damaged(format!("cannot be read: {e}"))),
        };
        if !meta.is_file() {
            return Err(damaged("is not a regular file".to_owned()));
        }
        if meta.len() == 0 {
            return Err(damaged("is empty (0 bytes)".to_owned()));
        }
        let mut head = [0u8; 16];
        let mut f = File::open(&path).map_err(|e| damaged(format!("cannot be read: {e}")))?;
        let n = f
            .read(&mut head)
            .map_err(|e| damaged(format!("cannot be read: {e}")))?;
        if name == STORE_FILE && &head[..n] != b"SQLite format 3\0" {
            return Err(damaged("is not a SQLite database".to_owned()));
        }
        Ok(())
    }

    /// The marker, if the dir has one. Errors: it exists but cannot be read or parsed.
    pub fn marker(&self) -> Result<Option<Marker>, StateDirError> {
        let path = self.path.join(MARKER_FILE);
        match fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| StateDirError::Damaged {
                    dir: self.path.clone(),
                    file: path.clone(),
                    problem: format!("is not valid: {e}"),
                    evidence: format!("it has {MARKER_FILE}"),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path)(e)),
        }
    }

    /// Refuses a `ca.crt` whose pin is not the one the dir was initialised with (a certificate
    /// restored from another state dir would change the pin every agent checks).
    pub fn check_pin(&self, pin: &str) -> Result<(), StateDirError> {
        match self.marker()? {
            Some(m) if m.ca_pin != pin => Err(StateDirError::Damaged {
                dir: self.path.clone(),
                file: self.path.join(CA_CERT_FILE),
                problem: format!(
                    "is not the CA this dir was initialised with (its pin is {pin}; {MARKER_FILE} records {})",
                    m.ca_pin
                ),
                evidence: format!("it has {MARKER_FILE}"),
            }),
            _ => Ok(()),
        }
    }

    /// Writes the marker with `ca_pin` unless the dir has one (atomically, 0644).
    pub fn mark_initialised(&self, ca_pin: &str) -> Result<(), StateDirError> {
        if self.marker()?.is_some() {
            return Ok(());
        }
        let m = Marker {
            initialised_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            ca_pin: ca_pin.to_owned(),
            bmc_credentials_key: true,
        };
        let path = self.path.join(MARKER_FILE);
        let text = serde_json::to_string_pretty(&m).unwrap_or_default();
        crate::ca::write_atomic(&path, format!("{text}\n").as_bytes(), 0o644).map_err(|e| {
            StateDirError::Io {
                path: path.clone(),
                source: std::io::Error::other(e.to_string()),
            }
        })
    }
}

impl StateDir {
    /// The BMC credentials key (`bmc-credentials.key`, 0600): made when the dir is initialised
    /// (`fresh`) or when a dir initialised before the key existed starts for the first time
    /// (recorded in the marker); afterwards it must be there and whole, or the start is refused
    /// (the store's sealed credentials open with it alone; a new key would lose them all), as it
    /// is when the group or others may read it ([`StateDirError::Exposed`]).
    pub fn bmc_key(
        &self,
        fresh: bool,
    ) -> Result<cpl_core::bare_metal::CredentialKey, StateDirError> {
        use cpl_core::bare_metal::CredentialKey;
        use std::os::unix::fs::PermissionsExt;
        let path = self.path.join(BMC_KEY_FILE);
        let marker = self.marker()?;
        let recorded = marker.as_ref().is_some_and(|m| m.bmc_credentials_key);
        let damaged = |problem: String| StateDirError::Damaged {
            dir: self.path.clone(),
            file: path.clone(),
            problem,
            evidence: format!("{MARKER_FILE} records that it was made"),
        };
        match fs::read_to_string(&path) {
            Ok(text) => {
                let key = hex::decode(text.trim())
                    .ok()
                    .and_then(|b| CredentialKey::from_bytes(&b).ok())
                    .ok_or_else(|| {
                        damaged(format!("is not {} hex-encoded bytes", CredentialKey::LEN))
                    })?;
                let mode = fs::metadata(&path).map_err(io(&path))?.permissions().mode();
                if mode & 0o077 != 0 {
                    return Err(StateDirError::Exposed {
                        file: path.clone(),
                        mode: mode & 0o777,
                    });
                }
                Ok(key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && (fresh || !recorded) => {
                let key = CredentialKey::generate();
                crate::ca::write_atomic(
                    &path,
                    format!("{}\n", hex::encode(key.to_bytes())).as_bytes(),
                    0o600,
                )
                .map_err(|e| StateDirError::Io {
                    path: path.clone(),
                    source: std::io::Error::other(e.to_string()),
                })?;
                if let Some(mut m) = marker {
                    m.bmc_credentials_key = true;
                    let mpath = self.path.join(MARKER_FILE);
                    let text = serde_json::to_string_pretty(&m).unwrap_or_default();
                    crate::ca::write_atomic(&mpath, format!("{text}\n").as_bytes(), 0o644)
                        .map_err(|e| StateDirError::Io {
                            path: mpath.clone(),
                            source: std::io::Error::other(e.to_string()),
                        })?;
                }
                Ok(key)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(damaged("is missing".to_owned()))
            }
            Err(e) => Err(damaged(format!("cannot be read: {e}"))),
        }
    }
}

pub(crate) mod agreement;

#[cfg(test)]
mod state_dir_tests;
