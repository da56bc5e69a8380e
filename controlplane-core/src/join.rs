//! JoinService's decision, without the wire: spend one use of the join token, find the machine if
//! the store already knows it (re-join in place: same node, new identity generation), else create
//! the node in `adopting` where the token's pool and site put it. The gRPC adapter checks the CSR
//! and signs the certificate around this.

use cpl_store::{NewNode, Reader, StoreError, TokenRefusal, Tx, random_lowercase};

use crate::edit::{Edit, create_node};
use crate::error::OpError;
use crate::ownership::placement_for_join;

/// What a joining agent says about its machine (the `JoinRequest`'s facts).
#[derive(Debug, Clone, Default)]
pub struct JoinFacts {
    /// `<id>.<secret>`.
    pub token: String,
    /// Hex SHA-256 hardware key; empty when the agent has none.
    pub hardware_key: String,
    /// Whether at least two independent identifiers survived on the agent.
    pub trusted: bool,
    /// Hex SHA-256 of each identifier.
    pub identifier_digests: Vec<String>,
    pub hostname: Option<String>,
}

/// A join that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Joined {
    pub node_id: String,
    /// 1 for a new node; a re-join in place always raises it.
    pub identity_generation: u64,
    /// Whether a known machine re-joined in place.
    pub rejoined: bool,
}

/// Why a join did not go through. A refusal rolls the transaction back: no node, no token use.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Token(TokenRefusal),
    /// The token's pool or site is gone or unusable.
    #[error("the join token's pool or site cannot take nodes: {0}")]
    Placement(String),
    /// The machine's record has a live session: a clone must never take it over.
    #[error(
        "DUPLICATE_HARDWARE_KEY: node {0} has this machine's hardware key and is connected right now; a cloned machine cannot take over its record"
    )]
    Duplicate(String),
    /// The store failed.
    #[error(transparent)]
    Failed(#[from] OpError),
}

impl From<StoreError> for JoinError {
    fn from(e: StoreError) -> Self {
        JoinError::Failed(OpError::Store(e))
    }
}

/// A fresh node id: `node_` and 20 characters of `[a-z0-9]`.
pub fn new_node_id() -> String {
    format!("node_{}", random_lowercase(20))
}

/// The node a joining machine already is, found by its trusted hardware key or by at least two
/// of its identifier digests (DESIGN.md "Hardware key"). An untrusted key never matches.
fn same_machine(r: &Reader<'_>, f: &JoinFacts) -> Result<Option<(String, u64)>, StoreError> {
    if f.trusted
        && !f.hardware_key.is_empty()
        && let Some(found) = r.node_by_trusted_key(&f.hardware_key)?
    {
        return Ok(Some(found));
    }
    if f.identifier_digests.len() < 2 {
        return Ok(None);
    }
    // An index probe, not a scan of every node: a join storm of 10,000 machines would otherwise
    // cost N²/2 row reads (docs/benchmarks.md).
    Ok(r.nodes_sharing_identifiers(&f.identifier_digests, 2)?
        .into_iter()
        .next())
}

/// Runs a join in the caller's write transaction. `connected(node_id)` says whether a node has
/// a live session (the gateway's registry).
pub fn join(
    tx: &Tx<'_>,
    f: &JoinFacts,
    connected: &dyn Fn(&str) -> bool,
) -> Result<Joined, JoinError> {
    let tok = tx
        .consume_token(&f.token, cpl_store::now_ms())?
        .map_err(JoinError::Token)?;
    if let Some((id, _)) = same_machine(tx, f)? {
        if connected(&id) {
            return Err(JoinError::Duplicate(id));
        }
        return rejoin_in_place(tx, &id, f, &tok.id);
    }
    let p = placement_for_join(tx, tok.pool_id.as_deref(), tok.site_id.as_deref(), false)
        .map_err(|e| JoinError::Placement(e.to_string()))?;
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
        hardware_key_trusted: f.trusted,
        identifier_digests: f.identifier_digests.clone(),
    };
    create_node(
        tx,
        &new,
        "JoinService",
        &format!("joined with token {}", tok.id),
    )?;
    Ok(Joined {
        node_id: id,
        identity_generation: 1,
        rejoined: false,
    })
}

/// Re-join in place: same node, new identity generation, so old certificates die. The next
/// Inventory is stored in full (its key and trust were just rewritten).
fn rejoin_in_place(
    tx: &Tx<'_>,
    id: &str,
    f: &JoinFacts,
    token_id: &str,
) -> Result<Joined, JoinError> {
    let mut edit = Edit::begin(tx, id, None, "JoinService")?;
    let before = edit.node.identity_generation;
    let after = before + 1;
    let n = &mut edit.node;
    n.identity_generation = after;
    if !f.hardware_key.is_empty() {
        n.hardware_key = Some(f.hardware_key.clone());
    }
    n.hardware_key_trusted = f.trusted;
    n.identifier_digests = f.identifier_digests.clone();
    n.inventory_sha256 = None;
    edit.event(
        "identityGeneration",
        Some(before.to_string()),
        Some(after.to_string()),
        format!("re-joined in place with token {token_id}"),
    );
    edit.save(tx)?;
    Ok(Joined {
        node_id: id.to_owned(),
        identity_generation: after,
        rejoined: true,
    })
}
