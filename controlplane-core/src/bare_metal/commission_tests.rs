//! Commissioning in the ramdisk (issue 15), through the core with a real store: the GPU
//! profile's `gpuDiag` step decided by `diag.nvml`'s verdict, a boot that begins in
//! `commissioning` (after `nodes.recover`), and a power-on that fails after the ramdisk joined.
//! The bed (a node `inspecting` with a verified BMC) is `boot_tests`'.

use std::time::Duration;

use bc_protocol::{ConditionStatus, Mode, ProvisionState};
use cpl_store::now_ms;

use super::boot;
use super::boot_tests::{MAC, SERIAL, TestResult, UUID, bed, cond, digests};
use super::commission::COMMISSIONED;
use crate::error::OpError;
use crate::join::JoinOutcome;

/// An inventory with `n` GPUs named like the H100 the profile may expect.
fn gpu_inventory(n: usize) -> String {
    let gpus: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({"name": "NVIDIA H100 80GB HBM3", "pciBusId": format!("0000:{:02x}:00.0", 0x10 + i), "source": "nvml"})
        })
        .collect();
    serde_json::json!({"schemaVersion": 1, "hostname": "ramdisk", "gpus": gpus}).to_string()
}

fn diag_done(node: &str, id: &str, verdict: &str, summary: &str) -> cpl_store::CommandRecord {
    cpl_store::CommandRecord {
        id: id.to_owned(),
        node_id: node.to_owned(),
        name: bc_protocol::CommandName::DiagNvml,
        args: serde_json::json!({}),
        state: cpl_store::CommandState::Succeeded,
        progress: 100,
        result: Some(serde_json::json!({
            "nvmlAvailable": true, "nodeChecks": [], "gpus": [],
            "verdict": verdict, "action": "none", "summary": summary
        })),
        error_code: None,
        error_message: None,
        actor: "t".into(),
        created_at: 1,
        sent_at: None,
        started_at: None,
        finished_at: Some(2),
        deadline_at: 3,
        subject_node_id: None,
    }
}

#[test]
fn a_gpu_profile_waits_for_diag_nvml_in_the_ramdisk_and_its_verdict_decides() -> TestResult {
    for (verdict, want) in [
        ("pass", ProvisionState::Ready),
        ("fail", ProvisionState::Failed),
    ] {
        let b = bed(Some(2))?;
        let token = b.boot(Duration::from_secs(600))?;
        let d = digests(UUID, SERIAL, MAC);
        assert!(matches!(
            b.join(&token, Mode::Ramdisk, d.clone())?,
            JoinOutcome::Joined(_)
        ));
        let doc = gpu_inventory(2);
        let state = b.report(doc.as_bytes())?;
        assert_eq!(
            state,
            Some(ProvisionState::Commissioning),
            "gpuDiag is still to run"
        );
        let n = b.node()?;
        assert_eq!(
            cond(&n, COMMISSIONED).map(|c| c.status),
            Some(ConditionStatus::Unknown)
        );
        let cmd = b.store.write_blocking(|tx| {
            let pool = tx.pool(n.pool_id.as_deref().unwrap_or_default())?;
            let id = super::commission::queue_diag(tx, &b.node, pool.as_ref(), 60_000)?;
            let mut boot = tx
                .boot(&b.node)?
                .ok_or(OpError::Internal("no boot".into()))?;
            boot.diag_command_id = Some(id.clone());
            tx.put_boot(&boot)?;
            let c = tx
                .command(&id)?
                .ok_or(OpError::Internal("no command".into()))?;
            Ok::<_, OpError>(c)
        })?;
        assert_eq!(cmd.name, bc_protocol::CommandName::DiagNvml);
        assert_eq!(cmd.args["expectedGpus"]["count"], 2);
        // A diag.nvml that is not the step's changes nothing.
        b.store.write_blocking(|tx| {
            super::table::on_final(tx, &diag_done(&b.node, "cmd_other", "fail", "x"))
        })?;
        assert_eq!(b.node()?.provision_state, ProvisionState::Commissioning);
        b.store.write_blocking(|tx| {
            super::table::on_final(
                tx,
                &diag_done(&b.node, &cmd.id, verdict, &format!("2 GPUs: {verdict}")),
            )
        })?;
        let n = b.node()?;
        assert_eq!(n.provision_state, want, "verdict {verdict}");
        if want == ProvisionState::Failed {
            let c = cond(&n, COMMISSIONED).ok_or("no Commissioned")?;
            assert!(c.message.contains("gpuDiag: 2 GPUs: fail"), "{}", c.message);
            assert_eq!(n.failed_from, Some(ProvisionState::Commissioning));
        }
    }
    Ok(())
}

