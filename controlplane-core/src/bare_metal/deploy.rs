//! Deploy of a bare-metal machine (issue 16): `ready -> deploying -> deployed`.
//!
//! # Design
//! - `nodes.deploy` ([`BareMetal::deploy`]) checks the image, root-device hints and config
//!   drive against `image.write`'s contract, keeps them on the node's BMC row (so
//!   `nodes.recover` deploys the same again) and moves the node to `deploying`, a ramdisk state:
//!   the controller boots it into the ramdisk with a one-time token.
//! - The ramdisk's first report, checked against the BMC's identifiers
//!   ([`super::work::on_inventory`]), makes the boot ready; the pass sends `image.write`
//!   ([`queue_write`]), whose deadline is what is left of the state's
//!   (`acceptance.deployDeadlineSeconds`, 3,600 s by default).
//! - Its result ([`on_command_final`]) is a `deployStep` event (the disk, why it was chosen,
//!   bytes, MiB/s); then the site agent sets the boot device to disk, persistent
//!   (`bmc.setBootDevice`), and reboots the machine (`bmc.power reboot`); that reboot's success
//!   is `deployed`, the `Deployed` condition true and the ramdisk's identity ended.
//! - Any failure — the image unreachable, a checksum mismatch (the ramdisk leaves the disk's
//!   ends zeroed), no disk that fits, the BMC refusing — is `failed` (failedFrom `deploying`,
//!   maintenance on) with the step and the reason in the `Deployed` condition. A lost lease
//!   only re-sends the BMC step through the next holder. `nodes.recover` deploys the same
//!   again; `nodes.deploy` on the failed node deploys another image.
//!
//! # Limitations
//! The deployed OS joins on its own (an agent with a join token in the image or the config
//! drive's user data); the control plane does not wait for it.

use std::time::Duration;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::deploy::{
    ConfigDrive, ImageSource, ImageWriteArgs, ImageWriteResult, RootDeviceHints,
};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Pool, Tx};
use serde::Deserialize;
use utoipa::ToSchema;

use super::BareMetal;
use super::boot::OWNER;
use super::work::{condition, event, fail, failure, owner_of};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity};

/// The condition deploying writes.
pub const DEPLOYED: &str = "Deployed";
/// Default of `acceptance.deployDeadlineSeconds`.
pub const DEFAULT_DEPLOY_DEADLINE: Duration = Duration::from_secs(3600);
/// `work_step` once `image.write` succeeded.
pub const IMAGE_WRITTEN: &str = "imageWritten";
/// `work_step` once the boot device is the disk.
pub const BOOT_DEVICE_SET: &str = "bootDeviceSet";
/// The shortest deadline an `image.write` is sent with.
const MIN_WRITE_TIMEOUT_MS: i64 = 60_000;

/// `nodes.deploy` request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeployRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    /// When given, the node must still be at this version.
    #[serde(default)]
    pub version: Option<u64>,
    /// The image: `http(s)` URL, its SHA-256, `raw` or `qcow2`, compression.
    pub image: ImageSource,
    /// Which disk receives it (every hint must match); default the smallest that fits.
    #[serde(default)]
    pub root_device: Option<RootDeviceHints>,
    /// A cloud-init NoCloud config drive with the hostname, SSH keys and user data.
    #[serde(default)]
    pub config_drive: Option<ConfigDrive>,
}

impl BareMetal {
    /// `nodes.deploy`: a `ready` machine enrolled through its BMC goes to `deploying`; so does
    /// one that failed deploying (`failed`, failedFrom `deploying`), with the new image in place
    /// of the one that failed (`nodes.recover` would try the same one again).
    /// Errors: `NOT_FOUND`, `CONFLICT` on a stale version, `INVALID_ARGUMENT` for an image,
    /// hints or config drive that `image.write` would refuse, `INVALID_STATE` for a node
    /// without a BMC or not `ready`.
    pub async fn deploy(&self, req: DeployRequest, actor: &str) -> Result<NodeRecord, OpError> {
        let args = ImageWriteArgs {
            image: req.image.clone(),
            root_device: req.root_device.clone(),
            config_drive: req.config_drive.clone(),
            instance_id: None,
        };
        let json = serde_json::to_value(&args).map_err(|e| OpError::Internal(e.to_string()))?;
        bc_protocol::commands::check_args(CommandName::ImageWrite, &json)
            .map_err(|e| OpError::InvalidArgument(format!("nodes.deploy: {e}")))?;
        let actor = actor.to_owned();
        self.store
            .write(move |tx| {
                let mut edit = Edit::begin(tx, &req.node_id, req.version, &actor)?;
                let Some(mut bmc) = tx.bmc(&req.node_id)? else {
                    return Err(OpError::InvalidState(format!(
                        "node {} was not enrolled through a BMC: there is no machine to boot and write",
                        req.node_id
                    )));
                };
                apply_transition(
                    &mut edit,
                    ProvisionState::Deploying,
                    &format!("nodes.deploy: {}", req.image.url),
                )?;
                bmc.deployment = Some(json);
                tx.put_bmc(&bmc)?;
                super::boot::end_open(tx, &req.node_id, edit.now())?;
                condition(
                    &mut edit,
                    ConditionStatus::False,
                    "Booting",
                    format!(
                        "waiting for the machine to boot the ramdisk and write {}",
                        req.image.url
                    ),
                );
                edit.save(tx)
            })
            .await
    }
}

