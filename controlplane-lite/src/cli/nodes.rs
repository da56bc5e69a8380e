//! `bcctl nodes ...`: the node verbs, `nodes run` (commands) and `nodes logs` (bundles).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, bail};
use bc_protocol::{Connectivity, ProvisionState};
use clap::Subcommand;
use cpl_core::text::{Id, Key, ShortText, Text};
use cpl_core::verbs::{
    ApproveRejoinRequest, CommandsCreateRequest, LeaseRequest, MaintenanceRequest, MoveRequest,
    NodeFilter, NodeRef, RemoveLabelsRequest, Request, SetLabelsRequest, SetRemediationRequest,
    SpecRequest, TaintRequest, UntaintRequest,
};
use serde_json::Value;

use super::call::{Call, all_of, items, print, spelled};
use super::{ClientArgs, render};

/// `bcctl nodes ...`
#[derive(Debug, Clone, Subcommand)]
pub enum NodesCommand {
    /// List nodes.
    List {
        /// Only nodes of this pool.
        #[arg(long)]
        pool: Option<String>,
        /// Only nodes in this provisionState.
        #[arg(long, value_parser = spelled::<ProvisionState>(all_of(ProvisionState::ALL, ProvisionState::as_str)))]
        provision_state: Option<ProvisionState>,
        /// Only nodes with this connectivity.
        #[arg(long, value_parser = spelled::<Connectivity>(all_of(Connectivity::ALL, Connectivity::as_str)))]
        connectivity: Option<Connectivity>,
        /// `true`: only schedulable nodes; `false`: only unschedulable ones.
        #[arg(long)]
        schedulable: Option<bool>,
        /// Only nodes with this label (`key=value`); repeatable, all must match.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// Only nodes whose inventory names this firmware: `<component>=<version>`, the
        /// component one of bios, bmc, nvme, nic, infiniband, gpu (e.g. `--firmware nvme=1B2QEXP7`).
        #[arg(long)]
        firmware: Option<String>,
    },
    /// Show one node (NodeDetail).
    Get {
        /// The node (`node_…`).
        node_id: String,
    },
    /// Show a node's event log.
    Events {
        /// The node (`node_…`).
        node_id: String,
    },
    /// Cordon: no new work.
    Cordon {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Uncordon.
    Uncordon {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Cordon plus `draining` until the node's allocations are released.
    Drain {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Add an operator taint (`taint:<key>` in noScheduleReasons).
    Taint {
        /// The node (`node_…`).
        node_id: String,
        /// The taint's key (`taint:<key>` in noScheduleReasons).
        key: String,
        /// The taint's value.
        #[arg(long, default_value = "")]
        value: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Add or replace labels (`key=value`, repeatable); other labels stay.
    SetLabels {
        /// The node (`node_…`).
        node_id: String,
        /// A label `key=value` (the value may be empty); repeatable.
        #[arg(required = true)]
        labels: Vec<String>,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Remove labels by key.
    RemoveLabels {
        /// The node (`node_…`).
        node_id: String,
        /// A label key to remove; repeatable.
        #[arg(required = true)]
        keys: Vec<String>,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Remove a taint.
    Untaint {
        /// The node (`node_…`).
        node_id: String,
        /// The taint's key.
        key: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Accept a node by hand (`adopting → adopted`).
    Adopt {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Recover a failed node back to where it failed from.
    Recover {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Retire a node for good: its identity ends; a node without a BMC goes on to `retired` at
    /// once, a machine enrolled through its BMC is cleaned in the ramdisk first.
    Retire {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Abort a bare-metal workflow in flight: the node fails from its state (maintenance on),
    /// its command in flight is cancelled and the machine powered off; `recover` starts over.
    Abort {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Turn maintenance on or off.
    SetMaintenance {
        /// The node (`node_…`).
        node_id: String,
        /// `true` or `false`.
        #[arg(action = clap::ArgAction::Set)]
        maintenance: bool,
        /// Why (shown as maintenanceReason).
        #[arg(long)]
        reason: Option<String>,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Suspend health remediation on the node (`true`: its open remediation is cancelled and
    /// the cordon it set lifted; nothing new starts) or lift the suspension (`false`).
    SetRemediation {
        /// The node (`node_…`).
        node_id: String,
        /// `true` (suspended) or `false`.
        #[arg(action = clap::ArgAction::Set)]
        suspended: bool,
        /// Why (shown by `bcctl remediations get`).
        #[arg(long)]
        reason: Option<String>,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Revoke the node's identity (identityGeneration + 1; its certificates stop working).
    RevokeIdentity {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Delete the node.
    Delete {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Replace the node's desired spec (generation + 1). JSON inline or `@file`.
    UpdateSpec {
        /// The node (`node_…`).
        node_id: String,
        /// The NodeSpec: JSON inline, or `@FILE`.
        spec: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Start a dedicated-root lease (trust becomes tenant-controlled).
    StartDedicatedRoot {
        /// The node (`node_…`).
        node_id: String,
        /// The tenant that holds the lease.
        #[arg(long)]
        tenant: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// End the dedicated-root lease.
    EndDedicatedRoot {
        /// The node (`node_…`).
        node_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Approve a machine's pending re-join in place (`nodes get` shows the request; the agent's
    /// log names it too). The machine joins at its next attempt, without a new token.
    ApproveRejoin {
        /// The node (`node_…`).
        node_id: String,
        /// The request id (`rejoin_…`).
        request_id: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Move the node to another pool (role, trust, owner, adapter and drivers follow the pool).
    Move {
        /// The node (`node_…`).
        node_id: String,
        /// The pool the node moves to.
        #[arg(long)]
        pool: String,
        /// The node's version you read (stale: CONFLICT); default: its current one.
        #[arg(long)]
        version: Option<u64>,
    },
    /// Run a command on the node (inventory.refresh, diag.nvml, logs.collect, gpu.reset, node.reboot).
    Run {
        /// The node (`node_…`).
        node_id: String,
        /// The command's name, e.g. `diag.nvml`.
        command: String,
        /// Argument `key=value` (value parsed as JSON when it is JSON, else a string); repeatable.
        #[arg(long = "arg")]
        args: Vec<String>,
        /// Wait for the result, showing progress.
        #[arg(long)]
        wait: bool,
        /// Deadline of the command.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
        timeout: Duration,
    },
    /// Download a logs.collect bundle (default: the node's newest succeeded one).
    Logs {
        /// The node (`node_…`).
        node_id: String,
        /// The logs.collect command id.
        #[arg(long)]
        command: Option<String>,
        /// Where to write the `.tar.gz` (`-o` is the output format).
        #[arg(short = 'f', long = "file")]
        file: std::path::PathBuf,
    },
    /// Bare metal: enroll, power, boot-device, update-bmc-credentials.
    #[command(flatten)]
    BareMetal(super::bare_metal::BareMetalCommand),
}

/// Runs `bcctl nodes ...`.
pub async fn nodes(args: &ClientArgs, cmd: NodesCommand) -> anyhow::Result<()> {
    let c = args.client()?;
    let table: fn(&Value) -> String = match &cmd {
        NodesCommand::Logs {
            node_id,
            command,
            file,
        } => return super::logs::download(args, node_id, command.clone(), file).await,
        NodesCommand::Run { wait: true, .. } => {
            let created = call(cmd)?.send(&c).await?;
            let id = created
                .get("id")
                .and_then(Value::as_str)
                .context("commands.create returned no id")?;
            return super::follow::follow(args, &c, id).await;
        }
        NodesCommand::List { .. } => |v| render::nodes(&items(v, "nodes")),
        NodesCommand::Events { .. } => events_table,
        _ => render::object,
    };
    let v = call(cmd)?.send(&c).await?;
    print(args, &v, table)
}

/// What `bcctl nodes <cmd>` sends (`nodes logs` downloads a bundle instead: not a request).
pub(crate) fn call(cmd: NodesCommand) -> anyhow::Result<Call> {
    use NodesCommand as N;
    let once = Call::once;
    Ok(match cmd {
        N::List {
            pool,
            provision_state,
            connectivity,
            schedulable,
            labels,
            firmware,
        } => once(Request::NodesList(NodeFilter {
            pool_id: pool.map(Id::unchecked),
            provision_state,
            connectivity,
            schedulable,
            labels: (!labels.is_empty())
                .then(|| label_map(&labels))
                .transpose()?,
            firmware: firmware.map(ShortText::unchecked),
        })),
        N::Get { node_id } => once(Request::NodesGet(node_ref(node_id))),
        N::Events { node_id } => once(Request::NodesEvents(node_ref(node_id))),
        N::Cordon { node_id, version } => Call::node_verb(node_id, version, Request::NodesCordon),
        N::Uncordon { node_id, version } => {
            Call::node_verb(node_id, version, Request::NodesUncordon)
        }
        N::Drain { node_id, version } => Call::node_verb(node_id, version, Request::NodesDrain),
        N::Adopt { node_id, version } => Call::node_verb(node_id, version, Request::NodesAdopt),
        N::Recover { node_id, version } => Call::node_verb(node_id, version, Request::NodesRecover),
        N::Retire { node_id, version } => Call::node_verb(node_id, version, Request::NodesRetire),
        N::Abort { node_id, version } => Call::node_verb(node_id, version, Request::NodesAbort),
        N::RevokeIdentity { node_id, version } => {
            Call::node_verb(node_id, version, Request::NodesRevokeIdentity)
        }
        N::Delete { node_id, version } => Call::node_verb(node_id, version, Request::NodesDelete),
        N::EndDedicatedRoot { node_id, version } => {
            Call::node_verb(node_id, version, Request::NodesEndDedicatedRoot)
        }
        N::Taint {
            node_id,
            key,
            value,
            version,
        } => {
            let (key, value) = (Key::unchecked(key), ShortText::unchecked(value));
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesTaint(TaintRequest {
                    node_id,
                    version,
                    key: key.clone(),
                    value: value.clone(),
                })
            })
        }
        N::Untaint {
            node_id,
            key,
            version,
        } => {
            let key = Key::unchecked(key);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesUntaint(UntaintRequest {
                    node_id,
                    version,
                    key: key.clone(),
                })
            })
        }
        N::SetLabels {
            node_id,
            labels,
            version,
        } => {
            let labels = label_map(&labels)?;
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesSetLabels(SetLabelsRequest {
                    node_id,
                    version,
                    labels: labels.clone(),
                })
            })
        }
        N::RemoveLabels {
            node_id,
            keys,
            version,
        } => {
            let keys: Vec<Key> = keys.into_iter().map(Key::unchecked).collect();
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesRemoveLabels(RemoveLabelsRequest {
                    node_id,
                    version,
                    keys: keys.clone(),
                })
            })
        }
        N::SetMaintenance {
            node_id,
            maintenance,
            reason,
            version,
        } => {
            let reason = reason.map(Text::unchecked);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesSetMaintenance(MaintenanceRequest {
                    node_id,
                    version,
                    maintenance,
                    reason: reason.clone(),
                })
            })
        }
        N::SetRemediation {
            node_id,
            suspended,
            reason,
            version,
        } => {
            let reason = reason.map(Text::unchecked);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesSetRemediation(SetRemediationRequest {
                    node_id,
                    version,
                    suspended,
                    reason: reason.clone(),
                })
            })
        }
        N::UpdateSpec {
            node_id,
            spec,
            version,
        } => {
            let spec = read_spec(spec)?;
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesUpdateSpec(SpecRequest {
                    node_id,
                    version,
                    spec: spec.clone(),
                })
            })
        }
        N::StartDedicatedRoot {
            node_id,
            tenant,
            version,
        } => {
            let tenant_id = Id::unchecked(tenant);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesStartDedicatedRoot(LeaseRequest {
                    node_id,
                    version,
                    tenant_id: tenant_id.clone(),
                })
            })
        }
        N::ApproveRejoin {
            node_id,
            request_id,
            version,
        } => {
            let request_id = Id::unchecked(request_id);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesApproveRejoin(ApproveRejoinRequest {
                    node_id,
                    version,
                    request_id: request_id.clone(),
                })
            })
        }
        N::Move {
            node_id,
            pool,
            version,
        } => {
            let pool_id = Id::unchecked(pool);
            Call::mutation(node_id, version, move |node_id, version| {
                Request::NodesMove(MoveRequest {
                    node_id,
                    version,
                    pool_id: pool_id.clone(),
                })
            })
        }
        N::Run {
            node_id,
            command,
            args,
            timeout,
            wait: _,
        } => {
            let mut a = serde_json::Map::new();
            for kv in &args {
                let (k, v) = parse_arg(kv)?;
                a.insert(k, v);
            }
            once(Request::CommandsCreate(CommandsCreateRequest {
                node_id: Id::unchecked(node_id),
                name: Id::unchecked(command),
                args: Some(Value::Object(a)),
                timeout_seconds: Some(timeout.as_secs().max(1)),
            }))
        }
        N::BareMetal(cmd) => super::bare_metal::call(cmd)?,
        N::Logs { .. } => bail!("`nodes logs` downloads a bundle; it is not one request"),
    })
}

/// A request naming `node_id`.
fn node_ref(node_id: String) -> NodeRef {
    NodeRef {
        node_id: Id::unchecked(node_id),
    }
}

/// `bcctl nodes events`: the node's event log as a table.
fn events_table(v: &Value) -> String {
    render::list(
        &items(v, "events"),
        &[
            ("AT", "/at"),
            ("WHAT", "/kind"),
            ("FROM", "/from"),
            ("TO", "/to"),
            ("WHO", "/actor"),
            ("MESSAGE", "/message"),
        ],
    )
}

/// `key=value` arguments as labels (the value may be empty: `key=`; a key given twice keeps its
/// last value).
fn label_map(pairs: &[String]) -> anyhow::Result<BTreeMap<Key, ShortText>> {
    pairs
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("label {kv:?}: expected key=value"))?;
            Ok((Key::unchecked(k), ShortText::unchecked(v)))
        })
        .collect()
}

/// A `--arg key=value` of `nodes run`: the value parsed as JSON when it is JSON, else a string.
fn parse_arg(kv: &str) -> anyhow::Result<(String, Value)> {
    let Some((k, v)) = kv.split_once('=') else {
        bail!("--arg {kv:?}: expected key=value");
    };
    let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_owned()));
    Ok((k.to_owned(), value))
}

/// The spec argument: JSON inline or `@file`.
fn read_spec(spec: String) -> anyhow::Result<Value> {
    let text = match spec.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => spec,
    };
    serde_json::from_str(&text).context("the spec is not valid JSON")
}
