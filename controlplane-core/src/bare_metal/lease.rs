//! The site lease: which site agent of a site does its BMC work, at which epoch, until when.
//!
//! [`decide`] is the rule (pure, tested on its own); `BareMetal::run_leases` the controller
//! that applies it on every tick: grants, moves (failing the old holder's open `bmc.*` commands
//! with `LEASE_LOST`, never re-sending them), assignments to both agents, and the enrollments
//! waiting for a holder. [`LeaseView`] is the in-memory copy the gateway answers heartbeats from.

use std::collections::HashMap;

use bc_protocol::commands::CommandErrorCode;
use cpl_store::{CommandRecord, CommandState, SiteLease, Tx};
use parking_lot::Mutex;

use crate::edit::Edit;
use crate::error::OpError;

/// A site agent as the lease rule sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agent {
    pub node_id: String,
    /// It has a live session on this control plane.
    pub live: bool,
    /// Its last heartbeat written (ms).
    pub last_seen: Option<i64>,
    /// When its current session opened (ms; the node's `connectedAt`).
    pub connected_at: Option<i64>,
}

/// What the rule says to do with a site's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Leave it as it is.
    Keep,
    /// Grant it to `to` at `epoch` (the previous holder `from`, if any, loses it).
    Grant {
        to: String,
        epoch: u64,
        from: Option<String>,
        why: String,
    },
    /// The holder is no longer a site agent of the site and nobody can take over.
    Release { from: String, why: String },
}

/// The lease rule at `now` for a site whose lease is `lease` and whose site agents are
/// `agents`. A valid lease is kept; during the start-up grace a holder that is still a site
/// agent of the site keeps it even when it lapsed (it is reconnecting); otherwise a lapsed
/// holder that is live and heard from within the TTL keeps it too (its renewal is on its way),
/// and anyone else goes to the live site agent heard from within the TTL whose session has
/// been open longest (the earliest `connectedAt`; the lowest id among equals).
pub fn decide(
    lease: Option<&SiteLease>,
    agents: &[Agent],
    now: i64,
    ttl_ms: i64,
    in_grace: bool,
) -> Decision {
    let fresh = |a: &Agent| a.live && a.last_seen.is_some_and(|t| t >= now - ttl_ms);
    let holder = lease.and_then(|l| l.holder_node_id.clone());
    let holder_agent = holder
        .as_deref()
        .and_then(|h| agents.iter().find(|a| a.node_id == h));
    if let (Some(l), Some(h)) = (lease, holder_agent) {
        let valid = l.expires_at.is_some_and(|e| e > now);
        if valid || in_grace || fresh(h) {
            return Decision::Keep;
        }
    }
    let mut candidates: Vec<&Agent> = agents
        .iter()
        .filter(|a| fresh(a) && Some(a.node_id.as_str()) != holder.as_deref())
        .collect();
    // The standby connected longest first: a machine that just joined with a site token must
    // not take the BMCs from the appliance that has stood by (issue 30.10). Ties by id keep the
    // rule a function of its input.
    candidates.sort_by(|a, b| {
        (a.connected_at.unwrap_or(i64::MAX), &a.node_id)
            .cmp(&(b.connected_at.unwrap_or(i64::MAX), &b.node_id))
    });
    let epoch = lease.map_or(0, |l| l.epoch) + 1;
    match (candidates.first(), holder, holder_agent) {
        (Some(c), from, h) => Decision::Grant {
            to: c.node_id.clone(),
            epoch,
            why: match (&from, h) {
                (None, _) => "no site agent held it".to_owned(),
                (Some(f), None) => format!("{f} is no longer a site agent of this site"),
                (Some(f), Some(h)) if !h.live => {
                    format!("{f} disconnected and its lease lapsed")
                }
                (Some(f), Some(_)) => format!("{f} went silent and its lease lapsed"),
            },
            from,
        },
        (None, Some(from), None) => Decision::Release {
            why: format!("{from} is no longer a site agent of this site"),
            from,
        },
        (None, _, _) => Decision::Keep,
    }
}

/// The leases as the gateway needs them for heartbeat acknowledgements: holder -> (site, epoch),
/// and the renewals noted since the last flush.
#[derive(Debug, Default)]
pub struct LeaseView {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_holder: HashMap<String, (String, u64)>,
    renewals: HashMap<String, (u64, i64)>,
}

impl LeaseView {
    /// Replaces the view with `leases` (as stored).
    pub fn set(&self, leases: &[SiteLease]) {
        let mut g = self.inner.lock();
        g.by_holder = leases
            .iter()
            .filter_map(|l| {
                l.holder_node_id
                    .clone()
                    .map(|h| (h, (l.site_id.clone(), l.epoch)))
            })
            .collect();
    }

