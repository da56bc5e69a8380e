//! Operator verbs: one `bcctl` subcommand per API method. Mutations take `--version` (the version
//! you read); without it bcctl reads the node's current version first.

use cpl_core::verbs::Method;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use super::{ClientArgs, Output, render};
use controlplane_lite::client::Client;

/// `bcctl pools|sites|tokens|allocations|commands ...`
#[derive(Debug, Clone, Subcommand)]
pub enum PoolsCommand {
    /// Create a pool.
    Create {
        #[arg(long)]
        name: String,
        /// metal-host | vps-host | provider | metal-dedicated
        #[arg(long)]
        kind: String,
        #[arg(long)]
        site: Option<String>,
        /// bcd | none
        #[arg(long, default_value = "bcd")]
        agent: String,
        #[arg(long)]
        owner_tenant: Option<String>,
        #[command(flatten)]
        profile: ProfileArgs,
        #[command(flatten)]
        acceptance: AcceptanceArgs,
    },
    List,
    Get {
        pool_id: String,
    },
    /// GPU counts per capacity bucket.
    Capacity {
        pool_id: String,
    },
    /// Rename a pool or change its hardware profile.
    Update {
        pool_id: String,
        #[arg(long)]
        version: u64,
        #[arg(long)]
        name: String,
        #[command(flatten)]
        profile: ProfileArgs,
        #[command(flatten)]
        acceptance: AcceptanceArgs,
    },
    Delete {
        pool_id: String,
        #[arg(long)]
        version: u64,
    },
}

/// A pool's hardware profile (`hardwareProfile` in the API): what its nodes must have. The
/// profile is replaced as a whole: on update, give again every key you keep.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileArgs {
    /// GPUs per node (`expectedGpuCount`).
    #[arg(long)]
    pub expected_gpus: Option<u32>,
    /// GPU model as NVML names it, or a part of it (`expectedGpuModel`).
    #[arg(long)]
    pub expected_gpu_model: Option<String>,
    /// Active NVLink links per GPU for diag.nvml's nvlink check, instead of bcd's table by
    /// product; 0: no NVLink expected (`expectedNvlinksPerGpu`).
    #[arg(long)]
    pub expected_nvlinks_per_gpu: Option<u32>,
    /// What a degraded PCIe link does (`hardwareProfile.pcieLinkDegraded`): ignore (report
    /// only, the default) | noSchedule.
    #[arg(long, value_parser = ["ignore", "noSchedule"])]
    pub pcie_link_degraded: Option<String>,
    /// Bare-metal commissioning: installed memory at least this, e.g. `512G` (`minMemoryBytes`).
    #[arg(long, value_parser = super::parse_bytes)]
    pub min_memory: Option<u64>,
    /// Bare-metal commissioning: the CPU model exactly as `/proc/cpuinfo` names it
    /// (`expectedCpuModel`).
    #[arg(long)]
    pub expected_cpu_model: Option<String>,
    /// Bare-metal commissioning: logical CPUs at least this many (`minCpuThreads`).
    #[arg(long)]
    pub min_cpu_threads: Option<u32>,
    /// Bare-metal commissioning: physical NICs with a link up, at least this many
    /// (`minLinkedNics`).
    #[arg(long)]
    pub min_linked_nics: Option<u32>,
}

impl ProfileArgs {
    /// The `hardwareProfile` object (absent keys: null, which the API reads as unset).
    fn json(&self) -> Value {
        json!({
            "expectedGpuCount": self.expected_gpus,
            "expectedGpuModel": self.expected_gpu_model,
            "expectedNvlinksPerGpu": self.expected_nvlinks_per_gpu,
            "pcieLinkDegraded": self.pcie_link_degraded,
            "minMemoryBytes": self.min_memory,
            "expectedCpuModel": self.expected_cpu_model,
            "minCpuThreads": self.min_cpu_threads,
            "minLinkedNics": self.min_linked_nics,
        })
    }
}

