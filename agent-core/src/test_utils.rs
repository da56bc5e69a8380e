//! A scripted fake control plane for protocol tests (feature `test-utils`, and this crate's own
//! tests): Join and Gateway over TLS on a loopback port, with a CA and a pin of its own. It
//! signs every CSR, records every JoinRequest and each node's first session, answers Welcome,
//! then sends its script, and acknowledges heartbeats. A test can also push a message to every
//! open session ([`FakeControlPlane::push`]) and choose the site lease expiry the
//! acknowledgements carry ([`FakeControlPlane::set_site_lease_expiry`]), or stop acknowledging
//! ([`FakeControlPlane::pause_acks`]), refuse joins ([`FakeControlPlane::refuse_joins`]), and
//! start a replica on another port with the same CA and the same records
//! ([`FakeControlPlane::replica`]). Not for production builds.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use bc_protocol::pb::gateway_server::{Gateway, GatewayServer};
use bc_protocol::pb::join_server::{Join, JoinServer};
use bc_protocol::pb::{
    AgentMessage, GatewayMessage, HeartbeatAck, JoinRequest, JoinResponse, RenewRequest,
    RenewResponse, UploadChunk, UploadResult, Welcome, agent_message, gateway_message,
};
use parking_lot::Mutex;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, IsCa, Issuer, KeyPair,
    SanType,
};
use tokio_stream::Stream;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// The status code a refusing fake answers with ([`FakeControlPlane::start_with`]).
pub use tonic::Code;

/// The epoch every session of the fake gets.
pub const EPOCH: u64 = 7;
/// The heartbeat interval the fake asks for, ms.
pub const HEARTBEAT_MS: u32 = 100;

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// Every JoinRequest, in order; node `i` is `node_<i>`.
    pub joins: Vec<JoinRequest>,
    /// `(node id, messages in arrival order)` of each node's first session.
    pub sessions: Vec<(String, Vec<AgentMessage>)>,
    /// Every `Gateway.Session` call, refused ones included.
    pub session_attempts: usize,
    /// Every `Join.Join` call, refused ones included.
    pub join_attempts: usize,
}

impl Seen {
    /// The first session's messages of `node_id`, if it had one.
    pub fn session(&self, node_id: &str) -> Option<&[AgentMessage]> {
        self.sessions
            .iter()
            .find(|(n, _)| n == node_id)
            .map(|(_, m)| m.as_slice())
    }
}

/// A running fake control plane.
#[derive(Debug, Clone)]
pub struct FakeControlPlane {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// `sha256:<hex>` of its CA.
    pub pin: String,
    /// What it saw.
    pub seen: Arc<Mutex<Seen>>,
    push: tokio::sync::broadcast::Sender<gateway_message::Msg>,
    site_lease_expiry: Arc<AtomicI64>,
    acks_paused: Arc<AtomicBool>,
    refuse_joins: Arc<Mutex<Option<(tonic::Code, String)>>>,
    /// What a replica is started from.
    seed: Arc<Seed>,
}

/// The service and TLS identity of a fake, kept to start replicas of it.
struct Seed {
    service: Service,
    tls: ServerTlsConfig,
}

impl std::fmt::Debug for Seed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seed")
    }
}

#[derive(Clone)]
struct Service {
    ca_pem: String,
    issuer: Arc<Issuer<'static, KeyPair>>,
    seen: Arc<Mutex<Seen>>,
    script: Arc<Vec<gateway_message::Msg>>,
    push: tokio::sync::broadcast::Sender<gateway_message::Msg>,
    site_lease_expiry: Arc<AtomicI64>,
    acks_paused: Arc<AtomicBool>,
    /// Refuse every session with this status (code, message).
    refuse: Option<(tonic::Code, String)>,
    /// Refuse every join with this status (code, message), per replica.
    refuse_joins: Arc<Mutex<Option<(tonic::Code, String)>>>,
}