    /// A heartbeat of `node_id` at `now`: when it holds a lease, the lease is renewed until
    /// `now + ttl_ms` (written by the next flush) and that expiry is returned; 0 otherwise.
    pub fn renew(&self, node_id: &str, now: i64, ttl_ms: i64) -> i64 {
        let mut g = self.inner.lock();
        let Some((_, epoch)) = g.by_holder.get(node_id).cloned() else {
            return 0;
        };
        let until = now.saturating_add(ttl_ms);
        g.renewals.insert(node_id.to_owned(), (epoch, until));
        until
    }

    /// The renewals noted since the last call: `(holder, epoch, expires_at)`.
    pub fn take_renewals(&self) -> Vec<(String, u64, i64)> {
        self.inner
            .lock()
            .renewals
            .drain()
            .map(|(h, (e, u))| (h, e, u))
            .collect()
    }

    /// The site and epoch of the lease `node_id` holds, if any.
    pub fn held_by(&self, node_id: &str) -> Option<(String, u64)> {
        self.inner.lock().by_holder.get(node_id).cloned()
    }

    /// The holder of `site_id`'s lease and its epoch, if any.
    pub fn holder_of(&self, site_id: &str) -> Option<(String, u64)> {
        self.inner
            .lock()
            .by_holder
            .iter()
            .find(|(_, (s, _))| s == site_id)
            .map(|(h, (_, e))| (h.clone(), *e))
    }
}

/// What a grant changed, for the work after the commit.
#[derive(Debug, Default)]
pub(crate) struct Moved {
    pub new_holder: Option<String>,
    pub old_holder: Option<String>,
    /// `bmc.*` commands failed with `LEASE_LOST` (to cancel on the old holder).
    pub failed: Vec<CommandRecord>,
}

/// Applies `d` to `site_id`'s lease in `tx` at `now`: the row, events on both site agents, and
/// the old holder's open `bmc.*` commands failed with `LEASE_LOST`.
pub(crate) fn apply(
    tx: &Tx<'_>,
    site_id: &str,
    d: &Decision,
    now: i64,
    ttl_ms: i64,
) -> Result<Moved, OpError> {
    let (to, epoch, from, why) = match d {
        Decision::Keep => return Ok(Moved::default()),
        Decision::Grant {
            to,
            epoch,
            from,
            why,
        } => (Some(to.clone()), *epoch, from.clone(), why.clone()),
        Decision::Release { from, why } => {
            let epoch = tx.site_lease(site_id)?.map_or(0, |l| l.epoch);
            (None, epoch, Some(from.clone()), why.clone())
        }
    };
    tx.put_site_lease(&SiteLease {
        site_id: site_id.to_owned(),
        holder_node_id: to.clone(),
        epoch,
        granted_at: to.as_ref().map(|_| now),
        expires_at: to.as_ref().map(|_| now.saturating_add(ttl_ms)),
    })?;
    if let Some(to) = &to {
        event(
            tx,
            to,
            None,
            "held",
            &format!("granted the lease of site {site_id} at epoch {epoch}: {why}"),
        )?;
    }
    let mut failed = Vec::new();
    if let Some(from) = &from {
        let whom = to.as_deref().unwrap_or("nobody");
        event(
            tx,
            from,
            Some("held"),
            "lost",
            &format!("the lease of site {site_id} went to {whom} (epoch {epoch}): {why}"),
        )?;
        for cmd in tx.open_bmc_commands(from)? {
            let message = format!(
                "the lease of site {site_id} moved from {from} to {whom} (epoch {epoch}) before this command finished; it is not sent again: check the machine and issue it anew"
            );
            if tx.finish_command(
                &cmd.id,
                CommandState::Failed,
                CommandErrorCode::LeaseLost.as_str(),
                &message,
                now,
            )? && let Some(done) = tx.command(&cmd.id)?
            {
                crate::commands::finished::on_final(tx, &done)?;
                failed.push(done);
            }
        }
    }
    Ok(Moved {
        new_holder: to,
        old_holder: from,
        failed,
    })
}

