//! The `enrolling` workflow: BMC verification. `bmc.verify` is queued on the site's lease holder
//! for every enrollment waiting for one (`issue`; the site pass sends it), its result applied
//! (identifiers stored as the hardware key's digests, or the node failed with what the BMC
//! answered), the deadline of an enrollment no holder verified (`fail_overdue`), and the
//! effect of every finished `bmc.*` command on its bare-metal node ([`on_final`]).

use bc_protocol::commands::bmc::{BmcFacts, PowerResult, PowerState, VerifyArgs};
use bc_protocol::commands::{CommandArgs, CommandErrorCode};
use bc_protocol::hwid::{self, Kind};
use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{BmcIdentifier, BmcRecord, CommandRecord, CommandState, Tx};

use super::bmc::{
    BMC_REACHABLE, BMC_VERIFIED, BmcFactsView, OWNER, power_of, reason_of, set_power,
};
use super::workflow::{Deadline, Workflow};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// `enrolling`: the site's lease holder verifies the BMC (`bmc.verify`, issued by the
/// controller's site pass); its result records the BMC's identifiers and moves the node on, or
/// fails it with what the BMC answered. No ramdisk; the deadline is the control plane's.
pub const WORKFLOW: Workflow = Workflow {
    state: ProvisionState::Enrolling,
    condition: BMC_VERIFIED,
    steps: None,
    deadline: Deadline::Verification,
    ramdisk: None,
    abort: |boot, bmc| {
        let mut cancel = super::workflow::boot_commands(boot, bmc);
        cancel.extend(bmc.verify_command_id.clone());
        cancel
    },
};

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

fn condition(edit: &mut Edit, type_: &str, status: ConditionStatus, reason: &str, msg: String) {
    crate::conditions::apply_owned(edit, OWNER, type_, status, reason, msg);
}

/// The effect of a `bmc.*` command that just ended on its bare-metal node, in the transaction
/// that ended it (an agent's result, an expiry, a `LEASE_LOST`, a cancel): a `bmcCommand` event,
/// and a verification's or a rotation's result, or the power state a `bmc.power` read back.
/// A command about no enrolled node is ignored.
pub fn on_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
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
            CommandState::Succeeded => format!(
                "{} ({}) succeeded{}",
                cmd.name,
                cmd.id,
                success_detail(cmd.result.as_ref())
            ),
            _ => format!(
                "{} ({}) {}: {code}: {message}",
                cmd.name,
                cmd.id,
                cmd.state.as_str()
            ),
        },
    );
    match CommandArgs::parse(cmd.name, &cmd.args) {
        Ok(CommandArgs::BmcVerify(a)) if a.candidate => {
            rotation_result(tx, &mut edit, bmc, cmd, &code, &message)?
        }
        Ok(CommandArgs::BmcVerify(_)) if bmc.verify_command_id.as_deref() == Some(&cmd.id) => {
            verify_result(tx, &mut edit, bmc, cmd, &code, &message)?
        }
        Ok(CommandArgs::BmcPower(a)) if cmd.state == CommandState::Succeeded => {
            // The state after the action, as the BMC read once it settled.
            if let Some(r) = cmd
                .result
                .as_ref()
                .and_then(|r| serde_json::from_value::<PowerResult>(r.clone()).ok())
                && r.power != PowerState::Unknown
            {
                set_power(
                    &mut edit,
                    power_of(r.power),
                    &format!(
                        "read back after nodes.power {} ({})",
                        a.action.as_str(),
                        cmd.id
                    ),
                );
            }
        }
        _ => {}
    }
    edit.save(tx)?;
    Ok(())
}

/// What a successful `bmc.*` result adds to its event: the BMC faults retried on the way (a
/// flaky BMC, issue 31 rule 13), the network boot confirmed, what the BMC holds where it
/// differs from what was asked.
fn success_detail(result: Option<&serde_json::Value>) -> String {
    let Some(r) = result else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(n) = r.get("transientFaults").and_then(serde_json::Value::as_u64)
        && n > 0
    {
        parts.push(format!(
            "after retrying {n} transient BMC fault(s) (no answer or a 5xx): a flaky BMC"
        ));
    }
    if let Some(b) = r.get("networkBoot") {
        parts.push(format!(
            "the machine asked the boot service for its script from {} after power-on {}{}",
            b.get("mac")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("?"),
            b.get("attempt")
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(1),
            if b.get("persistent").and_then(serde_json::Value::as_bool) == Some(true) {
                " (with a persistent override)"
            } else {
                ""
            }
        ));
    }
    if let Some(n) = r.get("note").and_then(serde_json::Value::as_str) {
        parts.push(n.to_owned());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join("; "))
    }
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
    let facts = match facts {
        Ok(f) => match duplicate_of(tx, &bmc, &f)? {
            Some(why) => Err(why),
            None => Ok(f),
        },
        Err(e) => Err(e),
    };
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