#[test]
fn a_boot_that_begins_in_commissioning_runs_the_steps_on_its_first_report() -> TestResult {
    // A GPU pool whose gpuDiag failed: the node is failed from commissioning.
    let b = bed(Some(2))?;
    let token = b.boot(Duration::from_secs(600))?;
    let d = digests(UUID, SERIAL, MAC);
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d.clone())?,
        JoinOutcome::Joined(_)
    ));
    let report = |doc: &str| b.report(doc.as_bytes());
    // Too few GPUs: failed from commissioning.
    assert_eq!(report(&gpu_inventory(1))?, Some(ProvisionState::Failed));
    // nodes.recover: back to commissioning, and a new boot for it (the controller's part).
    b.store.write_blocking(|tx| {
        let mut edit = crate::edit::Edit::begin(tx, &b.node, None, "operator:t")?;
        crate::ops::nodes::recover_in(&mut edit)?;
        edit.save(tx)?;
        let rec = boot::begin(
            tx,
            &b.key,
            &b.node,
            ProvisionState::Commissioning,
            Duration::from_secs(600),
            now_ms(),
        )?;
        Ok::<_, OpError>(rec)
    })?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Commissioning);
    let boot_rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    let token = b.key.open_boot_token(&b.node, &boot_rec.sealed)?;
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d.clone())?,
        JoinOutcome::Joined(_)
    ));
    // Its first report runs the steps (the GPUs are all there now): waiting for gpuDiag.
    assert_eq!(
        report(&gpu_inventory(2))?,
        Some(ProvisionState::Commissioning)
    );
    let boot_rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert!(boot_rec.steps_at.is_some(), "the steps ran on this boot");
    let n = b.node()?;
    assert_eq!(
        cond(&n, COMMISSIONED).map(|c| c.status),
        Some(ConditionStatus::Unknown)
    );
    Ok(())
}

#[test]
fn a_power_on_that_fails_after_the_ramdisk_joined_changes_nothing() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let mut boot_rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    boot_rec.command_id = Some("cmd_power".into());
    b.store.write_blocking(|tx| tx.put_boot(&boot_rec))?;
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?,
        JoinOutcome::Joined(_)
    ));
    let mut late = diag_done(&b.node, "cmd_power", "pass", "");
    late.name = bc_protocol::CommandName::BmcPower;
    late.state = cpl_store::CommandState::Expired;
    late.subject_node_id = Some(b.node.clone());
    b.store
        .write_blocking(|tx| super::table::on_power_on_final(tx, &late))?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Inspecting);
    // Before a join, the same failure fails the inspection at once, saying why.
    let b = bed(None)?;
    let _token = b.boot(Duration::from_secs(600))?;
    let mut boot_rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    boot_rec.command_id = Some("cmd_power".into());
    b.store.write_blocking(|tx| tx.put_boot(&boot_rec))?;
    late.error_code = Some("BMC_UNREACHABLE".into());
    late.error_message = Some("no answer".into());
    b.store
        .write_blocking(|tx| super::table::on_power_on_final(tx, &late))?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, super::inspect::INSPECTED).ok_or("no Inspected")?;
    assert_eq!(c.reason, "PowerOnFailed");
    assert!(c.message.contains("BMC_UNREACHABLE"), "{}", c.message);
    Ok(())
}

/// The controller over `b`'s store, with no live session anywhere (so no lease holder either).
fn controller(b: &super::boot_tests::Bed) -> super::BareMetal {
    let commands = crate::commands::Commands {
        store: b.store.clone(),
        sessions: std::sync::Arc::new(crate::port::NoSessions),
    };
    super::BareMetal::new(commands, b.key.clone(), Default::default())
}

#[tokio::test]
async fn each_ramdisk_state_fails_at_its_deadline_saying_what_never_happened() -> TestResult {
    // Inspecting, no site agent holding the lease: the controller begins the boot, never powers
    // the machine on, and the inspection deadline (1,800 s by default) fails it.
    let b = bed(None)?;
    let bm = controller(&b);
    let now = now_ms();
    bm.boot_pass(now).await;
    let boot_rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot begun")?;
    assert_eq!(boot_rec.command_id, None, "no holder: nothing powered on");
    bm.boot_pass(now + 1_799_000).await;
    assert_eq!(b.node()?.provision_state, ProvisionState::Inspecting);
    bm.boot_pass(now + 1_801_000).await;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, super::inspect::INSPECTED).ok_or("no Inspected")?;
    assert_eq!(c.reason, "InspectionDeadline");
    assert!(c.message.contains("no site agent"), "{}", c.message);

    // Commissioning waiting for gpuDiag (no session: never sent): the commissioning deadline.
    let b = bed(Some(2))?;
    let token = b.boot(Duration::from_secs(600))?;
    let d = digests(UUID, SERIAL, MAC);
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, d.clone())?,
        JoinOutcome::Joined(_)
    ));
    let doc = gpu_inventory(2);
    b.report(doc.as_bytes())?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Commissioning);
    let bm = controller(&b);
    bm.boot_pass(now_ms() + 3_601_000).await;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Commissioning));
    let c = cond(&n, COMMISSIONED).ok_or("no Commissioned")?;
    assert_eq!(c.reason, "CommissioningDeadline");
    Ok(())
}
