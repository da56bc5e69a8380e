//! The node agent's side of the session core: specs go to the converge task and its statuses
//! come back, XID events go out as they happen, and every step is written to `status.json`,
//! the metrics and systemd's `STATUS=` line.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::EventType;
use bc_protocol::pb::{self, SpecStatus, agent_message};
use bc_sys::notify::Notifier;
use bcd_core::mode::{Observer, SessionHooks};
use bcd_core::session::SessionEnd;
use bcd_core::state::{Identity, cert_validity};
use bcd_core::status::StatusFile;
use bcd_probes::nvml::XidEvent;
use tokio::sync::{mpsc, watch};

/// What the agent's session loop is wired to.
#[derive(Debug)]
pub struct AgentHooks {
    /// `<state dir>/status.json`.
    pub status: StatusFile,
    /// systemd's notify socket (disabled outside systemd).
    pub notifier: Arc<Notifier>,
    /// The state dir (for the observed generation in `status.json`).
    pub state_dir: PathBuf,
    /// The converge task's input.
    pub desired: watch::Sender<crate::converge::Desired>,
    /// The converge task's output.
    pub statuses: mpsc::Receiver<SpecStatus>,
    /// The newest SpecStatus, re-sent after a reconnect.
    pub last_status: Option<SpecStatus>,
    /// XID events from the watch, forwarded as they happen.
    pub xids: mpsc::Receiver<XidEvent>,
    /// The last heartbeat sent and when, for `bcd_heartbeat_rtt_seconds` when its ack comes.
    pub heartbeat_in_flight: Option<(u64, std::time::Instant)>,
}

/// The `Event` that carries an XID to the control plane.
pub fn xid_event(x: &XidEvent) -> pb::Event {
    pb::Event {
        r#type: EventType::Xid.as_str().to_owned(),
        message: format!(
            "Xid {} on {}",
            x.xid,
            x.pci_bus_id.as_deref().unwrap_or("an unknown GPU")
        ),
        data_json: serde_json::to_vec(x).unwrap_or_default(),
        at_ms: x.observed_at.timestamp_millis(),
    }
}

impl AgentHooks {
    fn notify_status(&self, text: &str) {
        let _ = self.notifier.status(text);
    }
}

impl SessionHooks for AgentHooks {
    fn on_spec(&mut self, generation: u64, spec: pb::NodeSpec) -> Option<SpecStatus> {
        let _ = self.desired.send(Some((generation, spec)));
        None
    }

    fn on_open(&mut self) -> Option<SpecStatus> {
        self.last_status.clone()
    }

    async fn next_report(&mut self) -> agent_message::Msg {
        tokio::select! {
            Some(s) = self.statuses.recv() => {
                tracing::info!(generation = s.generation, converged = s.converged, reason = %s.reason, "spec status");
                self.last_status = Some(s.clone());
                agent_message::Msg::SpecStatus(s)
            }
            Some(x) = self.xids.recv() => {
                tracing::warn!(xid = x.xid, gpu = ?x.pci_bus_id, class = ?x.class, "XID");
                crate::metrics::global().xid(&x);
                agent_message::Msg::Event(xid_event(&x))
            }
            // Both sources gone (no converge task, no XID watch): nothing more to say.
            else => std::future::pending().await,
        }
    }
}

impl Observer for AgentHooks {
    fn joining(&mut self, control_plane: &str) {
        self.status.update(|s| {
            s.state = "joining".into();
            s.control_plane = Some(control_plane.to_owned());
        });
    }

    fn waiting_for_token(&mut self, why: &str) {
        self.status.update(|s| {
            // A refused or broken identity keeps its state and explanation: both say what to do.
            if s.state == "refused" || s.state == "broken" {
                return;
            }
            s.state = "revoked".into();
            s.message = why.to_owned();
        });
    }

    fn refused(&mut self, why: &str) {
        self.status.update(|s| {
            s.state = "refused".into();
            s.message = why.to_owned();
        });
        self.notify_status("identity refused by the control plane: waiting for a new join token");
    }

    fn identity_broken(&mut self, why: &str, rejoining: bool) {
        self.status.update(|s| {
            s.state = "broken".into();
            s.message = why.to_owned();
        });
        self.notify_status(if rejoining {
            "stored identity broken: moved aside, joining again"
        } else {
            "stored identity broken: waiting for a join token"
        });
    }

    fn identity_ready(&mut self, id: &Identity) {
        let observed = crate::converge::observed_generation(&self.state_dir);
        self.status.update(|s| {
            s.node_id = Some(id.node.node_id.clone());
            s.identity_generation = Some(id.node.identity_generation);
            s.certificate_not_after = cert_validity(&id.cert_pem)
                .and_then(|v| chrono::DateTime::from_timestamp_millis(v.not_after_ms))
                .map(|t| t.to_rfc3339());
            s.observed_generation = Some(observed);
            s.state = "connecting".into();
        });
    }

    fn revoked(&mut self, why: &str) {
        self.status.update(|s| {
            s.state = "revoked".into();
            s.message = why.to_owned();
        });
        self.notify_status("identity revoked: waiting for a new join token");
    }

    fn connecting(&mut self, control_plane: &str) {
        // The replica being tried; once the session opens, the one it is open with.
        self.status
            .update(|s| s.control_plane = Some(control_plane.to_owned()));
        self.notify_status(&format!("connecting to {control_plane}"));
    }

    fn session_open(&mut self, epoch: u64, gateway_id: &str, control_plane: &str) {
        self.status.connected(epoch, gateway_id, control_plane);
        crate::metrics::global().set_connected(true);
    }

    fn heartbeat_sent(&mut self, seq: u64) {
        self.heartbeat_in_flight = Some((seq, std::time::Instant::now()));
        crate::metrics::global().heartbeat_sent();
    }

    fn heartbeat_acked(&mut self, seq: u64) {
        self.status.heartbeat_acked(seq);
        let m = crate::metrics::global();
        m.heartbeat_acked();
        // Only the ack of the heartbeat just sent: a late ack of an older one says nothing
        // about the time this one took.
        if let Some((sent, at)) = self.heartbeat_in_flight
            && sent == seq
        {
            m.observe_heartbeat_rtt(at.elapsed());
            self.heartbeat_in_flight = None;
        }
    }

    fn session_closed(&mut self, _end: &SessionEnd, _welcomed: bool) {
        crate::metrics::global().set_connected(false);
    }

    fn disconnected(&mut self, reason: &str, retry_in: Duration) {
        crate::metrics::global().reconnect();
        self.status.update(|s| {
            s.state = "disconnected".into();
            s.message = reason.to_owned();
        });
        self.notify_status(&format!("disconnected: {reason}"));
        tracing::warn!(reason = %reason, retry_in = ?retry_in, "session ended; reconnecting");
    }

    fn stopped(&mut self) {
        let _ = self.notifier.stopping();
        self.status.update(|s| {
            s.state = "stopped".into();
        });
    }
}
