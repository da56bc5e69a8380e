//! BMC verification: `bmc.verify` issued to the site's lease holder for every enrollment waiting
//! for one, its result applied (identifiers stored as the hardware key's digests, or the node
//! failed with what the BMC answered), the deadline of an enrollment no holder verified, and the
//! effect of every finished `bmc.*` command on its bare-metal node.

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::bmc::{BmcFacts, PowerResult, PowerState};
use bc_protocol::hwid::{self, Kind};
use bc_protocol::{CommandName, ConditionStatus, Power, ProvisionState};
use cpl_store::{BmcIdentifier, BmcRecord, CommandRecord, CommandState, NewEvent, Tx, now_ms};

use super::enroll::{BMC_REACHABLE, BMC_VERIFIED, BmcFactsView, OWNER};
use super::{BareMetal, ms};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// A `bmc.*` command for site agent `holder` about bare-metal node `subject`, queued in `tx`,
/// with a `bmcCommand` event on the subject so its log shows what was asked of its BMC.
pub(crate) fn queue(
    tx: &Tx<'_>,
    holder: &str,
    subject: &str,
    name: CommandName,
    args: serde_json::Value,
    timeout_ms: i64,
    actor: &str,
) -> Result<CommandRecord, OpError> {
    let now = now_ms();
    let rec = CommandRecord {
        id: crate::commands::new_command_id(),
        node_id: holder.to_owned(),
        name: name.as_str().to_owned(),
        args,
        state: CommandState::Queued,
        progress: 0,
        result: None,
        error_code: None,
        error_message: None,
        actor: actor.to_owned(),
        created_at: now,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: now.saturating_add(timeout_ms),
        subject_node_id: Some(subject.to_owned()),
    };
    tx.insert_command(&rec)?;
    tx.record_event(&NewEvent {
        node_id: subject,
        at: now,
        kind: "bmcCommand",
        from: None,
        to: Some("queued"),
        actor,
        message: &format!(
            "{} {} ({}) for site agent {holder}",
            rec.name,
            describe_args(&rec.args),
            rec.id
        ),
    })?;
    Ok(rec)
}

/// The arguments worth a log line (`action off`, `device pxe persistent`), never a credential
/// (none travels in `bmc.*` args).
fn describe_args(args: &serde_json::Value) -> String {
    let mut parts = Vec::new();
    for k in ["action", "device"] {
        if let Some(v) = args.get(k).and_then(|v| v.as_str()) {
            parts.push(format!("{k} {v}"));
        }
    }
    if args.get("persistent").and_then(|v| v.as_bool()) == Some(true) {
        parts.push("persistent".to_owned());
    }
    if args.get("candidate").and_then(|v| v.as_bool()) == Some(true) {
        parts.push("candidate credentials".to_owned());
    }
    if let Some(e) = args.get("leaseEpoch") {
        parts.push(format!("lease epoch {e}"));
    }
    parts.join(", ")
}

/// `BMC_AUTH_FAILED` as a condition reason: `BmcAuthFailed`.
pub fn reason_of(code: &str) -> String {
    code.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let lower = w.to_ascii_lowercase();
            let mut c = lower.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// The identifiers of `facts` as `kind:value` digests, by the hardware key's rules (a value
/// the rules reject, such as a placeholder serial, is left out as the hardware key leaves it).
pub fn identifiers(facts: &BmcFacts) -> Vec<BmcIdentifier> {
    let mut lines: Vec<(Kind, String)> = Vec::new();
    if let Some(Ok(l)) = facts.uuid.as_deref().map(hwid::uuid_line) {
        let kind = if l.starts_with("mac:") {
            Kind::Mac
        } else {
            Kind::SystemUuid
        };
        lines.push((kind, l));
    }
    if let Some(Ok(l)) = facts
        .serial
        .as_deref()
        .map(|s| hwid::serial_line(Kind::SystemSerial, s))
    {
        lines.push((Kind::SystemSerial, l));
    }
    for n in &facts.nics {
        if let Ok(l) = hwid::mac_line(&n.mac) {
            lines.push((Kind::Mac, l));
        }
    }
    let mut out: Vec<BmcIdentifier> = lines
        .into_iter()
        .map(|(k, l)| BmcIdentifier {
            kind: k.as_str().to_owned(),
            digest: hwid::digest(&l),
        })
        .collect();
    out.sort_by(|a, b| (&a.kind, &a.digest).cmp(&(&b.kind, &b.digest)));
    out.dedup();
    out
}

fn power_of(p: PowerState) -> Power {
    match p {
        PowerState::On => Power::On,
        PowerState::Off => Power::Off,
        PowerState::Unknown => Power::Unknown,
    }
}

/// Sets the power axis on `edit` with a `power` event when it changes.
pub(crate) fn set_power(edit: &mut Edit, to: Power, message: &str) {
    let from = edit.node.power;
    if from != to {
        edit.node.power = to;
        edit.event(
            "power",
            Some(from.to_string()),
            Some(to.to_string()),
            message,
        );
    }
}

fn condition(edit: &mut Edit, type_: &str, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, type_, status, reason, msg);
}

