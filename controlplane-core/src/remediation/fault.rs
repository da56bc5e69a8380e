//! What a remediation is about, read from the node as Health and Liveness left it: a GPU
//! condition that is `true` (its owner, reason, GPUs, and the recovery action its evidence
//! carries), or a node with a BMC silent past the pool's `unreachableSeconds`. Remediation never
//! reads hardware evidence itself: Health turned it into conditions, and a step counts as done
//! when the condition it was about is gone.

use bc_protocol::commands::xid::{RecommendedAction, XidClass};
use bc_protocol::{Condition, ConditionStatus, Connectivity};
use cpl_store::{Fault, FaultKind, NodeRecord};

use super::policy::Policy;
use crate::health::{GPU_UNHEALTHY, P2P_DRAIN_REQUIRED, XID_CRITICAL, canonical_bus_id};

/// The condition Health sets when one node alone shows an application-class XID in several
/// allocations (NoSchedule): the node's fault after all ([`super::workload`]).
pub const REPEATED_WORKLOAD_XID: &str = "RepeatedWorkloadXid";

/// The GPU conditions a remediation may be about.
pub const GPU_FAULT_CONDITIONS: &[&str] = &[
    XID_CRITICAL,
    GPU_UNHEALTHY,
    P2P_DRAIN_REQUIRED,
    REPEATED_WORKLOAD_XID,
];

/// The `condition` of a fault that is the node's silence, not a condition.
pub const CONNECTIVITY: &str = "connectivity";

fn parse_action(s: &str) -> Option<RecommendedAction> {
    serde_json::from_value(serde_json::Value::String(s.to_owned())).ok()
}

/// The recovery action condition `c` calls for: a failed diag names it in its reason
/// (`DiagFailed:resetGpu`); an XID's is the catalog's for its number (`Xid48`), else the one its
/// message announces (`…, action rebootNode`: an XID 154); a P2P drain calls for a drain; an XID
/// whose action cannot be read calls for a reboot, the catalog's answer to a critical XID it
/// does not know.
pub fn action_of(c: &Condition) -> RecommendedAction {
    if c.type_ == P2P_DRAIN_REQUIRED {
        return RecommendedAction::DrainP2p;
    }
    if let Some(a) = c.reason.strip_prefix("DiagFailed:").and_then(parse_action) {
        return a;
    }
    if c.type_ == GPU_UNHEALTHY {
        return RecommendedAction::None;
    }
    if c.type_ == REPEATED_WORKLOAD_XID {
        return RecommendedAction::ResetGpu;
    }
    let catalog = c
        .reason
        .strip_prefix("Xid")
        .and_then(|n| n.parse::<u64>().ok())
        .map(|n| XidClass::of(n).action())
        .filter(|a| *a != RecommendedAction::None);
    let announced = c
        .message
        .rsplit_once(", action ")
        .and_then(|(_, a)| parse_action(a.trim()))
        .filter(|a| *a != RecommendedAction::None);
    catalog
        .or(announced)
        .unwrap_or(RecommendedAction::RebootNode)
}

/// The fault kind of an action.
pub fn kind_of(a: RecommendedAction) -> FaultKind {
    match a {
        RecommendedAction::None => FaultKind::Unknown,
        RecommendedAction::DrainP2p => FaultKind::DrainP2p,
        RecommendedAction::ResetGpu => FaultKind::ResetGpu,
        RecommendedAction::RebootNode => FaultKind::RebootNode,
        RecommendedAction::Service => FaultKind::Service,
    }
}

/// The node's fault, if it has one: of its true GPU conditions the one whose action is the
/// strongest (a reboot fixes what a reset would; a person's fault outranks both); else, with a
/// BMC (`has_bmc`), its silence past the policy's `unreachableSeconds` at `now` (ms).
pub fn of(node: &NodeRecord, policy: &Policy, has_bmc: bool, now: i64) -> Option<Fault> {
    let gpu = node
        .conditions
        .iter()
        .filter(|c| c.status == ConditionStatus::True && GPU_FAULT_CONDITIONS.contains(&&*c.type_))
        .max_by_key(|c| action_of(c));
    if let Some(c) = gpu {
        return Some(Fault {
            kind: kind_of(action_of(c)),
            condition: c.type_.clone(),
            owner: c.owner.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            gpus: c.gpus.iter().map(|g| canonical_bus_id(g)).collect(),
        });
    }
    let silent_since = node.last_seen.or(node.disconnected_at)?;
    let silent = matches!(
        node.connectivity,
        Connectivity::Unreachable | Connectivity::Lost
    );
    (has_bmc && silent && now.saturating_sub(silent_since) >= policy.unreachable_ms).then(|| {
        Fault {
            kind: FaultKind::Unreachable,
            condition: CONNECTIVITY.to_owned(),
            owner: "Liveness".to_owned(),
            reason: node.connectivity.as_str().to_owned(),
            message: format!(
                "no heartbeat for {} s",
                now.saturating_sub(silent_since) / 1000
            ),
            gpus: Vec::new(),
        }
    })
}

