//! NodeLifecycle acceptance: when an `adopting` node becomes `adopted`, per pool.
//!
//! # Background
//! Acceptance used to be "the first inventory arrived": a node with `hardwareKeyTrusted: false`
//! and no surviving identifier became `adopted` and schedulable.
//!
//! # Design
//! A node is accepted when, with its inventory stored, (1) the pool's hardware profile matches
//! (`GpuCountMismatch` and `GpuModelMismatch` are not `true`), and (2) its hardware key is trusted
//! where the pool requires one ([`Rules::require_trusted_key`]: by default metal pools do, VPS and
//! provider pools do not; a pool says otherwise with `acceptance.requireTrustedKey`). The
//! verdict is the `Accepted` condition (owner NodeLifecycle): `true` when the node is adopted,
//! `false` with the reason while it waits (`NoInventory`, `ProfileMismatch`, `UntrustedKey`).
//! It is evaluated on every inventory report and when `nodes.move` changes the node's pool
//! ([`evaluate`]); [`sweep`] fails a node still `adopting` past its pool's deadline (`failed`,
//! failedFrom `adopting`, reason `DeadlineExceeded`), and [`run`] sweeps every [`SWEEP_PERIOD`].
//! `nodes.adopt` stays the operator's way to accept a node by hand.
//!
//! # Limitations
//! The deadline counts from the newest move into `adopting` (join, or `nodes.recover`); a node
//! whose agent never reports inventory fails the same way. Nodes without a pool take the defaults
//! of no kind: no trusted key required.

use std::time::Duration;

use bc_protocol::{ConditionStatus, PoolKind, ProvisionState};
use cpl_store::{Pool, Store, Tx};

use crate::conditions::{ConditionUpdate, apply};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// The condition acceptance writes.
pub const ACCEPTED: &str = "Accepted";
/// How long a node may stay `adopting` unless its pool says otherwise.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3600);
/// Longest deadline a pool may set (30 days).
pub const MAX_DEADLINE_SECONDS: u64 = 30 * 24 * 3600;
/// How often [`run`] looks for nodes past their deadline.
pub const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// A pool's acceptance rules with the defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// The node's hardware key must be trusted.
    pub require_trusted_key: bool,
    /// How long the node may stay `adopting`.
    pub deadline: Duration,
}

/// Whether a pool of `kind` requires a trusted key when it does not say: metal pools hold
/// machines the platform owns and tracks by their hardware; VPS and provider machines often
/// have no usable SMBIOS.
pub fn requires_trusted_key_by_default(kind: PoolKind) -> bool {
    matches!(kind, PoolKind::MetalHost | PoolKind::MetalDedicated)
}

/// The rules of `pool` (`None`: a node without a pool).
pub fn rules(pool: Option<&Pool>) -> Rules {
    let a = pool.map(|p| p.acceptance).unwrap_or_default();
    Rules {
        require_trusted_key: a
            .require_trusted_key
            .unwrap_or_else(|| pool.is_some_and(|p| requires_trusted_key_by_default(p.kind))),
        deadline: a
            .deadline_seconds
            .map_or(DEFAULT_DEADLINE, Duration::from_secs),
    }
}

/// Checks a pool's acceptance settings (`pools.create`, `pools.update`).
pub fn check_settings(a: &cpl_store::Acceptance) -> Result<(), OpError> {
    for (name, v) in [
        ("deadlineSeconds", a.deadline_seconds),
        ("inspectionDeadlineSeconds", a.inspection_deadline_seconds),
        (
            "commissioningDeadlineSeconds",
            a.commissioning_deadline_seconds,
        ),
        ("cleaningDeadlineSeconds", a.cleaning_deadline_seconds),
        ("deployDeadlineSeconds", a.deploy_deadline_seconds),
        ("rescueDeadlineSeconds", a.rescue_deadline_seconds),
    ] {
        if let Some(s) = v
            && (s == 0 || s > MAX_DEADLINE_SECONDS)
        {
            return Err(OpError::InvalidArgument(format!(
                "acceptance.{name} must be between 1 and {MAX_DEADLINE_SECONDS}, got {s}"
            )));
        }
    }
    Ok(())
}

fn condition(status: ConditionStatus, reason: &str, message: String) -> ConditionUpdate {
    ConditionUpdate {
        type_: ACCEPTED.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        owner: "NodeLifecycle".to_owned(),
        gpus: Vec::new(),
    }
}

/// `Accepted` true after `nodes.adopt`: the operator accepted the node by hand.
pub fn accepted_by_operator() -> ConditionUpdate {
    condition(
        ConditionStatus::True,
        "AdoptedByOperator",
        "accepted by hand (nodes.adopt)".to_owned(),
    )
}

