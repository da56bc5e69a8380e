//! JoinService over gRPC: limits attempts per address, checks the CSR, runs the core's join
//! decision (`cpl_core::join`: token, same machine, re-join in place or a new node in
//! `adopting`) in one write transaction, and signs the CSR with the node id and identity
//! generation.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::{JoinRequest, JoinResponse, join_server::Join};
use cpl_core::join::{self as decision, AwaitingApproval, JoinError, JoinFacts, Joined};
use cpl_store::Store;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::ca::CertificateAuthority;
use crate::metrics::JoinOutcome;

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
    /// Told when a ramdisk spent its boot token (the site agent's boot service must forget it).
    pub bare_metal: cpl_core::bare_metal::BareMetal,
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

fn refusal_outcome(r: &JoinError) -> JoinOutcome {
    match r {
        JoinError::Token(_) => JoinOutcome::RefusedToken,
        JoinError::Placement(_) => JoinOutcome::RefusedPlacement,
        JoinError::Duplicate(_) => JoinOutcome::RefusedDuplicate,
        JoinError::AgentlessPool { .. } => JoinOutcome::RefusedPlacement,
        JoinError::WrongPool { .. } | JoinError::TrustMismatch { .. } | JoinError::WrongMode(_) => {
            JoinOutcome::RefusedScope
        }
        JoinError::Boot(_) => JoinOutcome::RefusedBootToken,
        JoinError::Deploy(_) => JoinOutcome::RefusedDeployIdentity,
        JoinError::Failed(_) => JoinOutcome::Error,
    }
}

fn refusal_status(r: &JoinError) -> Status {
    match r {
        JoinError::Token(_) => Status::unauthenticated(r.to_string()),
        JoinError::Placement(_) => Status::failed_precondition(r.to_string()),
        JoinError::Duplicate(_) => Status::already_exists(r.to_string()),
        JoinError::AgentlessPool { .. } => Status::failed_precondition(r.to_string()),
        JoinError::WrongPool { .. } | JoinError::TrustMismatch { .. } | JoinError::WrongMode(_) => {
            Status::failed_precondition(r.to_string())
        }
        JoinError::Boot(_) | JoinError::Deploy(_) => Status::unauthenticated(r.to_string()),
        JoinError::Failed(_) => Status::internal(r.to_string()),
    }
}

/// The answer to a re-join that waits for an operator: `UNAVAILABLE`, which the agent retries
/// with its backoff (with the same token), so the approval lets it in without a new token.
pub fn awaiting_status(a: &AwaitingApproval) -> Status {
    Status::unavailable(format!(
        "REJOIN_PENDING_APPROVAL: this machine matches node {node} by its identifiers but not by a trusted hardware key; an operator must approve the re-join in place (bcctl nodes approve-rejoin {node} {req}). This agent keeps retrying with its join token and joins once approved",
        node = a.node_id,
        req = a.request_id
    ))
}

impl JoinService {
    /// The checks before the store is touched: the per-address rate, the CSR's size and syntax
    /// (a bad CSR never spends a token use).
    fn precheck(&self, peer: Option<std::net::SocketAddr>, csr_pem: &str) -> Result<(), Status> {
        if let Some(addr) = peer
            && !self.limiter.allow(addr.ip())
        {
            self.metrics.join(JoinOutcome::RefusedRate);
            return Err(Status::resource_exhausted(format!(
                "too many join attempts from {}; try again in a minute",
                addr.ip()
            )));
        }
        if csr_pem.len() > MAX_CSR_BYTES {
            self.metrics.join(JoinOutcome::RefusedInvalid);
            return Err(Status::invalid_argument(format!(
                "CSR is {} bytes; at most {MAX_CSR_BYTES} accepted",
                csr_pem.len()
            )));
        }
        // The key type too: one the CA cannot issue for correctly is refused here, before the
        // store (and the token) is touched.
        if let Err(e) = crate::ca::check_csr(csr_pem) {
            self.metrics.join(JoinOutcome::RefusedInvalid);
            return Err(Status::invalid_argument(e.to_string()));
        }
        Ok(())
    }

