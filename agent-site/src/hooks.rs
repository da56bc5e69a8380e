//! The site agent's side of the session core: a `SiteAssignment` goes to the [`Site`], each
//! `HeartbeatAck` renews (or ends) the lease, power reports leave as the sync loop makes them,
//! and every step is written to `status.json` and told to the process around it (systemd's
//! `STATUS=` line) through [`ProcessSignals`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bc_protocol::pb::{self, SpecStatus, agent_message};
use bcd_core::mode::{Observer, SessionHooks};
use bcd_core::state::{Identity, cert_validity};
use bcd_core::status::{SiteStatus, StatusFile};

use crate::site::Site;

/// The site section of status.json is rewritten at most this often for renewals alone.
const STATUS_EVERY: Duration = Duration::from_secs(5);

/// What the process around the site agent wants to hear (the binary sends it to systemd).
pub trait ProcessSignals: Send {
    /// A one-line status for people (`STATUS=`).
    fn status(&self, _text: &str) {}
    /// The agent is stopping (`STOPPING=1`).
    fn stopping(&self) {}
}

/// No process around (tests).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSignals;

impl ProcessSignals for NoSignals {}

/// The hooks `bcd site` runs the session core with.
#[derive(Debug)]
pub struct SiteHooks<P> {
    site: Arc<Site>,
    status: StatusFile,
    signals: P,
    written: Option<(Instant, SiteStatus)>,
}

impl<P: ProcessSignals> SiteHooks<P> {
    /// Hooks for `site`, writing `status` and telling `signals`.
    pub fn new(site: Arc<Site>, status: StatusFile, signals: P) -> Self {
        Self {
            site,
            status,
            signals,
            written: None,
        }
    }

    /// Writes the site section of status.json when it changed (or, for a renewal alone, at
    /// most every [`STATUS_EVERY`]).
    fn write_site_status(&mut self, force: bool) {
        let v = self.site.view();
        let s = SiteStatus {
            site_id: v.site_id.clone(),
            lease_held: v.lease_valid,
            lease_epoch: v.lease_epoch,
            lease_valid_until: v.lease_left.and_then(|left| {
                let until = chrono::Utc::now() + chrono::Duration::from_std(left).ok()?;
                Some(until.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            }),
            bmcs: v.bmcs,
            bmcs_unreachable: v.unreachable,
        };
        let same_shape = |a: &SiteStatus| {
            a.site_id == s.site_id
                && a.lease_held == s.lease_held
                && a.lease_epoch == s.lease_epoch
                && a.bmcs == s.bmcs
                && a.bmcs_unreachable == s.bmcs_unreachable
        };
        let due = match &self.written {
            None => true,
            Some((at, prev)) => force || !same_shape(prev) || at.elapsed() >= STATUS_EVERY,
        };
        if !due {
            return;
        }
        let line = if s.lease_held {
            format!(
                "site {}: lease held (epoch {}), {} BMCs, {} not answering",
                s.site_id.as_deref().unwrap_or("-"),
                s.lease_epoch.unwrap_or(0),
                s.bmcs,
                s.bmcs_unreachable
            )
        } else {
            format!(
                "site {}: standby (no valid lease)",
                s.site_id.as_deref().unwrap_or("-")
            )
        };
        if self.written.as_ref().is_none_or(|(_, p)| !same_shape(p)) {
            self.signals.status(&line);
        }
        self.status.update(|st| st.site = Some(s.clone()));
        self.written = Some((Instant::now(), s));
    }
}

impl<P: ProcessSignals> SessionHooks for SiteHooks<P> {
    fn on_spec(&mut self, _generation: u64, _spec: pb::NodeSpec) -> Option<SpecStatus> {
        // A site appliance converges nothing; its desired state is the SiteAssignment.
        None
    }

    fn on_site_assignment(&mut self, assignment: pb::SiteAssignment) {
        self.site.apply(assignment);
        self.write_site_status(true);
    }

    fn on_heartbeat_ack(&mut self, ack: &pb::HeartbeatAck) {
        self.site.heartbeat_acked(ack);
        self.write_site_status(false);
    }

    async fn next_report(&mut self) -> agent_message::Msg {
        let report = self.site.reports.next().await;
        tracing::debug!(
            lease_epoch = report.lease_epoch,
            observations = report.observations.len(),
            "power report"
        );
        self.write_site_status(false);
        agent_message::Msg::PowerReport(report)
    }
}

impl<P: ProcessSignals> Observer for SiteHooks<P> {
    fn joining(&mut self, control_plane: &str) {
        self.status.update(|s| {
            s.state = "joining".into();
            s.control_plane = Some(control_plane.to_owned());
        });
    }

    fn waiting_for_token(&mut self, why: &str) {
        self.status.update(|s| {
            s.state = "revoked".into();
            s.message = why.to_owned();
        });
    }

    fn identity_ready(&mut self, id: &Identity) {
        self.status.update(|s| {
            s.node_id = Some(id.node.node_id.clone());
            s.identity_generation = Some(id.node.identity_generation);
            s.certificate_not_after = cert_validity(&id.cert_pem)
                .and_then(|v| chrono::DateTime::from_timestamp_millis(v.not_after_ms))
                .map(|t| t.to_rfc3339());
            s.state = "connecting".into();
        });
    }

    fn revoked(&mut self, why: &str) {
        self.status.update(|s| {
            s.state = "revoked".into();
            s.message = why.to_owned();
        });
        self.signals
            .status("identity revoked: waiting for a new join token");
    }

    fn connecting(&mut self, control_plane: &str) {
        self.status
            .update(|s| s.control_plane = Some(control_plane.to_owned()));
        self.signals
            .status(&format!("connecting to {control_plane}"));
    }

    fn session_open(&mut self, epoch: u64, gateway_id: &str, control_plane: &str) {
        self.status.connected(epoch, gateway_id, control_plane);
    }

    fn heartbeat_sent(&mut self, seq: u64) {
        self.site.heartbeat_sent(seq);
    }

    fn heartbeat_acked(&mut self, seq: u64) {
        self.status.heartbeat_acked(seq);
    }

    fn disconnected(&mut self, reason: &str, retry_in: Duration) {
        self.status.update(|s| {
            s.state = "disconnected".into();
            s.message = reason.to_owned();
        });
        self.signals.status(&format!("disconnected: {reason}"));
        tracing::warn!(reason = %reason, retry_in = ?retry_in, "session ended; reconnecting");
    }

    fn stopped(&mut self) {
        self.signals.stopping();
        self.status.update(|s| s.state = "stopped".into());
    }
}
