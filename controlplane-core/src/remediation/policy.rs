//! A pool's remediation policy with its defaults, and the ladders: what the controller tries,
//! in order, for each kind of fault. Both are data: the built-in ladders below, replaced per
//! fault kind by the pool's `remediation.ladders`; the limits named here with their defaults.

use std::collections::BTreeMap;

use cpl_store::{
    DrainPolicy, FaultKind, NodeRecord, Pool, RemediationMode, RemediationPolicy, RemediationStep,
    Tx,
};

use crate::error::OpError;

use RemediationStep::{BmcPowerCycle, RebootNode, Reinspect, ResetGpu};

/// Nodes of a pool in remediation at once, at most (N), unless the pool says otherwise.
pub const DEFAULT_MAX_CONCURRENT: u32 = 4;
/// The same as a percentage of the pool's nodes (P; at least one node).
pub const DEFAULT_MAX_CONCURRENT_PERCENT: u32 = 10;
/// Remediations started per pool per hour, at most (M).
pub const DEFAULT_MAX_PER_HOUR: u32 = 20;
/// How long allocations are waited for before the drain policy applies, s.
pub const DEFAULT_DRAIN_GRACE_SECONDS: u64 = 600;
/// Remediations of one node per window before it is given up on (it flaps).
pub const DEFAULT_MAX_ATTEMPTS_PER_NODE: u32 = 3;
/// That window, s (a day).
pub const DEFAULT_ATTEMPT_WINDOW_SECONDS: u64 = 86_400;
/// How long a node with a BMC stays unreachable before it is a fault, s.
pub const DEFAULT_UNREACHABLE_SECONDS: u64 = 300;
/// The window in which application-class XIDs are compared, s.
pub const DEFAULT_WORKLOAD_WINDOW_SECONDS: u64 = 600;
/// Nodes of one workload that must see an application-class XID in the window.
pub const DEFAULT_WORKLOAD_MIN_NODES: u32 = 2;
/// Allocations in which one node alone must see one for it to be the node's fault.
pub const DEFAULT_NODE_MIN_ALLOCATIONS: u32 = 3;
/// The largest number of seconds a policy takes (30 days).
pub const MAX_SECONDS: u64 = 2_592_000;

/// The built-in ladder of each fault kind, weakest step first. A step that does not apply to a
/// node (no BMC, a tenant-controlled node, not a `ready` bare-metal machine) is skipped and
/// recorded as skipped; after the last step the controller gives up.
pub const BUILT_IN_LADDERS: &[(FaultKind, &[RemediationStep])] = &[
    // NVML says a GPU reset recovers it; a reset that did not help is followed by a reboot, a
    // power cycle through the BMC, then a bare-metal machine's re-inspection.
    (
        FaultKind::ResetGpu,
        &[ResetGpu, RebootNode, BmcPowerCycle, Reinspect],
    ),
    (
        FaultKind::RebootNode,
        &[RebootNode, BmcPowerCycle, Reinspect],
    ),
    // XID 154 "drain P2P": the GPU's peer traffic must stop; a reset restores it.
    (FaultKind::DrainP2p, &[ResetGpu, RebootNode]),
    // A check failed without a recovery action (a missing GPU, a wrong driver): a reboot is
    // the one generic step worth a try.
    (FaultKind::Unknown, &[RebootNode, BmcPowerCycle]),
    // NVML or the catalog says a person must look: nothing to try, give up at once.
    (FaultKind::Service, &[]),
    // Silent past `unreachableSeconds`: only the BMC can reach it.
    (FaultKind::Unreachable, &[BmcPowerCycle, Reinspect]),
];

/// The built-in ladder of `kind`.
pub fn built_in(kind: FaultKind) -> &'static [RemediationStep] {
    BUILT_IN_LADDERS
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or(&[], |(_, l)| *l)
}

