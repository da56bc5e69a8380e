//! The power axis's owner: `nodes.power` and `nodes.setBootDevice` as `bmc.*` commands on the
//! site's lease holder, `PowerReport`s of the current holder moving `power` and `BmcReachable`,
//! and `nodes.updateBmcCredentials` (verify the new pair, then replace the old one).

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::{BootDevice, BootDeviceArgs, PowerAction, PowerArgs, VerifyArgs};
use bc_protocol::commands::{CommandArgs, CommandErrorCode};
use bc_protocol::pb::PowerReport;
use bc_protocol::{ConditionStatus, Power};
use cpl_store::{CommandRecord, Tx, duration_ms, now_ms};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::bmc::{BMC_REACHABLE, OWNER, live_holder, mark_expected, queue, set_power};
use super::enroll::{Secret, check_credentials};
use super::{BareMetal, Credentials};
use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;

/// How long after `nodes.power` a change toward what it asked for counts as asked for.
pub const EXPECTED_WINDOW_MS: i64 = 10 * 60 * 1000;

/// `nodes.power` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PowerRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    /// When given, the node must still be at this version.
    #[serde(default)]
    pub version: Option<u64>,
    /// `on`, `off`, `softOff` or `reboot`.
    #[schema(value_type = String)]
    pub action: PowerAction,
}

/// `nodes.setBootDevice` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BootDeviceRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    #[serde(default)]
    pub version: Option<u64>,
    /// `pxe` or `disk`.
    #[schema(value_type = String)]
    pub device: BootDevice,
    /// Every later boot, not only the next.
    #[serde(default)]
    pub persistent: bool,
}

/// `nodes.updateBmcCredentials` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateBmcCredentialsRequest {
    #[serde(alias = "id")]
    pub node_id: crate::text::Id,
    pub version: u64,
    pub username: String,
    /// Write-only.
    pub password: Secret,
}

/// What a `PowerReport` came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum ReportOutcome {
    /// Applied: how many observations changed a node.
    Applied(usize),
    /// Ignored: why (not the holder, another epoch).
    Ignored(String),
}

/// Checks a power or boot-device request's node: it exists (at `version` when given), was
/// enrolled through a BMC, and the BMC was verified. Returns its site.
fn check_node(tx: &Tx<'_>, node_id: &str, version: Option<u64>) -> Result<String, OpError> {
    let node = tx
        .node(node_id)?
        .ok_or_else(|| OpError::node_not_found(node_id))?;
    if let Some(v) = version
        && v != node.version
    {
        return Err(OpError::Conflict {
            kind: "node",
            id: node_id.to_owned(),
            expected: v,
            actual: node.version,
        });
    }
    let bmc = tx.bmc(node_id)?.ok_or_else(|| {
        OpError::InvalidState(format!(
            "node {node_id} was not enrolled through a BMC (nodes.enroll): it has no power control"
        ))
    })?;
    if bmc.verified_at.is_none() {
        return Err(OpError::InvalidState(format!(
            "the BMC of node {node_id} is not verified yet ({}): power and boot device wait for the verification",
            node.provision_state
        )));
    }
    node.site_id
        .ok_or_else(|| OpError::InvalidState(format!("node {node_id} has no site")))
}

impl BareMetal {
    /// `nodes.power`: a `bmc.power` command on the site's lease holder. The node's events and
    /// `commands.list {nodeId}` show it; a change toward `action` is not out of band.
    pub async fn power(&self, req: PowerRequest, actor: &str) -> Result<CommandRecord, OpError> {
        let sessions = Arc::clone(&self.sessions);
        let actor = actor.to_owned();
        let timeout = duration_ms(self.cfg.command_timeout);
        let rec = self
            .store
            .write(move |tx| {
                let site = check_node(tx, &req.node_id, req.version)?;
                let (holder, epoch) = live_holder(tx, sessions.as_ref(), &site)?;
                let expected = match req.action {
                    PowerAction::On | PowerAction::Reboot => Power::On,
                    PowerAction::Off | PowerAction::SoftOff => Power::Off,
                };
                mark_expected(tx, &req.node_id, expected)?;
                let args = CommandArgs::BmcPower(PowerArgs {
                    node_id: req.node_id.to_string(),
                    lease_epoch: epoch,
                    action: req.action,
                    boot_device: None,
                    network_boot: None,
                });
                queue(tx, &holder, &req.node_id, args, timeout, &actor)
            })
            .await?;
        self.commands.dispatch(&rec.node_id, false).await;
        Ok(self.commands.get(&rec.id).await?.unwrap_or(rec))
    }