/// A `siteLease` event on site agent `node_id` (a report's edit: no `version` move).
fn event(
    tx: &Tx<'_>,
    node_id: &str,
    from: Option<&str>,
    to: &str,
    message: &str,
) -> Result<(), OpError> {
    let mut edit = match Edit::report(tx, node_id, "SiteLease") {
        Ok(e) => e,
        Err(OpError::NotFound { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    edit.event(
        "siteLease",
        from.map(str::to_owned),
        Some(to.to_owned()),
        message,
    );
    edit.save(tx)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, live: bool, last_seen: i64) -> Agent {
        Agent {
            node_id: id.into(),
            live,
            last_seen: Some(last_seen),
            connected_at: Some(0),
        }
    }

    fn lease(holder: Option<&str>, epoch: u64, expires_at: i64) -> SiteLease {
        SiteLease {
            site_id: "s".into(),
            holder_node_id: holder.map(str::to_owned),
            epoch,
            granted_at: Some(0),
            expires_at: Some(expires_at),
        }
    }

    #[test]
    fn first_grant_renewal_lapse_and_move_bump_the_epoch() {
        let (a, b) = (agent("node_a", true, 1_000), agent("node_b", true, 1_000));
        // Nobody holds it: the first live agent (connected as long as the other: by id) gets
        // epoch 1, even in the grace period.
        match decide(None, &[b.clone(), a.clone()], 1_000, 15_000, true) {
            Decision::Grant {
                to, epoch, from, ..
            } => {
                assert_eq!((to.as_str(), epoch, from), ("node_a", 1, None));
            }
            d => panic!("expected a grant, got {d:?}"),
        }
        // A valid lease is kept.
        let l = lease(Some("node_a"), 1, 16_000);
        assert_eq!(
            decide(Some(&l), &[a.clone(), b.clone()], 2_000, 15_000, false),
            Decision::Keep
        );
        // Lapsed, holder disconnected: b takes it at epoch 2.
        let dead_a = agent("node_a", false, 1_000);
        let b_fresh = agent("node_b", true, 20_000);
        match decide(
            Some(&l),
            &[dead_a.clone(), b_fresh.clone()],
            20_000,
            15_000,
            false,
        ) {
            Decision::Grant {
                to,
                epoch,
                from,
                why,
            } => {
                assert_eq!((to.as_str(), epoch), ("node_b", 2));
                assert_eq!(from.as_deref(), Some("node_a"));
                assert!(why.contains("disconnected"), "{why}");
            }
            d => panic!("expected a move, got {d:?}"),
        }
        // The same in the start-up grace: kept (a restart must not flap the lease).
        assert_eq!(
            decide(
                Some(&l),
                &[dead_a.clone(), b_fresh.clone()],
                20_000,
                15_000,
                true
            ),
            Decision::Keep
        );
        // Lapsed and nobody to take it: kept (the holder may come back at the same epoch).
        assert_eq!(
            decide(
                Some(&l),
                std::slice::from_ref(&dead_a),
                20_000,
                15_000,
                false
            ),
            Decision::Keep
        );
        // A standby that is live but silent past the TTL is no candidate.
        let stale_b = agent("node_b", true, 1_000);
        assert_eq!(
            decide(Some(&l), &[dead_a, stale_b], 20_000, 15_000, false),
            Decision::Keep
        );
        // A holder that is live and heard from keeps a lease whose renewal is late.
        let a_live = agent("node_a", true, 19_000);
        assert_eq!(
            decide(Some(&l), &[a_live, b_fresh], 20_000, 15_000, false),
            Decision::Keep
        );
        // A holder that is no longer a site agent of the site: released when nobody can take it.
        assert!(matches!(
            decide(Some(&l), &[], 2_000, 15_000, false),
            Decision::Release { .. }
        ));
    }

    #[test]
    fn a_lapsed_lease_goes_to_the_longest_connected_standby_not_the_lowest_id() {
        let connected = |id: &str, at: i64| Agent {
            connected_at: Some(at),
            ..agent(id, true, 20_000)
        };
        let l = lease(Some("node_m"), 4, 16_000);
        let holder = agent("node_m", false, 1_000);
        // The real standby has been connected since t=2,000; a machine that joined with a
        // site token at t=19,000 sorts first by id.
        let standby = connected("node_z", 2_000);
        let newcomer = connected("node_a", 19_000);
        for agents in [
            vec![holder.clone(), newcomer.clone(), standby.clone()],
            vec![standby.clone(), holder.clone(), newcomer.clone()],
        ] {
            match decide(Some(&l), &agents, 20_000, 15_000, false) {
                Decision::Grant { to, epoch, .. } => {
                    assert_eq!((to.as_str(), epoch), ("node_z", 5));
                }
                d => panic!("expected a move, got {d:?}"),
            }
        }
        // Connected at the same moment: the lower id, so the rule stays a function of its input.
        let twin = connected("node_b", 2_000);
        match decide(Some(&l), &[holder, standby, twin], 20_000, 15_000, false) {
            Decision::Grant { to, .. } => assert_eq!(to, "node_b"),
            d => panic!("expected a move, got {d:?}"),
        }
    }

    #[test]
    fn the_view_renews_only_holders() {
        let v = LeaseView::default();
        v.set(&[lease(Some("node_a"), 3, 0), lease(None, 1, 0)]);
        assert_eq!(v.renew("node_b", 100, 15_000), 0);
        assert_eq!(v.renew("node_a", 100, 15_000), 15_100);
        assert_eq!(v.take_renewals(), vec![("node_a".to_owned(), 3, 15_100)]);
        assert!(v.take_renewals().is_empty());
        assert_eq!(v.holder_of("s"), Some(("node_a".to_owned(), 3)));
    }
}
