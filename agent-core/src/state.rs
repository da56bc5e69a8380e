//! The agent's state dir (default `/var/lib/bcd`): `key.pem` (0600, never leaves the machine),
//! `cert.pem`, `ca.pem`, `node.json` (node id, identity generation, control plane), and
//! `agent.lock` (the running agent's pid, under its `flock`). Every write is atomic ([`bc_sys::atomic::write`]): temp file, fsync, rename, fsync of the directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use bc_sys::atomic;
use serde::{Deserialize, Serialize};

/// What went wrong with the state dir.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file could not be replaced atomically.
    #[error(transparent)]
    Write(#[from] bc_sys::atomic::AtomicWriteError),
    /// The state dir's lock ([`LOCK_FILE`]) is held by another process, or cannot be taken.
    #[error(transparent)]
    Lock(#[from] bc_sys::lockfile::LockError),
    /// `node.json` is not what we wrote.
    #[error("{path} is corrupt: {source}; {}", BROKEN_ADVICE)]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A path of the state dir is a directory where a file must be, or the other way round
    /// (an operator's `mkdir` or `cp` gone wrong). Not a broken identity: nothing is moved aside
    /// by the agent, the operator is told to.
    #[error(
        "{path} {found}, but {want}: move it aside (mv {path} {path}.aside) and start the agent again{after}"
    )]
    WrongKind {
        path: PathBuf,
        /// What is there: `is a directory`, `is not a directory`.
        found: &'static str,
        /// What must be there and why.
        want: &'static str,
        /// What happens once it is gone.
        after: &'static str,
    },
    /// A file of the stored identity is missing, unreadable as what it must be, or does not
    /// match the others (the key not the certificate's, a CA that did not issue it, `node.json`
    /// naming another node than the certificate).
    #[error("{path}: {problem}; {}", BROKEN_ADVICE)]
    Broken {
        /// The file at fault (for a mismatch, the one named first in `problem`).
        path: PathBuf,
        /// What is wrong with it, for people.
        problem: String,
    },
}

/// What every broken-identity message ends with: what to do about it.
pub const BROKEN_ADVICE: &str = "the node identity in the state dir cannot be used. Give the agent a join token (--join-token, or a token in join_token_file) to move it aside and join again, or restore the file from a backup";

impl StateError {
    /// Whether the stored identity is unusable as it is (as opposed to a failed system call):
    /// a join token can replace it.
    pub fn is_broken(&self) -> bool {
        matches!(self, StateError::Corrupt { .. } | StateError::Broken { .. })
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The lock file in the state dir: the one process using the dir holds an exclusive
/// `flock(2)` on it and has written its pid in it.
pub const LOCK_FILE: &str = "agent.lock";

/// `node.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFile {
    pub node_id: String,
    pub identity_generation: u64,
    /// The gateway URL this identity belongs to.
    pub control_plane: String,
    pub trust_domain: String,
    /// RFC 3339.
    pub joined_at: String,
}

/// A complete identity: who we are and how we prove it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node: NodeFile,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

/// Validity of a certificate, ms since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// Reads notBefore/notAfter of the first certificate in `pem`.
pub fn cert_validity(pem: &str) -> Option<Validity> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).ok()?;
    let cert = p.parse_x509().ok()?;
    let v = cert.validity();
    Some(Validity {
        not_before_ms: v.not_before.timestamp().saturating_mul(1000),
        not_after_ms: v.not_after.timestamp().saturating_mul(1000),
    })
}

