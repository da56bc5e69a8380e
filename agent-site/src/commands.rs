//! The BMC commands: `bmc.verify`, `bmc.power`, `bmc.setBootDevice`, each through
//! [`Site::with_bmc`] (lease of the command's epoch, the node's BMC, its permits) and a driver.
//!
//! # Design
//! The arguments carry no credentials (`bc_protocol::commands::bmc`), so the executor's journal
//! (`<state dir>/commands/<id>.json`, arguments and result) holds none either; error messages
//! name the BMC by address and are scrubbed of the password by the drivers. A command the
//! journal already knows is never run again (`bcd_core::journal`): one interrupted by a restart
//! is reported `AGENT_RESTARTED`, so a power action is never sent twice for one command.

use bc_protocol::CommandName;
use bc_protocol::commands::bmc::{BootDeviceArgs, PowerArgs, PowerResult, PowerState, VerifyArgs};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bcd_core::executor::{CommandRun, to_result};
use serde_json::Value;

use crate::site::Site;

/// Runs a `bmc.*` command on `site`.
pub async fn run(site: &Site, run: &CommandRun) -> Result<Value, CommandFailure> {
    match run.name {
        CommandName::BmcVerify => verify(site, run.args()?).await,
        CommandName::BmcPower => power(site, run.args()?).await,
        CommandName::BmcSetBootDevice => boot_device(site, run.args()?).await,
        other => Err(CommandFailure::new(
            CommandErrorCode::Unsupported,
            format!("{other} is not a BMC command"),
        )),
    }
}

/// `bmc.verify`: the BMC's facts with the current (or candidate) credentials.
pub async fn verify(site: &Site, a: VerifyArgs) -> Result<Value, CommandFailure> {
    let facts = site
        .with_bmc(a.lease_epoch, &a.node_id, a.candidate, |b| b.facts())
        .await?;
    tracing::info!(
        node_id = %a.node_id,
        candidate = a.candidate,
        uuid = ?facts.uuid,
        nics = facts.nics.len(),
        power = facts.power.as_str(),
        "BMC verified"
    );
    to_result(&facts)
}

/// `bmc.power`: the action, then the power state read back (a BMC may apply the action later:
/// a failed read-back is `unknown`, not a failed command).
pub async fn power(site: &Site, a: PowerArgs) -> Result<Value, CommandFailure> {
    let action = a.action;
    if let Some(device) = a.boot_device {
        site.with_bmc(a.lease_epoch, &a.node_id, false, move |b| {
            b.set_boot_device(device, false)
        })
        .await?;
        tracing::info!(node_id = %a.node_id, device = device.as_str(), "boot device set for the next boot");
    }
    site.with_bmc(a.lease_epoch, &a.node_id, false, move |b| b.power(action))
        .await?;
    tracing::info!(node_id = %a.node_id, action = a.action.as_str(), "power action sent");
    let power = match site
        .with_bmc(a.lease_epoch, &a.node_id, false, |b| b.power_state())
        .await
    {
        Ok(p) => p,
        Err(f) => {
            tracing::warn!(node_id = %a.node_id, error = %f, "power state not read back");
            PowerState::Unknown
        }
    };
    to_result(&PowerResult { power })
}

/// `bmc.setBootDevice`: sets the override and returns what the BMC reports back.
pub async fn boot_device(site: &Site, a: BootDeviceArgs) -> Result<Value, CommandFailure> {
    let (device, persistent) = (a.device, a.persistent);
    let r = site
        .with_bmc(a.lease_epoch, &a.node_id, false, move |b| {
            b.set_boot_device(device, persistent)
        })
        .await?;
    tracing::info!(
        node_id = %a.node_id,
        device = a.device.as_str(),
        persistent = a.persistent,
        reported = ?r.device,
        "boot device set"
    );
    to_result(&r)
}
