//! `bcctl serve`: wires the store, the CA, the gateway (gRPC over TLS) and the operator API
//! (HTTP + JSON) together, and runs the controllers.
//!
//! The state dir holds `state.db` (SQLite, WAL), `ca.key` (0600) / `ca.crt`, `api-token` (0600,
//! the operator bearer token), `bmc-credentials.key` (0600, the key BMC credentials are sealed
//! under), `state-dir.json` (the marker of an initialised dir),
//! `serve.lock` (held for the process's life) and `endpoints.json` (the addresses actually bound,
//! written after binding so clients and tests can find a server started on port 0). Which dir is
//! initialised and when a start is refused: [`crate::state_dir`].

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
use tonic::transport::Server;

use cpl_core::commands::Commands;
use cpl_core::liveness::{self, LivenessConfig};
use cpl_core::verbs::{Core, TokenIssuer};
use cpl_store::{Store, StoreError};

use crate::api::{self, ApiState};
use crate::ca::{self, CaError, CertificateAuthority};
use crate::gateway::join::JoinService;
use crate::gateway::registry::Registry;
use crate::gateway::{GatewayConfig, GatewayService, HeartbeatBuffer};
use crate::limits::{
    API_HEADER_TIMEOUT, API_MAX_CONNECTIONS, API_MAX_CONNECTIONS_PER_ADDRESS, IDLE_TIMEOUT,
};
use crate::state_dir::{Init, STORE_FILE, StateDir};