/// The state dir.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// Opens (creating, mode 0700) the state dir.
    pub fn open(dir: &Path) -> Result<Self, StateError> {
        fs::create_dir_all(dir).map_err(io(dir))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Takes the state dir's exclusive lock ([`LOCK_FILE`], [`bc_sys::lockfile`]) without
    /// waiting: one agent per state dir. Keep it for the process's life. Held by another process:
    /// [`StateError::Lock`] with that process's pid.
    pub fn lock(&self) -> Result<bc_sys::lockfile::DirLock, StateError> {
        Ok(bc_sys::lockfile::lock(&self.file(LOCK_FILE))?)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The stored identity as its files say, not yet checked (see
    /// [`crate::identity_check::check`]); `None` when the node has not joined (no `node.json`).
    /// A missing or non-text key, certificate or CA file is [`StateError::Broken`].
    pub fn load_identity(&self) -> Result<Option<Identity>, StateError> {
        let node_path = self.file("node.json");
        let text = match fs::read_to_string(&node_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::IsADirectory => {
                return Err(StateError::WrongKind {
                    path: node_path,
                    found: "is a directory",
                    want: "node.json must be the file that names this node's identity",
                    after: " (without node.json the agent joins again with its join token)",
                });
            }
            Err(e) => return Err(io(&node_path)(e)),
        };
        let node: NodeFile = serde_json::from_str(&text).map_err(|source| StateError::Corrupt {
            path: node_path.clone(),
            source,
        })?;
        let read = |name: &str| {
            let p = self.file(name);
            fs::read_to_string(&p).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => StateError::Broken {
                    path: p.clone(),
                    problem: "is missing (node.json is there)".to_owned(),
                },
                std::io::ErrorKind::IsADirectory => StateError::WrongKind {
                    path: p.clone(),
                    found: "is a directory",
                    want: "it must be a file of the node's identity (PEM)",
                    after: "",
                },
                std::io::ErrorKind::InvalidData => StateError::Broken {
                    path: p.clone(),
                    problem: "is not text (not PEM)".to_owned(),
                },
                _ => io(&p)(e),
            })
        };
        Ok(Some(Identity {
            node,
            key_pem: read("key.pem")?,
            cert_pem: read("cert.pem")?,
            ca_pem: read("ca.pem")?,
        }))
    }

    /// Moves a dead identity (revoked, deleted, expired) aside as `*.retired-<ms>` so it is never
    /// used again but stays for an operator to read.
    pub fn retire_identity(&self, why: &str) -> Result<(), StateError> {
        let stamp = chrono::Utc::now().timestamp_millis();
        for name in ["node.json", "cert.pem", "key.pem"] {
            let from = self.file(name);
            if from.exists() {
                let to = self.file(&format!("{name}.retired-{stamp}"));
                fs::rename(&from, &to).map_err(io(&from))?;
            }
        }
        let note = self.file(&format!("retired-{stamp}.txt"));
        Ok(atomic::write(&note, why.as_bytes(), 0o644)?)
    }

    /// Replaces the certificate and key after a renewal (the node id and generation stay).
    pub fn replace_certificate(&self, key_pem: &str, cert_pem: &str) -> Result<(), StateError> {
        atomic::write(&self.file("key.pem"), key_pem.as_bytes(), 0o600)?;
        Ok(atomic::write(
            &self.file("cert.pem"),
            cert_pem.as_bytes(),
            0o644,
        )?)
    }

    /// Stores an identity. `node.json` is written last, so a crash mid-way leaves no half identity.
    pub fn save_identity(&self, id: &Identity) -> Result<(), StateError> {
        atomic::write(&self.file("key.pem"), id.key_pem.as_bytes(), 0o600)?;
        atomic::write(&self.file("cert.pem"), id.cert_pem.as_bytes(), 0o644)?;
        atomic::write(&self.file("ca.pem"), id.ca_pem.as_bytes(), 0o644)?;
        let json = serde_json::to_vec_pretty(&id.node).map_err(|source| StateError::Corrupt {
            path: self.file("node.json"),
            source,
        })?;
        Ok(atomic::write(&self.file("node.json"), &json, 0o644)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_round_trips_with_a_private_key_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let sd = StateDir::open(&dir.path().join("bcd"))?;
        assert!(sd.load_identity()?.is_none());
        let id = Identity {
            node: NodeFile {
                node_id: "node_a".into(),
                identity_generation: 2,
                control_plane: "https://127.0.0.1:1".into(),
                trust_domain: "bc.test".into(),
                joined_at: "2026-01-01T00:00:00Z".into(),
            },
            key_pem: "KEY".into(),
            cert_pem: "CERT".into(),
            ca_pem: "CA".into(),
        };
        sd.save_identity(&id)?;
        let back = sd.load_identity()?.ok_or("identity missing")?;
        assert_eq!(back.node, id.node);
        let mode = fs::metadata(sd.path().join("key.pem"))?
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        fs::write(sd.path().join("node.json"), b"{not json")?;
        assert!(matches!(
            sd.load_identity(),
            Err(StateError::Corrupt { .. })
        ));
        Ok(())
    }
}
