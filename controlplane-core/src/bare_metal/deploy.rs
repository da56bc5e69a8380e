//! Deploy of a bare-metal machine (issue 16): `ready -> deploying -> deployed`.
//!
//! # Design
//! - `nodes.deploy` ([`deploy`]) checks the image, root-device hints and config
//!   drive against `image.write`'s contract, keeps them on the node's BMC row (so
//!   `nodes.recover` deploys the same again) and moves the node to `deploying`, a ramdisk state:
//!   the controller boots it into the ramdisk with a one-time token.
//! - The ramdisk's first report, checked against the BMC's identifiers
//!   ([`super::workflow::Workflow::ready_for_work`]), makes the boot ready; the pass sends
//!   `image.write` (`queue_write`), whose deadline is what is left of the state's
//!   (`acceptance.deployDeadlineSeconds`, 3,600 s by default).
//! - Its result (`finished`) is a `deployStep` event (the disk, why it was chosen,
//!   bytes, MiB/s); then the site agent sets the boot device to disk, persistent
//!   (`bmc.setBootDevice`), and reboots the machine (`bmc.power reboot`); that reboot's success
//!   is `deployed`, the `Deployed` condition true and the ramdisk's identity ended.
//! - Any failure — the image unreachable, a checksum mismatch (the ramdisk leaves the disk's
//!   ends zeroed), no disk that fits, the BMC refusing — is `failed` (failedFrom `deploying`,
//!   maintenance on) with the step and the reason in the `Deployed` condition. A lost lease
//!   only re-sends the BMC step through the next holder. `nodes.recover` deploys the same
//!   again; `nodes.deploy` on the failed node deploys another image.
//!
//! - With a config drive, each `image.write` carries a fresh deploy identity
//!   ([`super::deploy_identity`]) that the ramdisk writes onto it: the deployed system's agent
//!   joins as the node with it, and from then on no pool join token re-joins the node.
//!
//! # Limitations
//! The deployed OS joins on its own (its agent with the config drive's `bcd-join-token`); the
//! control plane does not wait for it.

use std::time::Duration;

use bc_protocol::commands::bmc::{BootDevice, BootDeviceArgs, PowerAction, PowerArgs};
use bc_protocol::commands::deploy::{
    ConfigDrive, ImageSource, ImageWriteArgs, ImageWriteResult, RootDeviceHints,
};
use bc_protocol::commands::{CommandArgs, CommandErrorCode};
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Pool, Tx, WorkStep};
use serde::Deserialize;
use utoipa::ToSchema;

use super::boot::OWNER;
use super::workflow::{Deadline, Ramdisk, Turn, Workflow, failure, send_to_holder};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::{apply_transition, bump_identity};

/// The condition deploying writes.
pub const DEPLOYED: &str = "Deployed";
/// Default of `acceptance.deployDeadlineSeconds`.
pub const DEFAULT_DEPLOY_DEADLINE: Duration = Duration::from_secs(3600);
/// The shortest deadline an `image.write` is sent with.
const MIN_WRITE_TIMEOUT_MS: i64 = 60_000;

/// `deploying`: boot the ramdisk, `image.write`, the BMC's boot device to disk, a reboot.
pub const WORKFLOW: Workflow = Workflow {
    state: ProvisionState::Deploying,
    condition: DEPLOYED,
    steps: Some("deployStep"),
    deadline: Deadline::Pool {
        seconds: |a| a.deploy_deadline_seconds,
        default: DEFAULT_DEPLOY_DEADLINE,
    },
    ramdisk: Some(Ramdisk {
        power_on_condition: DEPLOYED,
        open_ended_after: None,
        on_report: |tx, edit, b| WORKFLOW.ready_for_work(tx, edit, b, CommandName::ImageWrite),
        next,
        finished,
        overdue: |b, secs| ("DeployDeadline", super::workflow::overdue_work(b, secs)),
    }),
    abort: super::workflow::boot_commands,
};

fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    WORKFLOW.condition(edit, status, reason, msg);
}

fn event(edit: &mut Edit, to: &str, msg: String) {
    WORKFLOW.step(edit, to, msg);
}

fn fail(edit: &mut Edit, reason: &str, why: String) -> Result<(), OpError> {
    WORKFLOW.fail(edit, reason, why)
}

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

/// The arguments `image.write` will get for `req` (without the boot's instance id), checked as
/// the ramdisk would check them. Errors: `INVALID_ARGUMENT` naming what `image.write` refuses.
pub fn write_args(req: &DeployRequest) -> Result<ImageWriteArgs, OpError> {
    let args = ImageWriteArgs {
        image: req.image.clone(),
        root_device: req.root_device.clone(),
        config_drive: req.config_drive.clone(),
        instance_id: None,
        deploy_token: None,
    };
    let json = CommandArgs::ImageWrite(args.clone()).to_value();
    CommandArgs::parse(CommandName::ImageWrite, &json)
        .map_err(|e| OpError::InvalidArgument(format!("nodes.deploy: {e}")))?;
    Ok(args)
}

