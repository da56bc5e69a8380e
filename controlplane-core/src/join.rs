//! JoinService's decision, without the wire: check the join token, find the machine if the store
//! already knows it (re-join in place: same node, new identity generation), else create the node
//! in `adopting` where the token's pool and site put it. The gRPC adapter checks the CSR and signs
//! the certificate around this.
//!
//! A re-join in place takes over a node's record, so it is held to rules (issue 19.1, 18.15;
//! docs/node-model.md "Re-join in place"):
//! - the trust of the machine's key is recomputed ([`crate::identity`]), never taken from the
//!   agent's claim alone;
//! - only within the token's scope: its pool (or its site, for a site token; for a token bound to
//!   neither, a node with neither), else [`JoinError::WrongPool`] naming the node's pool;
//! - never across trust levels ([`JoinError::TrustMismatch`]);
//! - never while the node has a live session ([`JoinError::Duplicate`]);
//! - a `platform` node re-joins only on a trusted hardware key match (the key and two of the
//!   node's identifier digests) or, matched by identifiers only, once an operator approved the
//!   request (`nodes.approveRejoin`): until then the join answers [`JoinOutcome::AwaitingApproval`]
//!   and records the request with an event; the agent keeps retrying with its token;
//! - a node enrolled through a BMC never (issue 30.1, [`RefusalKind::BareMetal`]): its sessions
//!   come from its ramdisk's boot token, and once deployed from the identity its deploy issued
//!   (`crate::bare_metal::deploy_identity`); only a `deployed` node that no deploy wrote
//!   (enrolled with `--deployed`) still re-joins with a join token.

use bc_protocol::{Adapter, ProvisionState, Trust};
use cpl_store::{
    JoinToken, NewNode, NodeRecord, Reader, RejoinRequest, StoreError, TokenRefusal, Tx,
    random_lowercase,
};

use crate::edit::{Edit, create_node};
use crate::error::OpError;
use crate::identity;
use crate::ownership::{Placement, placement_for_join};

/// How long an operator's approval of a re-join stays usable, milliseconds (one hour). The agent
/// retries with backoff capped at two minutes, so it comes back well within that.
pub const APPROVAL_TTL_MS: i64 = 3_600_000;

/// What a joining agent says about its machine (the `JoinRequest`'s facts).
#[derive(Debug, Clone)]
pub struct JoinFacts {
    /// `<id>.<secret>`.
    pub token: String,
    /// Hex SHA-256 hardware key; empty when the agent has none.
    pub hardware_key: String,
    /// The agent's claim that at least two independent identifiers survived (checked against the
    /// digests: [`identity::trusted`]).
    pub trusted: bool,
    /// Hex SHA-256 of each identifier.
    pub identifier_digests: Vec<String>,
    pub hostname: Option<String>,
    /// The source address of the join, for the operator who approves a re-join.
    pub peer: Option<String>,
    /// What joins: a node agent (the default), or a site agent (`bcd site`), which needs a token
    /// bound to a site and no pool and becomes a node with `role: site`.
    pub mode: bc_protocol::Mode,
}

impl Default for JoinFacts {
    fn default() -> Self {
        Self {
            token: String::new(),
            hardware_key: String::new(),
            trusted: false,
            identifier_digests: Vec::new(),
            hostname: None,
            peer: None,
            mode: bc_protocol::Mode::Node,
        }
    }
}

/// A join that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub node_id: String,
    /// 1 for a new node; a re-join in place always raises it.
    pub identity_generation: u64,
    /// Whether a known machine re-joined in place.
    pub rejoined: bool,
    /// For a ramdisk's join with a boot token: the node's site, whose site agent's boot service
    /// must stop serving the spent token.
    pub boot_site: Option<String>,
}

/// A join refused after it changed something that must be kept (the ramdisk of a machine that
/// is not the one its BMC described: its boot token is spent and its node failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub node_id: String,
    /// What the agent is told (and why).
    pub message: String,
    /// Which rule refused it (the gateway's `bcctl_join_total{outcome}`).
    pub kind: RefusalKind,
}

/// Which rule refused a join whose effects commit ([`Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// The machine that booted the ramdisk is not the one its BMC described
    /// (`crate::bare_metal::boot::join`).
    HardwareMismatch,
    /// A join token tried to re-join in place a node enrolled through a BMC (issue 30.1):
    /// such a node takes a session only from its ramdisk's boot token, or, once `deployed`,
    /// from its deployed system's agent. The refusal is an event on the node.
    BareMetal,
}