/// What went wrong starting or running the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The state dir is locked by another process, damaged, or not one to initialise.
    #[error(transparent)]
    State(#[from] crate::state_dir::StateDirError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store file could not be opened or migrated; `path` names it.
    #[error("store {path}: {source}")]
    OpenStore { path: PathBuf, source: StoreError },
    /// The database server's store was set up by a control plane with another CA or BMC
    /// credential key: this replica's certificates or sealed credentials would not agree with it.
    #[error(
        "store {store}: it records {what} {stored}, this state dir has {ours}: every replica of one \
         store needs the same ca.key, ca.crt and bmc-credentials.key (copy them from the first \
         replica's state dir)"
    )]
    StoreOfAnother {
        store: String,
        what: &'static str,
        stored: String,
        ours: String,
    },
    /// The state dir's `bmc-credentials.key` is not the key the SQLite store's BMC credentials
    /// were sealed under (another valid key: a wrong backup, a copy from another control
    /// plane). Every enrolled BMC would silently drop out of its site's assignment.
    #[error(
        "{key_file} is not the key the store {store} sealed its BMC credentials under ({evidence}): \
         restore this state dir's own bmc-credentials.key (from a backup of this dir); a new key \
         cannot open what is sealed, so every enrolled BMC would have to be enrolled again"
    )]
    KeyOfAnotherStore {
        key_file: PathBuf,
        store: PathBuf,
        /// What shows it: the digests, or the node whose credentials do not open.
        evidence: String,
    },
    #[error(transparent)]
    Ca(#[from] CaError),
    /// tonic refused the TLS setup or the server failed.
    #[error("gateway: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The gateway's TLS configuration could not be built.
    #[error(transparent)]
    GatewayTls(#[from] crate::gateway::listener::ListenerError),
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
    /// Which state dir may be initialised (`--init`).
    pub init: Init,
    /// Site lease, BMC verification and power sync timings.
    pub bare_metal: cpl_core::bare_metal::BareMetalConfig,
    /// How long logs.collect bundles are kept and how much room they may take.
    pub bundle_retention: crate::bundle_store::Retention,
    /// Connection caps and timeouts of the gateway listener.
    pub gateway_limits: crate::gateway::listener::Limits,
    /// The store on a PostgreSQL server instead of the state dir's `state.db`.
    pub postgres: Option<cpl_store::PostgresOptions>,
    /// How long the controller lease lasts unless renewed ([`crate::leadership`]).
    pub controller_lease_ttl: Duration,
    /// Health remediation's pass period and step deadlines.
    pub remediation: cpl_core::remediation::RemediationConfig,
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
            init: Init::IfEmpty,
            bare_metal: cpl_core::bare_metal::BareMetalConfig::default(),
            bundle_retention: crate::bundle_store::Retention::default(),
            gateway_limits: crate::gateway::listener::Limits::default(),
            postgres: None,
            controller_lease_ttl: crate::leadership::DEFAULT_TTL,
            remediation: cpl_core::remediation::RemediationConfig::default(),
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
    /// This process's replica id (`gw-<8 hex>`, new at every start): the `gatewayId` of the
    /// sessions it holds and the holder of the controller lease while it leads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_id: Option<String>,
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
    /// The state dir's lock, held while this runs.
    _lock: StateDir,
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

/// A state dir locked, checked, and opened (initialised first when it is new).
#[derive(Debug)]
pub struct OpenedState {
    /// The lock: held as long as this (or what takes it over) lives.
    pub dir: StateDir,
    /// `state.db`, migrated.
    pub store: Store,
    /// The CA of `ca.key` / `ca.crt`.
    pub ca: CertificateAuthority,
    /// The operator bearer token (`api-token`).
    pub api_token: String,
    /// The key BMC credentials are sealed under (`bmc-credentials.key`).
    pub bmc_key: cpl_core::bare_metal::CredentialKey,
}

/// Locks `dir`, checks it ([`StateDir::check`]), and opens its store, CA and API token; a new
/// dir (as `init` allows) is initialised: an empty store, a new CA, a token, the marker.
pub fn open_state(dir: &Path, trust_domain: &str, init: Init) -> Result<OpenedState, ServeError> {
    open_state_with(dir, trust_domain, init, None)
}

/// [`open_state`] with the store on a PostgreSQL server (`postgres`) instead of `state.db`.
/// The database records the CA pin and the BMC credential key's fingerprint on first open; a
/// replica whose state dir holds another CA or key is refused ([`ServeError::StoreOfAnother`]).
pub fn open_state_with(
    dir: &Path,
    trust_domain: &str,
    init: Init,
    postgres: Option<&cpl_store::PostgresOptions>,
) -> Result<OpenedState, ServeError> {
    let sd = StateDir::lock(dir)?;
    let fresh = sd.check_with(init, postgres.is_some())?;
    if fresh {
        tracing::info!(state_dir = %dir.display(), "initialising a new state dir: an empty store, a new CA, an API token");
    }
    let (store, location) = match postgres {
        Some(opts) => {
            let location = redacted_url(&opts.url);
            let store = Store::open_postgres(opts).map_err(|source| ServeError::OpenStore {
                path: PathBuf::from(&location),
                source,
            })?;
            (store, Some(location))
        }
        None => {
            // SQLite's own message names no file.
            let db = dir.join(STORE_FILE);
            let store =
                Store::open(&db).map_err(|source| ServeError::OpenStore { path: db, source })?;
            (store, None)
        }
    };
    let ca = if fresh {
        CertificateAuthority::create(dir, trust_domain)?
    } else {
        CertificateAuthority::load(dir, trust_domain)?
    };
    let pin = ca.pin()?;
    sd.check_pin(&pin)?;
    let api_token = load_or_create_api_token(dir)?;
    let bmc_key = sd.bmc_key(fresh)?;
    crate::state_dir::agreement::check(dir, &store, location, &pin, &bmc_key)?;
    sd.mark_initialised(&pin)?;
    Ok(OpenedState {
        dir: sd,
        store,
        ca,
        api_token,
        bmc_key,
    })
}

/// `url` with its password, if any, replaced by `***` (for logs and errors).
pub fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
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

/// The listeners, bound before anything is spawned: an address in use fails the start.
struct Listeners {
    gateway: TcpListener,
    api: TcpListener,
    gateway_addr: SocketAddr,
    api_addr: SocketAddr,
}

async fn bind(cfg: &ServeConfig) -> Result<Listeners, ServeError> {
    let bind_err = |addr| move |source| ServeError::Bind { addr, source };
    let gateway = bind_gateway(cfg.listen).map_err(bind_err(cfg.listen))?;
    let api = TcpListener::bind(cfg.api_listen)
        .await
        .map_err(bind_err(cfg.api_listen))?;
    let gateway_addr = gateway.local_addr().map_err(bind_err(cfg.listen))?;
    let api_addr = api.local_addr().map_err(bind_err(cfg.api_listen))?;
    Ok(Listeners {
        gateway,
        api,
        gateway_addr,
        api_addr,
    })
}

/// `host` as a URL writes it; an unspecified address is reached on loopback.
fn url_host(a: SocketAddr) -> String {
    if a.ip().is_unspecified() {
        "127.0.0.1".to_owned()
    } else if a.is_ipv6() {
        format!("[{}]", a.ip())
    } else {
        a.ip().to_string()
    }
}

/// What the gateway, the operator API and the controllers share.
struct Parts {
    store: Store,
    ca: Arc<CertificateAuthority>,
    registry: Arc<Registry>,
    /// The core's sessions: this replica's registry and the other replicas' ([`crate::cluster`]).
    cluster: Arc<crate::cluster::ClusterSessions>,
    metrics: crate::metrics::Metrics,
    commands: Commands,
    gateway: GatewayService,
    bare_metal: cpl_core::bare_metal::BareMetal,
    core: Core,
}

fn parts(
    cfg: &ServeConfig,
    store: Store,
    ca: Arc<CertificateAuthority>,
    bmc_key: cpl_core::bare_metal::CredentialKey,
    boot: cpl_core::bare_metal::boot::BootSettings,
) -> Parts {
    let registry = Arc::new(Registry::default());
    let gateway_id = format!("gw-{}", &hex::encode(rand::random::<[u8; 4]>()));
    let cluster = crate::cluster::ClusterSessions::new(
        Arc::clone(&registry),
        store.clone(),
        gateway_id.clone(),
    );
    let metrics = crate::metrics::Metrics::new();
    let commands = Commands {
        store: store.clone(),
        sessions: Arc::clone(&cluster) as Arc<dyn cpl_core::port::AgentSessions>,
    };
    let mut bm_cfg = cfg.bare_metal;
    // A restart must not flap a lease: no move while agents may still be reconnecting (the same
    // grace Liveness gives them before it judges silence).
    bm_cfg.grace = cfg.liveness.unreachable_after;
    let issuer = TokenIssuer {
        ca_pin: boot.ca_pin.clone(),
        control_plane: boot.gateway_url.clone(),
    };
    let replica = cpl_core::status::ReplicaIdentity {
        id: gateway_id.clone(),
        gateway_url: boot.gateway_url.clone(),
    };
    let bare_metal =
        cpl_core::bare_metal::BareMetal::new(commands.clone(), bmc_key, bm_cfg).with_boot(boot);
    let core = Core {
        store: store.clone(),
        commands: commands.clone(),
        bare_metal: bare_metal.clone(),
        sessions: Arc::clone(&cluster) as Arc<dyn cpl_core::port::AgentSessions>,
        issuer,
        replica,
    };
    let gateway = GatewayService {
        store: store.clone(),
        ca: Arc::clone(&ca),
        cfg: GatewayConfig {
            gateway_id,
            heartbeat_interval: cfg.heartbeat_interval,
            node_cert_ttl: cfg.node_cert_ttl,
            hello_timeout: Duration::from_secs(10),
            bundles_dir: cfg.state_dir.join("bundles"),
            bundle_retention: cfg.bundle_retention,
        },
        registry: Arc::clone(&registry),
        heartbeats: Arc::new(HeartbeatBuffer::default()),
        metrics: metrics.clone(),
        reports: Arc::new(crate::gateway::report_rate::ReportLimiter::default()),
        uploads: Arc::new(crate::gateway::upload::InFlight::default()),
        core: core.clone(),
    };
    Parts {
        store,
        ca,
        registry,
        cluster,
        metrics,
        commands,
        gateway,
        bare_metal,
        core,
    }
}

/// A future that resolves once `rx` turns true.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}

/// Spawns the gRPC server (JoinService and the Gateway) on `listener`, over TLS.
fn spawn_gateway(
    tasks: &mut tokio::task::JoinSet<()>,
    cfg: &ServeConfig,
    p: &Parts,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    let mut names = default_names(&cfg.listen);
    names.extend(cfg.server_names.iter().cloned());
    names.sort();
    names.dedup();
    let (chain_pem, key_pem) = p.ca.server_cert(&names)?;
    // TLS is done by the gateway's own listener (caps per address and in total, a handshake
    // and a preface timeout: a connection that never finishes either would hold a socket, and a
    // file descriptor, forever), which hands tonic finished connections.
    let tls = crate::gateway::listener::tls_config(&chain_pem, &key_pem, p.ca.cert_pem())?;
    let join = JoinService {
        store: p.store.clone(),
        ca: Arc::clone(&p.ca),
        heartbeat_interval: cfg.heartbeat_interval,
        node_cert_ttl: cfg.node_cert_ttl,
        registry: Arc::clone(&p.registry),
        limiter: Arc::new(crate::gateway::join::RateLimiter::new(
            cfg.join_attempts_per_minute,
        )),
        metrics: p.metrics.clone(),
        bare_metal: p.bare_metal.clone(),
    };
    let mut grpc = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_nodelay(true);
    let router = grpc.add_service(JoinServer::new(join)).add_service(
        GatewayServer::new(p.gateway.clone())
            .max_decoding_message_size(bc_protocol::MAX_SESSION_MESSAGE_BYTES),
    );
    let (limits, metrics) = (cfg.gateway_limits, p.metrics.clone());
    tasks.spawn(async move {
        let incoming = crate::gateway::listener::incoming(listener, tls, limits, metrics);
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, stopped(stop))
            .await
        {
            tracing::error!(error = %e, "gateway server failed");
        }
    });
    Ok(())
}

/// Spawns the operator API (axum) on `listener`.
fn spawn_api(
    tasks: &mut tokio::task::JoinSet<()>,
    state: ApiState,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
) {
    let app = api::router(Arc::new(state));
    // The limits of every small endpoint (a header-read deadline, per-address and total caps,
    // an idle cut), as the boot service and the metrics endpoints have.
    let limits = bc_net::http::Limits {
        max_connections: API_MAX_CONNECTIONS,
        max_per_address: API_MAX_CONNECTIONS_PER_ADDRESS,
        header_timeout: API_HEADER_TIMEOUT,
        idle: IDLE_TIMEOUT,
        stats: bc_net::http::ListenerStats::default(),
    };
    tasks.spawn(bc_net::http::serve_on(
        listener,
        app,
        limits,
        "operator API",
        stopped(stop),
    ));
}

/// Spawns the controllers: this replica's heartbeat flusher and bundle pruning, the controller
/// lease, and — while this replica holds it ([`crate::leadership`]) — command deadlines, site
/// leases, NodeLifecycle, Remediation and Liveness.
fn spawn_controllers(
    tasks: &mut tokio::task::JoinSet<()>,
    cfg: &ServeConfig,
    p: &Parts,
    stop: &watch::Receiver<bool>,
) {
    use crate::leadership::while_leader;
    let (lead_tx, leading) = watch::channel(false);
    tasks.spawn(crate::leadership::run(
        p.store.clone(),
        p.gateway.cfg.gateway_id.clone(),
        cfg.controller_lease_ttl,
        lead_tx,
        stop.clone(),
    ));
    let (metrics, mut lead_seen) = (p.metrics.clone(), leading.clone());
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        let watch = async {
            loop {
                metrics.set_leader(*lead_seen.borrow_and_update());
                if lead_seen.changed().await.is_err() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = watch => {}
            _ = until => {}
        }
    });

    let flush_period =
        (cfg.heartbeat_interval / 2).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let gw_flush = p.gateway.clone();
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        tokio::select! {
            _ = gw_flush.clone().flush_heartbeats(flush_period) => {}
            _ = until => {}
        }
        gw_flush.flush_once().await;
    });

    let (deadlines, lead) = (p.commands.clone(), leading.clone());
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        tokio::select! {
            _ = while_leader("deadlines", lead, || deadlines.clone().run_deadlines(Duration::from_millis(500))) => {}
            _ = until => {}
        }
    });

    let (leases, gw_lease, lead) = (p.bare_metal.clone(), p.gateway.clone(), leading.clone());
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        let run = while_leader("site leases", lead, || {
            let gw_lease = gw_lease.clone();
            leases.clone().run_leases(move || {
                let gw = gw_lease.clone();
                async move { gw.flush_once().await }
            })
        });
        tokio::select! {
            _ = run => {}
            _ = until => {}
        }
    });

    // NodeLifecycle: nodes still adopting past their pool's acceptance deadline fail.
    let (lifecycle_store, lead) = (p.store.clone(), leading.clone());
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        tokio::select! {
            _ = while_leader("NodeLifecycle", lead, || cpl_core::acceptance::run(lifecycle_store.clone())) => {}
            _ = until => {}
        }
    });

    // Health remediation: faults climb their pool's ladder under its circuit breaker.
    let remediation = cpl_core::remediation::Remediation::new(p.commands.clone(), cfg.remediation);
    let (lead, until) = (leading.clone(), stopped(stop.clone()));
    tasks.spawn(async move {
        tokio::select! {
            _ = while_leader("Remediation", lead, || remediation.clone().run()) => {}
            _ = until => {}
        }
    });

    // Bundles age out even when no upload comes to prune them.
    let gw_bundles = p.gateway.clone();
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        let bundles = crate::bundle_store::BundleStore::new(
            gw_bundles.cfg.bundles_dir.clone(),
            gw_bundles.cfg.bundle_retention,
        );
        let mut tick = tokio::time::interval(crate::bundle_store::PRUNE_PERIOD);
        let prune = async {
            loop {
                tick.tick().await;
                crate::gateway::upload::prune(&gw_bundles, &bundles, None);
            }
        };
        tokio::select! {
            _ = prune => {}
            _ = until => {}
        }
    });

    let (live_store, gw_live, live_cfg) = (p.store.clone(), p.gateway.clone(), cfg.liveness);
    let until = stopped(stop.clone());
    tasks.spawn(async move {
        // A new leader starts Liveness afresh, with its startup grace.
        let run = while_leader("Liveness", leading, || {
            let gw_live = gw_live.clone();
            liveness::run(live_store.clone(), live_cfg, move || {
                let gw = gw_live.clone();
                async move { gw.flush_once().await }
            })
        });
        tokio::select! {
            _ = run => {}
            _ = until => {}
        }
    });
}