/// `nodes.deploy` in `tx` by `actor` (with `args` from [`write_args`]): a `ready` machine
/// enrolled through its BMC goes to `deploying`; so does one that failed deploying (`failed`,
/// failedFrom `deploying`), with the new image in place of the one that failed
/// (`nodes.recover` would try the same one again). Errors: `NOT_FOUND`, `CONFLICT` on a stale
/// version, `INVALID_STATE` for a node without a BMC or not `ready`.
pub fn deploy(
    tx: &Tx<'_>,
    req: &DeployRequest,
    args: &ImageWriteArgs,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, &req.node_id, req.version, actor)?;
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
    bmc.deployment = Some(CommandArgs::ImageWrite(args.clone()).to_value());
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
}

/// The deploy's next step: `image.write` once the ramdisk reported (and its session is live),
/// then the BMC's boot device (`bmc.setBootDevice disk`, persistent), then `bmc.power reboot`,
/// each through the lease holder.
fn next(tx: &Tx<'_>, t: &mut Turn<'_>) -> Result<Option<String>, OpError> {
    if t.boot.steps_at.is_none() || t.boot.work_command_id.is_some() {
        return Ok(None);
    }
    let node_id = t.boot.node_id.clone();
    match t.boot.work_step {
        None if t.live => {
            let id = queue_write(tx, t.boot, t.pool, t.now)?;
            t.boot.work_command_id = Some(id);
            tx.put_boot(t.boot)?;
            Ok(Some(node_id))
        }
        Some(WorkStep::ImageWritten) => send_to_holder(tx, t, |epoch| {
            CommandArgs::BmcSetBootDevice(BootDeviceArgs {
                node_id,
                lease_epoch: epoch,
                device: BootDevice::Disk,
                persistent: true,
            })
        }),
        Some(WorkStep::BootDeviceSet) => send_to_holder(tx, t, |epoch| {
            CommandArgs::BmcPower(PowerArgs {
                node_id,
                lease_epoch: epoch,
                action: PowerAction::Reboot,
                boot_device: None,
                network_boot: None,
            })
        }),
        _ => Ok(None),
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
    // The deployed system's own identity (issue 30.1): on the config drive, the only place the
    // written system can read it from; without one it would have nowhere to go.
    if args.config_drive.is_some() {
        args.deploy_token = Some(super::deploy_identity::issue(tx, &b.node_id, now)?);
    }
    let left = WORKFLOW.time_left(b, pool, now, MIN_WRITE_TIMEOUT_MS);
    let url = args.image.url.clone();
    let rec =
        super::workflow::send_to_ramdisk(tx, &b.node_id, CommandArgs::ImageWrite(args), now, left)?;
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

/// The deploy's command in flight is over (in the transaction that ended it): `image.write`,
/// then `bmc.setBootDevice`, then `bmc.power reboot` decide the next step or the failure.
fn finished(
    tx: &Tx<'_>,
    cmd: &CommandRecord,
    mut b: BootRecord,
    mut edit: Edit,
) -> Result<(), OpError> {
    let step = match cmd.name {
        n @ (CommandName::ImageWrite | CommandName::BmcSetBootDevice | CommandName::BmcPower) => n,
        _ => return Ok(()),
    };
    b.work_command_id = None;
    // The write is over, whatever its outcome: its stored arguments keep no user data (the
    // node's deployment keeps it for `nodes.recover` until deployed; issue 30.4).
    if step == CommandName::ImageWrite
        && let Some(args) = super::user_data::withhold(&cmd.args)
    {
        tx.set_command_args(&cmd.id, &args)?;
    }
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
            b.work_step = Some(WorkStep::ImageWritten);
        }
        CommandName::BmcSetBootDevice => {
            event(
                &mut edit,
                "bootDeviceSet",
                "the BMC boots the machine from its disk from now on (persistent)".to_owned(),
            );
            b.work_step = Some(WorkStep::BootDeviceSet);
        }
        _ => {
            event(
                &mut edit,
                "rebooted",
                "the BMC rebooted the machine onto its disk".to_owned(),
            );
            b.work_step = Some(WorkStep::Rebooted);
            let mut bmc = tx.bmc(&edit.node.id)?;
            let url = bmc
                .as_ref()
                .and_then(|m| m.deployment.clone())
                .and_then(|d| serde_json::from_value::<ImageWriteArgs>(d).ok())
                .map(|a| a.image.url)
                .unwrap_or_default();
            // Deployed: nothing will send it again (issue 30.4).
            if let Some(m) = bmc.as_mut()
                && let Some(d) = m.deployment.as_ref().and_then(super::user_data::withhold)
            {
                m.deployment = Some(d);
                tx.put_bmc(m)?;
            }
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
