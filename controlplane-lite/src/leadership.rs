//! Which replica runs the controllers (issue 17): Liveness, NodeLifecycle, the command and
//! bare-metal deadlines and the site leases run on the replica holding the store's controller
//! lease ([`cpl_store::ControllerLease`], name [`LEASE`]); every replica runs its own gateway,
//! API and heartbeat flusher.
//!
//! # Design
//! - [`run`] claims or renews the lease every third of its time to live and publishes "we lead"
//!   on a watch channel. A leader that could not renew steps down *before* its lease can lapse
//!   (at two thirds of it, counted from its last renewal), so two replicas never both run the
//!   controllers while their clocks agree to within a third of the lease; on a clean shutdown it
//!   gives the lease up, so a standby takes over at its next try.
//! - [`while_leader`] runs a controller only while the channel says so, and starts it afresh on
//!   every new leadership: Liveness then begins with its startup grace (no verdict before
//!   `unreachable_after` has passed with the new leader), so a failover never marks nodes
//!   unreachable whose heartbeats the old leader had not judged.
//! - On SQLite (one process) the lease is taken at the first try and never contested.
use std::future::Future;
use std::time::{Duration, Instant};

use cpl_store::{Store, now_ms};
use tokio::sync::watch;

/// The lease's name in the store.
pub const LEASE: &str = cpl_store::CONTROLLERS_LEASE;

/// Time to live of the controller lease when none is configured: a failover takes at most this
/// plus a third of it.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Claims and renews the lease for `holder` until `stop` turns true, publishing on `leading`
/// whether this replica leads; gives the lease up at the end if it held it.
pub async fn run(
    store: Store,
    holder: String,
    ttl: Duration,
    leading: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let period = (ttl / 3).max(Duration::from_millis(50));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When this replica last renewed: it leads until two thirds of the lease after that.
    let mut renewed: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let (h, now) = (holder.clone(), now_ms());
        let ttl_ms = ms(ttl);
        let asked = Instant::now();
        // Outside the write lock: a storm of writes must not make the leader miss its renewal.
        let claim = store.claim_controller_lease(LEASE, h, now, ttl_ms).await;
        let lead = match claim {
            Ok(lease) if lease.holder == holder => {
                renewed = Some(asked);
                if !*leading.borrow() {
                    tracing::info!(epoch = lease.epoch, "this replica leads: controllers start");
                }
                true
            }
            Ok(lease) => {
                renewed = None;
                if *leading.borrow() {
                    tracing::warn!(holder = %lease.holder, epoch = lease.epoch, "controller lease taken by another replica: controllers stop");
                }
                false
            }
            Err(e) => {
                let still = renewed.is_some_and(|r| r.elapsed() < ttl * 2 / 3);
                if *leading.borrow() && !still {
                    tracing::warn!(error = %e, "controller lease not renewed in time: controllers stop");
                    renewed = None;
                } else {
                    tracing::debug!(error = %e, "controller lease claim failed");
                }
                still
            }
        };
        leading.send_if_modified(|v| std::mem::replace(v, lead) != lead);
    }
    if *leading.borrow() {
        leading.send_replace(false);
        let h = holder.clone();
        let released = store.release_controller_lease(LEASE, h, now_ms()).await;
        if let Err(e) = released {
            tracing::warn!(error = %e, "controller lease not given up; another replica takes it when it lapses");
        }
    }
}

/// Runs `controller()` while `leading` is true, stopping it when leadership is lost and starting
/// a new one when it comes back. Returns when the channel closes or the controller returns.
pub async fn while_leader<F, Fut>(
    name: &'static str,
    mut leading: watch::Receiver<bool>,
    mut controller: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        tracing::debug!(controller = name, "controller starts on this replica");
        tokio::select! {
            () = controller() => return,
            lost = leading.wait_for(|l| !*l) => {
                if lost.is_err() {
                    return;
                }
                tracing::debug!(controller = name, "controller stops: this replica no longer leads");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpl_store::StoreError;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn one_replica_leads_and_a_standby_takes_over_when_it_stops() -> Result<(), StoreError> {
        let store = cpl_store::testing::store()?;
        let ttl = Duration::from_millis(600);
        let (stop_a, stop_a_rx) = watch::channel(false);
        let (stop_b, stop_b_rx) = watch::channel(false);
        let (lead_a, mut a) = watch::channel(false);
        let (lead_b, b) = watch::channel(false);
        let ta = tokio::spawn(run(store.clone(), "gw-a".into(), ttl, lead_a, stop_a_rx));
        tokio::time::timeout(Duration::from_secs(5), a.wait_for(|l| *l))
            .await
            .map_err(|_| StoreError::Task("A never led".into()))?
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let tb = tokio::spawn(run(store.clone(), "gw-b".into(), ttl, lead_b, stop_b_rx));
        // B stays a standby for several of its tries while A renews.
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&starts);
        let ctl = tokio::spawn(while_leader("test", b.clone(), move || {
            counted.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>()
        }));
        tokio::time::sleep(ttl * 2).await;
        assert!(*a.borrow() && !*b.borrow(), "A leads, B waits");
        assert_eq!(
            starts.load(Ordering::SeqCst),
            0,
            "no controller runs on the standby"
        );
        // A shuts down cleanly: B leads at its next try, and its controller starts once.
        let _ = stop_a.send(true);
        let _ = ta.await;
        let mut b2 = b.clone();
        tokio::time::timeout(Duration::from_secs(5), b2.wait_for(|l| *l))
            .await
            .map_err(|_| StoreError::Task("B never took over".into()))?
            .map_err(|e| StoreError::Task(e.to_string()))?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        let lease = store.read(|r| r.controller_lease(LEASE)).await?;
        assert_eq!(
            lease.map(|l| (l.holder, l.epoch)),
            Some(("gw-b".to_owned(), 2))
        );
        let _ = stop_b.send(true);
        let _ = tb.await;
        ctl.abort();
        Ok(())
    }
}
