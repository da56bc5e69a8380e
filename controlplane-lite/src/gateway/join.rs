//! JoinService: checks the join token, signs the agent's CSR with the node id and identity
//! generation, and creates the node in provisionState `adopting`.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::{JoinRequest, JoinResponse, join_server::Join};
use rusqlite::TransactionBehavior;
use tonic::{Request, Response, Status};

use crate::ca::CertificateAuthority;
use crate::metrics::JoinOutcome;
use crate::store::nodes::{self, NewNode};
use crate::store::tokens::{self, TokenRefusal};
use crate::store::{Store, events, now_ms};

/// Largest CSR accepted, bytes.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// The Join gRPC service.
#[derive(Debug, Clone)]
pub struct JoinService {
    pub store: Store,
    pub ca: Arc<CertificateAuthority>,
    pub heartbeat_interval: Duration,
    pub node_cert_ttl: Duration,
    /// Live sessions: a machine whose record has one may not re-join (cloned machines).
    pub registry: Arc<crate::gateway::registry::Registry>,
    /// Join attempts per source address.
    pub limiter: Arc<RateLimiter>,
    /// `bcctl_join_total{outcome}`.
    pub metrics: crate::metrics::Metrics,
}

/// Fixed-window limit of join attempts per source address (a guessing or runaway agent must not
/// hammer the store).
#[derive(Debug)]
pub struct RateLimiter {
    per_minute: u32,
    windows:
        parking_lot::Mutex<std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u32)>>,
}

impl RateLimiter {
    /// At most `per_minute` attempts per address per minute; 0 turns the limit off.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            windows: parking_lot::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Counts an attempt from `ip`; false when over the limit.
    pub fn allow(&self, ip: std::net::IpAddr) -> bool {
        if self.per_minute == 0 {
            return true;
        }
        let now = std::time::Instant::now();
        let mut w = self.windows.lock();
        if w.len() > 100_000 {
            w.retain(|_, (start, _)| now.duration_since(*start) < Duration::from_secs(60));
        }
        let e = w.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= Duration::from_secs(60) {
            *e = (now, 0);
        }
        e.1 += 1;
        e.1 <= self.per_minute
    }
}

