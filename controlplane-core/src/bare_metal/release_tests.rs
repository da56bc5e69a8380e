//! Release and retire through the ramdisk's `disk.clean` (issue 16), through the core with a
//! real store: a clean release commissions back to `ready`, a failed disk fails it (and
//! `nodes.recover` cleans again), a wrong machine is never cleaned, a retire ends `retired`
//! with no identity, the cleaning deadline says how far the machine got, and an enrollment of
//! a running machine ends `deployed`. The bed is `boot_tests`'.

use std::time::Duration;

use bc_protocol::{ConditionStatus, Mode, ProvisionState};
use cpl_store::{CommandRecord, CommandState, NodeRecord, now_ms};
use serde_json::{Value, json};

use super::boot;
use super::boot_tests::{Bed, MAC, SERIAL, TestResult, UUID, bed, cond, digests};
use super::release::{self, CLEANED};
use crate::edit::Edit;
use crate::error::OpError;
use crate::join::JoinOutcome;
use crate::ops::nodes::apply_transition;

const INVENTORY: &str = r#"{"schemaVersion": 1, "hostname": "ramdisk"}"#;

/// The bed's node taken to `deployed` the way inspection and a deploy would: `ready` through
/// the ramdisk's report, then `deploying -> deployed` (the deploy workflow's moves).
fn deployed() -> Result<Bed, Box<dyn std::error::Error>> {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    let joined = b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?;
    assert!(matches!(joined, JoinOutcome::Joined(_)));
    assert_eq!(b.report(INVENTORY.as_bytes())?, Some(ProvisionState::Ready));
    b.store.write_blocking(|tx| {
        // The controller ends the inspection's boot once the node is ready.
        if let Some(mut rec) = tx.boot(&b.node)? {
            rec.ended_at = Some(now_ms());
            tx.put_boot(&rec)?;
        }
        let mut e = Edit::begin(tx, &b.node, None, "test")?;
        apply_transition(&mut e, ProvisionState::Deploying, "test")?;
        apply_transition(&mut e, ProvisionState::Deployed, "test")?;
        e.save(tx)
    })?;
    Ok(b)
}

/// Begins the boot the controller would begin for the node's current state and joins the
/// ramdisk with it.
fn boot_and_join(b: &Bed) -> TestResult {
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
    Ok(())
}

/// Queues the boot's `disk.clean` as the controller's pass would.
fn queue(b: &Bed) -> Result<CommandRecord, Box<dyn std::error::Error>> {
    let n = b.node()?;
    Ok(b.store.write_blocking(|tx| {
        let mut rec = tx
            .boot(&b.node)?
            .ok_or(OpError::Internal("no boot".into()))?;
        assert!(
            rec.steps_at.is_some(),
            "the report made the boot ready to clean"
        );
        let pool = tx.pool(n.pool_id.as_deref().unwrap_or_default())?;
        let id = release::queue_clean(tx, &rec, pool.as_ref(), now_ms())?;
        rec.work_command_id = Some(id.clone());
        tx.put_boot(&rec)?;
        tx.command(&id)?
            .ok_or(OpError::Internal("no command".into()))
    })?)
}

/// `cmd` finished with `state` and `result`, decided in one transaction.
fn finish(b: &Bed, cmd: &CommandRecord, state: CommandState, result: Option<Value>) -> TestResult {
    let mut done = cmd.clone();
    done.state = state;
    done.result = result;
    if state != CommandState::Succeeded {
        done.error_code = Some("DEADLINE_EXCEEDED".into());
        done.error_message = Some("ran past its deadline".into());
    }
    b.store
        .write_blocking(|tx| crate::commands::finished::on_final(tx, &done))?;
    Ok(())
}

fn result(disks: Value) -> Value {
    json!({"mode": "metadata", "durationMs": 81, "disks": disks})
}

fn cleaned(name: &str) -> Value {
    json!({"name": name, "serial": "S-1", "sizeBytes": 8_589_934_592u64, "outcome": "cleaned",
           "steps": ["metadata", "rereadPartitions"], "durationMs": 40, "bytesErased": 4_194_304})
}

