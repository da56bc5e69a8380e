//! The Health controller's rules on typed reports: which conditions a diag, a reset or an XID
//! sets, and that fixing one GPU clears only that GPU's entry.

use bc_protocol::commands::diag::{Check, CheckStatus, DiagReport, GpuReport};
use bc_protocol::commands::reset::{GpuResetResult, GpuSnapshot, ResetReport};
use bc_protocol::commands::xid::{RecommendedAction, XidClass, XidEvent, XidSource};

use super::*;
use crate::test_utils::node;

const A: &str = "0000:1a:00.0";
const B: &str = "0000:2b:00.0";

fn cmd(
    name: bc_protocol::CommandName,
    state: CommandState,
    result: Option<serde_json::Value>,
) -> CommandRecord {
    CommandRecord {
        id: "cmd_1".into(),
        node_id: "node_1".into(),
        name,
        args: serde_json::json!({}),
        state,
        progress: 100,
        result,
        error_code: None,
        error_message: None,
        actor: "t".into(),
        created_at: 0,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: 1,
        subject_node_id: None,
    }
}

fn gpu(bus: &str, verdict: CheckStatus) -> GpuReport {
    GpuReport {
        index: 0,
        uuid: format!("GPU-{bus}"),
        pci_bus_id: bus.to_owned(),
        name: "NVIDIA H100 80GB HBM3".into(),
        checks: Vec::new(),
        verdict,
        action: RecommendedAction::None,
    }
}

fn diag(gpus: Vec<GpuReport>, node_checks: Vec<Check>) -> serde_json::Value {
    let verdict = gpus
        .iter()
        .map(|g| g.verdict)
        .chain(node_checks.iter().map(|c| c.status))
        .max()
        .unwrap_or(CheckStatus::Pass);
    let report = DiagReport {
        nvml_available: true,
        unavailable_reason: None,
        driver_version: None,
        nvml_version: None,
        node_checks,
        gpus,
        verdict,
        action: if verdict == CheckStatus::Fail {
            RecommendedAction::ResetGpu
        } else {
            RecommendedAction::None
        },
        summary: format!("{verdict:?}"),
    };
    serde_json::to_value(report).unwrap_or_default()
}

fn reset(verified: &[&str]) -> serde_json::Value {
    let snap = GpuSnapshot {
        uuid: "GPU-x".into(),
        persistence_mode: true,
        volatile_corrected_ecc: Some(0),
        volatile_uncorrected_ecc: Some(0),
        recovery_action: None,
    };
    let report = ResetReport {
        gpus: verified
            .iter()
            .map(|b| GpuResetResult {
                pci_bus_id: (*b).to_owned(),
                requested: true,
                before: snap.clone(),
                after: Some(snap.clone()),
                persistence_mode_restored: Some(true),
                problems: Vec::new(),
            })
            .collect(),
        nvidia_smi_output: String::new(),
        verified: true,
    };
    serde_json::to_value(report).unwrap_or_default()
}

fn xid(n: u64, bus: Option<&str>, class: XidClass) -> XidEvent {
    XidEvent {
        xid: n,
        pci_bus_id: bus.map(str::to_owned),
        uuid: None,
        class,
        action: class.action(),
        description: None,
        message: None,
        pid: None,
        source: XidSource::Kmsg,
        observed_at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
        driver_message: false,
    }
}

/// Applies an XID and returns the node's conditions afterwards.
fn on_xid_in(tx: &Tx<'_>, event: &XidEvent) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, "node_1", None, "Health")?;
    if let Some(u) = xid_update(&edit.node.conditions, event) {
        apply(&mut edit, &u);
    }
    edit.save(tx)
}

fn cond<'a>(n: &'a NodeRecord, t: &str) -> Option<(&'a ConditionStatus, &'a [String])> {
    n.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| (&c.status, c.gpus.as_slice()))
}