/// The effect of a finished `bmc.*` command on its bare-metal node, in the transaction that
/// finished it (an agent's result, an expiry, a `LEASE_LOST`, a cancel). Anything else is
/// ignored.
pub fn on_command_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    let Some(subject) = cmd.subject_node_id.as_deref() else {
        return Ok(());
    };
    let Some(bmc) = tx.bmc(subject)? else {
        return Ok(());
    };
    if tx.node(subject)?.is_none() {
        return Ok(());
    }
    let code = cmd.error_code.clone().unwrap_or_default();
    let message = cmd.error_message.clone().unwrap_or_default();
    let mut edit = Edit::report(tx, subject, OWNER)?;
    edit.event(
        "bmcCommand",
        None,
        Some(cmd.state.as_str().to_owned()),
        match cmd.state {
            CommandState::Succeeded => format!("{} ({}) succeeded", cmd.name, cmd.id),
            _ => format!(
                "{} ({}) {}: {code}: {message}",
                cmd.name,
                cmd.id,
                cmd.state.as_str()
            ),
        },
    );
    let candidate = cmd.args.get("candidate").and_then(|v| v.as_bool()) == Some(true);
    match cmd.name.as_str() {
        "bmc.verify" if candidate => rotation_result(tx, &mut edit, bmc, cmd, &code, &message)?,
        "bmc.verify" if bmc.verify_command_id.as_deref() == Some(&cmd.id) => {
            verify_result(tx, &mut edit, bmc, cmd, &code, &message)?
        }
        "bmc.power" if cmd.state == CommandState::Succeeded => {
            if let Some(r) = cmd
                .result
                .as_ref()
                .and_then(|r| serde_json::from_value::<PowerResult>(r.clone()).ok())
                && r.power != PowerState::Unknown
            {
                let action = cmd
                    .args
                    .get("action")
                    .and_then(|v| v.as_str())
                    .unwrap_or("");
                set_power(
                    &mut edit,
                    power_of(r.power),
                    &format!("read back after nodes.power {action} ({})", cmd.id),
                );
            }
        }
        _ => {}
    }
    edit.save(tx)?;
    Ok(())
}

