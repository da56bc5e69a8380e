//! Command execution: each run journaled before it starts and again before its result is
//! reported (see [`crate::journal`]), with its deadline, a cancel handle and a tracing span that
//! carries its id. What a command does is the mode's business ([`Machine::run_command`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::CommandName;
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb::{AgentMessage, Command, CommandState, CommandUpdate, agent_message};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::journal::{Entry, Journal};
use crate::mode::Machine;
use crate::ops::logs::upload::Uploader;

/// The session a command came on (or the live one): where its messages go.
#[derive(Debug, Clone)]
pub struct SessionLink {
    /// The session's outbound stream.
    pub out: mpsc::Sender<AgentMessage>,
    /// The session's epoch, stamped on every message.
    pub epoch: u64,
}

impl SessionLink {
    /// Wraps `msg` with this session's epoch.
    pub fn message(&self, msg: agent_message::Msg) -> AgentMessage {
        AgentMessage {
            epoch: self.epoch,
            msg: Some(msg),
        }
    }

    /// Sends `msg`, waiting for room; an error means the session closed.
    pub async fn send(&self, msg: agent_message::Msg) -> Result<(), CommandFailure> {
        self.out.send(self.message(msg)).await.map_err(|_| {
            CommandFailure::new(
                CommandErrorCode::SessionClosed,
                "the session closed before the message was sent",
            )
        })
    }

    /// Sends a CommandUpdate without waiting. A full or closed channel loses nothing that
    /// matters: the journal holds results for the next Hello.
    pub fn update(&self, u: CommandUpdate) {
        let _ = self
            .out
            .try_send(self.message(agent_message::Msg::CommandUpdate(u)));
    }
}

/// One command run, as the mode's handler sees it.
#[derive(Debug, Clone)]
pub struct CommandRun {
    /// The command id (a plain token; the journal's file name).
    pub id: String,
    /// Which command.
    pub name: CommandName,
    /// `Command.args_json`, parsed (`{}` when it did not parse).
    pub args: Value,
    /// The session it came on.
    pub link: SessionLink,
    /// Where `logs.collect` uploads on the session live when the command started.
    pub upload: Option<Uploader>,
}

impl CommandRun {
    /// Reports progress (0–100) while running.
    pub fn progress(&self, percent: u32) {
        self.link.update(CommandUpdate {
            id: self.id.clone(),
            state: CommandState::Running.into(),
            progress: percent,
            ..Default::default()
        });
    }

    /// The arguments as `T`; `INVALID_ARGUMENT` naming the command otherwise.
    pub fn args<T: serde::de::DeserializeOwned>(&self) -> Result<T, CommandFailure> {
        serde_json::from_value(self.args.clone()).map_err(|e| {
            CommandFailure::new(
                CommandErrorCode::InvalidArgument,
                format!("{} args: {e}", self.name),
            )
        })
    }
}

/// Runs blocking work of a command (NVML, sysfs) off the runtime's workers; a panic in it is an
/// `INTERNAL` failure of the command, not of the agent.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, CommandFailure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CommandFailure::new(CommandErrorCode::Internal, e.to_string()))
}

/// A typed result as the JSON value the journal keeps and the update carries.
pub fn to_result(v: &impl serde::Serialize) -> Result<Value, CommandFailure> {
    serde_json::to_value(v)
        .map_err(|e| CommandFailure::new(CommandErrorCode::Internal, e.to_string()))
}

