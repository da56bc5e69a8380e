//! Deploy through the ramdisk's `image.write` and the BMC (issue 16), through the core with a
//! real store: the steps in order to `deployed`, a checksum mismatch failing it (and
//! `nodes.recover` deploying the same again), a lost lease re-sending only the BMC step, the
//! refusals at the verb, and the deadline. The bed is `boot_tests`'.

use std::time::Duration;

use bc_protocol::{ConditionStatus, Mode, ProvisionState};
use cpl_store::{CommandRecord, CommandState, now_ms};
use serde_json::{Value, json};

use super::boot;
use super::boot_tests::{Bed, MAC, SERIAL, TestResult, UUID, bed, cond, digests};
use super::deploy::{self, DEPLOYED, DeployRequest};
use crate::error::OpError;
use crate::join::JoinOutcome;

const INVENTORY: &str = r#"{"schemaVersion": 1, "hostname": "ramdisk"}"#;
const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

/// The bed's node `ready` (inspected and commissioned), its inspection's boot ended.
pub(super) fn ready() -> Result<Bed, Box<dyn std::error::Error>> {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let joined = b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?;
    assert!(matches!(joined, JoinOutcome::Joined(_)));
    assert_eq!(b.report(INVENTORY.as_bytes())?, Some(ProvisionState::Ready));
    b.store.write_blocking(|tx| {
        if let Some(mut rec) = tx.boot(&b.node)? {
            rec.ended_at = Some(now_ms());
            tx.put_boot(&rec)?;
        }
        Ok::<_, OpError>(())
    })?;
    Ok(b)
}

pub(super) fn controller(b: &Bed) -> super::BareMetal {
    let commands = crate::commands::Commands {
        store: b.store.clone(),
        sessions: std::sync::Arc::new(crate::port::NoSessions),
    };
    super::BareMetal::new(commands, b.key.clone(), Default::default())
}

pub(super) fn request(b: &Bed, body: Value) -> Result<DeployRequest, serde_json::Error> {
    let mut v = json!({"nodeId": b.node});
    if let (Some(o), Some(extra)) = (v.as_object_mut(), body.as_object()) {
        o.extend(extra.clone());
    }
    serde_json::from_value(v)
}

pub(super) fn image() -> Value {
    json!({
        "image": {"url": "http://10.0.2.2:8080/disk.raw", "sha256": SHA},
        "rootDevice": {"serial": "QM00001"},
        "configDrive": {"hostname": "web-1", "sshKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW t@h"]}
    })
}

/// Boots and joins the ramdisk for the node's state and reports, as the controller and the
/// ramdisk would.
pub(super) fn boot_join_report(b: &Bed) -> TestResult {
    let state = b.node()?.provision_state;
    let rec = b.store.write_blocking(|tx| {
        boot::begin(
            tx,
            &b.key,
            &b.node,
            state,
            Duration::from_secs(600),
            now_ms(),
        )
    })?;
    let token = b.key.open_boot_token(&b.node, &rec.sealed)?;
    let joined = b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?;
    assert!(matches!(joined, JoinOutcome::Joined(_)), "{joined:?}");
    assert_eq!(b.report(INVENTORY.as_bytes())?, Some(state));
    Ok(())
}

/// The boot's `image.write`, queued as the pass would.
pub(super) fn queue_write(b: &Bed) -> Result<CommandRecord, Box<dyn std::error::Error>> {
    Ok(b.store.write_blocking(|tx| {
        let mut rec = tx
            .boot(&b.node)?
            .ok_or(OpError::Internal("no boot".into()))?;
        let id = deploy::queue_write(tx, &rec, None, now_ms())?;
        rec.work_command_id = Some(id.clone());
        tx.put_boot(&rec)?;
        tx.command(&id)?
            .ok_or(OpError::Internal("no command".into()))
    })?)
}