/// A pool's acceptance rules (`acceptance` in the API). Without any flag a pool keeps the
/// kind's defaults (create) or its current rules (update); with one, the others take their
/// defaults.
#[derive(Debug, Clone, clap::Args)]
pub struct AcceptanceArgs {
    /// Whether a joining node needs a trusted hardware key (default: yes for metal pools).
    #[arg(long)]
    pub require_trusted_key: Option<bool>,
    /// How long a node may stay adopting before it fails, e.g. `1h` (default 1h).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub acceptance_deadline: Option<Duration>,
    /// Bare metal: how long a machine may stay inspecting (power-on to the ramdisk's first
    /// report), e.g. `30m` (the default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub inspection_deadline: Option<Duration>,
    /// Bare metal: how long a machine may stay commissioning, e.g. `1h` (the default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub commissioning_deadline: Option<Duration>,
    /// Bare metal: whether the site agent powers a ready machine off (default true).
    #[arg(long)]
    pub power_off_when_ready: Option<bool>,
    /// Bare metal: how much of every disk release and retire erase: metadata (partition tables
    /// and signatures, the default) or full (every block).
    #[arg(long)]
    pub cleaning: Option<bc_protocol::commands::clean::CleanMode>,
    /// Bare metal: how long a machine may stay releasing or retiring, e.g. `1h` (the default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub cleaning_deadline: Option<Duration>,
    /// Bare metal: how long a machine may stay deploying, e.g. `1h` (the default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub deploy_deadline: Option<Duration>,
    /// Bare metal: how long a rescue may take to boot and start its SSH server, e.g. `30m`
    /// (the default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub rescue_deadline: Option<Duration>,
}

impl AcceptanceArgs {
    /// The `acceptance` object, `None` when no flag was given.
    fn json(&self) -> Option<Value> {
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs());
        let any = self.require_trusted_key.is_some()
            || self.acceptance_deadline.is_some()
            || self.inspection_deadline.is_some()
            || self.commissioning_deadline.is_some()
            || self.power_off_when_ready.is_some()
            || self.cleaning.is_some()
            || self.cleaning_deadline.is_some()
            || self.deploy_deadline.is_some()
            || self.rescue_deadline.is_some();
        any.then(|| {
            json!({
                "requireTrustedKey": self.require_trusted_key,
                "deadlineSeconds": secs(self.acceptance_deadline),
                "inspectionDeadlineSeconds": secs(self.inspection_deadline),
                "commissioningDeadlineSeconds": secs(self.commissioning_deadline),
                "powerOffWhenReady": self.power_off_when_ready,
                "cleaning": self.cleaning.map(|m| m.as_str()),
                "cleaningDeadlineSeconds": secs(self.cleaning_deadline),
                "deployDeadlineSeconds": secs(self.deploy_deadline),
                "rescueDeadlineSeconds": secs(self.rescue_deadline),
            })
        })
    }
}

/// `bcctl sites ...`
#[derive(Debug, Clone, Subcommand)]
pub enum SitesCommand {
    Create {
        #[arg(long)]
        name: String,
        /// platform | custom
        #[arg(long, default_value = "platform")]
        kind: String,
        #[arg(long)]
        owner_tenant: Option<String>,
    },
    List,
    Get {
        site_id: String,
    },
    /// Rename a site.
    Update {
        site_id: String,
        #[arg(long)]
        version: u64,
        #[arg(long)]
        name: String,
    },
    Delete {
        site_id: String,
        #[arg(long)]
        version: u64,
    },
}

/// `bcctl tokens ...`
#[derive(Debug, Clone, Subcommand)]
pub enum TokensCommand {
    /// Create a join token; prints it once with the CA pin.
    Create {
        #[arg(long)]
        pool: Option<String>,
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
    /// Revoke a token by id.
    Revoke { token_id: String },
}

/// `bcctl allocations ...`
#[derive(Debug, Clone, Subcommand)]
pub enum AllocationsCommand {
    /// Book GPUs on one schedulable node of a pool.
    Create {
        #[arg(long)]
        pool: String,
        #[arg(long)]
        gpus: u32,
        #[arg(long)]
        tenant: Option<String>,
    },
    List {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        active: bool,
    },
    Get {
        allocation_id: String,
    },
    Release {
        allocation_id: String,
    },
}

/// `bcctl commands ...`
#[derive(Debug, Clone, Subcommand)]
pub enum CommandsCommand {
    Get {
        command_id: String,
    },
    List {
        #[arg(long)]
        node: Option<String>,
    },
    Cancel {
        command_id: String,
    },
}

pub(super) fn print(
    args: &ClientArgs,
    v: &Value,
    table: impl FnOnce(&Value) -> String,
) -> anyhow::Result<()> {
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        print!("{}", table(v));
    }
    Ok(())
}

