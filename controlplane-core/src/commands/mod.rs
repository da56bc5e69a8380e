//! The Commands controller: a persisted per-node queue, dispatch over the node's live session,
//! updates from the agent, cancel, and deadlines (`queued → sent → running → succeeded | failed |
//! cancelled | expired`).
//!
//! Exactly-once effect rests on two rules: the control plane may send a command more than once
//! (every new session re-sends what is not over), and the agent journals each command id before
//! running it, so a second delivery re-sends the journaled result instead of running again.
//!
//! Every record is built by [`record::queued`] from typed arguments ([`record::Args`]); what a
//! command that is over means for its node is decided by one router ([`finished::on_final`]),
//! in the transaction that ended it: an agent's update, a cancel, an expiry, a lost lease.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::diag::{DiagArgs, ExpectedGpus};
use bc_protocol::pb::{Cancel, Command, GatewayMessage, gateway_message::Msg};
use bc_protocol::{CommandName, ErrorCode, Trust};
use cpl_store::{CommandRecord, CommandState, Store, StoreError, Tx, now_ms};
use serde::Deserialize;
use tracing::Instrument;

use crate::error::OpError;
use crate::port::AgentSessions;

pub mod finished;
pub mod record;

pub use record::new_command_id;

/// Default time a command may take, queue time included.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

/// Commands a tenant-controlled node may receive: they read, never change, the machine.
pub const READ_ONLY_COMMANDS: &[CommandName] =
    &[CommandName::InventoryRefresh, CommandName::DiagNvml];