/// Queues `image.write` for the ramdisk of boot `b` with the node's deployment, its deadline
/// what is left of the state's (at least a minute); returns the command's id.
pub(crate) fn queue_write(
    tx: &Tx<'_>,
    b: &BootRecord,
    pool: Option<&Pool>,
    now: i64,
) -> Result<String, OpError> {
    let deployment = tx
        .bmc(&b.node_id)?
        .and_then(|m| m.deployment)
        .ok_or_else(|| OpError::Internal(format!("node {} deploys nothing", b.node_id)))?;
    let mut args: ImageWriteArgs = serde_json::from_value(deployment)
        .map_err(|e| OpError::Internal(format!("node {}'s deployment: {e}", b.node_id)))?;
    // cloud-init runs again on each deploy: one instance id per boot.
    args.instance_id = Some(format!("{}-{}", b.node_id, b.token_id));
    let left = super::work::time_left(
        b,
        pool,
        ProvisionState::Deploying,
        now,
        MIN_WRITE_TIMEOUT_MS,
    );
    let url = args.image.url.clone();
    let rec = super::work::insert_ramdisk_command(
        tx,
        &b.node_id,
        CommandName::ImageWrite,
        serde_json::to_value(&args).map_err(|e| OpError::Internal(e.to_string()))?,
        now,
        left,
    )?;
    let mut edit = Edit::report(tx, &b.node_id, OWNER)?;
    event(
        &mut edit,
        "running",
        format!("image.write ({}) of {url} sent to the ramdisk", rec.id),
    );
    condition(
        &mut edit,
        ConditionStatus::Unknown,
        "Writing",
        format!("the ramdisk is writing {url} ({})", rec.id),
    );
    edit.save(tx)?;
    Ok(rec.id)
}

/// `written <disk> (<why>): <MiB> MiB in <ms> ms (<MiB/s> MiB/s), sha256 <hex>[, config
/// drive <part>]`.
fn written(r: &ImageWriteResult) -> String {
    let mib = r.written_bytes as f64 / f64::from(1u32 << 20);
    let rate = if r.duration_ms == 0 {
        0.0
    } else {
        mib * 1000.0 / r.duration_ms as f64
    };
    let mut s = format!(
        "written onto {} ({}): {mib:.1} MiB in {} ms ({rate:.1} MiB/s), sha256 {}",
        r.device, r.chosen_because, r.duration_ms, r.sha256
    );
    if let Some(p) = &r.config_drive_partition {
        s.push_str(&format!(", config drive {p}"));
    }
    s
}

/// `r` when it is a write of what `cmd` asked: the SHA-256 asked for, and a config drive when
/// one was asked. A result that says otherwise (an agent that ignored an argument, a result
/// of another command) is no deploy of this image.
fn matches_args(cmd: &CommandRecord, r: ImageWriteResult) -> Result<ImageWriteResult, String> {
    let asked: ImageWriteArgs = serde_json::from_value(cmd.args.clone())
        .map_err(|e| format!("the image.write args do not parse: {e}"))?;
    if !r.sha256.eq_ignore_ascii_case(asked.image.sha256.trim()) {
        return Err(format!(
            "image.write reports SHA-256 {} where {} was asked",
            r.sha256.chars().take(64).collect::<String>(),
            asked.image.sha256
        ));
    }
    if asked.config_drive.is_some() && r.config_drive_partition.is_none() {
        return Err("image.write reports no config drive where one was asked".to_owned());
    }
    Ok(r)
}

