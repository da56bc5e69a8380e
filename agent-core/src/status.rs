//! `<state dir>/status.json`: what the running agent says about itself, for `bcd status` (and
//! for an operator reading the file after a crash). Written atomically on every change of
//! connectivity and at most every few seconds for heartbeat acknowledgements.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// How often heartbeat acknowledgements are written at most.
pub const ACK_WRITE_EVERY: Duration = Duration::from_secs(5);

/// The file's content (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// `joining`, `connecting`, `connected`, `disconnected`, `revoked`, `refused` (the control
    /// plane refuses this identity for good; a new join token is needed), `broken` (the stored
    /// identity is unusable; `message` names the file), `stopped`.
    pub state: String,
    pub node_id: Option<String>,
    pub identity_generation: Option<u64>,
    /// The gateway URL (replica) of the open session; while joining or connecting, the one
    /// being tried.
    pub control_plane: Option<String>,
    pub session_epoch: Option<u64>,
    pub gateway_id: Option<String>,
    /// RFC 3339.
    pub last_heartbeat_ack: Option<String>,
    /// RFC 3339: the node certificate's notAfter.
    pub certificate_not_after: Option<String>,
    pub observed_generation: Option<u64>,
    /// Why the agent is in this state, for people.
    pub message: String,
    /// The agent's pid.
    pub pid: u32,
    /// `http://host:port/metrics` when the agent serves metrics (`metrics_listen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
    /// RFC 3339.
    pub updated_at: String,
    /// Site agents only: the site lease and the BMCs (never a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteStatus>,
}

/// What a site agent (`bcd site`) says about its site in `status.json` (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiteStatus {
    /// The site, once an assignment named it.
    pub site_id: Option<String>,
    /// Whether this appliance holds a valid site lease now (BMC work allowed).
    pub lease_held: bool,
    /// The lease epoch held, valid or not.
    pub lease_epoch: Option<u64>,
    /// RFC 3339: until when the lease stays valid without another renewal (local clock).
    pub lease_valid_until: Option<String>,
    /// BMCs assigned.
    pub bmcs: usize,
    /// BMCs whose last power read found no answer.
    pub bmcs_unreachable: usize,
}

/// The status file writer.
#[derive(Debug)]
pub struct StatusFile {
    path: PathBuf,
    inner: Mutex<(AgentStatus, Option<Instant>)>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl StatusFile {
    /// A writer for `<state_dir>/status.json`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            path: state_dir.join("status.json"),
            inner: Mutex::new((
                AgentStatus {
                    pid: std::process::id(),
                    ..Default::default()
                },
                None,
            )),
        }
    }

    /// Reads the file of a state dir.
    pub fn read(state_dir: &Path) -> Option<AgentStatus> {
        let text = std::fs::read_to_string(state_dir.join("status.json")).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn write(&self, s: &AgentStatus) {
        if let Ok(data) = serde_json::to_vec_pretty(s)
            && let Err(e) = bc_sys::atomic::write(&self.path, &data, 0o644)
        {
            tracing::debug!(error = %e, "status.json not written");
        }
    }

    /// Changes the status with `f` and writes it.
    pub fn update(&self, f: impl FnOnce(&mut AgentStatus)) {
        let snapshot = {
            let mut g = self.inner.lock();
            f(&mut g.0);
            g.0.updated_at = now();
            g.0.clone()
        };
        self.write(&snapshot);
    }

    /// A session opened at the gateway URL `control_plane`.
    pub fn connected(&self, epoch: u64, gateway_id: &str, control_plane: &str) {
        self.update(|s| {
            s.state = "connected".to_owned();
            s.control_plane = Some(control_plane.to_owned());
            s.session_epoch = Some(epoch);
            s.gateway_id = Some(gateway_id.to_owned());
            s.message = String::new();
        });
    }

    /// A heartbeat was acknowledged; written at most every [`ACK_WRITE_EVERY`].
    pub fn heartbeat_acked(&self, _seq: u64) {
        let snapshot = {
            let mut g = self.inner.lock();
            g.0.last_heartbeat_ack = Some(now());
            if g.1.is_some_and(|t| t.elapsed() < ACK_WRITE_EVERY) {
                return;
            }
            g.1 = Some(Instant::now());
            g.0.updated_at = now();
            g.0.clone()
        };
        self.write(&snapshot);
    }
}