/// A `bmc.*` step on the site agent about the node, made the boot's command in flight.
pub(super) fn bmc_step(b: &Bed, name: &str) -> Result<CommandRecord, Box<dyn std::error::Error>> {
    let id = format!("cmd_{}", name.replace('.', "_"));
    b.store.write_blocking(|tx| {
        let mut rec = tx
            .boot(&b.node)?
            .ok_or(OpError::Internal("no boot".into()))?;
        rec.work_command_id = Some(id.clone());
        tx.put_boot(&rec)?;
        Ok::<_, OpError>(())
    })?;
    Ok(CommandRecord {
        id,
        node_id: "node_site".into(),
        name: name.parse()?,
        args: json!({}),
        state: CommandState::Queued,
        progress: 0,
        result: None,
        error_code: None,
        error_message: None,
        actor: "t".into(),
        created_at: 1,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: 2,
        subject_node_id: Some(b.node.clone()),
    })
}

pub(super) fn finish(
    b: &Bed,
    cmd: &CommandRecord,
    state: CommandState,
    result: Option<Value>,
    code: Option<&str>,
) -> TestResult {
    let mut done = cmd.clone();
    done.state = state;
    done.result = result;
    done.error_code = code.map(str::to_owned);
    done.error_message = code.map(|c| format!("{c}: as the test says"));
    b.store
        .write_blocking(|tx| crate::commands::finished::on_final(tx, &done))?;
    Ok(())
}

pub(super) fn written() -> Value {
    json!({"device": "vda", "chosenBecause": "serial QM00001 (hint)", "deviceSizeBytes": 1_073_741_824u64,
           "imageBytes": 33_554_432u64, "writtenBytes": 33_554_432u64, "sha256": SHA,
           "configDrivePartition": "vda3", "durationMs": 800})
}

fn steps(b: &Bed) -> Result<Vec<String>, OpError> {
    Ok(b.store
        .read_blocking(|r| r.events(&b.node))?
        .into_iter()
        .filter(|e| e.kind == "deployStep")
        .filter_map(|e| e.to)
        .collect())
}

#[tokio::test]
async fn a_deploy_writes_the_image_then_boots_the_disk() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    let n = bm.deploy(request(&b, image())?, "operator:t").await?;
    assert_eq!(n.provision_state, ProvisionState::Deploying);
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    assert_eq!(cmd.name, bc_protocol::CommandName::ImageWrite);
    assert_eq!(cmd.args["image"]["sha256"], SHA);
    assert_eq!(cmd.args["configDrive"]["hostname"], "web-1");
    let instance = cmd.args["instanceId"].as_str().unwrap_or_default();
    assert!(
        instance.starts_with(&format!("{}-boot_", b.node)),
        "{instance}"
    );
    finish(&b, &cmd, CommandState::Succeeded, Some(written()), None)?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Deploying);
    let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
    assert_eq!(c.reason, "ImageWritten");
    assert!(
        c.message
            .contains("vda (serial QM00001 (hint)): 32.0 MiB in 800 ms (40.0 MiB/s)")
            && c.message.contains("config drive vda3"),
        "{}",
        c.message
    );
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_eq!(rec.work_step, Some(cpl_store::WorkStep::ImageWritten));
    assert_eq!(
        rec.work_command_id, None,
        "the next pass sends the boot device"
    );
    let boot_device = bmc_step(&b, "bmc.setBootDevice")?;
    finish(
        &b,
        &boot_device,
        CommandState::Succeeded,
        Some(json!({})),
        None,
    )?;
    let before = b.node()?;
    let reboot = bmc_step(&b, "bmc.power")?;
    finish(&b, &reboot, CommandState::Succeeded, Some(json!({})), None)?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Deployed);
    assert_eq!(
        n.identity_generation,
        before.identity_generation + 1,
        "the ramdisk's identity ends"
    );
    assert_eq!(
        cond(&n, DEPLOYED).map(|c| c.status),
        Some(ConditionStatus::True)
    );
    assert_eq!(
        steps(&b)?,
        [
            "ready",
            "running",
            "imageWritten",
            "bootDeviceSet",
            "rebooted"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn a_checksum_mismatch_fails_the_deploy_and_recover_deploys_the_same_again() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    bm.deploy(request(&b, image())?, "operator:t").await?;
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    finish(
        &b,
        &cmd,
        CommandState::Failed,
        None,
        Some("CHECKSUM_MISMATCH"),
    )?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Deploying));
    assert!(n.maintenance);
    let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, "ChecksumMismatch")
    );
    assert!(
        c.message.contains("deploy failed at image.write"),
        "{}",
        c.message
    );
    let n = b
        .store
        .write_blocking(|tx| super::abort::recover(tx, &b.node, n.version, "operator:t"))?;
    assert_eq!(n.provision_state, ProvisionState::Deploying);
    boot_join_report(&b)?;
    let again = queue_write(&b)?;
    assert_eq!(
        again.args["image"], cmd.args["image"],
        "the same image again"
    );
    assert_ne!(again.args["instanceId"], cmd.args["instanceId"]);
    // Failed again; nodes.deploy on the failed node deploys another image instead.
    finish(
        &b,
        &again,
        CommandState::Failed,
        None,
        Some("IMAGE_UNREACHABLE"),
    )?;
    let n = b.node()?;
    assert_eq!(
        cond(&n, DEPLOYED).map(|c| c.reason.as_str()),
        Some("ImageUnreachable")
    );
    let mut other = image();
    other["image"]["url"] = json!("http://10.0.2.2:8080/other.raw");
    let n = bm.deploy(request(&b, other)?, "operator:t").await?;
    assert_eq!(n.provision_state, ProvisionState::Deploying);
    boot_join_report(&b)?;
    let third = queue_write(&b)?;
    assert_eq!(third.args["image"]["url"], "http://10.0.2.2:8080/other.raw");
    Ok(())
}

