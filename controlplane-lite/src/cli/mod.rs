//! `bcctl` verbs: `serve`, `dev`, and one operator-client verb per API method (tables by default,
//! the API's JSON with `-o json`).

pub mod bare_metal;
pub mod bench;
pub mod call;
pub mod dev;
pub mod dev_metal;
pub mod follow;
pub mod logs;
pub mod nodes;
pub mod ops;
pub mod remediation;
pub mod render;
pub mod status;
pub mod table;
#[cfg(test)]
mod wire_cases;
#[cfg(test)]
mod wire_tests;

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
    /// The store on a PostgreSQL server instead of the state dir's state.db:
    /// `postgres://USER@HOST:PORT/DATABASE?sslmode=require&sslrootcert=CA.pem`. Replicas on one
    /// database need the same ca.key, ca.crt and bmc-credentials.key in their state dirs. Keep
    /// the password out of the command line: --store-password-file, or BCCTL_STORE in
    /// /etc/default/bcctl. Empty: state.db.
    #[arg(long, env = "BCCTL_STORE")]
    pub store: Option<String>,
    /// A file holding the database password (its first line).
    #[arg(long, env = "BCCTL_STORE_PASSWORD_FILE")]
    pub store_password_file: Option<PathBuf>,
    /// The CA that signed the database server's certificate (PEM), instead of `sslrootcert`.
    #[arg(long, env = "BCCTL_STORE_CA")]
    pub store_ca: Option<PathBuf>,
    /// Database connections of this replica, at most.
    #[arg(long, default_value_t = 16)]
    pub store_max_connections: u32,
    /// How long connecting to the database, or waiting for a free connection, may take before a
    /// request fails with "database unavailable".
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub store_timeout: Duration,
    /// How long the controller lease lasts unless renewed: of several replicas on one database,
    /// the lease holder runs Liveness, NodeLifecycle and the deadlines; another takes over this
    /// long (and a third more) after it dies. Replicas' clocks must agree well within a third of
    /// it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub controller_lease_ttl: Duration,
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
    /// Open gateway connections at most, all addresses together (0: no cap). Past it a new
    /// connection is closed at accept.
    #[arg(long, default_value_t = 50_000)]
    pub gateway_max_connections: usize,
    /// Open gateway connections at most from one source IP address (0: no cap). Nodes behind
    /// one NAT address count together: raise it for a larger NAT'd site.
    #[arg(long, default_value_t = 1024)]
    pub gateway_max_connections_per_address: usize,
    /// Time a gateway connection has to finish its TLS handshake.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub gateway_handshake_timeout: Duration,
    /// Time a gateway connection has, after TLS, to send the HTTP/2 preface and first frame.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub gateway_preface_timeout: Duration,
    /// logs.collect bundles older than this are deleted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "7d")]
    pub bundle_max_age: Duration,
    /// At most this many bundles are kept (the newest).
    #[arg(long, default_value_t = 1000)]
    pub bundle_max_count: usize,
    /// At most this many bytes of bundles are kept (the newest); a larger bundle is refused.
    /// Bytes, or with a K, M, G or T suffix (powers of 1024: `10G`, `512MiB`).
    #[arg(long, value_parser = parse_bytes, default_value = "10G")]
    pub bundle_max_bytes: u64,
    /// An upload is refused before it would leave less than this free on the bundles' file
    /// system. Same units as --bundle-max-bytes.
    #[arg(long, value_parser = parse_bytes, default_value = "1G")]
    pub bundle_min_free_bytes: u64,
    /// How long a site lease lasts without a renewal by its holder's heartbeats; a lapsed lease
    /// goes to a standby site agent of the site.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "15s")]
    pub site_lease_ttl: Duration,
    /// How long an enrollment may wait for its BMC verification (time without a lease holder
    /// included) before the node fails.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub bmc_verify_deadline: Duration,
    /// How often site agents read every BMC's power state (sent in the site assignment).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub power_sync_interval: Duration,
    /// Requests in flight at most per BMC that site agents allow themselves, commands and the
    /// power sync together (sent in the site assignment; BMC session tables are small).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), default_value_t = 4)]
    pub max_requests_per_bmc: u32,
    /// How long after a power-on with PXE a machine may take to ask the site's boot service for
    /// its script before it is powered on again (three power-ons, the last with a persistent
    /// boot override; then it fails NetworkBootNotRequested).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    pub network_boot_timeout: Duration,
}

/// A size: bytes, or a number with `K`, `M`, `G` or `T` (powers of 1024; `KiB`, `MiB`, ... and a
/// trailing `B` accepted too).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(digits);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: expected a number of bytes, e.g. 10G"))?;
    let shift = match unit.trim().trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        other => return Err(format!("{s:?}: unknown unit {other:?} (K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
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
    pub fn config(&self) -> Result<controlplane_lite::server::ServeConfig, String> {
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
        cfg.gateway_limits = controlplane_lite::gateway::listener::Limits {
            max_connections: self.gateway_max_connections,
            max_per_address: self.gateway_max_connections_per_address,
            handshake_timeout: self.gateway_handshake_timeout,
            preface_timeout: self.gateway_preface_timeout,
        };
        cfg.bundle_retention = controlplane_lite::bundle_store::Retention {
            max_age: self.bundle_max_age,
            max_count: self.bundle_max_count,
            max_bytes: self.bundle_max_bytes,
            min_free_bytes: self.bundle_min_free_bytes,
        };
        cfg.bare_metal.lease_ttl = self.site_lease_ttl;
        cfg.bare_metal.verify_deadline = self.bmc_verify_deadline;
        cfg.bare_metal.power_sync_interval = self.power_sync_interval;
        cfg.bare_metal.max_requests_per_bmc = self.max_requests_per_bmc;
        cfg.bare_metal.network_boot_timeout = self.network_boot_timeout;
        cfg.postgres = self.postgres()?;
        cfg.controller_lease_ttl = self.controller_lease_ttl;
        Ok(cfg)
    }

    /// The PostgreSQL options of `--store` and its companions; `None` for state.db.
    fn postgres(&self) -> Result<Option<cpl_store::PostgresOptions>, String> {
        let Some(url) = self
            .store
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            return Ok(None);
        };
        if !cpl_store::is_postgres_url(url) {
            return Err(format!(
                "--store {}: expected postgres://… or postgresql://… (leave it out for state.db)",
                controlplane_lite::server::redacted_url(url)
            ));
        }
        let mut opts = cpl_store::PostgresOptions::new(url);
        opts.ca_file = self.store_ca.clone();
        opts.max_connections = self.store_max_connections;
        opts.connect_timeout = self.store_timeout;
        if let Some(path) = &self.store_password_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--store-password-file {}: {e}", path.display()))?;
            opts.password = Some(text.lines().next().unwrap_or_default().to_owned());
        }
        Ok(Some(opts))
    }
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_in_powers_of_1024() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("10G"), Ok(10 << 30));
        assert_eq!(parse_bytes("512MiB"), Ok(512 << 20));
        assert_eq!(parse_bytes("1KB"), Ok(1024));
        assert!(parse_bytes("1Q").is_err());
        assert!(parse_bytes("G").is_err());
        assert!(parse_bytes("99999999999T").is_err());
    }
}
