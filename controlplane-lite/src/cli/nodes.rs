//! `bcctl nodes ...`: the node verbs, `nodes run` (commands) and `nodes logs` (bundles).

use cpl_core::verbs::Method;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::{Value, json};

use super::ops::{items, mutate, parse_arg, print};
use super::{ClientArgs, Output, render};
use controlplane_lite::client::Client;

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
    Get { node_id: String },
    /// Show a node's event log.
    Events { node_id: String },
    /// Cordon: no new work.
    Cordon {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Uncordon.
    Uncordon {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Cordon plus `draining` until the node's allocations are released.
    Drain {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Add an operator taint (`taint:<key>` in noScheduleReasons).
    Taint {
        node_id: String,
        key: String,
        #[arg(long, default_value = "")]
        value: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Add or replace labels (`key=value`, repeatable); other labels stay.
    SetLabels {
        node_id: String,
        #[arg(required = true)]
        labels: Vec<String>,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Remove labels by key.
    RemoveLabels {
        node_id: String,
        #[arg(required = true)]
        keys: Vec<String>,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Remove a taint.
    Untaint {
        node_id: String,
        key: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Accept a node by hand (`adopting → adopted`).
    Adopt {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Recover a failed node back to where it failed from.
    Recover {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Retire a node for good: its identity ends; a node without a BMC goes on to `retired` at
    /// once, a machine enrolled through its BMC is cleaned in the ramdisk first.
    Retire {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Abort a bare-metal workflow in flight: the node fails from its state (maintenance on),
    /// its command in flight is cancelled and the machine powered off; `recover` starts over.
    Abort {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Turn maintenance on or off.
    SetMaintenance {
        node_id: String,
        /// `true` or `false`.
        #[arg(action = clap::ArgAction::Set)]
        maintenance: bool,
        #[arg(long)]
        reason: Option<String>,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Revoke the node's identity (identityGeneration + 1; its certificates stop working).
    RevokeIdentity {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Delete the node.
    Delete {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Replace the node's desired spec (generation + 1). JSON inline or `@file`.
    UpdateSpec {
        node_id: String,
        spec: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Start a dedicated-root lease (trust becomes tenant-controlled).
    StartDedicatedRoot {
        node_id: String,
        #[arg(long)]
        tenant: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// End the dedicated-root lease.
    EndDedicatedRoot {
        node_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Approve a machine's pending re-join in place (`nodes get` shows the request; the agent's
    /// log names it too). The machine joins at its next attempt, without a new token.
    ApproveRejoin {
        node_id: String,
        /// The request id (`rejoin_…`).
        request_id: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Move the node to another pool (role, trust, owner, adapter and drivers follow the pool).
    Move {
        node_id: String,
        #[arg(long)]
        pool: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Run a command on the node (inventory.refresh, diag.nvml, logs.collect, gpu.reset, node.reboot).
    Run {
        node_id: String,
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
    match cmd {
        NodesCommand::List {
            pool,
            provision_state,
            connectivity,
            schedulable,
            labels,
            firmware,
        } => {
            let mut filter = json!({"poolId": pool, "provisionState": provision_state, "connectivity": connectivity, "schedulable": schedulable, "firmware": firmware});
            if !labels.is_empty() {
                filter["labels"] = Value::Object(label_map(&labels)?);
            }
            let v: Value = c.call(Method::NodesList, &filter).await?;
            print(args, &v, |v| render::nodes(&items(v, "nodes")))
        }
        NodesCommand::Get { node_id } => {
            let v: Value = c
                .call(Method::NodesGet, &json!({"nodeId": node_id}))
                .await?;
            print(args, &v, render::object)
        }
        NodesCommand::Events { node_id } => events(args, &c, &node_id).await,
        NodesCommand::Logs {
            node_id,
            command,
            file,
        } => super::logs::download(args, &node_id, command, &file).await,
        NodesCommand::Run {
            node_id,
            command,
            args: kvs,
            wait,
            timeout,
        } => run(args, &c, &node_id, &command, &kvs, wait, timeout).await,
        NodesCommand::BareMetal(cmd) => super::bare_metal::run(args, cmd).await,
        mutation => {
            let (method, node_id, version, extra) = node_mutation(mutation)?;
            mutate(args, &c, method, &node_id, version, extra).await
        }
    }
}

/// `bcctl nodes events`: the node's event log as a table.
async fn events(args: &ClientArgs, c: &Client, node_id: &str) -> anyhow::Result<()> {
    let v: Value = c
        .call(Method::NodesEvents, &json!({"nodeId": node_id}))
        .await?;
    print(args, &v, |v| {
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
    })
}

/// A node mutation subcommand as its method, node, `--version` and the body's other fields.
fn node_mutation(cmd: NodesCommand) -> anyhow::Result<(Method, String, Option<u64>, Value)> {
    use NodesCommand as N;
    let plain = |m, node_id, version| Ok((m, node_id, version, json!({})));
    match cmd {
        N::Cordon { node_id, version } => plain(Method::NodesCordon, node_id, version),
        N::Uncordon { node_id, version } => plain(Method::NodesUncordon, node_id, version),
        N::Drain { node_id, version } => plain(Method::NodesDrain, node_id, version),
        N::Adopt { node_id, version } => plain(Method::NodesAdopt, node_id, version),
        N::Recover { node_id, version } => plain(Method::NodesRecover, node_id, version),
        N::Retire { node_id, version } => plain(Method::NodesRetire, node_id, version),
        N::Abort { node_id, version } => plain(Method::NodesAbort, node_id, version),
        N::RevokeIdentity { node_id, version } => {
            plain(Method::NodesRevokeIdentity, node_id, version)
        }
        N::Delete { node_id, version } => plain(Method::NodesDelete, node_id, version),
        N::EndDedicatedRoot { node_id, version } => {
            plain(Method::NodesEndDedicatedRoot, node_id, version)
        }
        N::Taint {
            node_id,
            key,
            value,
            version,
        } => Ok((
            Method::NodesTaint,
            node_id,
            version,
            json!({"key": key, "value": value}),
        )),
        N::Untaint {
            node_id,
            key,
            version,
        } => Ok((Method::NodesUntaint, node_id, version, json!({"key": key}))),
        N::SetLabels {
            node_id,
            labels,
            version,
        } => Ok((
            Method::NodesSetLabels,
            node_id,
            version,
            json!({"labels": label_map(&labels)?}),
        )),
        N::RemoveLabels {
            node_id,
            keys,
            version,
        } => Ok((
            Method::NodesRemoveLabels,
            node_id,
            version,
            json!({"keys": keys}),
        )),
        N::SetMaintenance {
            node_id,
            maintenance,
            reason,
            version,
        } => Ok((
            Method::NodesSetMaintenance,
            node_id,
            version,
            json!({"maintenance": maintenance, "reason": reason}),
        )),
        N::UpdateSpec {
            node_id,
            spec,
            version,
        } => Ok((
            Method::NodesUpdateSpec,
            node_id,
            version,
            json!({"spec": read_spec(spec)?}),
        )),
        N::StartDedicatedRoot {
            node_id,
            tenant,
            version,
        } => Ok((
            Method::NodesStartDedicatedRoot,
            node_id,
            version,
            json!({"tenantId": tenant}),
        )),
        N::ApproveRejoin {
            node_id,
            request_id,
            version,
        } => Ok((
            Method::NodesApproveRejoin,
            node_id,
            version,
            json!({"requestId": request_id}),
        )),
        N::Move {
            node_id,
            pool,
            version,
        } => Ok((Method::NodesMove, node_id, version, json!({"poolId": pool}))),
        N::List { .. }
        | N::Get { .. }
        | N::Events { .. }
        | N::Run { .. }
        | N::Logs { .. }
        | N::BareMetal(_) => bail!("not a node mutation"),
    }
}

/// `key=value` arguments as a JSON object of strings (the value may be empty: `key=`).
fn label_map(pairs: &[String]) -> anyhow::Result<serde_json::Map<String, Value>> {
    pairs
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("label {kv:?}: expected key=value"))?;
            Ok((k.to_owned(), Value::String(v.to_owned())))
        })
        .collect()
}

/// The spec argument: JSON inline or `@file`.
fn read_spec(spec: String) -> anyhow::Result<Value> {
    let text = match spec.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => spec,
    };
    serde_json::from_str(&text).context("the spec is not valid JSON")
}

/// `bcctl nodes run`: creates the command; with `--wait`, follows it to its end.
async fn run(
    args: &ClientArgs,
    c: &Client,
    node_id: &str,
    command: &str,
    kvs: &[String],
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut a = serde_json::Map::new();
    for kv in kvs {
        let (k, v) = parse_arg(kv)?;
        a.insert(k, v);
    }
    let body = json!({"nodeId": node_id, "name": command, "args": a, "timeoutSeconds": timeout.as_secs().max(1)});
    let created: Value = c.call(Method::CommandsCreate, &body).await?;
    if !wait {
        return print(args, &created, render::object);
    }
    let id = created
        .get("id")
        .and_then(Value::as_str)
        .context("commands.create returned no id")?
        .to_owned();
    follow(args, c, &id).await
}

/// Polls a command until it is over, printing progress; fails unless it succeeded.
async fn follow(args: &ClientArgs, c: &Client, id: &str) -> anyhow::Result<()> {
    let mut last = String::new();
    loop {
        let v: Value = c
            .call(Method::CommandsGet, &json!({"commandId": id}))
            .await?;
        let state = v
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned();
        let progress = v.get("progress").and_then(Value::as_u64).unwrap_or(0);
        let line = format!("{id} {state} {progress}%");
        if line != last && args.output == Output::Table {
            eprintln!("{line}");
            last = line;
        }
        if matches!(
            state.as_str(),
            "succeeded" | "failed" | "cancelled" | "expired"
        ) {
            print(args, &v, render::object)?;
            if state != "succeeded" {
                bail!("{}", failure_line(id, &state, &v));
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What `nodes run --wait` says when a command did not succeed: its state, and the error code
/// and message the agent (or the control plane: `DEADLINE_EXCEEDED`, `CANCELLED`) gave.
fn failure_line(id: &str, state: &str, v: &Value) -> String {
    let err = v.get("error");
    let code = err.and_then(|e| e.get("code")).and_then(Value::as_str);
    let message = err.and_then(|e| e.get("message")).and_then(Value::as_str);
    match (code, message) {
        (Some(c), Some(m)) if !m.is_empty() => {
            format!("command {id} {state}: {c}: {}", super::table::safe(m))
        }
        (Some(c), _) => format!("command {id} {state}: {c}"),
        _ => format!("command {id} {state}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_command_says_its_code_and_message() {
        let v = json!({"state": "failed", "error": {"code": "GPU_BUSY", "message": "pid 42 runs on 0000:1a:00.0"}});
        assert_eq!(
            failure_line("cmd_1", "failed", &v),
            "command cmd_1 failed: GPU_BUSY: pid 42 runs on 0000:1a:00.0"
        );
        let esc = json!({"error": {"code": "X", "message": "a\u{1b}[2J"}});
        assert_eq!(
            failure_line("c", "failed", &esc),
            "command c failed: X: a\\u{1b}[2J"
        );
        assert_eq!(
            failure_line("c", "expired", &json!({})),
            "command c expired"
        );
    }
}
