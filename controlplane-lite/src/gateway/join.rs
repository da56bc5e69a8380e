//! JoinService: checks the join token, signs the agent's CSR with the node id and identity
//! generation, and creates the node in provisionState `adopting`.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::{JoinRequest, JoinResponse, join_server::Join};
use rand::Rng;
use rusqlite::TransactionBehavior;
use tonic::{Request, Response, Status};

use crate::ca::CertificateAuthority;
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

/// Why a join was refused.
#[derive(Debug, thiserror::Error)]
enum JoinRefusal {
    #[error(transparent)]
    Token(TokenRefusal),
    /// The token's pool or site is gone or unusable.
    #[error("the join token's pool or site cannot take nodes: {0}")]
    Placement(String),
}

fn refusal_status(r: &JoinRefusal) -> Status {
    match r {
        JoinRefusal::Token(_) => Status::unauthenticated(r.to_string()),
        JoinRefusal::Placement(_) => Status::failed_precondition(r.to_string()),
    }
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
                    Err(refusal) => return Ok(Err(JoinRefusal::Token(refusal))),
                };
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