/// The condition reason of a failed `image.write`, from its error code.
fn reason_of(code: Option<&str>) -> &'static str {
    match code.and_then(|c| c.parse::<CommandErrorCode>().ok()) {
        Some(CommandErrorCode::ChecksumMismatch) => "ChecksumMismatch",
        Some(CommandErrorCode::ImageUnreachable) => "ImageUnreachable",
        Some(CommandErrorCode::NoRootDevice) => "NoRootDevice",
        Some(CommandErrorCode::ImageWriteFailed) => "ImageWriteFailed",
        _ => "StepFailed",
    }
}

/// A finished command that is the current deploy's step decides it (in the transaction that
/// finished it): `image.write`, then `bmc.setBootDevice`, then `bmc.power reboot`.
pub fn on_command_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    let step = match cmd.name.parse::<CommandName>() {
        Ok(
            n @ (CommandName::ImageWrite | CommandName::BmcSetBootDevice | CommandName::BmcPower),
        ) => n,
        _ => return Ok(()),
    };
    let Some((mut b, mut edit)) = owner_of(tx, cmd)? else {
        return Ok(());
    };
    if edit.node.provision_state != ProvisionState::Deploying {
        return Ok(());
    }
    b.work_command_id = None;
    let lost = cmd.error_code.as_deref() == Some(CommandErrorCode::LeaseLost.as_str());
    if step != CommandName::ImageWrite && lost {
        // Another site agent took the lease: the next pass sends the step through it.
        tx.put_boot(&b)?;
        return Ok(());
    }
    if cmd.state != CommandState::Succeeded {
        tx.put_boot(&b)?;
        let why = format!("deploy failed at {step}: {}", failure(cmd));
        let reason = if step == CommandName::ImageWrite {
            reason_of(cmd.error_code.as_deref())
        } else {
            "BmcStepFailed"
        };
        event(&mut edit, "failed", why.clone());
        fail(&mut edit, reason, why)?;
        edit.save(tx)?;
        return Ok(());
    }
    match step {
        CommandName::ImageWrite => {
            let parsed = cmd
                .result
                .clone()
                .map(serde_json::from_value::<ImageWriteResult>);
            let r = match parsed.map(|p| {
                p.map_err(|e| e.to_string())
                    .and_then(|r| matches_args(cmd, r))
            }) {
                Some(Ok(r)) => r,
                Some(Err(e)) => {
                    tx.put_boot(&b)?;
                    fail(
                        &mut edit,
                        "StepFailed",
                        format!("deploy failed: the image.write result does not parse: {e}"),
                    )?;
                    edit.save(tx)?;
                    return Ok(());
                }
                None => {
                    tx.put_boot(&b)?;
                    fail(
                        &mut edit,
                        "StepFailed",
                        "deploy failed: image.write returned no result".to_owned(),
                    )?;
                    edit.save(tx)?;
                    return Ok(());
                }
            };
            let msg = written(&r);
            event(&mut edit, "imageWritten", msg.clone());
            condition(&mut edit, ConditionStatus::Unknown, "ImageWritten", msg);
            b.work_step = Some(IMAGE_WRITTEN.to_owned());
        }
        CommandName::BmcSetBootDevice => {
            event(
                &mut edit,
                "bootDeviceSet",
                "the BMC boots the machine from its disk from now on (persistent)".to_owned(),
            );
            b.work_step = Some(BOOT_DEVICE_SET.to_owned());
        }
        _ => {
            event(
                &mut edit,
                "rebooted",
                "the BMC rebooted the machine onto its disk".to_owned(),
            );
            b.work_step = Some("rebooted".to_owned());
            let url = tx
                .bmc(&edit.node.id)?
                .and_then(|m| m.deployment)
                .and_then(|d| d["image"]["url"].as_str().map(str::to_owned))
                .unwrap_or_default();
            condition(
                &mut edit,
                ConditionStatus::True,
                "Deployed",
                format!("{url} is on the disk and the machine boots from it"),
            );
            apply_transition(
                &mut edit,
                ProvisionState::Deployed,
                &format!("deployed: {url}"),
            )?;
            bump_identity(
                &mut edit,
                "deployed: the ramdisk's identity ends; the deployed system joins on its own",
            );
        }
    }
    tx.put_boot(&b)?;
    edit.save(tx)?;
    Ok(())
}