    /// `nodes.setBootDevice`: a `bmc.setBootDevice` command on the site's lease holder.
    pub async fn set_boot_device(
        &self,
        req: BootDeviceRequest,
        actor: &str,
    ) -> Result<CommandRecord, OpError> {
        let sessions = Arc::clone(&self.sessions);
        let actor = actor.to_owned();
        let timeout = duration_ms(self.cfg.command_timeout);
        let rec = self
            .store
            .write(move |tx| {
                let site = check_node(tx, &req.node_id, req.version)?;
                let (holder, epoch) = live_holder(tx, sessions.as_ref(), &site)?;
                let args = CommandArgs::BmcSetBootDevice(BootDeviceArgs {
                    node_id: req.node_id.to_string(),
                    lease_epoch: epoch,
                    device: req.device,
                    persistent: req.persistent,
                });
                queue(tx, &holder, &req.node_id, args, timeout, &actor)
            })
            .await?;
        self.commands.dispatch(&rec.node_id, false).await;
        Ok(self.commands.get(&rec.id).await?.unwrap_or(rec))
    }

    /// `nodes.updateBmcCredentials`: the new pair goes to the holder as the BMC's candidate and
    /// `bmc.verify {candidate: true}` checks it; only when the BMC took it does it replace the
    /// stored pair (and the holder gets the new assignment). Waits for the verification (at most
    /// the command deadline). Errors: `INVALID_STATE` with what the BMC answered when it refused
    /// (the old pair stays); `UNAVAILABLE` without a lease holder.
    pub async fn update_credentials(
        &self,
        req: UpdateBmcCredentialsRequest,
        actor: &str,
    ) -> Result<(), OpError> {
        check_credentials(&req.username, req.password.expose())?;
        let bm = self.clone();
        let actor = actor.to_owned();
        let timeout = duration_ms(self.cfg.command_timeout);
        let (holder, rec) = self
            .store
            .write(move |tx| {
                let mut edit = Edit::begin(tx, &req.node_id, Some(req.version), &actor)?;
                let mut b = tx.bmc(&req.node_id)?.ok_or_else(|| {
                    OpError::InvalidState(format!(
                        "node {} was not enrolled through a BMC: it has no BMC credentials",
                        req.node_id
                    ))
                })?;
                if b.candidate.is_some() {
                    return Err(OpError::InvalidState(format!(
                        "a rotation of node {}'s BMC credentials is already being verified",
                        req.node_id
                    )));
                }
                let site = edit.node.site_id.clone().unwrap_or_default();
                let (holder, epoch) = live_holder(tx, bm.sessions.as_ref(), &site)?;
                b.candidate = Some(bm.key.seal(
                    &req.node_id,
                    &Credentials {
                        username: req.username.clone(),
                        password: req.password.expose().to_owned(),
                    },
                )?);
                tx.put_bmc(&b)?;
                edit.event(
                    "bmcCredentials",
                    None,
                    Some("rotating".into()),
                    "nodes.updateBmcCredentials: the site agent verifies the new credentials before they replace the old ones",
                );
                edit.save(tx)?;
                let args = CommandArgs::BmcVerify(VerifyArgs {
                    node_id: req.node_id.to_string(),
                    lease_epoch: epoch,
                    candidate: true,
                });
                let rec = queue(tx, &holder, &req.node_id, args, timeout, &actor)?;
                Ok((holder, rec))
            })
            .await?;
        // The candidate must reach the agent before the command that uses it.
        self.push_assignment(&holder).await;
        self.commands.dispatch(&holder, false).await;
        let done = self.wait_final(&rec.id, self.cfg.command_timeout).await?;
        // Success or not, the assignment changes (new pair, or no candidate).
        self.push_assignment(&holder).await;
        match done.state {
            cpl_store::CommandState::Succeeded => Ok(()),
            s => Err(OpError::InvalidState(format!(
                "the BMC did not accept the new credentials ({} {}: {}: {}); the stored credentials are unchanged",
                rec.id,
                s.as_str(),
                done.error_code.unwrap_or_default(),
                done.error_message.unwrap_or_default()
            ))),
        }
    }

