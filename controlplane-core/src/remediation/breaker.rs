//! The circuit breaker: a fleet-wide event (a switch reboot, a bad driver roll-out) must never
//! turn into a fleet-wide reboot storm. Per pool, at most N nodes (`maxConcurrent`) and at most
//! P % of its nodes (`maxConcurrentPercent`) are in remediation at once, and at most M
//! remediations start per hour (`maxPerHour`, counted from the last resume at the earliest).
//! The remediation that would break a limit does not start; the pool's breaker opens instead:
//! its `RemediationPaused` condition turns `true` with the numbers, the node whose start was
//! refused gets a `remediation` event saying so, the trip is counted (a metric), and no new
//! remediation starts in the pool until an operator resumes it (`pools.resumeRemediation`).
//! Remediations already running go on: each was within the limits when it started.

use bc_protocol::{Condition, ConditionStatus};
use cpl_store::{NewEvent, Pool, Tx};

use super::OWNER;
use super::policy::Policy;
use crate::conditions::rfc3339_ms;
use crate::error::OpError;

/// The pool condition that is `true` while the pool's breaker is open.
pub const REMEDIATION_PAUSED: &str = "RemediationPaused";

/// One hour, ms: the window of `maxPerHour`.
pub const HOUR_MS: i64 = 3_600_000;

/// What the breaker weighs: the pool's disruptive remediations open now and started within the
/// hour (since the last resume at the earliest), and its node count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub open: u64,
    pub started_last_hour: u64,
    pub pool_nodes: u64,
}

/// The concurrency limit of `policy` in a pool of `nodes` nodes: the smaller of N and P % of
/// the nodes (rounded up, at least one).
pub fn concurrency_limit(policy: &Policy, nodes: u64) -> u64 {
    let pct = u64::from(policy.max_concurrent_percent);
    let of_pool = nodes.saturating_mul(pct).div_ceil(100).max(1);
    of_pool.min(u64::from(policy.max_concurrent))
}

/// Why one more remediation may not start under `policy` with `load`, with the numbers;
/// `None`: it may.
pub fn refuses(policy: &Policy, load: Load) -> Option<String> {
    let n = u64::from(policy.max_concurrent);
    if load.open >= n {
        return Some(format!(
            "{} of the pool's nodes are in remediation, the limit is {n} (maxConcurrent)",
            load.open
        ));
    }
    let limit = concurrency_limit(policy, load.pool_nodes);
    if load.open >= limit {
        return Some(format!(
            "{} of the pool's {} nodes are in remediation, the limit is {limit} ({} %, maxConcurrentPercent)",
            load.open, load.pool_nodes, policy.max_concurrent_percent
        ));
    }
    let m = u64::from(policy.max_per_hour);
    if load.started_last_hour >= m {
        return Some(format!(
            "{} remediations started in the pool within the hour, the limit is {m} (maxPerHour)",
            load.started_last_hour
        ));
    }
    None
}

/// Whether `pool`'s breaker is open.
pub fn paused(pool: &Pool) -> bool {
    pool.conditions
        .iter()
        .any(|c| c.type_ == REMEDIATION_PAUSED && c.status == ConditionStatus::True)
}

/// `conditions` with `type_` set: `lastTransitionTime` moves only when the status changes.
fn with_condition(
    conditions: &[Condition],
    status: ConditionStatus,
    reason: &str,
    message: String,
    now: i64,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = conditions
        .iter()
        .filter(|c| c.type_ != REMEDIATION_PAUSED)
        .cloned()
        .collect();
    let before = conditions.iter().find(|c| c.type_ == REMEDIATION_PAUSED);
    out.push(Condition {
        type_: REMEDIATION_PAUSED.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        last_transition_time: match before {
            Some(b) if b.status == status => b.last_transition_time.clone(),
            _ => rfc3339_ms(now),
        },
        owner: OWNER.to_owned(),
        gpus: Vec::new(),
    });
    out.sort_by(|a, b| a.type_.cmp(&b.type_));
    out
}

