//! `bcctl serve`: wires the store, the CA, the gateway (gRPC over TLS) and the operator API
//! (HTTP + JSON) together, and runs the controllers.
//!
//! The state dir holds `state.db` (SQLite, WAL), `ca.key` (0600) / `ca.crt`, `api-token` (0600,
//! the operator bearer token) and `endpoints.json` (the addresses actually bound, written after
//! binding so clients and tests can find a server started on port 0).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::GoodbyeReason;
use bc_protocol::pb::gateway_server::GatewayServer;
use bc_protocol::pb::join_server::JoinServer;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::api::{self, ApiState};
use crate::ca::{self, CaError, CertificateAuthority};
use crate::commands::Commands;
use crate::gateway::join::JoinService;
use crate::gateway::registry::Registry;
use crate::gateway::{GatewayConfig, GatewayService, HeartbeatBuffer};
use crate::liveness::{self, LivenessConfig};
use crate::store::{Store, StoreError};

/// What went wrong starting or running the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The state dir could not be made or written.
    #[error("state dir {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ca(#[from] CaError),
    /// tonic refused the TLS setup or the server failed.
    #[error("gateway: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The metrics listener could not be started.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
}

/// Configuration of `bcctl serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub state_dir: PathBuf,
    /// Gateway (gRPC, TLS) address; port 0 picks one.
    pub listen: SocketAddr,
    /// Operator API (HTTP) address; port 0 picks one.
    pub api_listen: SocketAddr,
    /// Extra names (DNS or IP) for the gateway's server certificate.
    pub server_names: Vec<String>,
    /// The URL agents are told to use; default `https://<listen address>`.
    pub advertise_url: Option<String>,
    pub trust_domain: String,
    pub heartbeat_interval: Duration,
    pub liveness: LivenessConfig,
    pub node_cert_ttl: Duration,
    /// Join attempts allowed per source address per minute (0: no limit).
    pub join_attempts_per_minute: u32,
    /// Prometheus metrics (`GET /metrics`) address; `None`: no metrics listener. Port 0 picks one.
    pub metrics_listen: Option<SocketAddr>,
}

impl ServeConfig {
    /// Defaults (DESIGN.md "Liveness timings") with a state dir and addresses.
    pub fn new(state_dir: PathBuf, listen: SocketAddr, api_listen: SocketAddr) -> Self {
        Self {
            state_dir,
            listen,
            api_listen,
            server_names: Vec::new(),
            advertise_url: None,
            trust_domain: "bc.local".to_owned(),
            heartbeat_interval: Duration::from_secs(10),
            liveness: LivenessConfig::default(),
            node_cert_ttl: ca::DEFAULT_NODE_CERT_TTL,
            join_attempts_per_minute: 60,
            metrics_listen: None,
        }
    }
}

/// Addresses a running control plane bound, as written to `endpoints.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// `https://host:port` of the gateway, for agents.
    pub gateway_url: String,
    /// `http://host:port` of the operator API.
    pub api_url: String,
    /// `sha256:<hex>` pin of the CA.
    pub ca_pin: String,
    /// `http://host:port/metrics` when `--metrics-listen` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_url: Option<String>,
}

/// File names in the state dir.
pub const ENDPOINTS_FILE: &str = "endpoints.json";
/// The operator bearer token file.
pub const API_TOKEN_FILE: &str = "api-token";

/// A started control plane.
#[derive(Debug)]
pub struct Running {
    pub endpoints: Endpoints,
    pub store: Store,
    pub registry: Arc<Registry>,
    pub api_token: String,
    shutdown: watch::Sender<bool>,
    tasks: tokio::task::JoinSet<()>,
    state_dir: PathBuf,
}

fn state_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServeError + '_ {
    move |source| ServeError::StateDir {
        path: path.to_owned(),
        source,
    }
}

fn load_or_create_api_token(dir: &Path) -> Result<String, ServeError> {
    let path = dir.join(API_TOKEN_FILE);
    if let Ok(t) = std::fs::read_to_string(&path) {
        let t = t.trim().to_owned();
        if !t.is_empty() {
            return Ok(t);
        }
    }
    let mut bytes = [0u8; 24];
    rand::fill(&mut bytes);
    let token = format!("bcapi_{}", hex::encode(bytes));
    ca::write_atomic(&path, format!("{token}\n").as_bytes(), 0o600)?;
    Ok(token)
}

