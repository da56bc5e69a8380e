//! `bcctl` verbs: `serve`, `dev`, and the operator client verbs (`nodes`, `tokens`).

pub mod dev;
pub mod table;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use controlplane_lite::api::detail::NodeDetail;
use controlplane_lite::api::handlers::{
    EventsResponse, NodesListResponse, TokensCreateResponse, TokensListResponse,
};
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
    fn client(&self) -> Result<Client, ClientError> {
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
        cfg
    }
}

/// `bcctl nodes ...`
#[derive(Debug, Clone, Subcommand)]
pub enum NodesCommand {
    /// List nodes.
    List {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        provision_state: Option<bc_protocol::ProvisionState>,
        #[arg(long)]
        connectivity: Option<bc_protocol::Connectivity>,
    },
    /// Show one node (NodeDetail).
    Get { node_id: String },
    /// Show a node's event log.
    Events { node_id: String },
}

/// `bcctl tokens ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TokensCommand {
    /// Create a join token; prints it once with the CA pin.
    Create {
        /// Bind the token to a pool.
        #[arg(long)]
        pool: Option<String>,
        /// Bind the token to a site.
        #[arg(long)]
        site: Option<String>,
        /// Lifetime, e.g. `1h`, `30m`.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
        ttl: Duration,
        /// How many joins it allows (default: unlimited).
        #[arg(long)]
        uses: Option<u64>,
        #[arg(long)]
        description: Option<String>,
    },
    /// List tokens (never their secrets).
    List,
}

fn dash(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| "-".to_owned())
}

/// Renders NodeDetail as key/value lines.
pub fn node_detail_text(n: &NodeDetail) -> String {
    let conditions = if n.conditions.is_empty() {
        "-".to_owned()
    } else {
        n.conditions
            .iter()
            .map(|c| format!("{}={} ({})", c.type_, c.status, c.reason))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut pairs = vec![
        ("id", n.id.clone()),
        ("siteId", dash(&n.site_id)),
        ("poolId", dash(&n.pool_id)),
        ("role", n.role.to_string()),
        ("trust", n.trust.to_string()),
        ("provisionState", n.provision_state.to_string()),
        ("maintenance", n.maintenance.to_string()),
        ("cordoned", n.cordoned.to_string()),
        ("connectivity", n.connectivity.to_string()),
        (
            "noScheduleReasons",
            if n.no_schedule_reasons.is_empty() {
                "-".into()
            } else {
                n.no_schedule_reasons.join(", ")
            },
        ),
        ("conditions", conditions),
        ("hardwareKeyTrusted", n.hardware_key_trusted.to_string()),
        ("generation", n.generation.to_string()),
        ("observedGeneration", n.observed_generation.to_string()),
        ("identityGeneration", n.identity_generation.to_string()),
        ("version", n.version.to_string()),
        ("session.epoch", n.session.epoch.to_string()),
        ("session.gatewayId", dash(&n.session.gateway_id)),
        ("session.connectedAt", dash(&n.session.connected_at)),
        ("session.disconnectedAt", dash(&n.session.disconnected_at)),
        ("session.lastSeen", dash(&n.session.last_seen)),
    ];
    if let Some(inv) = &n.inventory {
        pairs.push(("hostname", dash(&inv.hostname)));
        pairs.push((
            "cpu",
            format!(
                "{} ({} threads)",
                dash(&inv.cpu_model),
                inv.cpu_threads
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "?".into())
            ),
        ));
        pairs.push((
            "memory",
            inv.memory_bytes
                .map(|b| format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "-".into()),
        ));
        let nics = inv
            .nics
            .iter()
            .map(|n| format!("{} {}", n.name, n.mac.as_deref().unwrap_or("-")))
            .collect::<Vec<_>>()
            .join(", ");
        pairs.push(("nics", if nics.is_empty() { "-".into() } else { nics }));
        pairs.push(("kernel", dash(&inv.kernel)));
    }
    table::render_kv(&pairs)
}