    /// The core's join decision in one write transaction; a refusal rolls it back, a re-join
    /// waiting for approval commits its request and is answered `UNAVAILABLE`.
    async fn decide(
        &self,
        peer: Option<std::net::SocketAddr>,
        req: &JoinRequest,
    ) -> Result<Joined, Status> {
        let hw = req.hardware.clone().unwrap_or_default();
        let facts = JoinFacts {
            token: req.token.clone(),
            hardware_key: hw.hardware_key,
            trusted: hw.trusted,
            identifier_digests: hw.identifier_digests,
            hostname: (!req.hostname.is_empty()).then(|| req.hostname.clone()),
            peer: peer.map(|p| p.ip().to_string()),
            mode: match bc_protocol::pb::AgentMode::try_from(req.mode) {
                Ok(bc_protocol::pb::AgentMode::Site) => bc_protocol::Mode::Site,
                Ok(bc_protocol::pb::AgentMode::Ramdisk) => bc_protocol::Mode::Ramdisk,
                _ => bc_protocol::Mode::Node,
            },
        };
        let registry = Arc::clone(&self.registry);
        let outcome = self
            .store
            .write(move |tx| cpl_core::join::join(tx, &facts, &|id| registry.sender(id).is_some()))
            .await;
        match outcome {
            Ok(decision::JoinOutcome::Joined(j)) => {
                if let Some(site) = j.boot_site.clone() {
                    let bm = self.bare_metal.clone();
                    tokio::spawn(async move { bm.push_site(&site).await });
                }
                Ok(j)
            }
            Ok(decision::JoinOutcome::Refused(r)) => {
                self.metrics.join(match r.kind {
                    decision::RefusalKind::HardwareMismatch => JoinOutcome::RefusedHardwareMismatch,
                    decision::RefusalKind::BareMetal => JoinOutcome::RefusedBareMetal,
                });
                tracing::warn!(node_id = %r.node_id, reason = %r.message, "join refused");
                Err(Status::permission_denied(r.message))
            }
            Ok(decision::JoinOutcome::AwaitingApproval(a)) => {
                self.metrics.join(JoinOutcome::PendingApproval);
                if a.new_request {
                    tracing::warn!(node_id = %a.node_id, request = %a.request_id, "re-join in place waits for an operator's approval");
                }
                Err(awaiting_status(&a))
            }
            Err(refusal) => {
                self.metrics.join(refusal_outcome(&refusal));
                if matches!(refusal, JoinError::Failed(_)) {
                    tracing::error!(error = %refusal, "join failed");
                } else {
                    tracing::warn!(reason = %refusal, "join refused");
                }
                Err(refusal_status(&refusal))
            }
        }
    }
}

#[tonic::async_trait]
impl Join for JoinService {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let peer = super::listener::remote_addr(&request);
        let span = tracing::info_span!("join", peer = ?peer, node_id = tracing::field::Empty);
        let mut req = request.into_inner();
        // Hostname, agent version and identifiers are kept: bounded before anything reads them.
        let cut = bc_protocol::limits::bound_join_request(&mut req);
        if !cut.is_empty() {
            span.in_scope(|| tracing::warn!(fields = ?cut, "join request text cut to its limits"));
        }
        self.run_join(peer, req, &span)
            .instrument(span.clone())
            .await
    }
}

impl JoinService {
    /// One join, in `span` (which gets the node id once it is known).
    async fn run_join(
        &self,
        peer: Option<std::net::SocketAddr>,
        req: JoinRequest,
        span: &tracing::Span,
    ) -> Result<Response<JoinResponse>, Status> {
        self.precheck(peer, &req.csr_pem)?;
        let joined = self.decide(peer, &req).await?;
        span.record("node_id", joined.node_id.as_str());
        let (certificate_pem, ident) = self
            .ca
            .sign_node_csr(
                &req.csr_pem,
                &joined.node_id,
                joined.identity_generation,
                self.node_cert_ttl,
            )
            .map_err(|e| {
                self.metrics.join(JoinOutcome::Error);
                Status::internal(e.to_string())
            })?;
        self.metrics.join(if joined.rejoined {
            JoinOutcome::Rejoined
        } else {
            JoinOutcome::NewNode
        });
        tracing::info!(rejoined = joined.rejoined, "node joined");
        Ok(Response::new(JoinResponse {
            node_id: joined.node_id,
            certificate_pem,
            ca_pem: self.ca.cert_pem().to_owned(),
            identity_generation: ident.identity_generation,
            heartbeat_interval_ms: u32::try_from(self.heartbeat_interval.as_millis())
                .unwrap_or(u32::MAX),
            trust_domain: self.ca.trust_domain().to_owned(),
        }))
    }
}
