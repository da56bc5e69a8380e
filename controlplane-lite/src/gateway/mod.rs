//! The gateway: JoinService (server-authenticated TLS) and the agents' sessions (mutual TLS).
//!
//! Each session is a bidirectional gRPC stream. The certificate names the node and its identity
//! generation; both are checked against the store when the stream opens.

pub mod join;
#[cfg(test)]
mod join_tests;
pub mod listener;
pub mod registry;
pub mod report_rate;
mod session;
pub mod upload;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::gateway_server::Gateway;
use bc_protocol::pb::{
    AgentMessage, GatewayMessage, RenewRequest, RenewResponse, UploadChunk, UploadResult,
};
use parking_lot::Mutex;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use cpl_store::Store;

use crate::ca::{CertificateAuthority, NodeIdentity};
use registry::Registry;

/// Timings and identity of this gateway.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub gateway_id: String,
    pub heartbeat_interval: Duration,
    pub node_cert_ttl: Duration,
    /// How long an agent has to send Hello after opening the stream.
    pub hello_timeout: Duration,
    /// Where logs.collect bundles are stored (`<state dir>/bundles`).
    pub bundles_dir: std::path::PathBuf,
    /// How long bundles are kept and how much room they may take.
    pub bundle_retention: crate::bundle_store::Retention,
}

/// Heartbeats waiting to be written: node id -> (epoch, last seen ms).
#[derive(Debug, Default)]
pub struct HeartbeatBuffer {
    pending: Mutex<HashMap<String, (u64, i64)>>,
}

impl HeartbeatBuffer {
    /// Notes a heartbeat; the flusher writes it with the others in one transaction.
    pub fn note(&self, node_id: &str, epoch: u64, at: i64) {
        self.pending.lock().insert(node_id.to_owned(), (epoch, at));
    }

    /// Takes everything noted so far.
    pub fn take(&self) -> Vec<(String, u64, i64)> {
        self.pending
            .lock()
            .drain()
            .map(|(id, (epoch, at))| (id, epoch, at))
            .collect()
    }
}

/// The Gateway gRPC service.
#[derive(Debug, Clone)]
pub struct GatewayService {
    pub store: Store,
    pub ca: Arc<CertificateAuthority>,
    pub cfg: GatewayConfig,
    pub registry: Arc<Registry>,
    pub heartbeats: Arc<HeartbeatBuffer>,
    /// Heartbeat, inventory and flush metrics (`bcctl_…`).
    pub metrics: crate::metrics::Metrics,
    /// Each node's bound on reports that need the store.
    pub reports: Arc<report_rate::ReportLimiter>,
    /// Commands with an upload in progress: one at a time per command.
    pub uploads: Arc<upload::InFlight>,
    /// The core: what agents report enters through `Core::report`; site agents' assignments and
    /// lease renewals are its bare-metal service's.
    pub core: cpl_core::verbs::Core,
}

impl GatewayService {
    /// Checks the client certificate: chain already verified by TLS; here the node id and identity
    /// generation must match the store.
    async fn authenticate<T>(&self, req: &Request<T>) -> Result<NodeIdentity, Status> {
        let certs = listener::peer_certs(req).ok_or_else(|| {
            Status::unauthenticated("a node certificate is required (mutual TLS)")
        })?;
        let leaf = certs.first().ok_or_else(|| {
            Status::unauthenticated("a node certificate is required (mutual TLS)")
        })?;
        let ident = self
            .ca
            .node_identity(leaf.as_ref())
            .map_err(|e| Status::unauthenticated(e.to_string()))?;
        let id = ident.node_id.clone();
        let node = self
            .store
            .read(move |r| r.node(&id))
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?
            .ok_or_else(|| {
                Status::unauthenticated(format!("node {} no longer exists", ident.node_id))
            })?;
        if node.identity_generation != ident.identity_generation {
            return Err(Status::unauthenticated(format!(
                "certificate of identity generation {} is revoked: node {} is at generation {}",
                ident.identity_generation, node.id, node.identity_generation
            )));
        }
        Ok(ident)
    }

    /// Writes buffered heartbeats until the process ends; every `period`.
    pub async fn flush_heartbeats(self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.flush_once().await;
        }
    }

    /// Writes buffered heartbeats now, with the site leases their holders' heartbeats renewed
    /// (one transaction).
    pub async fn flush_once(&self) {
        let beats = self.heartbeats.take();
        let renewals = self.core.bare_metal.leases.take_renewals();
        if beats.is_empty() && renewals.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        if let Err(e) = self
            .store
            .write(move |tx| {
                tx.renew_site_leases(&renewals)?;
                cpl_core::sessions::flush_heartbeats(tx, &beats)
            })
            .await
        {
            tracing::error!(error = %e, "writing heartbeats failed");
        }
        self.metrics.observe_heartbeat_flush(started.elapsed());
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<GatewayMessage, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Gateway for GatewayService {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let ident = self.authenticate(&request).await?;
        let rx = session::open(self.clone(), ident, request.into_inner()).await?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn renew(
        &self,
        request: Request<RenewRequest>,
    ) -> Result<Response<RenewResponse>, Status> {
        let ident = self.authenticate(&request).await?;
        let req = request.into_inner();
        let (certificate_pem, signed) = self
            .ca
            .sign_node_csr(
                &req.csr_pem,
                &ident.node_id,
                ident.identity_generation,
                self.cfg.node_cert_ttl,
            )
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(RenewResponse {
            certificate_pem,
            not_after_ms: signed.not_after_ms,
        }))
    }

    async fn upload(
        &self,
        request: Request<Streaming<UploadChunk>>,
    ) -> Result<Response<UploadResult>, Status> {
        let ident = self.authenticate(&request).await?;
        let span = tracing::info_span!("upload", node_id = %ident.node_id, command_id = tracing::field::Empty);
        upload::receive(self, &ident.node_id, request.into_inner())
            .instrument(span)
            .await
            .map(Response::new)
    }
}