pub(super) fn items(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub(super) async fn version_of(
    client: &Client,
    node_id: &str,
    given: Option<u64>,
) -> anyhow::Result<u64> {
    if let Some(v) = given {
        return Ok(v);
    }
    let n: Value = client
        .call(Method::NodesGet, &json!({"nodeId": node_id}))
        .await?;
    n.get("version")
        .and_then(Value::as_u64)
        .context("nodes.get returned no version")
}

pub(super) async fn mutate(
    args: &ClientArgs,
    client: &Client,
    method: Method,
    node_id: &str,
    version: Option<u64>,
    extra: Value,
) -> anyhow::Result<()> {
    use controlplane_lite::client::ClientError;
    // Without --version the operator means "the node as it is now": a CONFLICT then only says an
    // agent report (Inventory, SpecStatus) moved the version between our read and our write, so
    // read it again. With --version a CONFLICT is the answer the operator asked for.
    const CONFLICT_RETRIES: u32 = 5;
    let mut attempt = 0;
    loop {
        let current = version_of(client, node_id, version).await?;
        let mut body = json!({"nodeId": node_id, "version": current});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        match client.call::<_, Value>(method, &body).await {
            Ok(v) => return print(args, &v, render::object),
            Err(ClientError::Api(e))
                if version.is_none()
                    && e.code == bc_protocol::ErrorCode::Conflict
                    && attempt < CONFLICT_RETRIES =>
            {
                attempt += 1;
                tracing::debug!(
                    node_id,
                    attempt,
                    "version moved under {method}; reading it again"
                );
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) fn parse_arg(kv: &str) -> anyhow::Result<(String, Value)> {
    let Some((k, v)) = kv.split_once('=') else {
        bail!("--arg {kv:?}: expected key=value");
    };
    let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
    Ok((k.to_owned(), value))
}

/// Runs `bcctl pools ...`.
pub async fn pools(args: &ClientArgs, cmd: PoolsCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    let v: Value = match cmd {
        PoolsCommand::Create {
            name,
            kind,
            site,
            agent,
            owner_tenant,
            profile,
            acceptance,
        } => {
            let mut body = json!({"name": name, "kind": kind, "siteId": site, "agent": agent, "ownerTenantId": owner_tenant,
                        "hardwareProfile": profile.json()});
            if let Some(a) = acceptance.json() {
                body["acceptance"] = a;
            }
            c.call(Method::PoolsCreate, &body).await?
        }
        PoolsCommand::List => {
            let v: Value = c.call(Method::PoolsList, &json!({})).await?;
            return print(args, &v, |v| {
                render::list(
                    &items(v, "pools"),
                    &[
                        ("ID", "/id"),
                        ("NAME", "/name"),
                        ("KIND", "/kind"),
                        ("AGENT", "/agent"),
                        ("SITE", "/siteId"),
                        ("OWNER", "/ownerTenantId"),
                        ("VERSION", "/version"),
                    ],
                )
            });
        }
        PoolsCommand::Get { pool_id } => {
            c.call(Method::PoolsGet, &json!({"poolId": pool_id}))
                .await?
        }
        PoolsCommand::Capacity { pool_id } => {
            c.call(Method::PoolsCapacity, &json!({"poolId": pool_id}))
                .await?
        }
        PoolsCommand::Update {
            pool_id,
            version,
            name,
            profile,
            acceptance,
        } => {
            let mut body = json!({"poolId": pool_id, "version": version, "name": name,
                        "hardwareProfile": profile.json()});
            if let Some(a) = acceptance.json() {
                body["acceptance"] = a;
            }
            c.call(Method::PoolsUpdate, &body).await?
        }
        PoolsCommand::Delete { pool_id, version } => {
            c.call(
                Method::PoolsDelete,
                &json!({"poolId": pool_id, "version": version}),
            )
            .await?
        }
    };
    print(args, &v, render::object)
}

/// Runs `bcctl sites ...`.
pub async fn sites(args: &ClientArgs, cmd: SitesCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    let v: Value = match cmd {
        SitesCommand::Create {
            name,
            kind,
            owner_tenant,
        } => {
            c.call(
                Method::SitesCreate,
                &json!({"name": name, "kind": kind, "ownerTenantId": owner_tenant}),
            )
            .await?
        }
        SitesCommand::List => {
            let v: Value = c.call(Method::SitesList, &json!({})).await?;
            return print(args, &v, |v| {
                render::list(
                    &items(v, "sites"),
                    &[
                        ("ID", "/id"),
                        ("NAME", "/name"),
                        ("KIND", "/kind"),
                        ("OWNER", "/ownerTenantId"),
                        ("VERSION", "/version"),
                    ],
                )
            });
        }
        SitesCommand::Get { site_id } => {
            let v: Value = c
                .call(Method::SitesGet, &json!({"siteId": site_id}))
                .await?;
            return print(args, &v, super::bare_metal::site);
        }
        SitesCommand::Update {
            site_id,
            version,
            name,
        } => {
            c.call(
                Method::SitesUpdate,
                &json!({"siteId": site_id, "version": version, "name": name}),
            )
            .await?
        }
        SitesCommand::Delete { site_id, version } => {
            c.call(
                Method::SitesDelete,
                &json!({"siteId": site_id, "version": version}),
            )
            .await?
        }
    };
    print(args, &v, render::object)
}

/// Runs `bcctl tokens ...`.
pub async fn tokens(args: &ClientArgs, cmd: TokensCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    match cmd {
        TokensCommand::Create {
            pool,
            site,
            ttl,
            uses,
            description,
        } => {
            let v: Value = c
                .call(Method::TokensCreate, &json!({"poolId": pool, "siteId": site, "ttlSeconds": ttl.as_secs().max(1), "maxUses": uses, "description": description}))
                .await?;
            print(args, &v, |v| {
                format!(
                    "{}\nJoin a machine:\n  bcd agent --control-plane {} --join-token {} --ca-pin {}\n",
                    render::object(v),
                    render::cell(v.get("controlPlane")),
                    render::cell(v.get("token")),
                    render::cell(v.get("caPin"))
                )
            })
        }
        TokensCommand::List => {
            let v: Value = c.call(Method::TokensList, &json!({})).await?;
            print(args, &v, |v| {
                render::list(
                    &items(v, "tokens"),
                    &[
                        ("ID", "/id"),
                        ("POOL", "/poolId"),
                        ("SITE", "/siteId"),
                        ("EXPIRES", "/expiresAt"),
                        ("USES", "/uses"),
                        ("MAX", "/maxUses"),
                        ("REVOKED", "/revoked"),
                    ],
                )
            })
        }
        TokensCommand::Revoke { token_id } => {
            let v: Value = c
                .call(Method::TokensRevoke, &json!({"tokenId": token_id}))
                .await?;
            print(args, &v, render::object)
        }
    }
}

/// Runs `bcctl allocations ...`.
pub async fn allocations(args: &ClientArgs, cmd: AllocationsCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    let v: Value = match cmd {
        AllocationsCommand::Create { pool, gpus, tenant } => {
            c.call(
                Method::AllocationsCreate,
                &json!({"poolId": pool, "gpus": gpus, "tenantId": tenant}),
            )
            .await?
        }
        AllocationsCommand::List { pool, node, active } => {
            let v: Value = c
                .call(
                    Method::AllocationsList,
                    &json!({"poolId": pool, "nodeId": node, "activeOnly": active}),
                )
                .await?;
            return print(args, &v, |v| {
                render::list(
                    &items(v, "allocations"),
                    &[
                        ("ID", "/id"),
                        ("POOL", "/poolId"),
                        ("NODE", "/nodeId"),
                        ("GPUS", "/gpus"),
                        ("ATOMS", "/atoms"),
                        ("TENANT", "/tenantId"),
                        ("RELEASED", "/releasedAt"),
                    ],
                )
            });
        }
        AllocationsCommand::Get { allocation_id } => {
            c.call(
                Method::AllocationsGet,
                &json!({"allocationId": allocation_id}),
            )
            .await?
        }
        AllocationsCommand::Release { allocation_id } => {
            c.call(
                Method::AllocationsRelease,
                &json!({"allocationId": allocation_id}),
            )
            .await?
        }
    };
    print(args, &v, render::object)
}

/// Runs `bcctl commands ...`.
pub async fn commands(args: &ClientArgs, cmd: CommandsCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    match cmd {
        CommandsCommand::Get { command_id } => {
            let v: Value = c
                .call(Method::CommandsGet, &json!({"commandId": command_id}))
                .await?;
            print(args, &v, render::object)
        }
        CommandsCommand::Cancel { command_id } => {
            let v: Value = c
                .call(Method::CommandsCancel, &json!({"commandId": command_id}))
                .await?;
            print(args, &v, render::object)
        }
        CommandsCommand::List { node } => {
            let v: Value = c
                .call(Method::CommandsList, &json!({"nodeId": node}))
                .await?;
            print(args, &v, |v| {
                render::list(
                    &items(v, "commands"),
                    &[
                        ("ID", "/id"),
                        ("NODE", "/nodeId"),
                        ("NAME", "/name"),
                        ("STATE", "/state"),
                        ("PROGRESS", "/progress"),
                        ("CREATED", "/createdAt"),
                        ("FINISHED", "/finishedAt"),
                    ],
                )
            })
        }
    }
}