/// Why a node is not accepted (yet): `(reason, message)`; `None` when it passes.
fn refusal(
    node: &cpl_store::NodeRecord,
    rules: &Rules,
    pool: Option<&Pool>,
) -> Option<(&'static str, String)> {
    if node.inventory_json.is_none() {
        return Some(("NoInventory", "no inventory reported yet".to_owned()));
    }
    let mismatch: Vec<String> = node
        .conditions
        .iter()
        .filter(|c| {
            matches!(c.type_.as_str(), "GpuCountMismatch" | "GpuModelMismatch")
                && c.status != ConditionStatus::False
        })
        .map(|c| format!("{} ({})", c.type_, c.message))
        .collect();
    if !mismatch.is_empty() {
        return Some((
            "ProfileMismatch",
            format!(
                "the pool's hardware profile does not match: {}",
                mismatch.join("; ")
            ),
        ));
    }
    if rules.require_trusted_key && !node.hardware_key_trusted {
        let why = node
            .conditions
            .iter()
            .find(|c| c.type_ == "HardwareKeyTrusted")
            .map_or_else(|| "no hardware key".to_owned(), |c| c.message.clone());
        let pool = pool.map_or("its pool", |p| p.id.as_str());
        return Some((
            "UntrustedKey",
            format!("{pool} requires a trusted hardware key (acceptance.requireTrustedKey): {why}"),
        ));
    }
    None
}

/// Runs acceptance on an edit of a node whose inventory and profile conditions were just
/// written: an `adopting` node that passes becomes `adopted` (`Accepted` true); one that does not
/// keeps waiting with `Accepted` false and the reason. Other states change nothing.
pub fn evaluate(tx: &Tx<'_>, edit: &mut Edit) -> Result<(), OpError> {
    if edit.node.provision_state != ProvisionState::Adopting {
        return Ok(());
    }
    let pool = match &edit.node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    };
    let rules = rules(pool.as_ref());
    let actor = edit.actor().to_owned();
    edit.act_as("NodeLifecycle");
    match refusal(&edit.node, &rules, pool.as_ref()) {
        None => {
            let trust = if rules.require_trusted_key {
                "hardware key trusted"
            } else {
                "a trusted hardware key is not required by the pool"
            };
            let message = format!("inventory received; hardware profile matches; {trust}");
            apply(
                edit,
                &condition(ConditionStatus::True, "AcceptancePassed", message.clone()),
            );
            apply_transition(
                edit,
                ProvisionState::Adopted,
                &format!("acceptance passed: {message}"),
            )?;
        }
        Some((reason, message)) => {
            apply(edit, &condition(ConditionStatus::False, reason, message));
        }
    }
    edit.act_as(&actor);
    Ok(())
}

/// Fails every node still `adopting` past its pool's deadline at `now` (ms): `failed` with
/// failedFrom `adopting`, maintenance on, and `Accepted` false with reason `DeadlineExceeded`
/// naming what it was waiting for. Returns the nodes failed.
pub fn sweep(tx: &Tx<'_>, now: i64) -> Result<Vec<String>, OpError> {
    let mut failed = Vec::new();
    for (id, pool) in due(tx, now)? {
        let rules = rules(pool.as_ref());
        let mut edit = Edit::begin(tx, &id, None, "NodeLifecycle")?;
        let waiting = refusal(&edit.node, &rules, pool.as_ref())
            .map_or_else(|| "acceptance had not run".to_owned(), |(_, m)| m);
        let message = format!(
            "acceptance did not pass within {}: {waiting}",
            humanize(rules.deadline)
        );
        apply(
            &mut edit,
            &condition(ConditionStatus::False, "DeadlineExceeded", message.clone()),
        );
        apply_transition(&mut edit, ProvisionState::Failed, &message)?;
        edit.save(tx)?;
        failed.push(id);
    }
    Ok(failed)
}

/// The `adopting` nodes past their pool's deadline at `now`, with their pool.
pub fn due(r: &cpl_store::Reader<'_>, now: i64) -> Result<Vec<(String, Option<Pool>)>, OpError> {
    let mut out = Vec::new();
    for (id, pool_id, since) in r.adopting_nodes()? {
        let pool = match &pool_id {
            Some(p) => r.pool(p)?,
            None => None,
        };
        let deadline_ms =
            i64::try_from(rules(pool.as_ref()).deadline.as_millis()).unwrap_or(i64::MAX);
        if now.saturating_sub(since) >= deadline_ms {
            out.push((id, pool));
        }
    }
    Ok(out)
}

/// `1h`, `90s`: how a deadline reads in a message.
fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Runs the deadline sweep every [`SWEEP_PERIOD`] until the task is dropped.
pub async fn run(store: Store) {
    let mut tick = tokio::time::interval(SWEEP_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = cpl_store::now_ms();
        // A read first: the write lock is taken only when some node is due.
        match store.read(move |r| due(r, now)).await {
            Ok(d) if d.is_empty() => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "acceptance sweep failed");
                continue;
            }
        }
        match store.write(move |tx| sweep(tx, now)).await {
            Ok(failed) => {
                for id in failed {
                    let span = tracing::info_span!("node", node_id = %id);
                    span.in_scope(|| {
                        tracing::warn!("NodeLifecycle: acceptance deadline passed; node failed")
                    });
                }
            }
            Err(e) => tracing::error!(error = %e, "acceptance sweep failed"),
        }
    }
}

#[cfg(test)]
#[path = "acceptance_tests.rs"]
mod acceptance_tests;