/// A pool's policy with every default filled in. Times are milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: RemediationMode,
    pub max_concurrent: u32,
    pub max_concurrent_percent: u32,
    pub max_per_hour: u32,
    pub drain_grace_ms: i64,
    pub drain: DrainPolicy,
    pub max_attempts_per_node: u32,
    pub attempt_window_ms: i64,
    pub bmc_on_tenant_controlled: bool,
    pub unreachable_ms: i64,
    pub workload_window_ms: i64,
    pub workload_min_nodes: u32,
    pub node_min_allocations: u32,
    ladders: BTreeMap<FaultKind, Vec<RemediationStep>>,
}

fn ms(seconds: u64) -> i64 {
    i64::try_from(seconds.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// The pool of `node` and its policy, or `None` when the node has no pool (or it vanished) or
/// the pool's remediation is `off`: the gate every remediation decision starts with.
pub fn of_node(tx: &Tx<'_>, node: &NodeRecord) -> Result<Option<(Pool, Policy)>, OpError> {
    let Some(pool) = node
        .pool_id
        .as_deref()
        .map(|p| tx.pool(p))
        .transpose()?
        .flatten()
    else {
        return Ok(None);
    };
    let policy = Policy::of(Some(&pool.remediation));
    Ok((policy.mode != RemediationMode::Off).then_some((pool, policy)))
}

impl Policy {
    /// `p` with its defaults; a pool without one (`None`) is `off`.
    pub fn of(p: Option<&RemediationPolicy>) -> Self {
        let d = RemediationPolicy::default();
        let p = p.unwrap_or(&d);
        Self {
            mode: p.mode.unwrap_or(RemediationMode::Off),
            max_concurrent: p.max_concurrent.unwrap_or(DEFAULT_MAX_CONCURRENT),
            max_concurrent_percent: p
                .max_concurrent_percent
                .unwrap_or(DEFAULT_MAX_CONCURRENT_PERCENT),
            max_per_hour: p.max_per_hour.unwrap_or(DEFAULT_MAX_PER_HOUR),
            drain_grace_ms: ms(p.drain_grace_seconds.unwrap_or(DEFAULT_DRAIN_GRACE_SECONDS)),
            drain: p.drain.unwrap_or(DrainPolicy::Wait),
            max_attempts_per_node: p
                .max_attempts_per_node
                .unwrap_or(DEFAULT_MAX_ATTEMPTS_PER_NODE),
            attempt_window_ms: ms(p
                .attempt_window_seconds
                .unwrap_or(DEFAULT_ATTEMPT_WINDOW_SECONDS)),
            bmc_on_tenant_controlled: p.bmc_on_tenant_controlled.unwrap_or(false),
            unreachable_ms: ms(p.unreachable_seconds.unwrap_or(DEFAULT_UNREACHABLE_SECONDS)),
            workload_window_ms: ms(p
                .workload_window_seconds
                .unwrap_or(DEFAULT_WORKLOAD_WINDOW_SECONDS)),
            workload_min_nodes: p.workload_min_nodes.unwrap_or(DEFAULT_WORKLOAD_MIN_NODES),
            node_min_allocations: p
                .node_min_allocations
                .unwrap_or(DEFAULT_NODE_MIN_ALLOCATIONS),
            ladders: p.ladders.clone(),
        }
    }

    /// The ladder for `kind`: the pool's, else the built-in one.
    pub fn ladder(&self, kind: FaultKind) -> Vec<RemediationStep> {
        self.ladders
            .get(&kind)
            .cloned()
            .unwrap_or_else(|| built_in(kind).to_vec())
    }
}

/// Checks a policy an operator gave (`pools.setRemediation`). Errors: `INVALID_ARGUMENT`
/// naming the key and its range.
pub fn check(p: &RemediationPolicy) -> Result<(), OpError> {
    let bad = |name: &str, range: &str, got: String| {
        Err(OpError::InvalidArgument(format!(
            "remediation.{name} must be {range}, got {got}"
        )))
    };
    for (name, v) in [
        ("maxConcurrent", p.max_concurrent),
        ("maxPerHour", p.max_per_hour),
        ("maxAttemptsPerNode", p.max_attempts_per_node),
        ("workloadMinNodes", p.workload_min_nodes),
        ("nodeMinAllocations", p.node_min_allocations),
    ] {
        if let Some(v) = v
            && !(1..=100_000).contains(&v)
        {
            return bad(name, "between 1 and 100000", v.to_string());
        }
    }
    if let Some(v) = p.max_concurrent_percent
        && !(1..=100).contains(&v)
    {
        return bad("maxConcurrentPercent", "between 1 and 100", v.to_string());
    }
    if p.workload_min_nodes == Some(1) {
        return bad(
            "workloadMinNodes",
            "at least 2 (one node alone is never a workload's fault)",
            "1".to_owned(),
        );
    }
    for (name, v) in [
        ("drainGraceSeconds", p.drain_grace_seconds),
        ("attemptWindowSeconds", p.attempt_window_seconds),
        ("unreachableSeconds", p.unreachable_seconds),
        ("workloadWindowSeconds", p.workload_window_seconds),
    ] {
        if let Some(v) = v
            && v > MAX_SECONDS
        {
            return bad(name, &format!("at most {MAX_SECONDS}"), v.to_string());
        }
    }
    for (kind, ladder) in &p.ladders {
        let mut seen = Vec::new();
        for s in ladder {
            if seen.contains(s) {
                return bad(
                    &format!("ladders.{kind}"),
                    "a ladder that names each step once",
                    format!("{s} twice"),
                );
            }
            seen.push(*s);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_kind_has_one_built_in_ladder_and_a_pool_replaces_it_per_kind() {
        for k in FaultKind::ALL {
            let n = BUILT_IN_LADDERS.iter().filter(|(x, _)| x == k).count();
            assert_eq!(n, 1, "{k}");
        }
        assert_eq!(
            built_in(FaultKind::ResetGpu),
            &[ResetGpu, RebootNode, BmcPowerCycle, Reinspect]
        );
        assert!(
            built_in(FaultKind::Service).is_empty(),
            "a fault that needs a person is given up at once"
        );
        let mut p = RemediationPolicy {
            mode: Some(RemediationMode::Auto),
            ..Default::default()
        };
        p.ladders.insert(FaultKind::ResetGpu, vec![RebootNode]);
        let policy = Policy::of(Some(&p));
        assert_eq!(policy.ladder(FaultKind::ResetGpu), vec![RebootNode]);
        assert_eq!(
            policy.ladder(FaultKind::RebootNode),
            built_in(FaultKind::RebootNode).to_vec(),
            "kinds the pool does not name keep the built-in ladder"
        );
        assert_eq!(policy.max_concurrent, DEFAULT_MAX_CONCURRENT);
        assert_eq!(Policy::of(None).mode, RemediationMode::Off);
    }

    #[test]
    fn a_policy_out_of_range_is_refused_naming_the_key() {
        let cases = [
            RemediationPolicy {
                max_concurrent_percent: Some(0),
                ..Default::default()
            },
            RemediationPolicy {
                max_concurrent: Some(0),
                ..Default::default()
            },
            RemediationPolicy {
                workload_min_nodes: Some(1),
                ..Default::default()
            },
            RemediationPolicy {
                drain_grace_seconds: Some(MAX_SECONDS + 1),
                ..Default::default()
            },
            RemediationPolicy {
                ladders: [(FaultKind::ResetGpu, vec![ResetGpu, ResetGpu])]
                    .into_iter()
                    .collect(),
                ..Default::default()
            },
        ];
        for (p, key) in cases.iter().zip([
            "maxConcurrentPercent",
            "maxConcurrent",
            "workloadMinNodes",
            "drainGraceSeconds",
            "ladders.resetGpu",
        ]) {
            match check(p) {
                Err(OpError::InvalidArgument(m)) => assert!(m.contains(key), "{m}"),
                other => panic!("{key}: {other:?}"),
            }
        }
        assert!(check(&RemediationPolicy::default()).is_ok());
    }
}