/// Opens `pool`'s breaker because the start of a remediation of `node_id` was refused for
/// `why`: the pool's `RemediationPaused` condition, its trip count, and a `remediation` event on
/// the node. Returns the message.
pub fn trip(
    tx: &Tx<'_>,
    pool: &Pool,
    node_id: &str,
    fault: &str,
    why: &str,
    now: i64,
) -> Result<String, OpError> {
    let message = format!(
        "remediation paused: {why}; no new remediation starts in pool {} until an operator resumes it (pools.resumeRemediation). Refused: {node_id}, {fault}",
        pool.id
    );
    let conditions = with_condition(
        &pool.conditions,
        ConditionStatus::True,
        "LimitReached",
        message.clone(),
        now,
    );
    tx.update_pool_breaker(&pool.id, &conditions, true, None, None)?;
    tx.record_event(&NewEvent {
        node_id,
        at: now,
        kind: "remediation",
        from: None,
        to: Some("paused"),
        actor: OWNER,
        message: &message,
    })?;
    tracing::warn!(pool_id = %pool.id, node_id, %why, "remediation circuit breaker tripped");
    Ok(message)
}

/// `pools.resumeRemediation`: closes the pool's breaker (`RemediationPaused` `false`,
/// `Resumed`, by `actor`); the hourly limit counts from now. Errors: `NOT_FOUND`, `CONFLICT` on
/// a stale `version`, `INVALID_STATE` when the breaker is not open.
pub fn resume(tx: &Tx<'_>, pool_id: &str, version: u64, actor: &str) -> Result<Pool, OpError> {
    let pool = crate::ops::pools::get(tx, pool_id)?;
    if pool.version != version {
        return Err(OpError::Conflict {
            kind: "pool",
            id: pool_id.to_owned(),
            expected: version,
            actual: pool.version,
        });
    }
    if !paused(&pool) {
        return Err(OpError::InvalidState(format!(
            "pool {pool_id}'s remediation is not paused: nothing to resume"
        )));
    }
    let now = cpl_store::now_ms();
    let conditions = with_condition(
        &pool.conditions,
        ConditionStatus::False,
        "Resumed",
        format!("resumed by {actor}; the hourly limit counts from now"),
        now,
    );
    tx.update_pool_breaker(pool_id, &conditions, false, Some(now), Some(version))?;
    crate::ops::pools::get(tx, pool_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpl_store::RemediationPolicy;

    fn policy(n: u32, p: u32, m: u32) -> Policy {
        Policy::of(Some(&RemediationPolicy {
            max_concurrent: Some(n),
            max_concurrent_percent: Some(p),
            max_per_hour: Some(m),
            ..Default::default()
        }))
    }

    fn load(open: u64, started: u64, nodes: u64) -> Load {
        Load {
            open,
            started_last_hour: started,
            pool_nodes: nodes,
        }
    }

    #[test]
    fn each_limit_refuses_the_start_that_would_break_it_and_says_which() {
        let p = policy(4, 10, 20);
        assert_eq!(refuses(&p, load(3, 3, 1000)), None, "the 4th may start");
        let why = refuses(&p, load(4, 4, 1000)).unwrap_or_default();
        assert!(why.contains("maxConcurrent") && why.contains("4"), "{why}");
        // 10 % of 20 nodes is 2: the percentage is the tighter limit.
        let why = refuses(&p, load(2, 2, 20)).unwrap_or_default();
        assert!(why.contains("maxConcurrentPercent"), "{why}");
        assert_eq!(refuses(&p, load(1, 1, 20)), None);
        // However small the pool, one node may be remediated.
        assert_eq!(concurrency_limit(&p, 3), 1);
        assert_eq!(refuses(&p, load(0, 0, 3)), None);
        let why = refuses(&p, load(0, 20, 1000)).unwrap_or_default();
        assert!(why.contains("maxPerHour") && why.contains("20"), "{why}");
        assert_eq!(concurrency_limit(&policy(100, 30, 20), 1000), 100);
        assert_eq!(concurrency_limit(&policy(100, 5, 20), 1000), 50);
    }
}
