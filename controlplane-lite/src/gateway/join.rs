//! JoinService: checks the join token, signs the agent's CSR with the node id and identity
//! generation, and creates the node in provisionState `adopting`.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::{JoinRequest, JoinResponse, join_server::Join};
use bc_protocol::{Adapter, NodeRole, Trust};
use rand::Rng;
use rusqlite::{OptionalExtension, TransactionBehavior};
use tonic::{Request, Response, Status};

use crate::ca::CertificateAuthority;
use crate::store::nodes::{self, NewNode};
use crate::store::tokens::{self, TokenRefusal};
use crate::store::{Store, StoreError, events, now_ms};

/// Largest CSR accepted, bytes.
pub const MAX_CSR_BYTES: usize = 16 * 1024;

/// The Join gRPC service.
#[derive(Debug, Clone)]
pub struct JoinService {
    pub store: Store,
    pub ca: Arc<CertificateAuthority>,
    pub heartbeat_interval: Duration,
    pub node_cert_ttl: Duration,
}

/// A fresh node id: `node_` and 20 characters of `[a-z0-9]`.
pub fn new_node_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let tail: String = (0..20)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("node_{tail}")
}

/// Where a token places the node: (site, pool, owner, role, trust, adapter, drivers).
struct Placement {
    site_id: Option<String>,
    pool_id: Option<String>,
    owner_tenant_id: Option<String>,
    role: NodeRole,
    trust: Trust,
    adapter: Adapter,
    drivers: serde_json::Map<String, serde_json::Value>,
}

/// Role from the pool kind (spec "Identity, ownership and generations"): `metal-host`,
/// `vps-host`, `provider` give `host`; `metal-dedicated` gives `dedicated`; no pool: `unassigned`.
pub fn role_for_pool_kind(kind: Option<&str>) -> NodeRole {
    match kind {
        Some("metal-host" | "vps-host" | "provider") => NodeRole::Host,
        Some("metal-dedicated") => NodeRole::Dedicated,
        _ => NodeRole::Unassigned,
    }
}

/// (site_id, kind, agent, owner_tenant_id, hardware_profile JSON) of a pool row.
type PoolRow = (Option<String>, String, String, Option<String>, String);

fn placement(c: &rusqlite::Connection, tok: &tokens::JoinToken) -> Result<Placement, StoreError> {
    let pool: Option<PoolRow> = match &tok.pool_id {
        Some(p) => c
            .query_row(
                "SELECT site_id, kind, agent, owner_tenant_id, hardware_profile FROM pools WHERE id = ?1",
                [p],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?,
        None => None,
    };
    let site_id = pool
        .as_ref()
        .and_then(|p| p.0.clone())
        .or_else(|| tok.site_id.clone());
    let site: Option<(String, Option<String>)> = match &site_id {
        Some(s) => c
            .query_row(
                "SELECT kind, owner_tenant_id FROM sites WHERE id = ?1",
                [s],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?,
        None => None,
    };
    let tenant_site = site.as_ref().is_some_and(|(kind, _)| kind == "custom");
    let drivers = pool
        .as_ref()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(&p.4).ok())
        .and_then(|v| v.get("drivers").and_then(|d| d.as_object()).cloned())
        .unwrap_or_default();
    Ok(Placement {
        role: role_for_pool_kind(pool.as_ref().map(|p| p.1.as_str())),
        trust: if tenant_site {
            Trust::TenantOwned
        } else {
            Trust::Platform
        },
        adapter: if pool.as_ref().is_some_and(|p| p.2 == "none") {
            Adapter::ProviderApiV1
        } else {
            Adapter::BcdV1
        },
        owner_tenant_id: pool
            .as_ref()
            .and_then(|p| p.3.clone())
            .or_else(|| site.as_ref().and_then(|s| s.1.clone())),
        pool_id: tok.pool_id.clone(),
        site_id,
        drivers,
    })
}

fn refusal_status(r: &TokenRefusal) -> Status {
    Status::unauthenticated(r.to_string())
}

#[tonic::async_trait]
impl Join for JoinService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let peer = request.remote_addr();
        let req = request.into_inner();
        if req.csr_pem.len() > MAX_CSR_BYTES {
            return Err(Status::invalid_argument(format!(
                "CSR is {} bytes; at most {MAX_CSR_BYTES} accepted",
                req.csr_pem.len()
            )));
        }
        // Validate the CSR before spending a token use.
        if let Err(e) = rcgen::CertificateSigningRequestParams::from_pem(&req.csr_pem) {
            return Err(Status::invalid_argument(format!(
                "certificate signing request is invalid: {e}"
            )));
        }
        let hw = req.hardware.clone().unwrap_or_default();
        let hostname = (!req.hostname.is_empty()).then(|| req.hostname.clone());
        let token = req.token.clone();
        let outcome = self
            .store
            .run(move |c| {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let tok = match tokens::consume(&tx, &token, now_ms())? {
                    Ok(t) => t,
                    Err(refusal) => return Ok(Err(refusal)),
                };
                let p = placement(&tx, &tok)?;
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
                Ok(Ok(id))
            })
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        let node_id = match outcome {
            Ok(id) => id,
            Err(refusal) => {
                tracing::warn!(peer = ?peer, reason = %refusal, "join refused");
                return Err(refusal_status(&refusal));
            }
        };
        let (certificate_pem, ident) = self
            .ca
            .sign_node_csr(&req.csr_pem, &node_id, 1, self.node_cert_ttl)
            .map_err(|e| Status::internal(e.to_string()))?;
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