/// A re-join that waits for an operator (`nodes.approveRejoin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwaitingApproval {
    /// The node the machine matched.
    pub node_id: String,
    /// The request the operator approves.
    pub request_id: String,
    /// Whether this attempt recorded a new request (the first attempt, or other facts).
    pub new_request: bool,
}

/// How a join ended when the transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JoinOutcome {
    /// A new node, or a re-join in place.
    Joined(Joined),
    /// Nothing joined; the request is recorded (the transaction must commit to keep it).
    AwaitingApproval(AwaitingApproval),
    /// Nothing joined, and the refusal's effects must commit
    /// (`crate::bare_metal::boot::join`).
    Refused(Refused),
}

/// Why a join did not go through. A refusal rolls the transaction back: no node, no token use.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The token is malformed, unknown, revoked, expired or used up.
    #[error(transparent)]
    Token(TokenRefusal),
    /// The token's pool or site is gone or unusable.
    #[error("the join token's pool or site cannot take nodes: {0}")]
    Placement(String),
    /// The token's pool is reached without an agent (`agent: none`): a bcd agent has no place in it.
    #[error(
        "pool {pool_id} has agent: none (its machines are reached through the provider-api/v1 adapter); a bcd agent cannot join it: use a token for a pool with agent: bcd"
    )]
    AgentlessPool { pool_id: String },
    /// The machine's record has a live session: a clone must never take it over.
    #[error(
        "DUPLICATE_HARDWARE_KEY: node {0} has this machine's hardware key and is connected right now; a cloned machine cannot take over its record"
    )]
    Duplicate(String),
    /// A re-join in place with a token of another pool or site (issue 18.15).
    #[error(
        "this machine is node {node_id}, which belongs to {belongs}; a join token for {token_scope} cannot re-join it in place. Join it with a token for {belongs}, or move the node first (bcctl nodes move {node_id} --pool <pool>)"
    )]
    WrongPool {
        node_id: String,
        /// `pool <id>`, `site <id> (no pool)` or `no pool or site`.
        belongs: String,
        /// `pool <id>`, `site <id>` or `no pool or site`.
        token_scope: String,
    },
    /// A re-join in place would change the node's trust.
    #[error(
        "this machine is node {node_id}, whose trust is {node_trust}; a join token that places machines as {token_trust} cannot re-join it in place: a re-join never crosses trust levels"
    )]
    TrustMismatch {
        node_id: String,
        node_trust: Trust,
        token_trust: Trust,
    },
    /// The token's scope does not fit what joins: a site agent needs a site-only token, a
    /// node agent a token that is not site-only; or a re-join in place would change the role.
    #[error("{0}")]
    WrongMode(String),
    /// The ramdisk's boot token is refused (issue 15).
    #[error(transparent)]
    Boot(crate::bare_metal::boot::BootRefusal),
    /// A deploy identity is refused (issue 30.1).
    #[error(transparent)]
    Deploy(crate::bare_metal::deploy_identity::DeployRefusal),
    /// The store failed.
    #[error(transparent)]
    Failed(#[from] OpError),
}

impl From<StoreError> for JoinError {
    fn from(e: StoreError) -> Self {
        match e {
            // The store's unique index caught two trusted holders: the clear error, not INTERNAL.
            StoreError::DuplicateTrustedKey { .. } => JoinError::Duplicate(e.to_string()),
            e => JoinError::Failed(OpError::Store(e)),
        }
    }
}

/// A fresh node id: `node_` and 20 characters of `[a-z0-9]`.
pub fn new_node_id() -> String {
    format!("node_{}", random_lowercase(20))
}

/// The node a joining machine already is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Match {
    node_id: String,
    /// Found by its trusted hardware key (and two of its identifier digests), not by identifiers
    /// alone.
    by_trusted_key: bool,
}