/// Why the BMC of `bmc`'s node, which answered with `f`, is a machine another node already is
/// (issue 30.8), as a `DUPLICATE_MACHINE: …` failure; `None` when it is no other's. Another
/// node's BMC (on any site) that reported the same system UUID or serial is one machine behind
/// two addresses (or two names of one BMC: the control plane resolves no DNS name); the same
/// canonical origin and system path is one BMC spelled twice.
fn duplicate_of(tx: &Tx<'_>, bmc: &BmcRecord, f: &BmcFacts) -> Result<Option<String>, OpError> {
    let mine = identifiers(f);
    let unique = [Kind::SystemUuid.as_str(), Kind::SystemSerial.as_str()];
    let origin = super::address::parse(&bmc.address)
        .ok()
        .map(|a| a.origin.with_system_path(&f.system_path));
    for other in tx.bmcs()? {
        if other.node_id == bmc.node_id {
            continue;
        }
        let shared: Vec<&str> = mine
            .iter()
            .filter(|i| unique.contains(&i.kind.as_str()))
            .filter(|i| other.identifiers.contains(i))
            .map(|i| {
                if i.kind == Kind::SystemUuid.as_str() {
                    "system UUID"
                } else {
                    "system serial"
                }
            })
            .collect();
        let same_system = || {
            let theirs = super::address::parse(&other.address).ok()?.origin;
            let path = other
                .facts
                .as_ref()
                .and_then(|v| serde_json::from_value::<BmcFactsView>(v.clone()).ok())
                .map(|v| v.system_path)
                .unwrap_or_default();
            let theirs = theirs.with_system_path(&path);
            (Some(&theirs) == origin.as_ref()).then_some(theirs)
        };
        let what = if !shared.is_empty() {
            format!(
                "it reported the {} node {}'s BMC ({}) reported",
                shared.join(" and "),
                other.node_id,
                other.address
            )
        } else if let Some(o) = same_system() {
            format!(
                "it is system {o}, which node {} is enrolled through ({})",
                other.node_id, other.address
            )
        } else {
            continue;
        };
        return Ok(Some(format!(
            "DUPLICATE_MACHINE: {} answered, but {what}: one machine is enrolled once. Use node {} (or delete it, then recover this one)",
            bmc.address, other.node_id
        )));
    }
    Ok(None)
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
        let note = cmd
            .result
            .as_ref()
            .and_then(|r| r.get("note"))
            .and_then(serde_json::Value::as_str)
            .map(|n| format!(" ({n})"))
            .unwrap_or_default();
        edit.event(
            "bmcCredentials",
            Some("rotating".into()),
            Some("rotated".into()),
            format!(
                "the BMC accepted the new credentials ({}){note}; they replace the old ones",
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

/// Queues `bmc.verify` on `holder`, if it holds `site_id`'s lease, for every `enrolling` node
/// of the site that waits for one (no verification yet, none in flight), each with a deadline
/// of `timeout_ms`. Returns how many were queued; the caller sends the holder its assignment
/// (it must know the BMCs) and dispatches them.
pub(crate) fn issue(
    tx: &Tx<'_>,
    site_id: &str,
    holder: &str,
    timeout_ms: i64,
) -> Result<usize, OpError> {
    let Some(lease) = tx.site_lease(site_id)? else {
        return Ok(0);
    };
    if lease.holder_node_id.as_deref() != Some(holder) {
        return Ok(0);
    }
    let mut n = 0;
    for mut b in tx.site_bmcs(site_id)? {
        let Some(node) = tx.node(&b.node_id)? else {
            continue;
        };
        if node.provision_state != ProvisionState::Enrolling || b.verified_at.is_some() {
            continue;
        }
        if let Some(c) = b.verify_command_id.as_deref()
            && tx.command(c)?.is_some_and(|c| !c.state.is_final())
        {
            continue;
        }
        let args = CommandArgs::BmcVerify(VerifyArgs {
            node_id: b.node_id.clone(),
            lease_epoch: lease.epoch,
            candidate: false,
        });
        let rec = super::bmc::queue(tx, holder, &b.node_id, args, timeout_ms, OWNER)?;
        b.verify_command_id = Some(rec.id);
        tx.put_bmc(&b)?;
        n += 1;
    }
    Ok(n)
}

/// Fails an enrollment whose verification did not finish within `limit` (and its command, if
/// one is in flight).
pub(crate) fn fail_overdue(
    tx: &Tx<'_>,
    node_id: &str,
    limit: std::time::Duration,
) -> Result<(), OpError> {
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
