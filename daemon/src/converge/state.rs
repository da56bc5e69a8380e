//! `<state_dir>/spec.json`: what the node last applied (observed generation, last spec, the
//! installed break-glass section, the uuid → bus id memo), written atomically after each apply.

use std::collections::BTreeMap;
use std::path::Path;

use bc_protocol::spec::{BreakGlassSsh, NodeSpec};
use serde::{Deserialize, Serialize};

use super::ConvergeError;

/// File in the state dir that holds [`AppliedState`].
pub const STATE_FILE: &str = "spec.json";

/// What the node last applied, persisted as `<state_dir>/spec.json` (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedState {
    /// Highest generation that converged completely; 0 = none yet. Goes in `Hello`.
    pub observed_generation: u64,
    /// Generation of the last spec an apply was attempted for.
    pub last_generation: u64,
    /// That spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_spec: Option<NodeSpec>,
    /// The break-glass section as last written to `authorized_keys`: what the expiry timer
    /// enforces and what is cleaned up when the user changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_applied: Option<BreakGlassSsh>,
    /// NVML uuid (lowercase) → bus id, remembered for GPUs that moved to `vfio-pci`.
    #[serde(default)]
    pub gpu_uuids: BTreeMap<String, String>,
}

impl AppliedState {
    /// The state in `state_dir`; the default when there is none yet.
    pub fn load(state_dir: &Path) -> Result<Self, ConvergeError> {
        let path = state_dir.join(STATE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| ConvergeError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConvergeError::Io {
                op: "read",
                path,
                source,
            }),
        }
    }

    /// Writes the state atomically (temp file, fsync, rename, fsync of the directory), 0600.
    pub fn save(&self, state_dir: &Path) -> Result<(), ConvergeError> {
        let path = state_dir.join(STATE_FILE);
        let bytes = serde_json::to_vec_pretty(self).map_err(|source| ConvergeError::Parse {
            path: path.clone(),
            source,
        })?;
        Ok(bc_sys::atomic::write(&path, &bytes, 0o600)?)
    }

    /// Earliest `expiresAt` (ms) after `now_ms` among the installed break-glass keys.
    pub fn next_expiry_ms(&self, now_ms: i64) -> Option<i64> {
        self.ssh_applied
            .iter()
            .flat_map(|s| &s.keys)
            .filter(|k| k.expires_at.is_some() && !k.expired_at(now_ms))
            .map(|k| k.expires_at_ms())
            .min()
    }
}

/// `observedGeneration` for `Hello`: from `<state_dir>/spec.json`, 0 when absent or unreadable.
pub fn observed_generation(state_dir: &Path) -> u64 {
    AppliedState::load(state_dir).map_or(0, |s| s.observed_generation)
}