/// Why a command was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("node {0} not found")]
    NodeNotFound(String),
    #[error("command {0} not found")]
    NotFound(String),
    #[error(transparent)]
    UnknownName(#[from] bc_protocol::ParseEnumError),
    #[error(
        "node {node_id} is tenant-controlled: only read-only commands ({allowed}) may be sent, not {name}"
    )]
    NotAllowed {
        node_id: String,
        name: String,
        allowed: String,
    },
    #[error("args must be a JSON object")]
    BadArgs,
    /// A command only a workflow sends (`disk.clean`: `nodes.release`, `nodes.retire`).
    #[error("{name} is sent only by the {workflow} workflow, never through commands.create")]
    WorkflowOnly {
        name: &'static str,
        workflow: &'static str,
    },
    /// The arguments break the command's typed contract (`bc_protocol::commands`).
    #[error(transparent)]
    InvalidArgs(#[from] bc_protocol::commands::ArgsError),
    /// A destructive command on a node that still takes work.
    #[error("{name} needs node {node_id} cordoned or draining first (or args.force: true)")]
    NotCordoned { node_id: String, name: String },
    #[error("command {id} is already {state}")]
    AlreadyOver { id: String, state: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CommandError {
    /// The API error code. Exhaustive on purpose: a new variant must choose its code here.
    pub fn code(&self) -> ErrorCode {
        match self {
            CommandError::NodeNotFound(_) | CommandError::NotFound(_) => ErrorCode::NotFound,
            CommandError::UnknownName(_) | CommandError::BadArgs | CommandError::InvalidArgs(_) => {
                ErrorCode::InvalidArgument
            }
            CommandError::NotAllowed { .. } | CommandError::WorkflowOnly { .. } => {
                ErrorCode::PermissionDenied
            }
            CommandError::AlreadyOver { .. } | CommandError::NotCordoned { .. } => {
                ErrorCode::InvalidState
            }
            CommandError::Store(_) => ErrorCode::Internal,
        }
    }
}

/// A refusal keeps its code and message through the verbs' one error type.
impl From<CommandError> for OpError {
    fn from(e: CommandError) -> Self {
        let message = e.to_string();
        match e {
            CommandError::NodeNotFound(id) => OpError::NotFound { kind: "node", id },
            CommandError::NotFound(id) => OpError::NotFound {
                kind: "command",
                id,
            },
            CommandError::UnknownName(_) | CommandError::BadArgs | CommandError::InvalidArgs(_) => {
                OpError::InvalidArgument(message)
            }
            CommandError::NotAllowed { .. } | CommandError::WorkflowOnly { .. } => {
                OpError::PermissionDenied(message)
            }
            CommandError::NotCordoned { .. } | CommandError::AlreadyOver { .. } => {
                OpError::InvalidState(message)
            }
            CommandError::Store(s) => OpError::Store(s),
        }
    }
}

/// Commands that disrupt running work: accepted only for a cordoned or draining node, or with
/// `force`.
pub const DISRUPTIVE_COMMANDS: &[CommandName] = &[CommandName::GpuReset, CommandName::NodeReboot];

/// The controller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Commands {
    pub store: Store,
    /// Live sessions, to send commands and cancels over.
    pub sessions: Arc<dyn AgentSessions>,
}

fn wire(c: &CommandRecord) -> GatewayMessage {
    GatewayMessage {
        msg: Some(Msg::Command(Command {
            id: c.id.clone(),
            name: c.name.as_str().to_owned(),
            args_json: serde_json::to_vec(&c.args).unwrap_or_default(),
            deadline_ms: c.deadline_at,
        })),
    }
}

impl Commands {
    /// Queues `name` for `node_id` and sends it at once if the node is connected.
    pub async fn create(
        &self,
        node_id: &str,
        name: &str,
        args: serde_json::Value,
        timeout: Duration,
        actor: &str,
    ) -> Result<CommandRecord, CommandError> {
        let parsed: CommandName = name.parse()?;
        let workflow = match parsed {
            CommandName::DiskClean => Some("release or retire (nodes.release, nodes.retire)"),
            CommandName::ImageWrite => Some("deploy (nodes.deploy)"),
            CommandName::RescueStart => Some("rescue (nodes.rescue)"),
            _ => None,
        };
        if let Some(workflow) = workflow {
            return Err(CommandError::WorkflowOnly {
                name: parsed.as_str(),
                workflow,
            });
        }
        let mut args = args;
        let Some(obj) = args.as_object_mut() else {
            return Err(CommandError::BadArgs);
        };
        // `force` is the control plane's to read; the agent never sees it.
        let force = obj
            .remove("force")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        // What the agent would refuse when it runs the command is refused here, before the
        // command is queued or sent.
        let args = record::Args::checked(parsed, args)?;
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let to = record::Queue {
            node_id,
            subject: None,
            actor,
            timeout_ms,
        };
        let rec = record::queued(to, args, now_ms());
        let to_insert = rec.clone();
        let id = node_id.to_owned();
        self.store
            .write(move |tx| queue(tx, &id, parsed, force, to_insert))
            .await?;
        self.dispatch(node_id, false).await;
        Ok(self.get(&rec.id).await?.unwrap_or(rec))
    }

    /// One command.
    pub async fn get(&self, id: &str) -> Result<Option<CommandRecord>, StoreError> {
        let id = id.to_owned();
        self.store.read(move |r| r.command(&id)).await
    }

    /// Sends the node's queued commands over its live session (with `resend`, also those sent or
    /// running before: a new session may have lost them; the agent's journal deduplicates).
    pub async fn dispatch(&self, node_id: &str, resend: bool) {
        if self.sessions.live_epoch(node_id).is_none() {
            return;
        }
        let id = node_id.to_owned();
        let open = match self.store.read(move |r| r.open_commands(&id)).await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "reading the command queue failed");
                return;
            }
        };
        for cmd in open {
            if cmd.state != CommandState::Queued && !resend {
                continue;
            }
            let span = tracing::info_span!("command", command_id = %cmd.id, name = %cmd.name);
            if !self
                .sessions
                .send(node_id, wire(&cmd))
                .instrument(span.clone())
                .await
            {
                return;
            }
            let cid = cmd.id.clone();
            if let Err(e) = self
                .store
                .write(move |tx| tx.mark_command_sent(&cid, now_ms()))
                .await
            {
                span.in_scope(|| tracing::error!(error = %e, "marking command sent failed"));
            }
        }
    }

    /// Applies a CommandUpdate from the node's agent (with what its end means for the node, in
    /// the same transaction). Returns the command as the update left it; `None` for an update
    /// of no command of this node, a state the wire does not define, or a store error (logged).
    pub async fn update(
        &self,
        node_id: &str,
        u: bc_protocol::pb::CommandUpdate,
    ) -> Option<CommandRecord> {
        use bc_protocol::pb::CommandState as W;
        let state = match W::try_from(u.state) {
            Ok(W::Running) => CommandState::Running,
            Ok(W::Succeeded) => CommandState::Succeeded,
            Ok(W::Failed) => CommandState::Failed,
            Ok(W::Cancelled) => CommandState::Cancelled,
            Ok(W::Expired) => CommandState::Expired,
            _ => return None,
        };
        let result = if u.result_json.is_empty() {
            None
        } else {
            serde_json::from_slice(&u.result_json).ok()
        };
        let error = u.error.map(|e| (e.code, e.message));
        let span = tracing::info_span!("command", command_id = %u.id);
        let (id, node) = (u.id.clone(), node_id.to_owned());
        let applied = self
            .store
            .write(move |tx| {
                let Some((before, after)) = tx.apply_command_update(
                    &id,
                    &node,
                    state,
                    u.progress,
                    result,
                    error,
                    now_ms(),
                )?
                else {
                    return Ok::<_, OpError>(None);
                };
                // What the command's end means for its node (Health's conditions, a workflow's
                // next state) is written in the same transaction, so nobody reads a finished
                // command before its effect. A result re-sent after a reconnect changes nothing.
                if after.state.is_final() && !before.state.is_final() {
                    finished::on_final(tx, &after)?;
                }
                Ok(Some(after))
            })
            .instrument(span.clone())
            .await;
        let _entered = span.enter();
        match applied {
            Ok(Some(c)) => {
                tracing::info!(name = %c.name, state = c.state.as_str(), "command update");
                Some(c)
            }
            Ok(None) => {
                tracing::warn!("update for an unknown command ignored");
                None
            }
            Err(e) => {
                tracing::error!(error = %e, "recording command update failed");
                None
            }
        }
    }

    /// Cancels a command that is not over; tells the agent if it was sent.
    pub async fn cancel(&self, id: &str) -> Result<CommandRecord, CommandError> {
        let cid = id.to_owned();
        let cur = self
            .get(id)
            .await?
            .ok_or_else(|| CommandError::NotFound(cid.clone()))?;
        if cur.state.is_final() {
            return Err(CommandError::AlreadyOver {
                id: cid,
                state: cur.state.as_str(),
            });
        }
        let c2 = cid.clone();
        self.store
            .write(move |tx| {
                if tx.finish_command(
                    &c2,
                    CommandState::Cancelled,
                    "CANCELLED",
                    "cancelled by operator",
                    now_ms(),
                )? && let Some(done) = tx.command(&c2)?
                    && let Err(e) = finished::on_final(tx, &done)
                {
                    tracing::warn!(error = %e, "the cancelled command's effect was not written");
                }
                Ok::<_, StoreError>(())
            })
            .await?;
        self.tell_cancel(&cur.node_id, &cid).await;
        Ok(self.get(&cid).await?.unwrap_or(cur))
    }

    async fn tell_cancel(&self, node_id: &str, id: &str) {
        let msg = GatewayMessage {
            msg: Some(Msg::Cancel(Cancel { id: id.to_owned() })),
        };
        let _ = self.sessions.send(node_id, msg).await;
    }

    /// Expires commands past their deadline, every `period`, until the task is dropped.
    pub async fn run_deadlines(self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let due = match self.store.read(|r| r.overdue_commands(now_ms())).await {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %e, "reading overdue commands failed");
                    continue;
                }
            };
            for cmd in due {
                let id = cmd.id.clone();
                let expired = self
                    .store
                    .write(move |tx| {
                        let over = tx.finish_command(
                            &id,
                            CommandState::Expired,
                            "DEADLINE_EXCEEDED",
                            "the command did not finish before its deadline",
                            now_ms(),
                        )?;
                        if over && let Some(done) = tx.command(&id)? {
                            finished::on_final(tx, &done)?;
                        }
                        Ok::<_, OpError>(over)
                    })
                    .await;
                if matches!(expired, Ok(true)) {
                    let span = tracing::info_span!("command", node_id = %cmd.node_id, command_id = %cmd.id);
                    span.in_scope(|| tracing::warn!(name = %cmd.name, "command expired"));
                    self.tell_cancel(&cmd.node_id, &cmd.id)
                        .instrument(span)
                        .await;
                }
            }
        }
    }
}