#[test]
fn diag_and_reset_results_set_and_clear_gpu_unhealthy() {
    let none: &[Condition] = &[];
    let fail = cmd(
        bc_protocol::CommandName::DiagNvml,
        CommandState::Succeeded,
        Some(diag(vec![gpu(A, CheckStatus::Fail)], vec![])),
    );
    let ev = evidence(&fail).unwrap_or(Evidence::Reset { verified: vec![] });
    let u = updates_for(none, &ev);
    assert_eq!(
        u.first()
            .map(|u| (u.status, u.reason.as_str(), u.gpus.clone())),
        Some((
            ConditionStatus::True,
            "DiagFailed:resetGpu",
            vec![A.to_owned()]
        ))
    );
    let pass = cmd(
        bc_protocol::CommandName::DiagNvml,
        CommandState::Succeeded,
        Some(diag(vec![gpu(A, CheckStatus::Pass)], vec![])),
    );
    let u = evidence(&pass)
        .map(|e| updates_for(none, &e))
        .unwrap_or_default();
    assert!(u.iter().all(|u| u.status == ConditionStatus::False) && u.len() == 2);
    // Without NVML a report says nothing; nor does a failed or an unreadable command.
    let mut no_nvml = diag(vec![], vec![]);
    no_nvml["nvmlAvailable"] = serde_json::json!(false);
    assert!(
        evidence(&cmd(
            bc_protocol::CommandName::DiagNvml,
            CommandState::Succeeded,
            Some(no_nvml)
        ))
        .is_none()
    );
    assert!(
        evidence(&cmd(
            bc_protocol::CommandName::GpuReset,
            CommandState::Failed,
            None
        ))
        .is_none()
    );
    assert!(
        evidence(&cmd(
            bc_protocol::CommandName::DiagNvml,
            CommandState::Succeeded,
            Some(serde_json::json!({"verdict": "fail"}))
        ))
        .is_none()
    );
    // A verified reset with nothing to clear still says the GPU is fine.
    let r = evidence(&cmd(
        bc_protocol::CommandName::GpuReset,
        CommandState::Succeeded,
        Some(reset(&[A])),
    ))
    .unwrap_or(Evidence::Reset { verified: vec![] });
    let u = updates_for(none, &r);
    assert!(
        u.iter()
            .any(|u| u.type_ == GPU_UNHEALTHY && u.status == ConditionStatus::False)
    );
}

#[test]
fn fixing_one_gpu_clears_only_its_xid() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        node(tx, "node_1", None)?;
        on_xid_in(tx, &xid(79, Some(A), XidClass::RebootRequired))?;
        let n = on_xid_in(
            tx,
            &xid(62, Some("00000000:2B:00.0"), XidClass::ResetRequired),
        )?;
        assert_eq!(
            cond(&n, XID_CRITICAL),
            Some((&ConditionStatus::True, &[A.to_owned(), B.to_owned()][..]))
        );
        assert!(n.no_schedule_reasons.contains(&XID_CRITICAL.to_owned()));

        // A reset of B (NVML spelling) leaves A's XID: the node stays out of scheduling.
        let mut c = cmd(
            bc_protocol::CommandName::GpuReset,
            CommandState::Succeeded,
            Some(reset(&["00000000:2B:00.0"])),
        );
        let n = apply_command_result(tx, &c)?.ok_or(OpError::Internal("no write".into()))?;
        assert_eq!(
            cond(&n, XID_CRITICAL),
            Some((&ConditionStatus::True, &[A.to_owned()][..]))
        );
        assert!(n.no_schedule_reasons.contains(&XID_CRITICAL.to_owned()));

        // A diag where only B passes (A still fails) clears nothing of A.
        c = cmd(
            bc_protocol::CommandName::DiagNvml,
            CommandState::Succeeded,
            Some(diag(
                vec![gpu(A, CheckStatus::Fail), gpu(B, CheckStatus::Pass)],
                vec![],
            )),
        );
        let n = apply_command_result(tx, &c)?.ok_or(OpError::Internal("no write".into()))?;
        assert_eq!(
            cond(&n, XID_CRITICAL),
            Some((&ConditionStatus::True, &[A.to_owned()][..]))
        );
        assert_eq!(
            cond(&n, GPU_UNHEALTHY),
            Some((&ConditionStatus::True, &[A.to_owned()][..]))
        );

        // Resetting A clears both of A's conditions; the node is schedulable again.
        c = cmd(
            bc_protocol::CommandName::GpuReset,
            CommandState::Succeeded,
            Some(reset(&[A])),
        );
        let n = apply_command_result(tx, &c)?.ok_or(OpError::Internal("no write".into()))?;
        assert_eq!(
            cond(&n, XID_CRITICAL).map(|c| *c.0),
            Some(ConditionStatus::False)
        );
        assert_eq!(
            cond(&n, GPU_UNHEALTHY).map(|c| *c.0),
            Some(ConditionStatus::False)
        );
        assert!(
            n.no_schedule_reasons.is_empty(),
            "{:?}",
            n.no_schedule_reasons
        );
        Ok(())
    })
}

