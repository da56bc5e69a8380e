//! `bcctl` verbs: `serve`, `dev`, and one operator-client verb per API method (tables by default,
//! the API's JSON with `-o json`).

pub mod bench;
pub mod dev;
pub mod logs;
pub mod nodes;
pub mod ops;
pub mod render;
pub mod table;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use controlplane_lite::client::{Client, ClientError};

/// Default state dir of `bcctl serve`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/bcctl";

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Where the operator API is.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Operator API URL, e.g. `http://127.0.0.1:7080`. Default: from the state dir's endpoints.json.
    #[arg(long, env = "BCCTL_API", global = true)]
    pub api: Option<String>,
    /// Operator bearer token. Default: the state dir's api-token file.
    #[arg(long, env = "BCCTL_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// State dir of the control plane (to find endpoints.json and api-token).
    #[arg(long, env = "BCCTL_STATE_DIR", default_value = DEFAULT_STATE_DIR, global = true)]
    pub state_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub output: Output,
}

impl ClientArgs {
    /// The client these flags describe.
    pub fn client(&self) -> Result<Client, ClientError> {
        Client::discover(self.api.clone(), self.token.clone(), &self.state_dir)
    }
}

/// `bcctl serve` flags.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Where the store, CA and API token live.
    #[arg(long, env = "BCCTL_STATE_DIR", default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Gateway address (gRPC over TLS) for agents. Port 0 picks a free port.
    #[arg(long, default_value = "0.0.0.0:7443")]
    pub listen: SocketAddr,
    /// Operator API address (HTTP). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:7080")]
    pub api_listen: SocketAddr,
    /// Extra DNS names or IPs for the gateway certificate (repeatable).
    #[arg(long = "san")]
    pub sans: Vec<String>,
    /// URL agents should use, when it differs from the listen address.
    #[arg(long)]
    pub advertise_url: Option<String>,
    /// Trust domain in node certificates' SPIFFE URIs.
    #[arg(long, default_value = "bc.local")]
    pub trust_domain: String,
    /// Heartbeat interval told to agents.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub heartbeat_interval: Duration,
    /// Silence after which a node is unreachable.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "40s")]
    pub unreachable_after: Duration,
    /// Further silence after which an unreachable node is lost.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub lost_after: Duration,
    /// Lifetime of node certificates.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "24h")]
    pub node_cert_ttl: Duration,
    /// Join attempts allowed per source address per minute (0: no limit).
    #[arg(long, default_value_t = 60)]
    pub join_attempts_per_minute: u32,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (e.g. `127.0.0.1:9464`; port 0 picks
    /// one, written to endpoints.json as `metricsUrl`). Off unless given.
    /// An empty value (`BCCTL_METRICS_LISTEN=` in /etc/default/bcctl) means off.
    #[arg(long, env = "BCCTL_METRICS_LISTEN", value_parser = parse_optional_addr)]
    pub metrics_listen: Option<OptionalAddr>,
    /// Initialise the state dir: a new CA, an empty store, an API token. Only a dir that was
    /// never initialised; without this flag only an empty (or absent) one is. An initialised dir
    /// with a missing or broken ca.crt, ca.key or state.db is never re-initialised: the start is
    /// refused naming the file.
    #[arg(long)]
    pub init: bool,
}

/// A listen address that may be given empty (off), as environment files often leave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalAddr(pub Option<SocketAddr>);

fn parse_optional_addr(s: &str) -> Result<OptionalAddr, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(OptionalAddr(None));
    }
    s.parse()
        .map(|a| OptionalAddr(Some(a)))
        .map_err(|e| format!("{e}: expected IP:PORT, e.g. 127.0.0.1:9464"))
}

impl ServeArgs {
    /// The server configuration these flags describe.
    pub fn config(&self) -> controlplane_lite::server::ServeConfig {
        let mut cfg = controlplane_lite::server::ServeConfig::new(
            self.state_dir.clone(),
            self.listen,
            self.api_listen,
        );
        cfg.server_names = self.sans.clone();
        cfg.advertise_url = self.advertise_url.clone();
        cfg.trust_domain = self.trust_domain.clone();
        cfg.heartbeat_interval = self.heartbeat_interval;
        cfg.liveness.unreachable_after = self.unreachable_after;
        cfg.liveness.lost_after = self.lost_after;
        cfg.node_cert_ttl = self.node_cert_ttl;
        cfg.join_attempts_per_minute = self.join_attempts_per_minute;
        cfg.metrics_listen = self.metrics_listen.and_then(|a| a.0);
        if self.init {
            cfg.init = controlplane_lite::state_dir::Init::Explicit;
        }
        cfg
    }
}