#[tonic::async_trait]
impl Join for Service {
    async fn join(&self, request: Request<JoinRequest>) -> Result<Response<JoinResponse>, Status> {
        let req = request.into_inner();
        self.seen.lock().join_attempts += 1;
        if let Some((code, message)) = self.refuse_joins.lock().clone() {
            return Err(Status::new(code, message));
        }
        let csr = CertificateSigningRequestParams::from_pem(&req.csr_pem)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let cert = CertificateParams::default()
            .signed_by(&csr.public_key, self.issuer.as_ref())
            .map_err(|e| Status::internal(e.to_string()))?;
        let mut seen = self.seen.lock();
        let node_id = format!("node_{}", seen.joins.len());
        seen.joins.push(req);
        Ok(Response::new(JoinResponse {
            node_id,
            certificate_pem: cert.pem(),
            ca_pem: self.ca_pem.clone(),
            identity_generation: 1,
            heartbeat_interval_ms: HEARTBEAT_MS,
            trust_domain: "bc.test".to_owned(),
        }))
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<GatewayMessage, Status>> + Send>>;

fn gw(m: gateway_message::Msg) -> Result<GatewayMessage, Status> {
    Ok(GatewayMessage { msg: Some(m) })
}

#[tonic::async_trait]
impl Gateway for Service {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        self.seen.lock().session_attempts += 1;
        if let Some((code, message)) = &self.refuse {
            return Err(Status::new(*code, message.clone()));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let (seen, script) = (Arc::clone(&self.seen), Arc::clone(&self.script));
        let mut pushed = self.push.subscribe();
        let lease = Arc::clone(&self.site_lease_expiry);
        let paused = Arc::clone(&self.acks_paused);
        tokio::spawn(async move {
            let Ok(Some(hello)) = inbound.message().await else {
                return;
            };
            let Some(agent_message::Msg::Hello(h)) = &hello.msg else {
                return;
            };
            let slot = {
                let mut seen = seen.lock();
                if seen.sessions.iter().any(|(id, _)| *id == h.node_id) {
                    None // a reconnect: only first sessions are recorded
                } else {
                    seen.sessions.push((h.node_id.clone(), vec![hello.clone()]));
                    Some(seen.sessions.len() - 1)
                }
            };
            let welcome = gateway_message::Msg::Welcome(Welcome {
                epoch: EPOCH,
                gateway_id: "fake".to_owned(),
                heartbeat_interval_ms: HEARTBEAT_MS,
                server_time_ms: chrono::Utc::now().timestamp_millis(),
            });
            for m in std::iter::once(welcome).chain(script.iter().cloned()) {
                if tx.send(gw(m)).await.is_err() {
                    return;
                }
            }
            loop {
                let m = tokio::select! {
                    m = inbound.message() => match m {
                        Ok(Some(m)) => m,
                        _ => return,
                    },
                    p = pushed.recv() => {
                        if let Ok(p) = p {
                            let _ = tx.send(gw(p)).await;
                        }
                        continue;
                    }
                };
                if let Some(agent_message::Msg::Heartbeat(hb)) = &m.msg
                    && !paused.load(Ordering::SeqCst)
                {
                    let ack = gateway_message::Msg::HeartbeatAck(HeartbeatAck {
                        seq: hb.seq,
                        site_lease_expires_at_ms: lease.load(Ordering::SeqCst),
                    });
                    let _ = tx.send(gw(ack)).await;
                }
                if let Some(i) = slot {
                    seen.lock().sessions[i].1.push(m);
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn renew(&self, _: Request<RenewRequest>) -> Result<Response<RenewResponse>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }

    async fn upload(
        &self,
        _: Request<Streaming<UploadChunk>>,
    ) -> Result<Response<UploadResult>, Status> {
        Err(Status::unimplemented("not in the fake"))
    }
}

impl FakeControlPlane {
    /// Starts the fake on a loopback port (a task of the current runtime); every session gets
    /// Welcome, then `script`.
    pub async fn start(script: Vec<gateway_message::Msg>) -> Self {
        Self::start_with(script, None).await
    }

    /// Same, refusing every session with `refuse` (code, message) when given: a control plane
    /// that joins nodes but will not hold their sessions.
    pub async fn start_with(
        script: Vec<gateway_message::Msg>,
        refuse: Option<(tonic::Code, String)>,
    ) -> Self {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let pin = format!(
            "sha256:{}",
            hex::encode(crate::tls::spki_sha256(ca_cert.der()).unwrap())
        );
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let mut leaf_params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        leaf_params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
        let service = Service {
            ca_pem: ca_cert.pem(),
            issuer: Arc::new(issuer),
            seen: Arc::default(),
            script: Arc::new(script),
            push: tokio::sync::broadcast::channel(64).0,
            site_lease_expiry: Arc::new(AtomicI64::new(0)),
            acks_paused: Arc::new(AtomicBool::new(false)),
            refuse,
            refuse_joins: Arc::default(),
        };
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(
            format!("{}{}", leaf.pem(), ca_cert.pem()),
            leaf_key.serialize_pem(),
        ));
        Self::serve(Arc::new(Seed { service, tls }), pin).await
    }

    /// Serves `seed` on a new loopback port.
    async fn serve(seed: Arc<Seed>, pin: String) -> Self {
        let service = seed.service.clone();
        let (seen, push, site_lease_expiry, acks_paused, refuse_joins) = (
            Arc::clone(&service.seen),
            service.push.clone(),
            Arc::clone(&service.site_lease_expiry),
            Arc::clone(&service.acks_paused),
            Arc::clone(&service.refuse_joins),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let server = Server::builder()
            .tls_config(seed.tls.clone())
            .unwrap()
            .add_service(JoinServer::new(service.clone()))
            .add_service(GatewayServer::new(service));
        tokio::spawn(
            server.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        Self {
            url,
            pin,
            seen,
            push,
            site_lease_expiry,
            acks_paused,
            refuse_joins,
            seed,
        }
    }

    /// Another replica of this control plane on a new port: the same CA (and pin), script and
    /// records ([`FakeControlPlane::seen`]); its own [`FakeControlPlane::refuse_joins`], and
    /// refusing every session with `refuse` (code, message) when given.
    pub async fn replica(&self, refuse: Option<(tonic::Code, String)>) -> Self {
        let mut service = self.seed.service.clone();
        service.refuse_joins = Arc::default();
        service.refuse = refuse;
        let tls = self.seed.tls.clone();
        Self::serve(Arc::new(Seed { service, tls }), self.pin.clone()).await
    }

    /// Refuses every later join on this replica with `code` and `message` (`None`: joins again).
    pub fn refuse_joins(&self, refusal: Option<(tonic::Code, &str)>) {
        *self.refuse_joins.lock() = refusal.map(|(c, m)| (c, m.to_owned()));
    }

    /// Sends `m` on every session open now (a command, a site assignment, ...).
    pub fn push(&self, m: gateway_message::Msg) {
        let _ = self.push.send(m);
    }

    /// What every later `HeartbeatAck.site_lease_expires_at_ms` carries (0, the default: the
    /// node holds no site lease; anything else renews the lease of a site agent).
    pub fn set_site_lease_expiry(&self, expires_at_ms: i64) {
        self.site_lease_expiry
            .store(expires_at_ms, Ordering::SeqCst);
    }

    /// Stops (or resumes) acknowledging heartbeats while the sessions stay open: a control
    /// plane that no longer renews anything, as a network partition looks from the agent.
    pub fn pause_acks(&self, paused: bool) {
        self.acks_paused.store(paused, Ordering::SeqCst);
    }
}
