//! The Commands controller: a persisted per-node queue, dispatch over the node's live session,
//! updates from the agent, cancel, and deadlines (`queued → sent → running → succeeded | failed |
//! cancelled | expired`).
//!
//! Exactly-once effect rests on two rules: the control plane may send a command more than once
//! (every new session re-sends what is not over), and the agent journals each command id before
//! running it, so a second delivery re-sends the journaled result instead of running again.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::{Cancel, Command, GatewayMessage, gateway_message::Msg};
use bc_protocol::{CommandName, ErrorCode, Trust};

use crate::api::ApiError;
use crate::gateway::registry::Registry;
use crate::store::commands::{self, CommandRecord, CommandState};
use crate::store::{Store, StoreError, nodes, now_ms};

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
    /// A destructive command on a node that still takes work.
    #[error("{name} needs node {node_id} cordoned or draining first (or args.force: true)")]
    NotCordoned { node_id: String, name: String },
    #[error("command {id} is already {state}")]
    AlreadyOver { id: String, state: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        let code = match &e {
            CommandError::NodeNotFound(_) | CommandError::NotFound(_) => ErrorCode::NotFound,
            CommandError::UnknownName(_) | CommandError::BadArgs => ErrorCode::InvalidArgument,
            CommandError::NotAllowed { .. } => ErrorCode::PermissionDenied,
            CommandError::AlreadyOver { .. } | CommandError::NotCordoned { .. } => {
                ErrorCode::InvalidState
            }
            CommandError::Store(_) => ErrorCode::Internal,
        };
        ApiError::new(code, e.to_string())
    }
}

/// Commands that disrupt running work: accepted only for a cordoned or draining node, or with
/// `force`.
pub const DISRUPTIVE_COMMANDS: &[CommandName] = &[CommandName::GpuReset, CommandName::NodeReboot];

/// A fresh command id: `cmd_` and 20 characters of `[a-z0-9]`.
pub fn new_command_id() -> String {
    format!("cmd_{}", crate::store::random_lowercase(20))
}

/// The controller. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Commands {
    pub store: Store,
    pub registry: Arc<Registry>,
}