/// The node a joining machine already is, found by its trusted hardware key or by at least two
/// of its identifier digests (DESIGN.md "Hardware key"). An untrusted key never matches.
fn same_machine(
    c: &rusqlite::Connection,
    hw: &bc_protocol::pb::HardwareIdentity,
) -> Result<Option<(String, u64)>, crate::store::StoreError> {
    use rusqlite::OptionalExtension;
    if hw.trusted && !hw.hardware_key.is_empty() {
        let found: Option<(String, i64)> = c
            .query_row(
                "SELECT id, identity_generation FROM nodes WHERE hardware_key = ?1 AND hardware_key_trusted = 1 ORDER BY created_at LIMIT 1",
                [&hw.hardware_key],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        if let Some((id, g)) = found {
            return Ok(Some((id, u64::try_from(g).unwrap_or(0))));
        }
    }
    if hw.identifier_digests.len() < 2 {
        return Ok(None);
    }
    // An index probe on node_identifier_digests (migration 4), not a scan of every node: a join
    // storm of 10,000 machines would otherwise cost N²/2 row reads (docs/benchmarks.md).
    Ok(nodes::sharing_identifiers(c, &hw.identifier_digests, 2)?
        .into_iter()
        .next())
}

/// A fresh node id: `node_` and 20 characters of `[a-z0-9]`.
pub fn new_node_id() -> String {
    format!("node_{}", crate::store::random_lowercase(20))
}

/// Why a join was refused.
#[derive(Debug, thiserror::Error)]
enum JoinRefusal {
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
}

fn refusal_outcome(r: &JoinRefusal) -> JoinOutcome {
    match r {
        JoinRefusal::Token(_) => JoinOutcome::RefusedToken,
        JoinRefusal::Placement(_) => JoinOutcome::RefusedPlacement,
        JoinRefusal::Duplicate(_) => JoinOutcome::RefusedDuplicate,
    }
}

fn refusal_status(r: &JoinRefusal) -> Status {
    match r {
        JoinRefusal::Token(_) => Status::unauthenticated(r.to_string()),
        JoinRefusal::Placement(_) => Status::failed_precondition(r.to_string()),
        JoinRefusal::Duplicate(_) => Status::already_exists(r.to_string()),
    }
}

#[tonic::async_trait]
impl Join for JoinService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let peer = request.remote_addr();
        if let Some(addr) = peer
            && !self.limiter.allow(addr.ip())
        {
            self.metrics.join(JoinOutcome::RefusedRate);
            return Err(Status::resource_exhausted(format!(
                "too many join attempts from {}; try again in a minute",
                addr.ip()
            )));
        }
        let req = request.into_inner();
        if req.csr_pem.len() > MAX_CSR_BYTES {
            self.metrics.join(JoinOutcome::RefusedInvalid);
            return Err(Status::invalid_argument(format!(
                "CSR is {} bytes; at most {MAX_CSR_BYTES} accepted",
                req.csr_pem.len()
            )));
        }
        // Validate the CSR before spending a token use.
        if let Err(e) = rcgen::CertificateSigningRequestParams::from_pem(&req.csr_pem) {
            self.metrics.join(JoinOutcome::RefusedInvalid);
            return Err(Status::invalid_argument(format!(
                "certificate signing request is invalid: {e}"
            )));
        }
        let hw = req.hardware.clone().unwrap_or_default();
        let hostname = (!req.hostname.is_empty()).then(|| req.hostname.clone());
        let token = req.token.clone();
        let registry = Arc::clone(&self.registry);
        let outcome = self
            .store
            .run(move |c| {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let tok = match tokens::consume(&tx, &token, now_ms())? {
                    Ok(t) => t,
                    Err(refusal) => return Ok(Err(JoinRefusal::Token(refusal))),
                };
                if let Some((id, gen_before)) = same_machine(&tx, &hw)? {
                    if registry.sender(&id).is_some() {
                        return Ok(Err(JoinRefusal::Duplicate(id)));
                    }
                    // Re-join in place: same node, new identity generation; old certificates die.
                    // The next Inventory is stored in full (its key and trust were just rewritten).
                    let now = now_ms();
                    tx.execute(
                        "UPDATE nodes SET identity_generation = identity_generation + 1, version = version + 1, \
                         hardware_key = COALESCE(?2, hardware_key), hardware_key_trusted = ?3, identifier_digests = ?4, \
                         inventory_sha256 = NULL, updated_at = ?5 WHERE id = ?1",
                        rusqlite::params![
                            id,
                            (!hw.hardware_key.is_empty()).then(|| hw.hardware_key.clone()),
                            hw.trusted,
                            serde_json::to_string(&hw.identifier_digests).unwrap_or_else(|_| "[]".into()),
                            now
                        ],
                    )?;
                    nodes::index_identifier_digests(&tx, &id, &hw.identifier_digests)?;
                    let gen_after = gen_before + 1;
                    events::record(
                        &tx,
                        &id,
                        now,
                        "identityGeneration",
                        Some(&gen_before.to_string()),
                        Some(&gen_after.to_string()),
                        "JoinService",
                        &format!("re-joined in place with token {}", tok.id),
                    )?;
                    tx.commit()?;
                    return Ok(Ok((id, gen_after)));
                }
                let p = match crate::model::ownership::placement_for_join(
                    &tx,
                    tok.pool_id.as_deref(),
                    tok.site_id.as_deref(),
                    false,
                ) {
                    Ok(p) => p,
                    Err(e) => return Ok(Err(JoinRefusal::Placement(e.to_string()))),
                };
                let id = new_node_id();
                let now = now_ms();
                nodes::insert(
                    &tx,
                    &NewNode {
                        id: id.clone(),
                        site_id: p.site_id,
                        pool_id: p.pool_id,
                        owner_tenant_id: p.owner_tenant_id,
                        role: p.role,
                        trust: p.trust,
                        adapter: p.adapter,
                        drivers: p.drivers,
                        hostname,
                        hardware_key: (!hw.hardware_key.is_empty())
                            .then(|| hw.hardware_key.clone()),
                        hardware_key_trusted: hw.trusted,
                        identifier_digests: hw.identifier_digests.clone(),
                    },
                    now,
                )?;
                events::record(
                    &tx,
                    &id,
                    now,
                    "provisionState",
                    None,
                    Some("adopting"),
                    "JoinService",
                    &format!("joined with token {}", tok.id),
                )?;
                tx.commit()?;
                Ok(Ok((id, 1)))
            })
            .await
            .map_err(|e| {
                self.metrics.join(JoinOutcome::Error);
                Status::internal(e.to_string())
            })?;
        let (node_id, generation) = match outcome {
            Ok(v) => v,
            Err(refusal) => {
                self.metrics.join(refusal_outcome(&refusal));
                tracing::warn!(peer = ?peer, reason = %refusal, "join refused");
                return Err(refusal_status(&refusal));
            }
        };
        let (certificate_pem, ident) = self
            .ca
            .sign_node_csr(&req.csr_pem, &node_id, generation, self.node_cert_ttl)
            .map_err(|e| {
                self.metrics.join(JoinOutcome::Error);
                Status::internal(e.to_string())
            })?;
        // A new node starts at identity generation 1; a re-join in place always raises it.
        self.metrics.join(if generation == 1 {
            JoinOutcome::NewNode
        } else {
            JoinOutcome::Rejoined
        });
        tracing::info!(node_id = %node_id, peer = ?peer, "node joined");
        Ok(Response::new(JoinResponse {
            node_id,
            certificate_pem,
            ca_pem: self.ca.cert_pem().to_owned(),
            identity_generation: ident.identity_generation,
            heartbeat_interval_ms: u32::try_from(self.heartbeat_interval.as_millis())
                .unwrap_or(u32::MAX),
            trust_domain: self.ca.trust_domain().to_owned(),
        }))
    }
}
