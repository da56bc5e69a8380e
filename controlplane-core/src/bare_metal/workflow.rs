//! The shape of a bare-metal workflow: what one provision state needs, as one [`Workflow`]
//! entry its module declares, and what the workflows share (sending a step, a deadline's time
//! left, the first report of a boot that works). The entries are listed in [`super::table`];
//! the controller's pass ([`super::controller`]), the ramdisk's report, the command router
//! (`crate::commands::finished`) and `nodes.abort` read them there.
//!
//! # Design
//! An entry is data and plain functions, no trait object: `deadline`, `condition`, `steps`
//! (the event kind), whether the state boots the ramdisk and, if so, what its boot does —
//! the ramdisk's first report ([`Ramdisk::on_report`]), the next command of the controller's
//! pass ([`Ramdisk::next`]), what a finished command in flight means ([`Ramdisk::finished`]),
//! why an overdue state failed ([`Ramdisk::overdue`]) — and what `nodes.abort` cancels
//! ([`Workflow::abort`]). Transactions only record; the pass sends, so a step whose sender is
//! missing (no ramdisk session, no site agent holding the lease) waits for the next pass.

use std::time::Duration;

use bc_protocol::commands::CommandArgs;
use bc_protocol::{CommandName, ConditionStatus, ProvisionState};
use cpl_store::{Acceptance, BmcRecord, BootRecord, CommandRecord, NodeRecord, Pool, Tx, WorkStep};

use super::boot::{self, OWNER};
use crate::commands::record::{self, Queue};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// What one bare-metal provision state needs. One per state, in [`super::table::WORKFLOWS`].
#[derive(Debug)]
pub struct Workflow {
    /// The provision state this entry owns.
    pub state: ProvisionState,
    /// The condition the state reports its progress and its failure in (`Inspected`, …).
    pub condition: &'static str,
    /// The event kind of its steps (`cleaningStep`); `None` for a state without steps.
    pub steps: Option<&'static str>,
    /// How long the state may last.
    pub deadline: Deadline,
    /// What the state's boot into the ramdisk does; `None`: the state boots nothing.
    pub ramdisk: Option<Ramdisk>,
    /// The commands `nodes.abort` cancels: the node's boot (if one is open) and its BMC row
    /// give them.
    pub abort: fn(Option<&BootRecord>, &BmcRecord) -> Vec<String>,
}

/// How long a state may last.
#[derive(Debug, Clone, Copy)]
pub enum Deadline {
    /// The pool's `acceptance.<…>DeadlineSeconds` (`seconds` reads it), else `default`.
    Pool {
        seconds: fn(&Acceptance) -> Option<u64>,
        default: Duration,
    },
    /// The control plane's `--bmc-verify-deadline` (`BareMetalConfig::verify_deadline`).
    Verification,
}