/// Checks a new command against its node and queues it (one write transaction): a
/// tenant-controlled node takes only read-only commands, a disruptive one needs the node cordoned
/// or draining (or `force`), and `diag.nvml` gets the pool profile's expected GPUs.
pub(crate) fn queue(
    tx: &Tx<'_>,
    node_id: &str,
    name: CommandName,
    force: bool,
    mut rec: CommandRecord,
) -> Result<(), CommandError> {
    let Some(node) = tx.node(node_id)? else {
        return Err(CommandError::NodeNotFound(node_id.to_owned()));
    };
    // A tenant-controlled node refuses before anything else is asked of it.
    if node.trust == Trust::TenantControlled && !READ_ONLY_COMMANDS.contains(&name) {
        return Err(CommandError::NotAllowed {
            node_id: node_id.to_owned(),
            name: name.as_str().to_owned(),
            allowed: READ_ONLY_COMMANDS
                .iter()
                .map(|c| c.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    if DISRUPTIVE_COMMANDS.contains(&name)
        && !force
        && !node.cordoned
        && !node
            .no_schedule_reasons
            .iter()
            .any(|r| r == crate::ops::nodes::REASON_DRAINING)
    {
        return Err(CommandError::NotCordoned {
            node_id: node_id.to_owned(),
            name: name.as_str().to_owned(),
        });
    }
    if name == CommandName::DiagNvml
        && let Ok(given) = DiagArgs::deserialize(&rec.args)
        && let Some(pool) = node.pool_id.as_deref()
        && let Some(p) = tx.pool(pool)?
        && let Some(a) = rec.args.as_object_mut()
    {
        // The pool's hardware profile says what the node should have, where the operator's
        // arguments do not; the keys come from the typed contract (`DiagArgs`), merged into
        // the operator's arguments.
        let profile = &p.hardware_profile;
        let expected = DiagArgs {
            expected_gpus: given.expected_gpus.is_none().then_some(()).and_then(|()| {
                profile.expected_gpu_count.map(|count| ExpectedGpus {
                    count,
                    name: profile.expected_gpu_model.clone(),
                })
            }),
            expected_nvlinks_per_gpu: given
                .expected_nvlinks_per_gpu
                .is_none()
                .then_some(profile.expected_nvlinks_per_gpu)
                .flatten(),
        };
        if let Ok(serde_json::Value::Object(m)) = serde_json::to_value(&expected) {
            // An absent expectation serializes as null (expectedGpus) or not at all: only
            // values are merged.
            a.extend(m.into_iter().filter(|(_, v)| !v.is_null()));
        }
    }
    tx.insert_command(&rec)?;
    Ok(())
}
