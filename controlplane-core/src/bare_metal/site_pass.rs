//! The per-site passes of the controller (`super::controller`): the site lease rule over every
//! site with site agents ([`BareMetal::sweep_leases`], the rule itself is [`super::lease`]), and
//! the `enrolling` workflow's verifications — `bmc.verify` for every enrollment waiting for one
//! on its site's lease holder, and the enrollments past their deadline failed
//! ([`BareMetal::verification_pass`]).

use bc_protocol::ProvisionState;
use cpl_store::{BmcRecord, duration_ms};

use super::lease::{Agent, Moved, apply, decide};
use super::{BareMetal, verify};
use crate::error::OpError;

/// What the verification pass does to one enrolling node.
fn due(b: &BmcRecord, now: i64, deadline_ms: i64) -> bool {
    b.verified_at.is_none()
        && b.verify_started_at
            .is_some_and(|t| now >= t.saturating_add(deadline_ms))
}

impl BareMetal {
    /// Loads the lease view from the store (at start, and after every change).
    pub async fn load_leases(&self) -> Result<(), OpError> {
        let leases = self
            .store
            .read(|r| r.site_leases().map_err(OpError::from))
            .await?;
        self.leases.set(&leases);
        Ok(())
    }

    /// One pass of the lease rule over every site with site agents, at `now`. Returns how many
    /// leases were granted or moved.
    pub async fn sweep_leases(&self, now: i64, in_grace: bool) -> Result<usize, OpError> {
        let sites = self
            .store
            .read(|r| r.sites_with_agents().map_err(OpError::from))
            .await?;
        let mut changed = 0;
        for site in sites {
            let sessions = std::sync::Arc::clone(&self.sessions);
            let ttl = duration_ms(self.cfg.lease_ttl);
            let s = site.clone();
            let moved = self
                .store
                .write(move |tx| {
                    let mut agents = Vec::new();
                    for id in tx.site_agent_ids(&s)? {
                        let node = tx.node(&id)?;
                        agents.push(Agent {
                            live: sessions.live_epoch(&id).is_some(),
                            node_id: id,
                            last_seen: node.as_ref().and_then(|n| n.last_seen),
                            connected_at: node.as_ref().and_then(|n| n.connected_at),
                        });
                    }
                    let lease = tx.site_lease(&s)?;
                    let d = decide(lease.as_ref(), &agents, now, ttl, in_grace);
                    apply(tx, &s, &d, now, ttl)
                })
                .await?;
            if moved.new_holder.is_none() && moved.old_holder.is_none() {
                continue;
            }
            changed += 1;
            self.after_move(&site, moved).await;
        }
        Ok(changed)
    }

    /// After a grant or move: the view, both agents' assignments, cancels for the commands the
    /// old holder must not finish, and the enrollments that waited for a holder.
    async fn after_move(&self, site_id: &str, moved: Moved) {
        if let Err(e) = self.load_leases().await {
            tracing::error!(error = %e, "reloading the site leases failed");
        }
        let span = tracing::info_span!("site", site_id = %site_id);
        span.in_scope(|| {
            tracing::info!(
                holder = moved.new_holder.as_deref().unwrap_or("none"),
                previous = moved.old_holder.as_deref().unwrap_or("none"),
                failed_commands = moved.failed.len(),
                "site lease granted"
            )
        });
        if let Some(old) = &moved.old_holder {
            for c in &moved.failed {
                let msg = bc_protocol::pb::GatewayMessage {
                    msg: Some(bc_protocol::pb::gateway_message::Msg::Cancel(
                        bc_protocol::pb::Cancel { id: c.id.clone() },
                    )),
                };
                let _ = self.sessions.send(old, msg).await;
            }
            self.push_assignment(old).await;
        }
        if let Some(new) = &moved.new_holder {
            self.push_assignment(new).await;
        }
        self.issue_verifications(site_id).await;
    }

    /// Issues `bmc.verify` to the holder of `site_id`'s lease for every `enrolling` node of the
    /// site that waits for one; sends the holder its assignment first (it must know the BMC).
    pub async fn issue_verifications(&self, site_id: &str) {
        let Some((holder, _)) = self.leases.holder_of(site_id) else {
            return;
        };
        if self.sessions.live_epoch(&holder).is_none() {
            return;
        }
        let (site, h) = (site_id.to_owned(), holder.clone());
        let timeout = duration_ms(self.cfg.command_timeout);
        let issued = self
            .store
            .write(move |tx| verify::issue(tx, &site, &h, timeout))
            .await;
        match issued {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(site_id = %site_id, holder = %holder, verifications = n, "bmc.verify issued");
                self.push_assignment(&holder).await;
                self.commands.dispatch(&holder, false).await;
            }
            Err(e) => tracing::error!(site_id = %site_id, error = %e, "issuing bmc.verify failed"),
        }
    }

    /// The controller's pass over enrollments at `now`: those past their deadline fail (with
    /// why: no site agent held the lease, or the BMC was not verified in time); the others get
    /// a verification if their site has a holder.
    pub async fn verification_pass(&self, now: i64) {
        let deadline = duration_ms(self.cfg.verify_deadline);
        let pending = match self
            .store
            .read(|r| {
                r.bmcs_in_state(ProvisionState::Enrolling.as_str())
                    .map_err(OpError::from)
            })
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "reading enrollments failed");
                return;
            }
        };
        let mut sites = std::collections::BTreeSet::new();
        for b in pending {
            if !due(&b, now, deadline) {
                let id = b.node_id.clone();
                if b.verified_at.is_none()
                    && let Ok(Some(n)) = self
                        .store
                        .read(move |r| r.node(&id).map_err(OpError::from))
                        .await
                    && let Some(s) = n.site_id
                {
                    sites.insert(s);
                }
                continue;
            }
            let limit = self.cfg.verify_deadline;
            let id = b.node_id.clone();
            let r = self
                .store
                .write(move |tx| verify::fail_overdue(tx, &id, limit))
                .await;
            if let Err(e) = r {
                tracing::error!(node_id = %b.node_id, error = %e, "failing an overdue enrollment failed");
            }
        }
        for s in sites {
            self.issue_verifications(&s).await;
        }
    }
}
