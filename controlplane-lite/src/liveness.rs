//! The Liveness controller: `connected` nodes silent for the grace period become `unreachable`,
//! and `lost` after `lostAfter` more. After the control plane starts, nobody is marked
//! unreachable for one grace period: the agents are reconnecting, not gone.

use std::time::Duration;

use crate::store::{Store, now_ms, sessions};

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

/// Runs the controller until the task is dropped. `before_sweep` runs first on every tick (the
/// gateway flushes its buffered heartbeats there, so a sweep never reads stale `lastSeen`).
pub async fn run<F, Fut>(store: Store, cfg: LivenessConfig, mut before_sweep: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = now_ms();
    let period =
        (cfg.unreachable_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = now_ms();
        if now - started < ms(cfg.unreachable_after) {
            continue;
        }
        before_sweep().await;
        let (u, l) = (ms(cfg.unreachable_after), ms(cfg.lost_after));
        match store.run(move |c| sessions::sweep(c, now, u, l)).await {
            Ok(changed) => {
                for (id, to) in changed {
                    tracing::warn!(node_id = %id, connectivity = %to, "Liveness: node went silent");
                }
            }
            Err(e) => tracing::error!(error = %e, "Liveness sweep failed"),
        }
    }
}
