//! The BMC commands: `bmc.verify`, `bmc.power`, `bmc.setBootDevice`, each through
//! [`Site::with_bmc`] (lease of the command's epoch, the node's BMC, its permits) and a driver.
//!
//! # Design
//! The arguments carry no credentials (`bc_protocol::commands::bmc`), so the executor's journal
//! (`<state dir>/commands/<id>.json`, arguments and result) holds none either; error messages
//! name the BMC by address and are scrubbed of the password by the drivers. A command the
//! journal already knows is never run again (`bcd_core::journal`): one interrupted by a restart
//! is reported `AGENT_RESTARTED`, so a power action is never sent twice for one command.
//!
//! - `bmc.power` with `bootDevice: pxe` and `networkBoot` (a ramdisk boot, issue 31 rule 5):
//!   the boot is confirmed by the machine asking this site agent's boot service for its script
//!   (one of its MACs, after the power-on). Without that within `withinMs`, the machine is
//!   powered on with PXE again, up to `attempts` times, the last with a persistent override;
//!   then the command fails with `NETWORK_BOOT_NOT_REQUESTED` ("never asked for its script"),
//!   the override disarmed. Without a boot service on this site agent nothing can be
//!   confirmed, and the power-on is taken as it is.
//! - `bmc.verify` of candidate credentials (a rotation) that the BMC refuses is tried once more
//!   after `[site] bmc_lockout_window_ms` (issue 31 rule 9): the account may be locked by
//!   earlier refusals, and the new password must get through once the lockout ends; the
//!   result's note says when it was refused and when it got through.

use bc_protocol::CommandName;
use bc_protocol::commands::bmc::{
    BootDevice, BootDeviceArgs, NetworkBootCheck, NetworkBootSeen, PowerArgs, PowerResult,
    PowerState, VerifyArgs,
};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bcd_core::executor::{CommandRun, to_result};
use serde_json::Value;
use tokio::time::Instant;

use crate::bmc::{BootOverride, PowerDone};
use crate::site::{Site, when};

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
    let first = site
        .with_bmc(a.lease_epoch, &a.node_id, a.candidate, |b| b.facts())
        .await;
    let window = site.config().bmc_lockout_window();
    let facts = match first {
        Err(f) if a.candidate && f.code == CommandErrorCode::BmcAuthFailed && !window.is_zero() => {
            let refused = site
                .refusal(&a.node_id, true)
                .map_or_else(|| chrono::Utc::now().timestamp_millis(), |r| r.wall_ms);
            tracing::warn!(node_id = %a.node_id, wait = ?window, "the BMC refused the new credentials (its account may be locked): trying them once more after the lockout window");
            tokio::time::sleep(window).await;
            site.forget_refusal(&a.node_id, true);
            let tried = chrono::Utc::now().timestamp_millis();
            match site
                .with_bmc(a.lease_epoch, &a.node_id, true, |b| b.facts())
                .await
            {
                Ok(mut facts) => {
                    facts.note = Some(format!(
                        "the BMC refused the new credentials at {} (its account was locked); they got through at {}, after the lockout window of {}s",
                        when(refused),
                        when(tried),
                        window.as_secs()
                    ));
                    facts
                }
                Err(again) => {
                    return Err(CommandFailure::new(
                        again.code,
                        format!(
                            "{} (refused at {} and again at {}, after a lockout window of {}s)",
                            again.message,
                            when(refused),
                            when(tried),
                            window.as_secs()
                        ),
                    ));
                }
            }
        }
        r => r?,
    };
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

/// `bmc.power`: the action (with its boot override armed right before the boot), the power
/// state read back once the BMC settled, and — for a network boot to confirm — the script
/// request that proves it.
pub async fn power(site: &Site, a: PowerArgs) -> Result<Value, CommandFailure> {
    let boot = a.boot_device.map(|device| BootOverride {
        device,
        persistent: false,
    });
    let confirm = a
        .network_boot
        .filter(|_| a.boot_device == Some(BootDevice::Pxe));
    let result = match confirm {
        Some(check) if site.config().boot_listen.is_some() => {
            confirmed_boot(site, &a, check).await?
        }
        _ => {
            let action = a.action;
            let done = site
                .with_bmc(a.lease_epoch, &a.node_id, false, move |b| {
                    b.power(action, boot)
                })
                .await?;
            PowerResult {
                power: done.power,
                network_boot: None,
                transient_faults: done.transient_faults,
            }
        }
    };
    if result.power != PowerState::Unknown {
        site.note_power(&a.node_id, (result.power, true, String::new()));
    }
    tracing::info!(node_id = %a.node_id, action = a.action.as_str(), power = result.power.as_str(), "power action done");
    to_result(&result)
}

/// A network boot, confirmed by the script request (see the module docs).
async fn confirmed_boot(
    site: &Site,
    a: &PowerArgs,
    check: NetworkBootCheck,
) -> Result<PowerResult, CommandFailure> {
    let attempts = check.attempts.max(1);
    let within = std::time::Duration::from_millis(check.within_ms);
    let mut faults = 0;
    for attempt in 1..=attempts {
        let persistent = attempt == attempts && attempts > 1;
        // The first power-on is the one asked for; a machine that did not boot the network is
        // restarted (or powered on, if it is off) into it again.
        let action = if attempt == 1 {
            a.action
        } else {
            bc_protocol::commands::bmc::PowerAction::Reboot
        };
        let boot = Some(BootOverride {
            device: BootDevice::Pxe,
            persistent,
        });
        let since = Instant::now();
        let done: PowerDone = site
            .with_bmc(a.lease_epoch, &a.node_id, false, move |b| {
                b.power(action, boot)
            })
            .await?;
        faults += done.transient_faults;
        if let Some(mac) = site
            .script_requested(&a.node_id, since, Instant::now() + within)
            .await
        {
            tracing::info!(node_id = %a.node_id, mac = %mac, attempt, persistent, "network boot confirmed: the machine asked for its script");
            return Ok(PowerResult {
                power: done.power,
                network_boot: Some(NetworkBootSeen {
                    mac,
                    attempt,
                    persistent,
                }),
                transient_faults: faults,
            });
        }
        tracing::warn!(node_id = %a.node_id, attempt, attempts, within = ?within, "the machine did not ask for its script after its power-on with PXE");
    }
    // Nothing booted the network: no override stays armed.
    if let Err(f) = site
        .with_bmc(a.lease_epoch, &a.node_id, false, |b| {
            b.set_boot_device(BootDevice::None, false)
        })
        .await
    {
        tracing::warn!(node_id = %a.node_id, error = %f, "the boot override could not be disarmed");
    }
    let macs = site.boot_macs(&a.node_id);
    Err(CommandFailure::new(
        CommandErrorCode::NetworkBootNotRequested,
        format!(
            "the machine never asked for its script: none of its MACs ({}) requested boot.ipxe from this site's boot service within {}s of any of {attempts} power-ons with PXE (the last with a persistent override); check its network boot in the firmware, the provisioning network and the DHCP's PXE options",
            if macs.is_empty() {
                "none known".to_owned()
            } else {
                macs.join(", ")
            },
            within.as_secs()
        ),
    ))
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
        note = ?r.note,
        "boot device set"
    );
    to_result(&r)
}
