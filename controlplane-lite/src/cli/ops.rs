//! Operator verbs: one `bcctl` subcommand per API method. Mutations take `--version` (the version
//! you read); without it bcctl reads the node's current version first.

use std::time::Duration;

use bc_protocol::{PoolAgent, PoolKind, SiteKind};
use clap::Subcommand;
use cpl_core::text::{Id, Name, Text};
use cpl_core::verbs::{
    AllocationListRequest, AllocationRef, AllocationRequest, CommandRef, CommandsListRequest,
    NewPool, NewSite, NoArgs, PoolDelete, PoolRef, PoolRemediationRequest, PoolUpdate, Request,
    ResumeRemediationRequest, SiteDelete, SiteRef, SiteUpdate, TokenRef, TokensCreateRequest,
};
use cpl_store::{Acceptance, HardwareProfile, LinkDegradedPolicy};
use serde_json::Value;

use super::call::{Call, all_of, items, print, spelled};
use super::{ClientArgs, render};

/// `bcctl pools|sites|tokens|allocations|commands ...`
#[derive(Debug, Clone, Subcommand)]
pub enum PoolsCommand {
    /// Create a pool.
    Create {
        #[arg(long)]
        name: String,
        /// What the pool's machines are; their role and trust follow from it.
        #[arg(long, value_parser = spelled::<PoolKind>(all_of(PoolKind::ALL, PoolKind::as_str)))]
        kind: PoolKind,
        /// The site the pool's machines are in.
        #[arg(long)]
        site: Option<String>,
        /// Whether its machines run bcd.
        #[arg(long, default_value = "bcd", value_parser = spelled::<PoolAgent>(all_of(PoolAgent::ALL, PoolAgent::as_str)))]
        agent: PoolAgent,
        /// The tenant whose pool this is.
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
    /// Set the pool's health remediation policy, as JSON (absent keys take their defaults):
    /// `{"mode": "auto", "maxConcurrent": 4, "maxConcurrentPercent": 10, "maxPerHour": 20,
    /// "drainGraceSeconds": 600, "drain": "evict", "ladders": {"resetGpu": ["resetGpu",
    /// "rebootNode"]}}`; `{}` turns it off.
    SetRemediation {
        pool_id: String,
        #[arg(long)]
        version: u64,
        #[arg(value_parser = super::remediation::parse_policy)]
        policy: cpl_store::RemediationPolicy,
    },
    /// Close the pool's remediation circuit breaker (RemediationPaused): new remediations may
    /// start again, and the hourly limit counts from now.
    ResumeRemediation {
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
    /// only, the default) or noSchedule.
    #[arg(long, value_parser = spelled::<LinkDegradedPolicy>(["ignore", "noSchedule"]))]
    pub pcie_link_degraded: Option<LinkDegradedPolicy>,
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
    /// The `hardwareProfile` (without drivers: the API sets those).
    fn profile(&self) -> HardwareProfile {
        HardwareProfile {
            expected_gpu_count: self.expected_gpus,
            expected_gpu_model: self.expected_gpu_model.clone(),
            expected_nvlinks_per_gpu: self.expected_nvlinks_per_gpu,
            drivers: Default::default(),
            pcie_link_degraded: self.pcie_link_degraded,
            min_memory_bytes: self.min_memory,
            expected_cpu_model: self.expected_cpu_model.clone(),
            min_cpu_threads: self.min_cpu_threads,
            min_linked_nics: self.min_linked_nics,
        }
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
    /// The `acceptance` rules, `None` when no flag was given.
    fn acceptance(&self) -> Option<Acceptance> {
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
        any.then(|| Acceptance {
            require_trusted_key: self.require_trusted_key,
            deadline_seconds: secs(self.acceptance_deadline),
            inspection_deadline_seconds: secs(self.inspection_deadline),
            commissioning_deadline_seconds: secs(self.commissioning_deadline),
            power_off_when_ready: self.power_off_when_ready,
            cleaning: self.cleaning,
            cleaning_deadline_seconds: secs(self.cleaning_deadline),
            deploy_deadline_seconds: secs(self.deploy_deadline),
            rescue_deadline_seconds: secs(self.rescue_deadline),
        })
    }
}

/// `bcctl sites ...`
#[derive(Debug, Clone, Subcommand)]
pub enum SitesCommand {
    Create {
        #[arg(long)]
        name: String,
        /// The platform's own site, or a tenant's `custom` one (its nodes are tenant-owned).
        #[arg(long, default_value = "platform", value_parser = spelled::<SiteKind>(all_of(SiteKind::ALL, SiteKind::as_str)))]
        kind: SiteKind,
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
        /// How many joins it allows (default: unlimited for a pool token, 1 for a site token).
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
        /// The workload the allocation belongs to (one id for a job's allocations on several
        /// nodes), so a fault of the workload is told from a fault of a node.
        #[arg(long)]
        workload: Option<String>,
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

/// Runs `bcctl pools ...`.
pub async fn pools(args: &ClientArgs, cmd: PoolsCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        PoolsCommand::List => |v| {
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
        },
        _ => render::object,
    };
    let v = pools_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl pools <cmd>` sends.
pub(crate) fn pools_call(cmd: PoolsCommand) -> Call {
    Call::once(match cmd {
        PoolsCommand::Create {
            name,
            kind,
            site,
            agent,
            owner_tenant,
            profile,
            acceptance,
        } => Request::PoolsCreate(NewPool {
            name: Name::unchecked(name),
            kind,
            agent,
            site_id: site.map(Id::unchecked),
            owner_tenant_id: owner_tenant.map(Id::unchecked),
            hardware_profile: profile.profile(),
            acceptance: acceptance.acceptance().unwrap_or_default(),
        }),
        PoolsCommand::List => Request::PoolsList(NoArgs {}),
        PoolsCommand::Get { pool_id } => Request::PoolsGet(pool_ref(pool_id)),
        PoolsCommand::Capacity { pool_id } => Request::PoolsCapacity(pool_ref(pool_id)),
        PoolsCommand::Update {
            pool_id,
            version,
            name,
            profile,
            acceptance,
        } => Request::PoolsUpdate(PoolUpdate {
            pool_id: Id::unchecked(pool_id),
            version,
            name: Name::unchecked(name),
            hardware_profile: profile.profile(),
            acceptance: acceptance.acceptance(),
        }),
        PoolsCommand::Delete { pool_id, version } => Request::PoolsDelete(PoolDelete {
            pool_id: Id::unchecked(pool_id),
            version,
        }),
        PoolsCommand::SetRemediation {
            pool_id,
            version,
            policy,
        } => Request::PoolsSetRemediation(PoolRemediationRequest {
            pool_id: Id::unchecked(pool_id),
            version,
            remediation: policy,
        }),
        PoolsCommand::ResumeRemediation { pool_id, version } => {
            Request::PoolsResumeRemediation(ResumeRemediationRequest {
                pool_id: Id::unchecked(pool_id),
                version,
            })
        }
    })
}

fn pool_ref(pool_id: String) -> PoolRef {
    PoolRef {
        pool_id: Id::unchecked(pool_id),
    }
}

/// Runs `bcctl sites ...`.
pub async fn sites(args: &ClientArgs, cmd: SitesCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        SitesCommand::List => |v| {
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
        },
        SitesCommand::Get { .. } => super::bare_metal::site,
        _ => render::object,
    };
    let v = sites_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl sites <cmd>` sends.
pub(crate) fn sites_call(cmd: SitesCommand) -> Call {
    Call::once(match cmd {
        SitesCommand::Create {
            name,
            kind,
            owner_tenant,
        } => Request::SitesCreate(NewSite {
            name: Name::unchecked(name),
            kind,
            owner_tenant_id: owner_tenant.map(Id::unchecked),
        }),
        SitesCommand::List => Request::SitesList(NoArgs {}),
        SitesCommand::Get { site_id } => Request::SitesGet(SiteRef {
            site_id: Id::unchecked(site_id),
        }),
        SitesCommand::Update {
            site_id,
            version,
            name,
        } => Request::SitesUpdate(SiteUpdate {
            site_id: Id::unchecked(site_id),
            version,
            name: Name::unchecked(name),
        }),
        SitesCommand::Delete { site_id, version } => Request::SitesDelete(SiteDelete {
            site_id: Id::unchecked(site_id),
            version,
        }),
    })
}

/// Runs `bcctl tokens ...`.
pub async fn tokens(args: &ClientArgs, cmd: TokensCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        TokensCommand::Create { .. } => |v| {
            format!(
                "{}\nJoin a machine:\n  bcd agent --control-plane {} --join-token {} --ca-pin {}\n",
                render::object(v),
                render::cell(v.get("controlPlane")),
                render::cell(v.get("token")),
                render::cell(v.get("caPin"))
            )
        },
        TokensCommand::List => |v| {
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
        },
        TokensCommand::Revoke { .. } => render::object,
    };
    let v = tokens_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl tokens <cmd>` sends.
pub(crate) fn tokens_call(cmd: TokensCommand) -> Call {
    Call::once(match cmd {
        TokensCommand::Create {
            pool,
            site,
            ttl,
            uses,
            description,
        } => Request::TokensCreate(TokensCreateRequest {
            pool_id: pool.map(Id::unchecked),
            site_id: site.map(Id::unchecked),
            ttl_seconds: Some(ttl.as_secs().max(1)),
            max_uses: uses,
            description: description.map(Text::unchecked),
        }),
        TokensCommand::List => Request::TokensList(NoArgs {}),
        TokensCommand::Revoke { token_id } => Request::TokensRevoke(TokenRef {
            token_id: Id::unchecked(token_id),
        }),
    })
}

/// Runs `bcctl allocations ...`.
pub async fn allocations(args: &ClientArgs, cmd: AllocationsCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        AllocationsCommand::List { .. } => |v| {
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
        },
        _ => render::object,
    };
    let v = allocations_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl allocations <cmd>` sends.
pub(crate) fn allocations_call(cmd: AllocationsCommand) -> Call {
    let allocation_ref = |id: String| AllocationRef {
        allocation_id: Id::unchecked(id),
    };
    Call::once(match cmd {
        AllocationsCommand::Create {
            pool,
            gpus,
            tenant,
            workload,
        } => Request::AllocationsCreate(AllocationRequest {
            pool_id: Id::unchecked(pool),
            gpus,
            tenant_id: tenant.map(Id::unchecked),
            workload_id: workload.map(Id::unchecked),
        }),
        AllocationsCommand::List { pool, node, active } => {
            Request::AllocationsList(AllocationListRequest {
                pool_id: pool.map(Id::unchecked),
                node_id: node.map(Id::unchecked),
                active_only: active,
            })
        }
        AllocationsCommand::Get { allocation_id } => {
            Request::AllocationsGet(allocation_ref(allocation_id))
        }
        AllocationsCommand::Release { allocation_id } => {
            Request::AllocationsRelease(allocation_ref(allocation_id))
        }
    })
}

/// Runs `bcctl commands ...`.
pub async fn commands(args: &ClientArgs, cmd: CommandsCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        CommandsCommand::List { .. } => |v| {
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
        },
        _ => render::object,
    };
    let v = commands_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl commands <cmd>` sends.
pub(crate) fn commands_call(cmd: CommandsCommand) -> Call {
    let command_ref = |id: String| CommandRef {
        command_id: Id::unchecked(id),
    };
    Call::once(match cmd {
        CommandsCommand::Get { command_id } => Request::CommandsGet(command_ref(command_id)),
        CommandsCommand::Cancel { command_id } => Request::CommandsCancel(command_ref(command_id)),
        CommandsCommand::List { node } => Request::CommandsList(CommandsListRequest {
            node_id: node.map(Id::unchecked),
            limit: None,
        }),
    })
}
