//! Which users' `authorized_keys` hold a managed break-glass block: a small record in the state
//! dir, so the agent can expire keys and remove old blocks without `spec.json`, and a scan of
//! the local accounts when that record is lost too.
//!
//! # Design
//! - `<state_dir>/break-glass-users.json` (`{"users": ["ops"]}`, 0600, atomic writes) lists
//!   every user a block was written for. A user is added before its block is written (a crash
//!   in between leaves a listed user without a block, which costs one look) and removed once
//!   its block is gone.
//! - When the record is missing or unreadable, the agent scans `<root>/etc/passwd` once: every
//!   account whose `~/.ssh/authorized_keys` (read under [`bc_sys::userfile`]'s rule) holds the
//!   BEGIN marker is managed. The result is written back. Only local accounts are scanned (not
//!   NSS): break-glass users are local, and walking every directory-service home (often on
//!   NFS) from a root daemon is not acceptable.
//! - Failing to write the record is logged, not fatal: the scan finds the blocks again.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use bcd_probes::hostroot::HostRoot;
use serde::{Deserialize, Serialize};

use super::ssh;

/// The record's file name in the state dir.
pub const MANAGED_FILE: &str = "break-glass-users.json";

/// The record's content (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    /// Users whose `authorized_keys` may hold a managed block.
    users: BTreeSet<String>,
}

/// The managed users, kept in the state dir.
#[derive(Debug)]
pub struct ManagedUsers {
    path: PathBuf,
    users: BTreeSet<String>,
}

impl ManagedUsers {
    /// The record of `state_dir`; when it is missing or unreadable, the users found by
    /// scanning the local accounts of `root` (then written back).
    pub fn open(root: &HostRoot, state_dir: &Path) -> Self {
        let path = state_dir.join(MANAGED_FILE);
        let loaded = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Record>(&bytes) {
                Ok(r) => Some(r.users),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "break-glass user record unreadable; scanning local accounts for managed blocks");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "break-glass user record unreadable; scanning local accounts for managed blocks");
                None
            }
        };
        match loaded {
            Some(users) => Self { path, users },
            None => {
                let users = scan(root);
                if !users.is_empty() {
                    tracing::info!(users = ?users, "found managed break-glass blocks by scanning local accounts");
                }
                let me = Self { path, users };
                me.save();
                me
            }
        }
    }

    /// The users, sorted.
    pub fn users(&self) -> Vec<String> {
        self.users.iter().cloned().collect()
    }

    /// Records `user` (before its block is written).
    pub fn add(&mut self, user: &str) {
        if self.users.insert(user.to_owned()) {
            self.save();
        }
    }

    /// Forgets `user` (its block is gone).
    pub fn remove(&mut self, user: &str) {
        if self.users.remove(user) {
            self.save();
        }
    }

    fn save(&self) {
        let record = Record {
            users: self.users.clone(),
        };
        let result = serde_json::to_vec_pretty(&record)
            .map_err(|e| e.to_string())
            .and_then(|b| bc_sys::atomic::write(&self.path, &b, 0o600).map_err(|e| e.to_string()));
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot write the break-glass user record; a restart scans local accounts instead");
        }
    }
}

/// Local accounts (`<root>/etc/passwd`) whose `authorized_keys` holds a managed block.
pub fn scan(root: &HostRoot) -> BTreeSet<String> {
    ssh::passwd_accounts(root)
        .into_iter()
        .filter(|a| ssh::has_block(root, a))
        .map(|a| a.name)
        .collect()
}