fn wire(c: &CommandRecord) -> GatewayMessage {
    GatewayMessage {
        msg: Some(Msg::Command(Command {
            id: c.id.clone(),
            name: c.name.clone(),
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
        let mut args = args;
        let Some(obj) = args.as_object_mut() else {
            return Err(CommandError::BadArgs);
        };
        // `force` is the control plane's to read; the agent never sees it.
        let force = obj
            .remove("force")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let now = now_ms();
        let rec = CommandRecord {
            id: new_command_id(),
            node_id: node_id.to_owned(),
            name: parsed.as_str().to_owned(),
            args,
            state: CommandState::Queued,
            progress: 0,
            result: None,
            error_code: None,
            error_message: None,
            actor: actor.to_owned(),
            created_at: now,
            sent_at: None,
            started_at: None,
            finished_at: None,
            deadline_at: now.saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX)),
        };
        let to_insert = rec.clone();
        let id = node_id.to_owned();
        let outcome = self
            .store
            .run(move |c| {
                let Some(node) = nodes::get(c, &id)? else {
                    return Ok(Err(CommandError::NodeNotFound(id)));
                };
                let mut to_insert = to_insert;
                // A tenant-controlled node refuses before anything else is asked of it.
                if node.trust == Trust::TenantControlled && !READ_ONLY_COMMANDS.contains(&parsed) {
                    return Ok(Err(CommandError::NotAllowed {
                        node_id: id,
                        name: parsed.as_str().to_owned(),
                        allowed: READ_ONLY_COMMANDS
                            .iter()
                            .map(|c| c.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    }));
                }
                if DISRUPTIVE_COMMANDS.contains(&parsed)
                    && !force
                    && !node.cordoned
                    && !node.no_schedule_reasons.iter().any(|r| r == "draining")
                {
                    return Ok(Err(CommandError::NotCordoned { node_id: id, name: parsed.as_str().to_owned() }));
                }
                if parsed == CommandName::DiagNvml
                    && to_insert.args.get("expectedGpus").is_none()
                    && let Some(pool) = node.pool_id.as_deref()
                    && let Some(p) = crate::store::pools::get(c, pool)?
                    && let Some(count) = p.hardware_profile.expected_gpu_count
                    && let Some(a) = to_insert.args.as_object_mut()
                {
                    // The pool's hardware profile says what the node should have.
                    a.insert(
                        "expectedGpus".to_owned(),
                        serde_json::json!({"count": count, "name": p.hardware_profile.expected_gpu_model}),
                    );
                }
                commands::insert(c, &to_insert)?;
                Ok(Ok(()))
            })
            .await?;
        outcome?;
        self.dispatch(node_id, false).await;
        Ok(self.get(&rec.id).await?.unwrap_or(rec))
    }

    /// One command.
    pub async fn get(&self, id: &str) -> Result<Option<CommandRecord>, StoreError> {
        let id = id.to_owned();
        self.store.run(move |c| commands::get(c, &id)).await
    }

    /// Sends the node's queued commands over its live session (with `resend`, also those sent or
    /// running before: a new session may have lost them; the agent's journal deduplicates).
    pub async fn dispatch(&self, node_id: &str, resend: bool) {
        let Some((_, tx)) = self.registry.sender(node_id) else {
            return;
        };
        let id = node_id.to_owned();
        let open = match self
            .store
            .run(move |c| commands::open_for_node(c, &id))
            .await
        {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(node_id, error = %e, "reading the command queue failed");
                return;
            }
        };
        for cmd in open {
            if cmd.state != CommandState::Queued && !resend {
                continue;
            }
            if tx.send(Ok(wire(&cmd))).await.is_err() {
                return;
            }
            let cid = cmd.id.clone();
            if let Err(e) = self.store.run(move |c| commands::mark_sent(c, &cid)).await {
                tracing::error!(command = %cmd.id, error = %e, "marking command sent failed");
            }
        }
    }

    /// Applies a CommandUpdate from the node's agent.
    pub async fn update(&self, node_id: &str, u: bc_protocol::pb::CommandUpdate) {
        use bc_protocol::pb::CommandState as W;
        let state = match W::try_from(u.state) {
            Ok(W::Running) => CommandState::Running,
            Ok(W::Succeeded) => CommandState::Succeeded,
            Ok(W::Failed) => CommandState::Failed,
            Ok(W::Cancelled) => CommandState::Cancelled,
            Ok(W::Expired) => CommandState::Expired,
            _ => return,
        };
        let result = if u.result_json.is_empty() {
            None
        } else {
            serde_json::from_slice(&u.result_json).ok()
        };
        let error = u.error.map(|e| (e.code, e.message));
        let (id, node) = (u.id.clone(), node_id.to_owned());
        match self
            .store
            .run(move |c| {
                let was_final = commands::get(c, &id)?.is_some_and(|r| r.state.is_final());
                let rec = commands::apply_update(c, &id, &node, state, u.progress, result, error)?;
                // The Health controller's conditions are written while the store is still held, so
                // nobody reads a finished command before its effect on the node.
                // A result re-sent after a reconnect changes nothing, conditions included.
                if let Some(r) = rec.as_ref().filter(|r| r.state.is_final() && !was_final) {
                    let updates = crate::health::updates_for(r);
                    if let Err(e) = crate::health::apply_now(c, &r.node_id, &updates) {
                        tracing::warn!(node_id = %r.node_id, error = %e, "Health: condition not written");
                    }
                }
                Ok(rec)
            })
            .await
        {
            Ok(Some(c)) => {
                tracing::info!(command = %c.id, name = %c.name, state = c.state.as_str(), "command update");
            }
            Ok(None) => {
                tracing::warn!(node_id, command = %u.id, "update for an unknown command ignored")
            }
            Err(e) => tracing::error!(node_id, error = %e, "recording command update failed"),
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
            .run(move |c| {
                commands::finish(
                    c,
                    &c2,
                    CommandState::Cancelled,
                    "CANCELLED",
                    "cancelled by operator",
                )
            })
            .await?;
        self.tell_cancel(&cur.node_id, &cid).await;
        Ok(self.get(&cid).await?.unwrap_or(cur))
    }

    async fn tell_cancel(&self, node_id: &str, id: &str) {
        if let Some((_, tx)) = self.registry.sender(node_id) {
            let _ = tx
                .send(Ok(GatewayMessage {
                    msg: Some(Msg::Cancel(Cancel { id: id.to_owned() })),
                }))
                .await;
        }
    }

    /// Expires commands past their deadline, every `period`, until the task is dropped.
    pub async fn run_deadlines(self, period: Duration) {
        let mut tick = tokio::time::interval(period);
        loop {
            tick.tick().await;
            let due = match self.store.run(|c| commands::overdue(c, now_ms())).await {
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
                    .run(move |c| {
                        commands::finish(
                            c,
                            &id,
                            CommandState::Expired,
                            "DEADLINE_EXCEEDED",
                            "the command did not finish before its deadline",
                        )
                    })
                    .await;
                if matches!(expired, Ok(true)) {
                    tracing::warn!(command = %cmd.id, name = %cmd.name, node_id = %cmd.node_id, "command expired");
                    self.tell_cancel(&cmd.node_id, &cmd.id).await;
                }
            }
        }
    }
}