/// A verification's result on an `enrolling` node.
fn verify_result(
    tx: &Tx<'_>,
    edit: &mut Edit,
    mut bmc: BmcRecord,
    cmd: &CommandRecord,
    code: &str,
    message: &str,
) -> Result<(), OpError> {
    bmc.verify_command_id = None;
    if cmd.state == CommandState::Failed && code == CommandErrorCode::LeaseLost.as_str() {
        // The holder changed under it: the next holder verifies again (a read, safe to repeat).
        tx.put_bmc(&bmc)?;
        return Ok(());
    }
    let facts = match (cmd.state, cmd.result.as_ref()) {
        (CommandState::Succeeded, Some(r)) => serde_json::from_value::<BmcFacts>(r.clone())
            .map_err(|e| format!("BMC_ERROR: the site agent's result does not parse: {e}")),
        (CommandState::Succeeded, None) => {
            Err("BMC_ERROR: the site agent returned no facts".to_owned())
        }
        (CommandState::Expired, _) => Err(format!(
            "DEADLINE_EXCEEDED: the BMC was not verified within the command's deadline ({message})"
        )),
        _ => Err(format!("{code}: {message}")),
    };
    if edit.node.provision_state != ProvisionState::Enrolling {
        tx.put_bmc(&bmc)?;
        return Ok(());
    }
    match facts {
        Ok(f) => {
            let view = BmcFactsView {
                system_path: f.system_path.clone(),
                uuid: f.uuid.clone(),
                serial: f.serial.clone(),
                manufacturer: f.manufacturer.clone(),
                model: f.model.clone(),
                macs: f.nics.iter().map(|n| n.mac.to_ascii_lowercase()).collect(),
            };
            bmc.identifiers = identifiers(&f);
            bmc.facts = serde_json::to_value(&view).ok();
            if bmc.tls == "pin" && bmc.cert_sha256.is_none() {
                bmc.cert_sha256 = f.cert_sha256.clone();
            }
            bmc.verified_at = Some(edit.now());
            bmc.last_error = None;
            bmc.reachable = Some(true);
            tx.put_bmc(&bmc)?;
            let what = [f.manufacturer.as_deref(), f.model.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ");
            condition(
                edit,
                BMC_VERIFIED,
                ConditionStatus::True,
                "Verified",
                format!(
                    "{} answered with these credentials: system {}{}, {} identifier(s) recorded",
                    bmc.address,
                    if f.system_path.is_empty() {
                        "(IPMI)"
                    } else {
                        &f.system_path
                    },
                    if what.is_empty() {
                        String::new()
                    } else {
                        format!(" ({what})")
                    },
                    bmc.identifiers.len()
                ),
            );
            condition(
                edit,
                BMC_REACHABLE,
                ConditionStatus::True,
                "Answered",
                "the BMC answered the verification".to_owned(),
            );
            set_power(edit, power_of(f.power), "read at the BMC's verification");
            if bmc.deployed {
                // A machine that runs its OS already (Metal3's externallyProvisioned): no PXE,
                // no inspection; its power is managed from here on.
                apply_transition(
                    edit,
                    ProvisionState::Deployed,
                    "the BMC is verified; the machine was enrolled as already deployed (its OS is kept, nothing is booted)",
                )?;
            } else if bmc.inspect {
                super::inspect::start(
                    edit,
                    "the BMC is verified; the machine boots the ramdisk for inspection",
                )?;
            }
        }
        Err(why) => {
            let code = why.split(':').next().unwrap_or("BMC_ERROR").to_owned();
            bmc.last_error = Some(why.clone());
            tx.put_bmc(&bmc)?;
            condition(
                edit,
                BMC_VERIFIED,
                ConditionStatus::False,
                &reason_of(&code),
                why.clone(),
            );
            apply_transition(
                edit,
                ProvisionState::Failed,
                &format!("BMC verification failed: {why}"),
            )?;
        }
    }
    Ok(())
}

/// A rotation's result: the candidate replaces the stored pair only when the BMC took it.
fn rotation_result(
    tx: &Tx<'_>,
    edit: &mut Edit,
    mut bmc: BmcRecord,
    cmd: &CommandRecord,
    code: &str,
    message: &str,
) -> Result<(), OpError> {
    let Some(candidate) = bmc.candidate.take() else {
        return Ok(());
    };
    if cmd.state == CommandState::Succeeded {
        bmc.credentials = candidate;
        bmc.last_error = None;
        edit.event(
            "bmcCredentials",
            Some("rotating".into()),
            Some("rotated".into()),
            format!(
                "the BMC accepted the new credentials ({}); they replace the old ones",
                cmd.id
            ),
        );
    } else {
        edit.event(
            "bmcCredentials",
            Some("rotating".into()),
            Some("kept".into()),
            format!(
                "the BMC did not accept the new credentials ({code}: {message}); the old ones stay"
            ),
        );
    }
    tx.put_bmc(&bmc).map_err(OpError::from)
}

/// What the verification pass does to one enrolling node.
fn due(b: &BmcRecord, now: i64, deadline_ms: i64) -> bool {
    b.verified_at.is_none()
        && b.verify_started_at
            .is_some_and(|t| now >= t.saturating_add(deadline_ms))
}

impl BareMetal {
    /// Issues `bmc.verify` to the holder of `site_id`'s lease for every `enrolling` node of the
    /// site that waits for one; sends the holder its assignment first (it must know the BMC).
    pub async fn issue_verifications(&self, site_id: &str) {
        let Some((holder, _)) = self.leases.holder_of(site_id) else {
            return;
        };
        if self.sessions.live_epoch(&holder).is_none() {
            return;
        }
        let (site, h) = (site_id.to_owned(), holder.clone());
        let timeout = ms(self.cfg.command_timeout);
        let issued = self
            .store
            .write(move |tx| {
                let Some(lease) = tx.site_lease(&site)? else {
                    return Ok::<_, OpError>(0);
                };
                if lease.holder_node_id.as_deref() != Some(h.as_str()) {
                    return Ok(0);
                }
                let mut n = 0;
                for mut b in tx.site_bmcs(&site)? {
                    let Some(node) = tx.node(&b.node_id)? else {
                        continue;
                    };
                    if node.provision_state != ProvisionState::Enrolling || b.verified_at.is_some()
                    {
                        continue;
                    }
                    if let Some(c) = b.verify_command_id.as_deref()
                        && tx.command(c)?.is_some_and(|c| !c.state.is_final())
                    {
                        continue;
                    }
                    let args = serde_json::json!({
                        "nodeId": b.node_id, "leaseEpoch": lease.epoch, "candidate": false
                    });
                    let rec = queue(
                        tx,
                        &h,
                        &b.node_id,
                        CommandName::BmcVerify,
                        args,
                        timeout,
                        OWNER,
                    )?;
                    b.verify_command_id = Some(rec.id);
                    tx.put_bmc(&b)?;
                    n += 1;
                }
                Ok(n)
            })
            .await;
        match issued {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(site_id = %site_id, holder = %holder, verifications = n, "bmc.verify issued");
                self.push_assignment(&holder).await;
                self.commands.dispatch(&holder, false).await;
            }
            Err(e) => tracing::error!(site_id = %site_id, error = %e, "issuing bmc.verify failed"),
        }
    }

    /// The controller's pass over enrollments at `now`: those past their deadline fail (with
    /// why: no site agent held the lease, or the BMC was not verified in time); the others get
    /// a verification if their site has a holder.
    pub async fn verification_pass(&self, now: i64) {
        let deadline = ms(self.cfg.verify_deadline);
        let pending = match self
            .store
            .read(|r| {
                r.bmcs_in_state(ProvisionState::Enrolling.as_str())
                    .map_err(OpError::from)
            })
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "reading enrollments failed");
                return;
            }
        };
        let mut sites = std::collections::BTreeSet::new();
        for b in pending {
            if !due(&b, now, deadline) {
                let id = b.node_id.clone();
                if b.verified_at.is_none()
                    && let Ok(Some(n)) = self
                        .store
                        .read(move |r| r.node(&id).map_err(OpError::from))
                        .await
                    && let Some(s) = n.site_id
                {
                    sites.insert(s);
                }
                continue;
            }
            let limit = self.cfg.verify_deadline;
            let id = b.node_id.clone();
            let r = self
                .store
                .write(move |tx| fail_overdue(tx, &id, limit))
                .await;
            if let Err(e) = r {
                tracing::error!(node_id = %b.node_id, error = %e, "failing an overdue enrollment failed");
            }
        }
        for s in sites {
            self.issue_verifications(&s).await;
        }
    }
}