fn events(b: &Bed, kind: &str) -> Result<Vec<(Option<String>, String)>, OpError> {
    Ok(b.store
        .read_blocking(|r| r.events(&b.node))?
        .into_iter()
        .filter(|e| e.kind == kind)
        .map(|e| (e.to, e.message))
        .collect())
}

fn generation(n: &NodeRecord) -> u64 {
    n.identity_generation
}

#[test]
fn a_release_cleans_every_disk_then_commissions_back_to_ready() -> TestResult {
    let b = deployed()?;
    let before = b.node()?;
    let after = b
        .store
        .write_blocking(|tx| release::release(tx, &b.node, before.version, "operator:t"))?;
    assert_eq!(after.provision_state, ProvisionState::Releasing);
    assert_eq!(
        generation(&after),
        generation(&before) + 1,
        "the tenant's identity ends with the release"
    );
    assert_eq!(
        cond(&after, CLEANED).map(|c| c.reason.as_str()),
        Some("Booting")
    );
    boot_and_join(&b)?;
    assert_eq!(
        b.report(INVENTORY.as_bytes())?,
        Some(ProvisionState::Releasing),
        "the report only makes the boot ready to clean"
    );
    let cmd = queue(&b)?;
    assert_eq!(cmd.name, bc_protocol::CommandName::DiskClean);
    assert_eq!(cmd.args, json!({"mode": "metadata"}));
    assert!(
        cmd.deadline_at > now_ms() + 500_000,
        "the state's deadline is left to it"
    );
    // A disk.clean that is not the boot's changes nothing.
    let mut other = cmd.clone();
    other.id = "cmd_other".into();
    finish(&b, &other, CommandState::Succeeded, Some(result(json!([]))))?;
    assert_eq!(b.node()?.provision_state, ProvisionState::Releasing);
    let disks = json!([cleaned("nvme0n1"),
        {"name": "sr0", "sizeBytes": 0, "outcome": "readOnly", "error": "read-only (ro = 1)", "durationMs": 0}]);
    finish(&b, &cmd, CommandState::Succeeded, Some(result(disks)))?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Ready);
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert_eq!(c.status, ConditionStatus::True);
    assert!(
        c.message.contains("1 disk(s) cleaned (metadata)") && c.message.contains("sr0"),
        "{}",
        c.message
    );
    let steps = events(&b, "cleaningStep")?;
    let to: Vec<Option<&str>> = steps.iter().map(|(t, _)| t.as_deref()).collect();
    assert_eq!(
        to,
        [
            Some("ready"),
            Some("running"),
            Some("cleaned"),
            Some("readOnly")
        ]
    );
    assert!(
        steps[2].1.contains("nvme0n1 (serial S-1): cleaned"),
        "{:?}",
        steps[2]
    );
    let moves = events(&b, "provisionState")?;
    let last = moves.last().ok_or("no move")?;
    assert!(
        last.1.contains("commissioning's checks passed again"),
        "{last:?}"
    );
    Ok(())
}

#[test]
fn a_failed_disk_fails_the_release_and_recover_cleans_again() -> TestResult {
    let b = deployed()?;
    let v = b.node()?.version;
    b.store
        .write_blocking(|tx| release::release(tx, &b.node, v, "operator:t"))?;
    boot_and_join(&b)?;
    b.report(INVENTORY.as_bytes())?;
    let cmd = queue(&b)?;
    let disks = json!([cleaned("nvme0n1"),
        {"name": "sdb", "sizeBytes": 10, "outcome": "failed", "error": "writing the first MiB: EIO", "durationMs": 3}]);
    finish(&b, &cmd, CommandState::Succeeded, Some(result(disks)))?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Releasing));
    assert!(n.maintenance);
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, "CleanFailed")
    );
    assert!(
        c.message.contains("sdb (writing the first MiB: EIO)"),
        "{}",
        c.message
    );
    // nodes.recover: back to releasing; the controller boots and cleans again.
    let n = b
        .store
        .write_blocking(|tx| super::abort::recover(tx, &b.node, n.version, "operator:t"))?;
    assert_eq!(n.provision_state, ProvisionState::Releasing);
    boot_and_join(&b)?;
    b.report(INVENTORY.as_bytes())?;
    let cmd = queue(&b)?;
    // A command that ran past its deadline fails it again, saying so.
    finish(&b, &cmd, CommandState::Expired, None)?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert!(c.message.contains("disk.clean expired"), "{}", c.message);
    Ok(())
}

