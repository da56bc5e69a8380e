//! The Liveness controller: `connected` nodes silent for the grace period become `unreachable`,
//! and `lost` after `lostAfter` more. After the control plane starts, and after this process
//! stood still (SIGSTOP, a paused VM), nobody is marked unreachable for one grace period: the
//! agents are reconnecting, or their heartbeats were waiting for us, not missing.

use std::time::Duration;

use cpl_store::{Store, now_ms};

use crate::error::OpError;
use crate::sessions;

/// Liveness timings.
#[derive(Debug, Clone, Copy)]
pub struct LivenessConfig {
    /// Silence after which a connected node is `unreachable` (default 40 s).
    pub unreachable_after: Duration,
    /// Further silence after which an unreachable node is `lost` (default 10 min).
    pub lost_after: Duration,
}

impl Default for LivenessConfig {
    fn default() -> Self {
        Self {
            unreachable_after: Duration::from_secs(40),
            lost_after: Duration::from_secs(600),
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When Liveness may judge silence. Agents are not silent while the control plane could not hear
/// them: not for one grace period after it starts (they are reconnecting), and not for one grace
/// period after this process itself stood still (SIGSTOP, a paused VM, a stalled runtime) for
/// longer than `stall`: their heartbeats were waiting for us, not missing.
#[derive(Debug, Clone, Copy)]
struct Grace {
    grace_ms: i64,
    stall_ms: i64,
    until: i64,
    last_tick: i64,
}

impl Grace {
    fn new(now: i64, grace_ms: i64, stall_ms: i64) -> Self {
        Self {
            grace_ms,
            stall_ms,
            until: now.saturating_add(grace_ms),
            last_tick: now,
        }
    }

    /// Called on every tick at `now` (ms); whether a sweep may mark nodes now.
    fn may_sweep(&mut self, now: i64) -> bool {
        let gap = now - self.last_tick;
        if gap > self.stall_ms {
            tracing::warn!(
                stalled_ms = gap,
                grace_ms = self.grace_ms,
                "Liveness did not run for a while; giving agents one grace period before judging silence"
            );
            self.until = now.saturating_add(self.grace_ms);
        }
        self.last_tick = now;
        now >= self.until
    }
}

/// Runs the controller until the task is dropped. `before_sweep` runs first on every tick (the
/// gateway flushes its buffered heartbeats there, so a sweep never reads stale `lastSeen`).
pub async fn run<F, Fut>(store: Store, cfg: LivenessConfig, mut before_sweep: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let period =
        (cfg.unreachable_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    // A tick normally comes every `period`; five missed ones (at least 2 s) is a stall.
    let stall = (period * 5).max(Duration::from_secs(2));
    let mut grace = Grace::new(now_ms(), ms(cfg.unreachable_after), ms(stall));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = now_ms();
        if !grace.may_sweep(now) {
            continue;
        }
        before_sweep().await;
        let (u, l) = (ms(cfg.unreachable_after), ms(cfg.lost_after));
        match store
            .write(move |tx| -> Result<_, OpError> { sessions::sweep(tx, now, u, l) })
            .await
        {
            Ok(changed) => {
                for (id, to) in changed {
                    let span = tracing::info_span!("node", node_id = %id);
                    span.in_scope(
                        || tracing::warn!(connectivity = %to, "Liveness: node went silent"),
                    );
                }
            }
            Err(e) => tracing::error!(error = %e, "Liveness sweep failed"),
        }
        // The sweep itself may have waited on a busy store: that time is not the agents' silence.
        grace.last_tick = now_ms();
    }
}

#[cfg(test)]
mod tests {
    use super::Grace;

    #[test]
    fn silence_is_judged_only_after_a_grace_period_from_start_and_after_a_stall() {
        // Grace 40 s, a stall is a tick gap over 5 s.
        let mut g = Grace::new(0, 40_000, 5_000);
        assert!(!g.may_sweep(1_000), "start-up grace");
        let mut t = 1_000;
        while t < 40_000 {
            t += 1_000;
            g.may_sweep(t);
        }
        assert!(g.may_sweep(41_000), "grace over, ticks regular");
        // The process stood still for 25 s: a new grace period from the moment it runs again.
        assert!(!g.may_sweep(66_000));
        assert!(!g.may_sweep(67_000));
        let mut t = 67_000;
        while t < 106_000 {
            t += 1_000;
            g.may_sweep(t);
        }
        assert!(g.may_sweep(107_000));
        // A late tick below the stall threshold changes nothing.
        assert!(g.may_sweep(111_000));
    }
}