/// Fails an enrollment whose verification did not finish within `limit` (and its command, if
/// one is in flight).
fn fail_overdue(tx: &Tx<'_>, node_id: &str, limit: std::time::Duration) -> Result<(), OpError> {
    let Some(mut b) = tx.bmc(node_id)? else {
        return Ok(());
    };
    let mut edit = Edit::begin(tx, node_id, None, OWNER)?;
    if edit.node.provision_state != ProvisionState::Enrolling || b.verified_at.is_some() {
        return Ok(());
    }
    let site = edit.node.site_id.clone().unwrap_or_default();
    let in_flight = match b.verify_command_id.take() {
        Some(c) => tx.finish_command(
            &c,
            CommandState::Expired,
            "DEADLINE_EXCEEDED",
            "the enrollment's verification deadline passed",
            edit.now(),
        )?,
        None => false,
    };
    let limit = humantime_secs(limit);
    let (reason, why) = if in_flight {
        (
            "VerifyDeadline",
            format!(
                "the BMC was not verified within {limit} (the site agent did not answer in time)"
            ),
        )
    } else {
        (
            "NoSiteAgent",
            format!(
                "no site agent of site {site} held the site's lease within {limit}, so the BMC was never verified"
            ),
        )
    };
    b.last_error = Some(why.clone());
    tx.put_bmc(&b)?;
    condition(
        &mut edit,
        BMC_VERIFIED,
        ConditionStatus::False,
        reason,
        why.clone(),
    );
    apply_transition(&mut edit, ProvisionState::Failed, &why)?;
    edit.save(tx)?;
    Ok(())
}

fn humantime_secs(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::commands::bmc::BmcNic;

    #[test]
    fn reasons_are_camel_case_codes() {
        assert_eq!(reason_of("BMC_AUTH_FAILED"), "BmcAuthFailed");
        assert_eq!(reason_of("DEADLINE_EXCEEDED"), "DeadlineExceeded");
    }

    #[test]
    fn identifiers_are_the_hardware_keys_digests() {
        let f = BmcFacts {
            uuid: Some("B26849EF-4FB0-4E03-A9D1-1A165A40C8D7".into()),
            serial: Some(" To Be Filled By O.E.M. ".into()),
            nics: vec![
                BmcNic {
                    id: "1".into(),
                    mac: "00:25:90:EB:96:28".into(),
                },
                BmcNic {
                    id: "2".into(),
                    mac: "02:42:ac:11:00:02".into(),
                },
            ],
            ..BmcFacts::default()
        };
        let ids = identifiers(&f);
        // The placeholder serial and the locally administered MAC are dropped, as the hardware
        // key drops them; the others are the digests of the hardware key's own lines.
        assert_eq!(
            ids,
            vec![
                BmcIdentifier {
                    kind: "mac".into(),
                    digest: hwid::digest("mac:00:25:90:eb:96:28")
                },
                BmcIdentifier {
                    kind: "system-uuid".into(),
                    digest: hwid::digest("system-uuid:b26849ef-4fb0-4e03-a9d1-1a165a40c8d7")
                },
            ]
        );
    }
}