#[tokio::test]
async fn a_lost_lease_resends_only_the_bmc_step_and_a_refusing_bmc_fails_it() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    bm.deploy(request(&b, image())?, "operator:t").await?;
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    finish(&b, &cmd, CommandState::Succeeded, Some(written()), None)?;
    let bd = bmc_step(&b, "bmc.setBootDevice")?;
    finish(&b, &bd, CommandState::Failed, None, Some("LEASE_LOST"))?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Deploying);
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_eq!(rec.work_step, Some(cpl_store::WorkStep::ImageWritten));
    assert_eq!(rec.work_command_id, None);
    let bd = bmc_step(&b, "bmc.setBootDevice")?;
    finish(&b, &bd, CommandState::Failed, None, Some("BMC_ERROR"))?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
    assert_eq!(c.reason, "BmcStepFailed");
    Ok(())
}

#[tokio::test]
async fn deploy_is_refused_for_a_bad_image_or_a_node_not_ready() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    let bad = request(&b, json!({"image": {"url": "ftp://h/i", "sha256": SHA}}))?;
    let r = bm.deploy(bad, "operator:t").await;
    assert!(
        matches!(&r, Err(OpError::InvalidArgument(m)) if m.contains("image.url")),
        "{r:?}"
    );
    assert!(
        request(&b, json!({"image": {"url": "http://h/i"}})).is_err(),
        "sha256 is required"
    );
    bm.deploy(request(&b, image())?, "operator:t").await?;
    let twice = bm.deploy(request(&b, image())?, "operator:t").await;
    assert!(
        matches!(twice, Err(OpError::InvalidTransition { .. })),
        "{twice:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_deploy_deadline_fails_a_machine_that_never_reports() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    bm.deploy(request(&b, image())?, "operator:t").await?;
    let now = now_ms();
    bm.boot_pass(now).await;
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot begun")?;
    assert_eq!(rec.purpose, ProvisionState::Deploying);
    bm.boot_pass(now + 3_601_000).await;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
    assert_eq!(c.reason, "DeployDeadline");
    assert!(c.message.contains("never powered on"), "{}", c.message);
    // Recovered at once, before a pass ended the failed boot: the next pass begins a new
    // boot rather than waiting on the one that failed.
    let failed_boot = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    b.store
        .write_blocking(|tx| super::abort::recover(tx, &b.node, n.version, "operator:t"))?;
    bm.boot_pass(now_ms()).await;
    let fresh = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_ne!(fresh.token_id, failed_boot.token_id);
    assert_eq!(
        (fresh.purpose.as_str(), fresh.ended_at),
        ("deploying", None)
    );
    Ok(())
}