fn default_names(listen: &SocketAddr) -> Vec<String> {
    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !listen.ip().is_unspecified() {
        names.push(listen.ip().to_string());
    }
    if let Ok(h) = nix::unistd::gethostname()
        && let Some(h) = h.to_str()
    {
        names.push(h.to_owned());
    }
    names
}

/// Open operator-API connections at most; more wait in the accept queue (bc_net).
const API_MAX_CONNECTIONS: usize = 256;

/// An operator-API or metrics connection with no byte in or out for this long is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a gateway connection may take to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accept queue of the gateway listener. A restart storm opens thousands of connections within
/// a second; with the usual 1,024 the kernel drops SYNs and clients wait for TCP's 1 s, 3 s, 7 s
/// retransmits. The kernel caps it at `net.core.somaxconn` (4,096 on current kernels).
const GATEWAY_BACKLOG: u32 = 8192;

/// Binds the gateway's listener (SO_REUSEADDR, as `TcpListener::bind` does, so a restart can
/// take the same port back at once) with [`GATEWAY_BACKLOG`].
fn bind_gateway(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(GATEWAY_BACKLOG)
}

/// Starts the control plane: binds both listeners, writes `endpoints.json`, spawns the servers
/// and controllers. Returns once everything listens.
pub async fn start(cfg: ServeConfig) -> Result<Running, ServeError> {
    std::fs::create_dir_all(&cfg.state_dir).map_err(state_err(&cfg.state_dir))?;
    let _ = std::fs::remove_file(cfg.state_dir.join(ENDPOINTS_FILE));
    let store = Store::open(&cfg.state_dir.join("state.db"))?;
    let ca = Arc::new(CertificateAuthority::load_or_create(
        &cfg.state_dir,
        &cfg.trust_domain,
    )?);
    let api_token = load_or_create_api_token(&cfg.state_dir)?;

    let mut names = default_names(&cfg.listen);
    names.extend(cfg.server_names.iter().cloned());
    names.sort();
    names.dedup();
    let (chain_pem, key_pem) = ca.server_cert(&names)?;

    let gw_listener = bind_gateway(cfg.listen).map_err(|source| ServeError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let api_listener =
        TcpListener::bind(cfg.api_listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: cfg.api_listen,
                source,
            })?;
    let gw_addr = gw_listener
        .local_addr()
        .map_err(|source| ServeError::Bind {
            addr: cfg.listen,
            source,
        })?;
    let api_addr = api_listener
        .local_addr()
        .map_err(|source| ServeError::Bind {
            addr: cfg.api_listen,
            source,
        })?;
    let host = |a: SocketAddr| {
        if a.ip().is_unspecified() {
            "127.0.0.1".to_owned()
        } else if a.is_ipv6() {
            format!("[{}]", a.ip())
        } else {
            a.ip().to_string()
        }
    };
    let gateway_url = cfg
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("https://{}:{}", host(gw_addr), gw_addr.port()));
    let mut endpoints = Endpoints {
        gateway_url: gateway_url.clone(),
        api_url: format!("http://{}:{}", host(api_addr), api_addr.port()),
        ca_pin: ca.pin()?,
        metrics_url: None,
    };

    let registry = Arc::new(Registry::default());
    let metrics = crate::metrics::Metrics::new();
    let heartbeats = Arc::new(HeartbeatBuffer::default());
    let commands = Commands {
        store: store.clone(),
        registry: Arc::clone(&registry),
    };
    let gateway = GatewayService {
        store: store.clone(),
        ca: Arc::clone(&ca),
        cfg: GatewayConfig {
            gateway_id: format!("gw-{}", &hex::encode(rand::random::<[u8; 4]>())),
            heartbeat_interval: cfg.heartbeat_interval,
            node_cert_ttl: cfg.node_cert_ttl,
            hello_timeout: Duration::from_secs(10),
            bundles_dir: cfg.state_dir.join("bundles"),
        },
        registry: Arc::clone(&registry),
        heartbeats: Arc::clone(&heartbeats),
        commands: commands.clone(),
        metrics: metrics.clone(),
    };
    let join = JoinService {
        store: store.clone(),
        ca: Arc::clone(&ca),
        heartbeat_interval: cfg.heartbeat_interval,
        node_cert_ttl: cfg.node_cert_ttl,
        registry: Arc::clone(&registry),
        limiter: Arc::new(crate::gateway::join::RateLimiter::new(
            cfg.join_attempts_per_minute,
        )),
        metrics: metrics.clone(),
    };
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(chain_pem, key_pem))
        .client_ca_root(Certificate::from_pem(ca.cert_pem()))
        .client_auth_optional(true)
        // A connection that never finishes its handshake would hold a socket (and a file
        // descriptor) forever.
        .timeout(TLS_HANDSHAKE_TIMEOUT);

    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

    // Bound before anything is spawned: an address in use fails the start, not a scrape later.
    if let Some(addr) = cfg.metrics_listen {
        let (bound, server) = crate::metrics::serve(
            addr,
            metrics.clone(),
            store.clone(),
            Arc::clone(&registry),
            shutdown_rx.clone(),
        )
        .await?;
        endpoints.metrics_url = Some(bc_net::http::url(bound, "/metrics"));
        tasks.spawn(async move {
            let _ = server.await;
        });
    }

    let mut grpc = Server::builder()
        .tls_config(tls)?
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_nodelay(true);
    let router = grpc.add_service(JoinServer::new(join)).add_service(
        GatewayServer::new(gateway.clone())
            .max_decoding_message_size(bc_protocol::MAX_SESSION_MESSAGE_BYTES),
    );
    let mut rx = shutdown_rx.clone();
    tasks.spawn(async move {
        let incoming = bc_net::accept_loop(gw_listener);
        let stop = async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, stop).await {
            tracing::error!(error = %e, "gateway server failed");
        }
    });

    let api_state = Arc::new(ApiState {
        store: store.clone(),
        ca: Arc::clone(&ca),
        api_token: api_token.clone(),
        gateway_url,
        commands: commands.clone(),
        registry: Arc::clone(&registry),
        bundles_dir: cfg.state_dir.join("bundles"),
    });
    let app = api::router(api_state);
    let mut rx = shutdown_rx.clone();
    tasks.spawn(async move {
        let stop = async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let api_listener =
            bc_net::BoundedListener::new(api_listener, API_MAX_CONNECTIONS, IDLE_TIMEOUT);
        if let Err(e) = axum::serve(api_listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, "operator API server failed");
        }
    });

    let flush_period =
        (cfg.heartbeat_interval / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let gw_flush = gateway.clone();
    let mut rx = shutdown_rx.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = gw_flush.clone().flush_heartbeats(flush_period) => {}
            _ = rx.wait_for(|v| *v) => {}
        }
        gw_flush.flush_once().await;
    });

    let mut rx = shutdown_rx.clone();
    let deadlines = commands.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = deadlines.run_deadlines(Duration::from_millis(500)) => {}
            _ = rx.wait_for(|v| *v) => {}
        }
    });

    let live_store = store.clone();
    let gw_live = gateway.clone();
    let live_cfg = cfg.liveness;
    let mut rx = shutdown_rx.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = liveness::run(live_store, live_cfg, move || {
                let gw = gw_live.clone();
                async move { gw.flush_once().await }
            }) => {}
            _ = rx.wait_for(|v| *v) => {}
        }
    });

    ca::write_atomic(
        &cfg.state_dir.join(ENDPOINTS_FILE),
        serde_json::to_string_pretty(&endpoints)
            .unwrap_or_default()
            .as_bytes(),
        0o644,
    )?;
    tracing::info!(gateway = %endpoints.gateway_url, api = %endpoints.api_url, metrics = endpoints.metrics_url.as_deref().unwrap_or("off"), state_dir = %cfg.state_dir.display(), "control plane listening");
    Ok(Running {
        endpoints,
        store,
        registry,
        api_token,
        shutdown,
        tasks,
        state_dir: cfg.state_dir.clone(),
    })
}

impl Running {
    /// Says Goodbye{shutdown} to every agent, stops the servers and controllers, and waits up to
    /// `grace` for them.
    pub async fn shutdown(mut self, grace: Duration) {
        self.registry
            .close_all(GoodbyeReason::Shutdown, "control plane shutting down");
        let _ = self.shutdown.send(true);
        let drained = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("shutdown grace period passed; aborting remaining tasks");
            self.tasks.abort_all();
        }
        // A stale endpoints.json would point clients at a dead server.
        let _ = std::fs::remove_file(self.state_dir.join(ENDPOINTS_FILE));
    }
}