    /// Waits until command `id` is over (polling the store), at most `limit` plus a second.
    async fn wait_final(&self, id: &str, limit: Duration) -> Result<CommandRecord, OpError> {
        let until = tokio::time::Instant::now() + limit + Duration::from_secs(1);
        loop {
            if let Some(c) = self.commands.get(id).await?
                && c.state.is_final()
            {
                return Ok(c);
            }
            if tokio::time::Instant::now() >= until {
                return Err(OpError::Unavailable(format!(
                    "command {id} did not finish in time; see commands.get"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A `PowerReport` from site agent `node_id`.
    pub async fn power_report(&self, node_id: &str, report: PowerReport) -> ReportOutcome {
        let id = node_id.to_owned();
        match self
            .store
            .write(move |tx| apply_power_report(tx, &id, &report, now_ms()))
            .await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "recording a power report failed");
                ReportOutcome::Ignored(e.to_string())
            }
        }
    }
}

/// Applies `report` of site agent `agent_id` at `now`: only the current holder at the current
/// epoch is heard; each observation of a node of its site moves `power` (an event saying
/// whether the control plane asked for it) and `BmcReachable`.
pub fn apply_power_report(
    tx: &Tx<'_>,
    agent_id: &str,
    report: &PowerReport,
    now: i64,
) -> Result<ReportOutcome, OpError> {
    let Some(site) = tx.node(agent_id)?.and_then(|n| n.site_id) else {
        return Ok(ReportOutcome::Ignored(format!("{agent_id} has no site")));
    };
    let lease = tx.site_lease(&site)?;
    let current = lease
        .as_ref()
        .filter(|l| l.holder_node_id.as_deref() == Some(agent_id))
        .map(|l| l.epoch);
    if current != Some(report.lease_epoch) {
        return Ok(ReportOutcome::Ignored(format!(
            "{agent_id} reported under lease epoch {} but the lease of site {site} is {} at epoch {}",
            report.lease_epoch,
            lease
                .as_ref()
                .and_then(|l| l.holder_node_id.as_deref())
                .unwrap_or("held by nobody"),
            lease.as_ref().map_or(0, |l| l.epoch)
        )));
    }
    let mut changed = 0;
    for o in &report.observations {
        let Some(mut b) = tx.bmc(&o.node_id)? else {
            continue;
        };
        let Some(node) = tx.node(&o.node_id)? else {
            continue;
        };
        if node.site_id.as_deref() != Some(site.as_str()) {
            continue;
        }
        let mut edit = Edit::report(tx, &o.node_id, "PowerSync")?;
        if o.reachable {
            apply(
                &mut edit,
                &ConditionUpdate {
                    type_: BMC_REACHABLE.to_owned(),
                    status: ConditionStatus::True,
                    reason: "Answered".to_owned(),
                    message: "the BMC answered the power sync".to_owned(),
                    owner: OWNER.to_owned(),
                    gpus: Vec::new(),
                },
            );
            let to: Power = o.power.parse().unwrap_or(Power::Unknown);
            if to != edit.node.power {
                let asked = b.power_expected.as_deref() == Some(to.as_str())
                    && b.power_expected_at
                        .is_some_and(|t| now - t <= EXPECTED_WINDOW_MS);
                let message = if asked {
                    "the BMC reports the power state nodes.power asked for".to_owned()
                } else {
                    format!(
                        "out-of-band: the BMC reports power {to} without a request from the control plane"
                    )
                };
                set_power(&mut edit, to, &message);
                if asked {
                    b.power_expected = None;
                    b.power_expected_at = None;
                }
            }
            b.last_error = None;
        } else {
            let why = if o.error.is_empty() {
                "the BMC did not answer".to_owned()
            } else {
                o.error.clone()
            };
            // A refused password is not an unreachable BMC: the operator gives new credentials
            // (the site agent no longer sends the refused ones).
            let refused = o.error_code == CommandErrorCode::BmcAuthFailed.as_str();
            let reason = if refused {
                "CredentialsRejected"
            } else {
                "BmcUnreachable"
            };
            apply(
                &mut edit,
                &ConditionUpdate {
                    type_: BMC_REACHABLE.to_owned(),
                    status: ConditionStatus::False,
                    reason: reason.to_owned(),
                    message: why.clone(),
                    owner: OWNER.to_owned(),
                    gpus: Vec::new(),
                },
            );
            set_power(
                &mut edit,
                Power::Unknown,
                &if refused {
                    format!("the BMC refused the credentials: {why}")
                } else {
                    format!("the BMC did not answer: {why}")
                },
            );
            b.last_error = Some(why);
        }
        b.reachable = Some(o.reachable);
        tx.put_bmc(&b)?;
        if edit.changed() {
            changed += 1;
        }
        edit.save(tx)?;
    }
    Ok(ReportOutcome::Applied(changed))
}