/// Whether `fault` is still there on `node`: its condition `true` and naming one of its GPUs
/// (or about the whole node); a silence, while the node is not `connected`.
pub fn present(node: &NodeRecord, fault: &Fault) -> bool {
    if fault.condition == CONNECTIVITY {
        return node.connectivity != Connectivity::Connected;
    }
    let Some(c) = node
        .conditions
        .iter()
        .find(|c| c.type_ == fault.condition && c.status == ConditionStatus::True)
    else {
        return false;
    };
    fault.gpus.is_empty()
        || c.gpus.is_empty()
        || c.gpus
            .iter()
            .any(|g| fault.gpus.contains(&canonical_bus_id(g)))
}

/// One line for people: `XidCritical Xid48 on 0000:18:00.0 (resetGpu)`.
pub fn describe(f: &Fault) -> String {
    let on = if f.gpus.is_empty() {
        "the node".to_owned()
    } else {
        f.gpus.join(", ")
    };
    format!("{} {} on {on} ({})", f.condition, f.reason, f.kind)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::TestResult;

    fn node() -> Result<NodeRecord, Box<dyn std::error::Error>> {
        let store = cpl_store::testing::store()?;
        let n = store.write_blocking(|tx| {
            tx.insert_node(&cpl_store::testing::new_node("node_a"), 1)?;
            tx.node("node_a")
        })?;
        Ok(n.ok_or("node_a vanished")?)
    }

    fn cond(type_: &str, reason: &str, message: &str, gpus: &[&str]) -> Condition {
        Condition {
            type_: type_.into(),
            status: ConditionStatus::True,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: String::new(),
            owner: "Health".into(),
            gpus: gpus.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    #[test]
    fn the_action_comes_from_the_diag_the_catalog_or_the_announcement() {
        let cases = [
            (
                cond(GPU_UNHEALTHY, "DiagFailed:resetGpu", "", &[]),
                RecommendedAction::ResetGpu,
            ),
            (
                cond(GPU_UNHEALTHY, "DiagFailed:none", "", &[]),
                RecommendedAction::None,
            ),
            (
                cond(XID_CRITICAL, "Xid48", "", &[]),
                RecommendedAction::ResetGpu,
            ),
            (
                cond(XID_CRITICAL, "Xid79", "", &[]),
                RecommendedAction::RebootNode,
            ),
            (
                cond(
                    XID_CRITICAL,
                    "Xid154",
                    "Xid 154 on 0000:18:00.0: resetRequired, action resetGpu",
                    &[],
                ),
                RecommendedAction::ResetGpu,
            ),
            (
                cond(XID_CRITICAL, "Xid999", "", &[]),
                RecommendedAction::RebootNode,
            ),
            (
                cond(P2P_DRAIN_REQUIRED, "Xid154", "", &[]),
                RecommendedAction::DrainP2p,
            ),
        ];
        for (c, want) in cases {
            assert_eq!(action_of(&c), want, "{c:?}");
        }
    }

    #[test]
    fn the_strongest_fault_wins_and_is_gone_when_its_gpus_are() -> TestResult {
        let mut node = node()?;
        node.conditions = vec![
            cond(GPU_UNHEALTHY, "DiagFailed:resetGpu", "", &["0000:18:00.0"]),
            cond(XID_CRITICAL, "Xid79", "", &["00000000:28:00.0"]),
        ];
        let policy = Policy::of(None);
        let f = of(&node, &policy, false, 0).ok_or("no fault")?;
        assert_eq!(f.kind, FaultKind::RebootNode);
        assert_eq!(f.condition, XID_CRITICAL);
        assert_eq!(f.gpus, vec!["0000:28:00.0".to_owned()], "canonical bus ids");
        assert!(present(&node, &f));
        node.conditions[1].gpus = vec!["0000:38:00.0".into()];
        assert!(!present(&node, &f), "another GPU's XID is another fault");
        node.conditions[1].status = ConditionStatus::False;
        assert!(!present(&node, &f));
        assert_eq!(
            of(&node, &policy, false, 0).map(|f| f.kind),
            Some(FaultKind::ResetGpu)
        );
        Ok(())
    }

    #[test]
    fn silence_is_a_fault_only_with_a_bmc_and_past_the_pools_time() -> TestResult {
        let mut node = node()?;
        node.connectivity = Connectivity::Unreachable;
        node.last_seen = Some(1_000);
        let policy = Policy::of(None);
        let later = 1_000 + policy.unreachable_ms;
        assert_eq!(
            of(&node, &policy, false, later),
            None,
            "no BMC: nothing to do"
        );
        assert_eq!(
            of(&node, &policy, true, later - 1),
            None,
            "not silent long enough"
        );
        let f = of(&node, &policy, true, later).ok_or("no fault")?;
        assert_eq!(f.kind, FaultKind::Unreachable);
        assert!(present(&node, &f));
        node.connectivity = Connectivity::Connected;
        assert!(!present(&node, &f));
        Ok(())
    }
}