/// The node a joining machine already is, found by its trusted hardware key or by at least two
/// of its identifier digests (DESIGN.md "Hardware key"). An untrusted key never matches, and a
/// trusted key matches only with two of the node's own digests beside it.
fn same_machine(r: &Reader<'_>, f: &JoinFacts, trusted: bool) -> Result<Option<Match>, StoreError> {
    let digests = identity::distinct_digests(&f.identifier_digests);
    if trusted && let Some((id, _)) = r.node_by_trusted_key(&f.hardware_key)? {
        let theirs = r
            .node(&id)?
            .map(|n| identity::distinct_digests(&n.identifier_digests))
            .unwrap_or_default();
        let shared = digests
            .iter()
            .filter(|d| theirs.binary_search(d).is_ok())
            .count();
        if shared >= identity::MIN_TRUSTED_IDENTIFIERS {
            return Ok(Some(Match {
                node_id: id,
                by_trusted_key: true,
            }));
        }
    }
    if digests.len() < identity::MIN_TRUSTED_IDENTIFIERS {
        return Ok(None);
    }
    // An index probe, not a scan of every node: a join storm of 10,000 machines would otherwise
    // cost N²/2 row reads (docs/benchmarks.md).
    Ok(r.nodes_sharing_identifiers(&f.identifier_digests, 2)?
        .into_iter()
        .next()
        .map(|(node_id, _)| Match {
            node_id,
            by_trusted_key: false,
        }))
}

/// Where the token puts machines; a bcd agent is refused from an `agent: none` pool (18.14).
fn token_placement(
    tx: &Tx<'_>,
    tok: &JoinToken,
    mode: bc_protocol::Mode,
) -> Result<Placement, JoinError> {
    check_mode(tok, mode)?;
    let site_agent = mode == bc_protocol::Mode::Site;
    let p = placement_for_join(
        tx,
        tok.pool_id.as_deref(),
        tok.site_id.as_deref(),
        site_agent,
    )
    .map_err(|e| JoinError::Placement(e.to_string()))?;
    if p.adapter != Adapter::BcdV1 {
        return Err(JoinError::AgentlessPool {
            pool_id: p.pool_id.unwrap_or_default(),
        });
    }
    Ok(p)
}

/// A site agent joins with a token bound to a site and no pool; a node agent (or a ramdisk)
/// with any other token.
fn check_mode(tok: &JoinToken, mode: bc_protocol::Mode) -> Result<(), JoinError> {
    use bc_protocol::Mode;
    match (mode, tok.pool_id.as_deref(), tok.site_id.as_deref()) {
        (Mode::Site, None, Some(_)) => Ok(()),
        (Mode::Site, Some(pool), _) => Err(JoinError::WrongMode(format!(
            "a site agent (bcd site) joins with a token bound to a site and no pool; token {} is bound to pool {pool}: create one with bcctl tokens create --site <site>",
            tok.id
        ))),
        (Mode::Site, None, None) => Err(JoinError::WrongMode(format!(
            "a site agent (bcd site) joins with a token bound to a site; token {} is bound to no site: create one with bcctl tokens create --site <site>",
            tok.id
        ))),
        (_, None, Some(site)) => Err(JoinError::WrongMode(format!(
            "token {} is bound to site {site} only, which is for site agents (bcd site); a node agent needs a token bound to a pool (bcctl tokens create --pool <pool>)",
            tok.id
        ))),
        _ => Ok(()),
    }
}

/// The token's scope in words.
fn scope(pool: Option<&str>, site: Option<&str>) -> String {
    match (pool, site) {
        (Some(p), _) => format!("pool {p}"),
        (None, Some(s)) => format!("site {s}"),
        (None, None) => "no pool or site".to_owned(),
    }
}

/// Re-join in place only within the token's scope and at the node's trust level.
fn check_scope(tok: &JoinToken, p: &Placement, node: &NodeRecord) -> Result<(), JoinError> {
    let in_scope = match (&tok.pool_id, &tok.site_id) {
        (Some(pool), _) => node.pool_id.as_deref() == Some(pool),
        (None, Some(site)) => node.site_id.as_deref() == Some(site),
        (None, None) => node.pool_id.is_none() && node.site_id.is_none(),
    };
    if !in_scope {
        let belongs = match (&node.pool_id, &node.site_id) {
            (Some(pool), _) => format!("pool {pool}"),
            (None, Some(site)) => format!("site {site} (no pool)"),
            (None, None) => "no pool or site".to_owned(),
        };
        return Err(JoinError::WrongPool {
            node_id: node.id.clone(),
            belongs,
            token_scope: scope(tok.pool_id.as_deref(), tok.site_id.as_deref()),
        });
    }
    if node.trust != p.trust {
        return Err(JoinError::TrustMismatch {
            node_id: node.id.clone(),
            node_trust: node.trust,
            token_trust: p.trust,
        });
    }
    Ok(())
}