/// What a ramdisk state's boot does, beyond what every boot does (a one-time token, power-on
/// with PXE through the site's lease holder, an end when the node leaves the state).
#[derive(Debug)]
pub struct Ramdisk {
    /// The condition a failed power-on into the ramdisk sets. Commissioning's is the
    /// inspection's: its boot is the inspection's, begun again by `nodes.recover`.
    pub power_on_condition: &'static str,
    /// Once the boot's work reached this step the state's deadline no longer applies (a rescue
    /// whose SSH server listens lasts as long as the operator needs it).
    pub open_ended_after: Option<WorkStep>,
    /// The ramdisk's inventory on this state's boot, in the report's transaction (the boot is
    /// used, not ended, and for this state).
    pub on_report: fn(&Tx<'_>, &mut Edit, &mut BootRecord) -> Result<(), OpError>,
    /// The next command of the controller's pass, queued in its transaction; returns the node
    /// whose queue to dispatch (the ramdisk's, or the lease holder's for `bmc.*`), `None` when
    /// nothing is due or its sender is missing.
    pub next: fn(&Tx<'_>, &mut Turn<'_>) -> Result<Option<String>, OpError>,
    /// What a command that was the boot's command in flight means, now that it is over (in the
    /// transaction that ended it). The edit is the node's, as a report's.
    pub finished: fn(&Tx<'_>, &CommandRecord, BootRecord, Edit) -> Result<(), OpError>,
    /// Why a node whose state outlived `secs` failed, from how far its boot got: the
    /// condition's reason and message.
    pub overdue: fn(&BootRecord, u64) -> (&'static str, String),
}

/// One boot's turn in the controller's pass, in its transaction: what a workflow's next step
/// may read and use.
#[derive(Debug)]
pub struct Turn<'a> {
    pub boot: &'a mut BootRecord,
    pub node: &'a NodeRecord,
    pub pool: Option<&'a Pool>,
    /// The site's lease holder with a live session, and the lease's epoch.
    pub holder: Option<(String, u64)>,
    /// Whether the ramdisk has a live session (its commands can be sent).
    pub live: bool,
    /// The pass's time, ms since the Unix epoch.
    pub now: i64,
    /// A command's deadline, ms (`BareMetalConfig::command_timeout`).
    pub timeout: i64,
}

impl Workflow {
    /// How long the state may last for a node of `pool`; `None` for the verification's
    /// deadline, which is the control plane's, not the pool's.
    pub fn limit(&self, pool: Option<&Pool>) -> Option<Duration> {
        match self.deadline {
            Deadline::Pool { seconds, default } => {
                let a = pool.map(|p| p.acceptance).unwrap_or_default();
                Some(seconds(&a).map_or(default, Duration::from_secs))
            }
            Deadline::Verification => None,
        }
    }

    /// Sets the state's condition on `edit`, owned by the workflow.
    pub fn condition(&self, edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
        crate::conditions::apply_owned(edit, OWNER, self.condition, status, reason, msg);
    }

    /// Records a step (`to`) as an event of the state's kind.
    pub fn step(&self, edit: &mut Edit, to: &str, msg: String) {
        if let Some(kind) = self.steps {
            edit.event(kind, None, Some(to.to_owned()), msg);
        }
    }

    /// Fails the node from this state, `reason` and `why` in its condition.
    pub fn fail(&self, edit: &mut Edit, reason: &str, why: String) -> Result<(), OpError> {
        self.condition(edit, ConditionStatus::False, reason, why.clone());
        apply_transition(edit, ProvisionState::Failed, &why)
    }

    /// What is left at `now` of boot `b`'s state deadline in `pool`, ms, at least `min_ms`:
    /// the deadline a long ramdisk command (a clean, an image write) is sent with.
    pub fn time_left(&self, b: &BootRecord, pool: Option<&Pool>, now: i64, min_ms: i64) -> i64 {
        let limit = self.limit(pool).map_or(i64::MAX, cpl_store::duration_ms);
        b.phase_started_at
            .saturating_add(limit)
            .saturating_sub(now)
            .max(min_ms)
    }

    /// The first report of a boot whose work follows it (deploy, rescue, cleaning), in the
    /// report's transaction: the identifiers are checked against the BMC's again — a wrong
    /// machine is never erased or written — then the boot is ready for `first`, which the next
    /// pass sends.
    pub fn ready_for_work(
        &self,
        tx: &Tx<'_>,
        edit: &mut Edit,
        b: &mut BootRecord,
        first: CommandName,
    ) -> Result<(), OpError> {
        if b.steps_at.is_some() {
            return Ok(());
        }
        let Some(bmc) = tx.bmc(&edit.node.id)? else {
            return Ok(());
        };
        edit.act_as(OWNER);
        if let Some(why) = boot::report_differs(edit, &bmc, ", so nothing was erased or written") {
            return self.fail(edit, "HardwareMismatch", why);
        }
        b.steps_at = Some(edit.now());
        tx.put_boot(b)?;
        self.step(
            edit,
            "ready",
            format!(
                "the ramdisk joined with boot token {} and reported; {first} is sent next",
                b.token_id
            ),
        );
        Ok(())
    }
}

/// `nodes.abort` of a ramdisk state cancels its boot's commands in flight.
pub fn boot_commands(boot: Option<&BootRecord>, _bmc: &BmcRecord) -> Vec<String> {
    boot.into_iter()
        .flat_map(|b| [b.work_command_id.clone(), b.diag_command_id.clone()])
        .flatten()
        .collect()
}

/// Queues `args` for the ramdisk of `node_id` (actor `BareMetalWorkflow`, its deadline
/// `timeout_ms` after `now`); the pass dispatches it.
pub fn send_to_ramdisk(
    tx: &Tx<'_>,
    node_id: &str,
    args: CommandArgs,
    now: i64,
    timeout_ms: i64,
) -> Result<CommandRecord, OpError> {
    let to = Queue {
        node_id,
        subject: None,
        actor: OWNER,
        timeout_ms,
    };
    let rec = record::queued(to, args.into(), now);
    tx.insert_command(&rec)?;
    Ok(rec)
}

/// Queues the `bmc.*` command `args(epoch)` on the turn's lease holder about its node, as the
/// boot's work command; returns the holder to dispatch, `None` without a live holder.
pub fn send_to_holder(
    tx: &Tx<'_>,
    t: &mut Turn<'_>,
    args: impl FnOnce(u64) -> CommandArgs,
) -> Result<Option<String>, OpError> {
    let Some((h, epoch)) = t.holder.clone() else {
        return Ok(None);
    };
    let rec = super::bmc::queue(tx, &h, &t.boot.node_id, args(epoch), t.timeout, OWNER)?;
    t.boot.work_command_id = Some(rec.id);
    tx.put_boot(t.boot)?;
    Ok(Some(h))
}

/// What a failed or lost command says, for messages: `<name> <state>: <code>: <message>`.
pub fn failure(cmd: &CommandRecord) -> String {
    format!(
        "{} {}: {}: {}",
        cmd.name,
        cmd.state.as_str(),
        cmd.error_code.as_deref().unwrap_or(""),
        cmd.error_message.as_deref().unwrap_or("")
    )
}

/// Why a node in a work state outlived its deadline of `secs`, from how far boot `b` got.
pub fn overdue_work(b: &BootRecord, secs: u64) -> String {
    let last = b.work_step.map_or("none", WorkStep::as_str);
    let why = match (b.used_at, b.steps_at, b.work_command_id.as_deref()) {
        (_, Some(_), Some(id)) => format!(
            "its command {id} did not finish within {secs}s of the state's start (last step: {last})"
        ),
        (Some(_), Some(_), None) => format!(
            "the ramdisk reported but the next step could not be sent within {secs}s (last step: {last}; no ramdisk session or no site agent holding the lease)"
        ),
        (Some(_), None, _) => {
            format!("the ramdisk joined but did not report an inventory within {secs}s")
        }
        (None, _, _) if b.command_id.is_none() => format!(
            "the machine was never powered on into the ramdisk within {secs}s: no site agent of its site held the lease"
        ),
        (None, _, _) => format!(
            "the machine never booted the ramdisk within {secs}s: it was powered with PXE ({}), but no ramdisk joined with its boot token {}",
            b.command_id.as_deref().unwrap_or("?"),
            b.token_id
        ),
    };
    format!("{}: {why}", b.purpose)
}