#[test]
fn another_machine_in_the_ramdisk_is_never_cleaned() -> TestResult {
    let b = deployed()?;
    let v = b.node()?.version;
    b.store
        .write_blocking(|tx| release::release(tx, &b.node, v, "operator:t"))?;
    boot_and_join(&b)?;
    // The report shows another machine's serial (a swapped board behind the same BMC).
    let other = digests(UUID, "SER-SOMEONE-ELSE", MAC);
    let state = b.store.write_blocking(|tx| {
        crate::reports::record_inventory(
            tx,
            &b.node,
            0,
            &crate::reports::InventoryReport {
                hardware_key: &"ef".repeat(32),
                trusted: true,
                digests: &other,
                document: INVENTORY.as_bytes(),
                sha256: &"cd".repeat(32),
            },
        )
    })?;
    assert_eq!(state, Some(ProvisionState::Failed));
    let n = b.node()?;
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert_eq!(c.reason, "HardwareMismatch");
    assert!(c.message.contains("nothing was erased"), "{}", c.message);
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot")?;
    assert_eq!(rec.steps_at, None, "no disk.clean may follow");
    Ok(())
}

#[test]
fn a_retired_machine_is_cleaned_and_holds_no_identity() -> TestResult {
    let b = deployed()?;
    let before = b.node()?;
    let n = b.store.write_blocking(|tx| {
        crate::ops::retire::retire(tx, &b.node, before.version, "operator:t")
    })?;
    assert_eq!(n.provision_state, ProvisionState::Retiring);
    assert_eq!(generation(&n), generation(&before) + 1);
    boot_and_join(&b)?;
    let joined = b.node()?;
    b.report(INVENTORY.as_bytes())?;
    let cmd = queue(&b)?;
    finish(
        &b,
        &cmd,
        CommandState::Succeeded,
        Some(result(json!([cleaned("vda")]))),
    )?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Retired);
    assert_eq!(
        generation(&n),
        generation(&joined) + 1,
        "the ramdisk's identity ends with the retire"
    );
    let d = b
        .store
        .read_blocking(|r| crate::query::get_node(r, &b.node))?;
    assert!(!d.schedulable, "a retired node is never schedulable");
    // Retired is terminal: nothing moves it but nodes.delete.
    let again = b
        .store
        .write_blocking(|tx| crate::ops::retire::retire(tx, &b.node, n.version, "operator:t"));
    assert!(matches!(again, Err(OpError::InvalidTransition { .. })));
    Ok(())
}

#[test]
fn release_is_refused_where_there_is_nothing_to_release() -> TestResult {
    // A ready machine is not deployed.
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?;
    b.report(INVENTORY.as_bytes())?;
    let n = b.node()?;
    let r = b
        .store
        .write_blocking(|tx| release::release(tx, &b.node, n.version, "operator:t"));
    assert!(matches!(r, Err(OpError::InvalidTransition { .. })), "{r:?}");
    // A server without a BMC has no machine to boot and clean.
    let store = cpl_store::testing::store()?;
    store.write_blocking(|tx| -> Result<(), OpError> {
        crate::test_utils::node(tx, "node_a", None)?;
        let a = crate::test_utils::ready_host(tx, "node_a", 2)?;
        let r = release::release(tx, "node_a", a.version, "operator:t");
        assert!(
            matches!(&r, Err(OpError::InvalidState(m)) if m.contains("nodes.retire")),
            "{r:?}"
        );
        Ok(())
    })?;
    Ok(())
}