/// The node's approved request this very join answers: same token, same key, trust and
/// identifiers, approved within [`APPROVAL_TTL_MS`].
fn approved_request(
    r: &Reader<'_>,
    node_id: &str,
    req: &RejoinRequest,
    now: i64,
) -> Result<Option<RejoinRequest>, StoreError> {
    let Some(stored) = r.rejoin_request(node_id)? else {
        return Ok(None);
    };
    let fresh = stored
        .approved_at
        .is_some_and(|at| now.saturating_sub(at) <= APPROVAL_TTL_MS);
    Ok((fresh && same_facts(&stored, req)).then_some(stored))
}

/// Whether two requests describe the same machine with the same token.
fn same_facts(a: &RejoinRequest, b: &RejoinRequest) -> bool {
    a.token_id == b.token_id
        && a.hardware_key == b.hardware_key
        && a.hardware_key_trusted == b.hardware_key_trusted
        && a.identifier_digests == b.identifier_digests
}

/// Runs a join in the caller's write transaction. `connected(node_id)` says whether a node has
/// a live session (the gateway's registry). The transaction must commit on `Ok` (a join, or a
/// recorded re-join request) and roll back on `Err`.
pub fn join(
    tx: &Tx<'_>,
    f: &JoinFacts,
    connected: &dyn Fn(&str) -> bool,
) -> Result<JoinOutcome, JoinError> {
    if crate::bare_metal::boot::is_ramdisk_join(f) {
        return crate::bare_metal::boot::join(tx, f, connected);
    }
    if crate::bare_metal::deploy_identity::is_deploy_join(f) {
        return crate::bare_metal::deploy_identity::join(tx, f, connected);
    }
    let now = cpl_store::now_ms();
    let tok = tx.authenticate_token(&f.token)?.map_err(JoinError::Token)?;
    // Revoked, expired or used up. Only an operator's approval of this very machine and token
    // outweighs expiry or uses (the token was good when the request was made); nothing outweighs
    // revocation.
    let limit = tok.refusal_at(now);
    if let Some(r @ TokenRefusal::Revoked { .. }) = limit {
        return Err(JoinError::Token(r));
    }
    let trusted = identity::trusted(f.trusted, &f.hardware_key, &f.identifier_digests);
    let Some(m) = same_machine(tx, f, trusted)? else {
        if let Some(r) = limit {
            return Err(JoinError::Token(r));
        }
        let p = token_placement(tx, &tok, f.mode)?;
        tx.spend_token(&tok.id)?;
        return new_node(tx, f, trusted, &tok, p);
    };
    let node = tx
        .node(&m.node_id)?
        .ok_or_else(|| OpError::node_not_found(&m.node_id))?;
    let request = RejoinRequest {
        id: format!("rejoin_{}", random_lowercase(12)),
        node_id: node.id.clone(),
        token_id: tok.id.clone(),
        hardware_key: (!f.hardware_key.is_empty()).then(|| f.hardware_key.clone()),
        hardware_key_trusted: trusted,
        identifier_digests: identity::distinct_digests(&f.identifier_digests),
        hostname: f.hostname.clone(),
        peer: f.peer.clone(),
        requested_at: now,
        approved_at: None,
        approved_by: None,
    };
    let needs_approval = node.trust == Trust::Platform && !m.by_trusted_key;
    let approved = if needs_approval {
        approved_request(tx, &node.id, &request, now)?
    } else {
        None
    };
    if approved.is_none()
        && let Some(r) = limit
    {
        return Err(JoinError::Token(r));
    }
    let p = token_placement(tx, &tok, f.mode)?;
    check_scope(&tok, &p, &node)?;
    if (node.role == bc_protocol::NodeRole::Site) != (f.mode == bc_protocol::Mode::Site) {
        return Err(JoinError::WrongMode(format!(
            "this machine is node {} (role {}); a {} cannot re-join it in place",
            node.id,
            node.role,
            if f.mode == bc_protocol::Mode::Site {
                "site agent"
            } else {
                "node agent"
            }
        )));
    }
    if let Some(refused) = crate::bare_metal::deploy_identity::join_token_refusal(tx, &node, f)? {
        return Ok(JoinOutcome::Refused(refused));
    }
    if connected(&node.id) {
        return Err(JoinError::Duplicate(node.id));
    }
    let how = match (&approved, needs_approval) {
        (Some(a), _) => {
            tx.delete_rejoin_request(&node.id)?;
            format!(
                "identifiers matched; approved by {} (request {})",
                a.approved_by.as_deref().unwrap_or("an operator"),
                a.id
            )
        }
        (None, true) => return record_request(tx, request).map(JoinOutcome::AwaitingApproval),
        (None, false) if m.by_trusted_key => "trusted hardware key matched".to_owned(),
        (None, false) => format!("identifiers matched ({} node)", node.trust),
    };
    if approved.is_none() {
        tx.spend_token(&tok.id)?;
    }
    rejoin_in_place(tx, &node.id, f, trusted, &tok.id, &how).map(JoinOutcome::Joined)
}