/// Starts the control plane: binds both listeners, writes `endpoints.json`, spawns the servers
/// and controllers. Returns once everything listens.
pub async fn start(cfg: ServeConfig) -> Result<Running, ServeError> {
    // The lock first: a second serve on this dir must not touch the first one's endpoints.json.
    let opened = open_state_with(
        &cfg.state_dir,
        &cfg.trust_domain,
        cfg.init,
        cfg.postgres.as_ref(),
    )?;
    let _ = std::fs::remove_file(cfg.state_dir.join(ENDPOINTS_FILE));
    let OpenedState {
        dir: lock,
        store,
        ca,
        api_token,
        bmc_key,
    } = opened;
    let ca = Arc::new(ca);
    let listeners = bind(&cfg).await?;
    let (gw_addr, api_addr) = (listeners.gateway_addr, listeners.api_addr);
    let gateway_url = cfg
        .advertise_url
        .clone()
        .unwrap_or_else(|| format!("https://{}:{}", url_host(gw_addr), gw_addr.port()));
    let mut endpoints = Endpoints {
        gateway_url: gateway_url.clone(),
        api_url: format!("http://{}:{}", url_host(api_addr), api_addr.port()),
        ca_pin: ca.pin()?,
        metrics_url: None,
        replica_id: None,
    };
    let boot = cpl_core::bare_metal::boot::BootSettings {
        gateway_url: gateway_url.clone(),
        ca_pin: endpoints.ca_pin.clone(),
    };
    let p = parts(&cfg, store, ca, bmc_key, boot);
    endpoints.replica_id = Some(p.gateway.cfg.gateway_id.clone());
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();

    // Bound before anything is spawned: an address in use fails the start, not a scrape later.
    if let Some(addr) = cfg.metrics_listen {
        let (bound, server) = crate::metrics::serve(
            addr,
            p.metrics.clone(),
            p.store.clone(),
            Arc::clone(&p.registry),
            shutdown_rx.clone(),
        )
        .await?;
        endpoints.metrics_url = Some(bc_net::http::url(bound, "/metrics"));
        tasks.spawn(async move {
            let _ = server.await;
        });
    }
    // Other replicas on the database: their sessions, and verbs for nodes connected here.
    if let Some(notices) = p.store.listen(crate::cluster::CHANNEL) {
        let events = p.registry.announce();
        let (cluster, commands) = (Arc::clone(&p.cluster), p.commands.clone());
        let until = stopped(shutdown_rx.clone());
        tasks.spawn(async move {
            tokio::select! {
                _ = cluster.run(notices, events, commands) => {}
                _ = until => {}
            }
        });
    }
    spawn_gateway(&mut tasks, &cfg, &p, listeners.gateway, shutdown_rx.clone())?;
    let api_state = ApiState {
        core: p.core.clone(),
        api_token: api_token.clone(),
        bundles_dir: cfg.state_dir.join("bundles"),
    };
    spawn_api(&mut tasks, api_state, listeners.api, shutdown_rx.clone());
    spawn_controllers(&mut tasks, &cfg, &p, &shutdown_rx);

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
        store: p.store,
        registry: p.registry,
        api_token,
        shutdown,
        tasks,
        state_dir: cfg.state_dir.clone(),
        _lock: lock,
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
