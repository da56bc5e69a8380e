//! Where a node belongs and who may take its record: `nodes.move` (between pools, issue 18.15)
//! and `nodes.approveRejoin` (an operator lets a machine that matched a platform node by its
//! identifiers only re-join it in place, issue 19.1). docs/node-model.md "Re-join in place" and
//! "Moving a node".

use bc_protocol::{Adapter, ConditionStatus, SiteKind, Trust};
use cpl_store::{NodeRecord, Tx};

use crate::conditions::{ConditionUpdate, apply, profile_conditions};
use crate::edit::Edit;
use crate::error::OpError;
use crate::join::APPROVAL_TTL_MS;
use crate::ownership::placement;

/// The profile conditions a pool's hardware profile decides.
const PROFILE_CONDITIONS: [&str; 2] = ["GpuCountMismatch", "GpuModelMismatch"];

/// `nodes.approveRejoin`: approves the node's pending re-join request `request_id` (named, so
/// an operator approves exactly the machine they saw in `nodes.get`). The machine re-joins in
/// place at its next attempt within [`APPROVAL_TTL_MS`] with the same token and the same
/// identity facts; a machine with other facts is not let in by it.
///
/// Errors: `NOT_FOUND` when the node has no such request; `CONFLICT` on a stale version.
pub fn approve_rejoin(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    request_id: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let req = tx
        .rejoin_request(node_id)?
        .filter(|r| r.id == request_id)
        .ok_or_else(|| OpError::NotFound {
            kind: "rejoin request",
            id: format!("{node_id}/{request_id}"),
        })?;
    let now = edit.now();
    tx.approve_rejoin_request(&req.id, actor, now)?;
    edit.event(
        "rejoinRequest",
        Some(if req.approved_at.is_some() { "approved" } else { "pending" }.to_owned()),
        Some("approved".to_owned()),
        format!(
            "request {} (hostname {}, from {}, token {}) approved: the machine re-joins in place at its next attempt within {} minutes",
            req.id,
            req.hostname.as_deref().unwrap_or("unknown"),
            req.peer.as_deref().unwrap_or("unknown"),
            req.token_id,
            APPROVAL_TTL_MS / 60_000
        ),
    );
    edit.save(tx)
}

/// `nodes.move`: moves the node into pool `pool_id`. Role, trust, owner, adapter and drivers
/// are recomputed from the target pool and its site through the ownership rules
/// ([`placement`]), and the profile conditions from its hardware profile, in one save.
///
/// Checks: the pool exists (`NOT_FOUND`); it is on the node's site (a node without a site takes
/// the pool's), its agent matches the node's adapter (a bcd node never lands in an
/// `agent: none` pool), and on a tenant's custom site the pool is that tenant's or nobody's
/// (`INVALID_ARGUMENT`); the node is not a site agent, holds no active allocation and is not
/// under a dedicated-root lease (`INVALID_STATE`). A move into the pool it is in changes
/// nothing. Its identity stays: a pending re-join request is dropped (it was made for the old
/// pool's token).
pub fn move_node(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    pool_id: &str,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let pool = tx.pool(pool_id)?.ok_or_else(|| OpError::NotFound {
        kind: "pool",
        id: pool_id.to_owned(),
    })?;
    if edit.node.pool_id.as_deref() == Some(pool_id) {
        return edit.save(tx);
    }
    let invalid = |why: String| {
        OpError::InvalidArgument(format!("cannot move {node_id} to pool {pool_id}: {why}"))
    };
    let state = |why: String| {
        OpError::InvalidState(format!("cannot move {node_id} to pool {pool_id}: {why}"))
    };
    if edit.node.role == bc_protocol::NodeRole::Site {
        return Err(state("a site agent belongs to no pool".into()));
    }
    if edit.node.trust == Trust::TenantControlled || tx.active_lease(node_id)?.is_some() {
        return Err(state(
            "it is under a dedicated-root lease; end it first".into(),
        ));
    }
    let active = tx.active_allocation_count(node_id)?;
    if active > 0 {
        return Err(state(format!(
            "it holds {active} active allocation(s); drain it first"
        )));
    }
    let site_id = match (&edit.node.site_id, &pool.site_id) {
        (Some(n), Some(p)) if n != p => {
            return Err(invalid(format!(
                "the node is on site {n}, the pool on site {p}"
            )));
        }
        (n, p) => n.clone().or_else(|| p.clone()),
    };
    let site = match &site_id {
        Some(s) => Some(tx.site(s)?.ok_or_else(|| OpError::NotFound {
            kind: "site",
            id: s.clone(),
        })?),
        None => None,
    };
    if let Some(s) = site.as_ref().filter(|s| s.kind == SiteKind::Custom)
        && pool.owner_tenant_id.is_some()
        && pool.owner_tenant_id != s.owner_tenant_id
    {
        return Err(invalid(format!(
            "the node is on tenant {}'s custom site; the pool belongs to tenant {}",
            s.owner_tenant_id.as_deref().unwrap_or("?"),
            pool.owner_tenant_id.as_deref().unwrap_or("?")
        )));
    }
    let p = placement(Some(&pool), site.as_ref(), false);
    if p.adapter != edit.node.adapter {
        let what = if edit.node.adapter == Adapter::BcdV1 {
            "the node runs a bcd agent; the pool has agent: none".to_owned()
        } else {
            format!(
                "the node's adapter is {}; the pool's is {}",
                edit.node.adapter, p.adapter
            )
        };
        return Err(invalid(what));
    }
    let from_pool = edit.node.pool_id.clone();
    let n = &mut edit.node;
    n.pool_id = p.pool_id;
    n.site_id = p.site_id;
    n.owner_tenant_id = p.owner_tenant_id;
    let (role_before, trust_before) = (n.role, n.trust);
    n.role = p.role;
    n.trust = p.trust;
    n.drivers = p.drivers;
    edit.event(
        "pool",
        from_pool,
        Some(pool_id.to_owned()),
        "nodes.move".to_owned(),
    );
    if role_before != edit.node.role {
        let to = edit.node.role.to_string();
        edit.event(
            "role",
            Some(role_before.to_string()),
            Some(to),
            "nodes.move",
        );
    }
    if trust_before != edit.node.trust {
        let to = edit.node.trust.to_string();
        edit.event(
            "trust",
            Some(trust_before.to_string()),
            Some(to),
            "nodes.move",
        );
    }
    // The target pool's hardware profile decides the profile conditions now.
    let updates = profile_conditions(
        &pool.hardware_profile,
        crate::inventory::of(&edit.node).as_ref(),
    );
    for type_ in PROFILE_CONDITIONS {
        let decided = updates.iter().any(|u| u.type_ == type_);
        let present = edit.node.conditions.iter().any(|c| c.type_ == type_);
        if present && !decided {
            apply(
                &mut edit,
                &ConditionUpdate {
                    type_: type_.to_owned(),
                    status: ConditionStatus::False,
                    reason: "NotInPoolProfile".to_owned(),
                    message: format!("pool {pool_id}'s hardware profile sets no expectation"),
                    owner: "Inventory".to_owned(),
                    gpus: Vec::new(),
                },
            );
        }
    }
    for u in &updates {
        apply(&mut edit, u);
    }
    // And whether a degraded PCIe link keeps work off the node.
    crate::pcie::set_no_schedule(&mut edit, &pool.hardware_profile);
    // An `adopting` node is judged by the target pool's acceptance rules now, not at its next
    // inventory report (which may come after the deadline); other states change nothing.
    crate::acceptance::evaluate(tx, &mut edit)?;
    tx.delete_rejoin_request(node_id)?;
    edit.save(tx)
}