/// A new node where the token's placement puts it. Its key is trusted only if no other node
/// holds it trusted (a claim never takes another node's key).
fn new_node(
    tx: &Tx<'_>,
    f: &JoinFacts,
    trusted: bool,
    tok: &JoinToken,
    p: Placement,
) -> Result<JoinOutcome, JoinError> {
    let trusted = trusted && tx.node_by_trusted_key(&f.hardware_key)?.is_none();
    let id = new_node_id();
    let new = NewNode {
        id: id.clone(),
        site_id: p.site_id,
        pool_id: p.pool_id,
        owner_tenant_id: p.owner_tenant_id,
        role: p.role,
        trust: p.trust,
        adapter: p.adapter,
        drivers: p.drivers,
        hostname: f.hostname.clone(),
        hardware_key: (!f.hardware_key.is_empty()).then(|| f.hardware_key.clone()),
        hardware_key_trusted: trusted,
        identifier_digests: f.identifier_digests.clone(),
    };
    create_node(
        tx,
        &new,
        ProvisionState::Adopting,
        "JoinService",
        &format!("joined with token {}", tok.id),
    )?;
    Ok(JoinOutcome::Joined(Joined {
        node_id: id,
        identity_generation: 1,
        rejoined: false,
        boot_site: None,
    }))
}

/// Records (or keeps) the node's re-join request. The event is a report's: it never moves the
/// node's `version` (a machine retrying with backoff must not lock operators out).
fn record_request(tx: &Tx<'_>, request: RejoinRequest) -> Result<AwaitingApproval, JoinError> {
    if let Some(stored) = tx.rejoin_request(&request.node_id)?
        && stored.approved_at.is_none()
        && same_facts(&stored, &request)
    {
        return Ok(AwaitingApproval {
            node_id: stored.node_id,
            request_id: stored.id,
            new_request: false,
        });
    }
    tx.put_rejoin_request(&request)?;
    let mut edit = Edit::report(tx, &request.node_id, "JoinService")?;
    edit.event(
        "rejoinRequest",
        None,
        Some("pending".to_owned()),
        format!(
            "request {}: a machine (hostname {}, from {}) with token {} matches this node by {} identifier(s) but not by a trusted hardware key; approve with nodes.approveRejoin",
            request.id,
            request.hostname.as_deref().unwrap_or("unknown"),
            request.peer.as_deref().unwrap_or("unknown"),
            request.token_id,
            request.identifier_digests.len()
        ),
    );
    edit.save(tx)?;
    Ok(AwaitingApproval {
        node_id: request.node_id,
        request_id: request.id,
        new_request: true,
    })
}

/// Re-join in place: same node, new identity generation, so old certificates die. The next
/// Inventory is stored in full (its key and trust were just rewritten).
pub(crate) fn rejoin_in_place(
    tx: &Tx<'_>,
    id: &str,
    f: &JoinFacts,
    trusted: bool,
    token_id: &str,
    how: &str,
) -> Result<Joined, JoinError> {
    let key_holder = if trusted {
        tx.trusted_key_holder(&f.hardware_key, id)?
    } else {
        None
    };
    let mut edit = Edit::begin(tx, id, None, "JoinService")?;
    let before = edit.node.identity_generation;
    let after = before + 1;
    let n = &mut edit.node;
    n.identity_generation = after;
    if !f.hardware_key.is_empty() {
        n.hardware_key = Some(f.hardware_key.clone());
    }
    n.hardware_key_trusted = trusted && key_holder.is_none();
    n.identifier_digests = f.identifier_digests.clone();
    n.inventory_sha256 = None;
    edit.event(
        "identityGeneration",
        Some(before.to_string()),
        Some(after.to_string()),
        format!("re-joined in place with token {token_id}: {how}"),
    );
    edit.save(tx)?;
    Ok(Joined {
        node_id: id.to_owned(),
        identity_generation: after,
        rejoined: true,
        boot_site: None,
    })
}