#[test]
fn a_passing_diag_of_another_gpu_leaves_the_xid() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        node(tx, "node_1", None)?;
        on_xid_in(tx, &xid(79, Some(A), XidClass::RebootRequired))?;
        // diag.nvml run on B alone (A is off the bus and not in the report): B passes, the
        // node-wide verdict fails on the GPU count.
        let count = Check::fail("gpuCount", 1, RecommendedAction::RebootNode);
        let c = cmd(
            bc_protocol::CommandName::DiagNvml,
            CommandState::Succeeded,
            Some(diag(vec![gpu(B, CheckStatus::Pass)], vec![count])),
        );
        let n = apply_command_result(tx, &c)?.ok_or(OpError::Internal("no write".into()))?;
        assert_eq!(
            cond(&n, XID_CRITICAL),
            Some((&ConditionStatus::True, &[A.to_owned()][..]))
        );
        // The node-wide failure makes GpuUnhealthy a condition of the whole node.
        assert_eq!(
            cond(&n, GPU_UNHEALTHY),
            Some((&ConditionStatus::True, &[][..]))
        );
        // A reset of B does not clear a node-wide condition; a diag passing everywhere does.
        let r = cmd(
            bc_protocol::CommandName::GpuReset,
            CommandState::Succeeded,
            Some(reset(&[B])),
        );
        let n = apply_command_result(tx, &r)?.unwrap_or(n);
        assert_eq!(
            cond(&n, GPU_UNHEALTHY).map(|c| *c.0),
            Some(ConditionStatus::True)
        );
        let ok = cmd(
            bc_protocol::CommandName::DiagNvml,
            CommandState::Succeeded,
            Some(diag(
                vec![gpu(A, CheckStatus::Pass), gpu(B, CheckStatus::Pass)],
                vec![],
            )),
        );
        let n = apply_command_result(tx, &ok)?.ok_or(OpError::Internal("no write".into()))?;
        assert!(
            n.no_schedule_reasons.is_empty(),
            "{:?}",
            n.no_schedule_reasons
        );
        Ok(())
    })
}

#[test]
fn an_xid_154_announcing_drain_p2p_is_a_noschedule_condition() -> Result<(), OpError> {
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        node(tx, "node_1", None)?;
        let n = on_xid_in(tx, &xid(154, Some(A), XidClass::DrainP2pRequired))?;
        assert_eq!(
            cond(&n, P2P_DRAIN_REQUIRED),
            Some((&ConditionStatus::True, &[A.to_owned()][..]))
        );
        assert_eq!(n.no_schedule_reasons, vec![P2P_DRAIN_REQUIRED.to_owned()]);
        let c = &n.conditions[0];
        assert_eq!((c.reason.as_str(), c.owner.as_str()), ("Xid154", "Health"));
        assert!(
            c.message.contains("drainP2pRequired") && c.message.contains("drainP2p"),
            "{}",
            c.message
        );
        // Informational and application XIDs change nothing; an XID without a bus id is about
        // the whole node.
        assert!(xid_update(&n.conditions, &xid(43, Some(A), XidClass::Informational)).is_none());
        assert!(xid_update(&n.conditions, &xid(13, Some(A), XidClass::ApplicationFault)).is_none());
        let whole = xid_update(&[], &xid(62, None, XidClass::ResetRequired));
        assert_eq!(whole.map(|u| u.gpus), Some(Vec::new()));
        // A verified reset of the GPU clears it.
        let r = cmd(
            bc_protocol::CommandName::GpuReset,
            CommandState::Succeeded,
            Some(reset(&[A])),
        );
        let n = apply_command_result(tx, &r)?.ok_or(OpError::Internal("no write".into()))?;
        assert_eq!(
            cond(&n, P2P_DRAIN_REQUIRED).map(|c| *c.0),
            Some(ConditionStatus::False)
        );
        assert!(n.no_schedule_reasons.is_empty());
        Ok(())
    })
}

#[test]
fn bus_ids_have_one_spelling() {
    assert_eq!(canonical_bus_id("00000000:1A:00.0"), A);
    assert_eq!(canonical_bus_id("0000:1a:00"), A);
    assert_eq!(canonical_bus_id("PCI:0000:1a:00"), A);
    assert_eq!(canonical_bus_id("1a:00.0"), A);
}