#[tokio::test]
async fn abort_fails_the_workflow_at_its_step_and_names_what_to_cancel() -> TestResult {
    let b = ready()?;
    let bm = controller(&b);
    bm.deploy(request(&b, image())?, "operator:t").await?;
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    let v = b.node()?.version;
    let (n, cancel) = b
        .store
        .write_blocking(|tx| super::abort::abort(tx, &b.node, v, "operator:alice"))?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Deploying));
    assert!(n.maintenance);
    assert_eq!(cancel, vec![cmd.id.clone()]);
    let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
    assert_eq!(c.reason, "Aborted");
    assert!(
        c.message
            .contains("deploying aborted by operator:alice while the ramdisk worked"),
        "{}",
        c.message
    );
    // The cancelled image.write arriving later changes nothing.
    finish(&b, &cmd, CommandState::Cancelled, None, Some("CANCELLED"))?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Failed);
    // Nothing is in flight on a failed node.
    let again = b
        .store
        .write_blocking(|tx| super::abort::abort(tx, &b.node, n.version, "operator:alice"));
    assert!(matches!(again, Err(OpError::InvalidState(_))), "{again:?}");
    Ok(())
}

#[tokio::test]
async fn an_image_write_result_that_is_not_of_the_image_asked_fails_the_deploy() -> TestResult {
    let mut other_sha = written();
    other_sha["sha256"] = json!("cd".repeat(32));
    let mut no_drive = written();
    if let Some(o) = no_drive.as_object_mut() {
        o.remove("configDrivePartition");
    }
    let mut wrong_type = written();
    wrong_type["writtenBytes"] = json!("lots");
    for (result, why) in [
        (other_sha, "reports SHA-256 cdcd"),
        (no_drive, "reports no config drive"),
        (wrong_type, "does not parse"),
        (json!(null), "does not parse"),
    ] {
        let b = ready()?;
        let bm = controller(&b);
        bm.deploy(request(&b, image())?, "operator:t").await?;
        boot_join_report(&b)?;
        let cmd = queue_write(&b)?;
        finish(
            &b,
            &cmd,
            CommandState::Succeeded,
            Some(result.clone()),
            None,
        )?;
        let n = b.node()?;
        assert_eq!(n.provision_state, ProvisionState::Failed, "{result}");
        let c = cond(&n, DEPLOYED).ok_or("no Deployed")?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "StepFailed")
        );
        assert!(c.message.contains(why), "{result}: {}", c.message);
        let rec = b
            .store
            .read_blocking(|r| r.boot(&b.node))?
            .ok_or("no boot")?;
        assert_eq!(rec.work_step, None, "no BMC step follows");
    }
    Ok(())
}

/// Issue 30.4: cloud-init user data reaches the ramdisk's `image.write`, but never a
/// `commands.*` answer, and is dropped from the stored command once the write is over and from
/// the node's deployment once it is deployed.
#[tokio::test]
async fn user_data_is_withheld_from_answers_and_dropped_once_written() -> TestResult {
    const SECRET: &str = "S3cret-user-data-pw";
    let b = ready()?;
    let bm = controller(&b);
    let mut body = image();
    body["configDrive"]["userData"] = json!(format!("#cloud-config\npassword: {SECRET}\n"));
    bm.deploy(request(&b, body)?, "operator:t").await?;
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    // The ramdisk gets it whole.
    assert!(
        cmd.args["configDrive"]["userData"]
            .as_str()
            .unwrap_or_default()
            .contains(SECRET)
    );
    let shown = serde_json::to_string(&crate::verbs::types::CommandView::from(&cmd))?;
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("withheld"), "{shown}");
    finish(&b, &cmd, CommandState::Succeeded, Some(written()), None)?;
    let stored = b
        .store
        .read_blocking(|r| r.command(&cmd.id))?
        .ok_or("no command")?;
    assert!(!stored.args.to_string().contains(SECRET), "{}", stored.args);
    assert_eq!(b.node()?.provision_state, ProvisionState::Deploying);
    let boot_device = bmc_step(&b, "bmc.setBootDevice")?;
    finish(
        &b,
        &boot_device,
        CommandState::Succeeded,
        Some(json!({})),
        None,
    )?;
    let reboot = bmc_step(&b, "bmc.power")?;
    finish(&b, &reboot, CommandState::Succeeded, Some(json!({})), None)?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Deployed);
    let bmc = b.store.read_blocking(|r| r.bmc(&b.node))?.ok_or("no BMC")?;
    let deployment = bmc.deployment.unwrap_or_default().to_string();
    assert!(!deployment.contains(SECRET), "{deployment}");
    assert!(deployment.contains("web-1"), "{deployment}");
    Ok(())
}