fn print_json<T: serde::Serialize>(v: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// Runs `bcctl nodes ...`.
pub async fn nodes(args: &ClientArgs, cmd: NodesCommand) -> anyhow::Result<()> {
    let client = args.client()?;
    match cmd {
        NodesCommand::List {
            pool,
            provision_state,
            connectivity,
        } => {
            let resp: NodesListResponse = client
                .call(
                    "nodes.list",
                    &serde_json::json!({"poolId": pool, "provisionState": provision_state, "connectivity": connectivity}),
                )
                .await?;
            if args.output == Output::Json {
                return print_json(&resp);
            }
            let rows: Vec<Vec<String>> = resp
                .nodes
                .iter()
                .map(|n| {
                    vec![
                        n.id.clone(),
                        n.inventory
                            .as_ref()
                            .and_then(|i| i.hostname.clone())
                            .unwrap_or_else(|| "-".into()),
                        n.role.to_string(),
                        n.provision_state.to_string(),
                        n.connectivity.to_string(),
                        if n.cordoned {
                            "yes".into()
                        } else {
                            "no".into()
                        },
                        format!("{}/{}", n.observed_generation, n.generation),
                        if n.no_schedule_reasons.is_empty() {
                            "-".into()
                        } else {
                            n.no_schedule_reasons.join(",")
                        },
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(
                    &[
                        "ID",
                        "HOSTNAME",
                        "ROLE",
                        "PROVISION",
                        "CONNECTIVITY",
                        "CORDONED",
                        "GEN",
                        "NOSCHEDULE"
                    ],
                    &rows
                )
            );
        }
        NodesCommand::Get { node_id } => {
            let n: NodeDetail = client
                .call("nodes.get", &serde_json::json!({"nodeId": node_id}))
                .await?;
            if args.output == Output::Json {
                return print_json(&n);
            }
            print!("{}", node_detail_text(&n));
        }
        NodesCommand::Events { node_id } => {
            let r: EventsResponse = client
                .call("nodes.events", &serde_json::json!({"nodeId": node_id}))
                .await?;
            if args.output == Output::Json {
                return print_json(&r);
            }
            let rows: Vec<Vec<String>> = r
                .events
                .iter()
                .map(|e| {
                    vec![
                        e.at.clone(),
                        e.kind.clone(),
                        dash(&e.from),
                        dash(&e.to),
                        e.actor.clone(),
                        e.message.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(&["AT", "WHAT", "FROM", "TO", "WHO", "MESSAGE"], &rows)
            );
        }
    }
    Ok(())
}

/// Runs `bcctl tokens ...`.
pub async fn tokens(args: &ClientArgs, cmd: TokensCommand) -> anyhow::Result<()> {
    let client = args.client()?;
    match cmd {
        TokensCommand::Create {
            pool,
            site,
            ttl,
            uses,
            description,
        } => {
            let r: TokensCreateResponse = client
                .call(
                    "tokens.create",
                    &serde_json::json!({"poolId": pool, "siteId": site, "ttlSeconds": ttl.as_secs().max(1), "maxUses": uses, "description": description}),
                )
                .await?;
            if args.output == Output::Json {
                return print_json(&r);
            }
            print!(
                "{}",
                table::render_kv(&[
                    ("token", r.token.clone()),
                    ("caPin", r.ca_pin.clone()),
                    ("controlPlane", r.control_plane.clone()),
                    ("expiresAt", r.expires_at.clone()),
                    (
                        "maxUses",
                        r.max_uses
                            .map(|u| u.to_string())
                            .unwrap_or_else(|| "unlimited".into())
                    ),
                ])
            );
            println!(
                "\nJoin a machine:\n  bcd agent --control-plane {} --join-token {} --ca-pin {}",
                r.control_plane, r.token, r.ca_pin
            );
        }
        TokensCommand::List => {
            let r: TokensListResponse = client.call("tokens.list", &serde_json::json!({})).await?;
            if args.output == Output::Json {
                return print_json(&r);
            }
            let s = |v: &serde_json::Value, k: &str| match v.get(k) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Null) | None => "-".into(),
                Some(other) => other.to_string(),
            };
            let rows: Vec<Vec<String>> = r
                .tokens
                .iter()
                .map(|t| {
                    vec![
                        s(t, "id"),
                        s(t, "poolId"),
                        s(t, "expiresAt"),
                        s(t, "uses"),
                        s(t, "maxUses"),
                        s(t, "revoked"),
                    ]
                })
                .collect();
            print!(
                "{}",
                table::render(&["ID", "POOL", "EXPIRES", "USES", "MAX", "REVOKED"], &rows)
            );
        }
    }
    Ok(())
}