/// The controller over `b`'s store, with no live session anywhere (so no lease holder either).
fn controller(b: &Bed) -> super::BareMetal {
    let commands = crate::commands::Commands {
        store: b.store.clone(),
        sessions: std::sync::Arc::new(crate::port::NoSessions),
    };
    super::BareMetal::new(commands, b.key.clone(), Default::default())
}

#[tokio::test]
async fn the_cleaning_deadline_fails_a_release_saying_how_far_it_got() -> TestResult {
    let b = deployed()?;
    let v = b.node()?.version;
    b.store
        .write_blocking(|tx| release::release(tx, &b.node, v, "operator:t"))?;
    let bm = controller(&b);
    let now = now_ms();
    bm.boot_pass(now).await;
    let rec = b
        .store
        .read_blocking(|r| r.boot(&b.node))?
        .ok_or("no boot begun")?;
    assert_eq!(rec.purpose, ProvisionState::Releasing);
    bm.boot_pass(now + 3_599_000).await;
    assert_eq!(b.node()?.provision_state, ProvisionState::Releasing);
    bm.boot_pass(now + 3_601_000).await;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    assert_eq!(n.failed_from, Some(ProvisionState::Releasing));
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert_eq!(c.reason, "CleaningDeadline");
    assert!(c.message.contains("no site agent"), "{}", c.message);
    Ok(())
}

#[tokio::test]
async fn a_rescue_starts_ssh_with_the_keys_and_then_has_no_deadline() -> TestResult {
    let b = deployed()?;
    let bm = controller(&b);
    let req = |keys: Value| -> Result<super::rescue::RescueRequest, serde_json::Error> {
        serde_json::from_value(json!({"nodeId": b.node, "sshKeys": keys}))
    };
    let bad = bm.rescue(req(json!([]))?, "operator:t").await;
    assert!(
        matches!(&bad, Err(OpError::InvalidArgument(m)) if m.contains("sshKeys")),
        "{bad:?}"
    );
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW op@laptop";
    // A key with options (a forced command for whoever logs in) is refused before any boot.
    let forced = bm
        .rescue(
            req(json!([format!("command=\"/bin/sh\" {key}")]))?,
            "operator:t",
        )
        .await;
    assert!(
        matches!(&forced, Err(OpError::InvalidArgument(m)) if m.contains("sshKeys")),
        "{forced:?}"
    );
    assert_eq!(b.node()?.provision_state, ProvisionState::Deployed);
    let n = bm.rescue(req(json!([key]))?, "operator:t").await?;
    assert_eq!(n.provision_state, ProvisionState::Rescue);
    boot_and_join(&b)?;
    assert_eq!(
        b.report(INVENTORY.as_bytes())?,
        Some(ProvisionState::Rescue)
    );
    let cmd = b.store.write_blocking(|tx| {
        let mut rec = tx
            .boot(&b.node)?
            .ok_or(OpError::Internal("no boot".into()))?;
        assert!(rec.steps_at.is_some());
        let id = super::rescue::queue_start(tx, &rec, now_ms(), 60_000)?;
        rec.work_command_id = Some(id.clone());
        tx.put_boot(&rec)?;
        tx.command(&id)?
            .ok_or(OpError::Internal("no command".into()))
    })?;
    assert_eq!(cmd.name, bc_protocol::CommandName::RescueStart);
    assert_eq!(cmd.args, json!({"sshKeys": [key]}));
    let result = json!({"port": 22, "hostKeyFingerprints": ["SHA256:abc"],
                        "addresses": ["10.0.2.15/24"], "authorizedKeys": 1});
    let mut done = cmd.clone();
    done.state = CommandState::Succeeded;
    done.result = Some(result);
    b.store
        .write_blocking(|tx| crate::commands::finished::on_final(tx, &done))?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Rescue);
    let c = cond(&n, super::rescue::RESCUED).ok_or("no Rescued")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::True, "SshReady")
    );
    assert!(
        c.message.contains("10.0.2.15, port 22") && c.message.contains("SHA256:abc"),
        "{}",
        c.message
    );
    // Up: no deadline any more.
    bm.boot_pass(now_ms() + 7_200_000).await;
    assert_eq!(b.node()?.provision_state, ProvisionState::Rescue);
    // Unrescue needs a site agent holding the lease to reboot the machine.
    let un: super::rescue::UnrescueRequest = serde_json::from_value(json!({"nodeId": b.node}))?;
    let r = bm.unrescue(un, "operator:t").await;
    assert!(
        matches!(&r, Err(OpError::InvalidState(m)) if m.contains("holds its lease")),
        "{r:?}"
    );
    assert_eq!(b.node()?.provision_state, ProvisionState::Rescue);
    Ok(())
}