/// Runs commands for a node's sessions. One per node, shared by its sessions: a command
/// outliving the session it came on reports on the live one.
#[derive(Debug)]
pub struct Executor<M> {
    machine: Arc<M>,
    journal: Journal,
    running: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Where logs.collect uploads: the current session's control plane and mutual-TLS config
    /// (replaced on every session: certificates rotate).
    uploader: Mutex<Option<Uploader>>,
    /// The live session.
    session: Mutex<Option<SessionLink>>,
    /// Called when a command finishes: `(name, journal state)`.
    on_finished: fn(&str, &str),
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl<M: Machine> Executor<M> {
    /// An executor for `machine` over `journal`.
    pub fn new(machine: Arc<M>, journal: Journal) -> Self {
        Self {
            machine,
            journal,
            running: Mutex::new(HashMap::new()),
            uploader: Mutex::new(None),
            session: Mutex::new(None),
            on_finished: |_, _| {},
        }
    }

    /// Calls `f(name, state)` whenever a command finishes (metrics).
    pub fn on_finished(mut self, f: fn(&str, &str)) -> Self {
        self.on_finished = f;
        self
    }

    /// The machine commands run on.
    pub fn machine(&self) -> &Arc<M> {
        &self.machine
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// The session that opened now carries command results.
    pub fn attach(&self, link: SessionLink) {
        *self.session.lock() = Some(link);
    }

    /// Sets where logs.collect uploads (called before each session).
    pub fn set_upload(&self, control_plane: String, tls: Arc<rustls::ClientConfig>) {
        *self.uploader.lock() = Some(Uploader { control_plane, tls });
    }

    /// Handles a Command from the gateway: re-reports a journaled one, else journals and runs it.
    pub fn on_command(self: &Arc<Self>, cmd: Command, link: SessionLink) {
        let args: Value = serde_json::from_slice(&cmd.args_json).unwrap_or_else(|_| json!({}));
        let Some(entry) = self.accept(&cmd, &args, &link) else {
            return;
        };
        link.update(CommandUpdate {
            id: cmd.id.clone(),
            state: CommandState::Running.into(),
            progress: 0,
            ..Default::default()
        });
        let remaining = u64::try_from(cmd.deadline_ms.saturating_sub(now_ms()))
            .unwrap_or(0)
            .max(1);
        let this = Arc::clone(self);
        let id = cmd.id.clone();
        let span = tracing::info_span!("command", command_id = %cmd.id, name = %cmd.name);
        let task = tokio::spawn(
            async move {
                let run = this.execute(&cmd.id, &cmd.name, args, link.clone());
                let outcome =
                    match tokio::time::timeout(Duration::from_millis(remaining), run).await {
                        Ok(r) => r,
                        Err(_) => Err(CommandFailure::new(
                            CommandErrorCode::DeadlineExceeded,
                            "the command ran past its deadline",
                        )),
                    };
                this.finish(entry, outcome, link);
            }
            .instrument(span),
        );
        self.running.lock().insert(id, task.abort_handle());
    }

    /// Journals `cmd` as accepted; `None` when it must not run: already journaled (a finished one
    /// has its result re-sent), or the journal cannot be written (then it is refused, since
    /// nothing could stop it from running twice).
    fn accept(&self, cmd: &Command, args: &Value, link: &SessionLink) -> Option<Entry> {
        if let Some(e) = self.journal.get(&cmd.id) {
            if e.is_finished() {
                tracing::info!(command_id = %cmd.id, "command already ran; re-sending its result");
                link.update(e.update());
            }
            return None;
        }
        let entry = Entry {
            id: cmd.id.clone(),
            name: cmd.name.clone(),
            args: args.clone(),
            state: "accepted".to_owned(),
            result: None,
            error_code: None,
            error_message: None,
            accepted_at: now_ms(),
            finished_at: None,
            boot_id: self.machine.boot_id().to_owned(),
        };
        if let Err(e) = self.journal.put(&entry) {
            tracing::error!(command_id = %cmd.id, error = %e, "cannot journal command; refusing it");
            link.update(CommandUpdate {
                id: cmd.id.clone(),
                state: CommandState::Failed.into(),
                progress: 0,
                result_json: Vec::new(),
                error: Some(
                    CommandFailure::new(CommandErrorCode::JournalUnwritable, e.to_string()).into(),
                ),
            });
            return None;
        }
        Some(entry)
    }

    /// Journals the outcome of a run, then reports it on the session live now (a closed one
    /// leaves the result in the journal for the next Hello).
    fn finish(&self, mut entry: Entry, outcome: Result<Value, CommandFailure>, link: SessionLink) {
        entry.finished_at = Some(now_ms());
        match outcome {
            Ok(v) => {
                entry.state = "succeeded".to_owned();
                entry.result = Some(v);
            }
            Err(f) => {
                entry.state = "failed".to_owned();
                entry.error_code = Some(f.code.as_str().to_owned());
                entry.error_message = Some(f.message);
            }
        }
        if let Err(e) = self.journal.put(&entry) {
            tracing::error!(error = %e, "cannot journal the result");
        }
        // A failure says why: its code and message (what the operator also sees in
        // `commands.get`; a driver scrubs what it puts there, e.g. a BMC's echo of a password).
        match (&entry.error_code, &entry.error_message) {
            (Some(code), message) => tracing::warn!(
                state = %entry.state,
                code = %code,
                error = %message.as_deref().unwrap_or_default(),
                "command finished"
            ),
            (None, _) => tracing::info!(state = %entry.state, "command finished"),
        }
        (self.on_finished)(&entry.name, &entry.state);
        let live = self.session.lock().clone().unwrap_or(link);
        live.update(entry.update());
        self.running.lock().remove(&entry.id);
    }

    /// Handles Cancel: stops a running command and journals it cancelled.
    pub fn on_cancel(&self, id: &str, link: &SessionLink) {
        let Some(handle) = self.running.lock().remove(id) else {
            return;
        };
        handle.abort();
        if let Some(mut e) = self.journal.get(id)
            && !e.is_finished()
        {
            e.state = "cancelled".to_owned();
            e.error_code = Some(CommandErrorCode::Cancelled.as_str().to_owned());
            e.error_message = Some("cancelled by the control plane".to_owned());
            e.finished_at = Some(now_ms());
            let _ = self.journal.put(&e);
            (self.on_finished)(&e.name, &e.state);
            link.update(e.update());
        }
    }

    /// Runs one command through the mode. A name this build does not know fails with
    /// `UNSUPPORTED`.
    async fn execute(
        &self,
        id: &str,
        name: &str,
        args: Value,
        link: SessionLink,
    ) -> Result<Value, CommandFailure> {
        let name: CommandName = name.parse().map_err(|e: bc_protocol::ParseEnumError| {
            CommandFailure::new(CommandErrorCode::Unsupported, e.to_string())
        })?;
        let run = CommandRun {
            id: id.to_owned(),
            name,
            args,
            link,
            upload: self.uploader.lock().clone(),
        };
        self.machine.run_command(&run).await
    }
}