#[test]
fn a_clean_result_in_another_mode_or_of_the_wrong_shape_fails_the_release() -> TestResult {
    for (asked, result, why) in [
        // The pool asked for a full erase; a metadata erase is not one.
        (
            json!({"mode": "full"}),
            json!({"mode": "metadata", "durationMs": 1, "disks": [cleaned("vda")]}),
            "reports mode metadata where full was asked",
        ),
        (
            json!({"mode": "metadata"}),
            json!({"mode": "metadata", "durationMs": 1, "disks": "vda"}),
            "does not parse",
        ),
        (
            json!({"mode": "metadata"}),
            json!({"mode": "metadata", "durationMs": -1, "disks": []}),
            "does not parse",
        ),
        (
            json!({"mode": "metadata"}),
            json!([1, 2, 3]),
            "does not parse",
        ),
    ] {
        let b = deployed()?;
        let v = b.node()?.version;
        b.store
            .write_blocking(|tx| release::release(tx, &b.node, v, "operator:t"))?;
        boot_and_join(&b)?;
        b.report(INVENTORY.as_bytes())?;
        let mut cmd = queue(&b)?;
        cmd.args = asked;
        finish(&b, &cmd, CommandState::Succeeded, Some(result.clone()))?;
        let n = b.node()?;
        assert_eq!(n.provision_state, ProvisionState::Failed, "{result}");
        let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
        assert_eq!(
            (c.status, c.reason.as_str()),
            (ConditionStatus::False, "CleanFailed")
        );
        assert!(c.message.contains(why), "{result}: {}", c.message);
    }
    Ok(())
}

#[test]
fn a_clean_that_misses_a_disk_the_inventory_lists_fails_the_release() -> TestResult {
    let b = deployed()?;
    let v = b.node()?.version;
    b.store
        .write_blocking(|tx| release::release(tx, &b.node, v, "operator:t"))?;
    boot_and_join(&b)?;
    // This boot's report lists two NVMe disks and a disk whose kernel name starts like a CD
    // drive's or a RAM disk's. What the inventory lists is a disk by the one disk rule
    // (`bcd_probes::inventory::disk_rule`, from sysfs, never from the name): a CD drive or a
    // RAM disk is never listed, so nothing listed is excused by its name.
    let doc = json!({"schemaVersion": 1, "hostname": "ramdisk", "disks": [
        {"name": "nvme0n1"}, {"name": "nvme1n1"}, {"name": "sr0"}, {"name": "ram0"}]})
    .to_string();
    let d = digests(UUID, SERIAL, MAC);
    b.store.write_blocking(|tx| {
        crate::reports::record_inventory(
            tx,
            &b.node,
            0,
            &crate::reports::InventoryReport {
                hardware_key: &"ab".repeat(32),
                trusted: true,
                digests: &d,
                document: doc.as_bytes(),
                sha256: &"ee".repeat(32),
            },
        )
    })?;
    let cmd = queue(&b)?;
    // The ramdisk saw only one of them (a controller's driver missing, say).
    finish(
        &b,
        &cmd,
        CommandState::Succeeded,
        Some(result(json!([cleaned("nvme0n1")]))),
    )?;
    let n = b.node()?;
    assert_eq!(n.provision_state, ProvisionState::Failed);
    let c = cond(&n, CLEANED).ok_or("no Cleaned")?;
    assert!(
        c.message.contains("did not clean nvme1n1, sr0, ram0"),
        "{}",
        c.message
    );
    Ok(())
}
