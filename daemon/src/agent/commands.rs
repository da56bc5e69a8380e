//! Command execution: the registry `name -> handler`, each run with its deadline and a cancel
//! handle, journaled before it runs and before its result is reported (see [`super::journal`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::CommandName;
use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::inventory::InventoryRefreshResult;
use bc_protocol::pb::{AgentMessage, Command, CommandState, CommandUpdate, agent_message};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::journal::{Entry, Journal};
use bcd_probes::hostroot::HostRoot;

/// A failed command: `(code, message)`.
pub type CommandFailure = (CommandErrorCode, String);

/// Runs commands for the session.
#[derive(Debug)]
pub struct Executor {
    pub journal: Journal,
    pub root: HostRoot,
    pub boot_id: String,
    /// Where NVML and `nvidia-smi` are (diag.nvml, gpu.reset, GPU inventory).
    pub nvml: bcd_probes::nvml::NvmlConfig,
    /// node.reboot and logs.collect settings.
    pub ops: crate::ops::OpsConfig,
    running: Mutex<HashMap<String, tokio::task::AbortHandle>>,
    /// Where logs.collect uploads: the current session's control plane and mutual-TLS config
    /// (replaced on every session: certificates rotate).
    uploader: Mutex<Option<crate::logs::upload::Uploader>>,
    /// The live session (outbound sender, epoch): a command outliving the session it came on
    /// reports on the current one.
    session: Mutex<Option<(mpsc::Sender<AgentMessage>, u64)>>,
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn send(out: &mpsc::Sender<AgentMessage>, epoch: u64, u: CommandUpdate) {
    // A full or closed channel loses nothing: the journal holds the result for the next Hello.
    let _ = out.try_send(AgentMessage {
        epoch,
        msg: Some(agent_message::Msg::CommandUpdate(u)),
    });
}

impl Executor {
    /// An executor over `journal`, reading the host through `root`.
    pub fn new(
        journal: Journal,
        root: HostRoot,
        boot_id: String,
        nvml: bcd_probes::nvml::NvmlConfig,
    ) -> Self {
        Self {
            journal,
            root,
            boot_id,
            nvml,
            ops: crate::ops::OpsConfig::default(),
            running: Mutex::new(HashMap::new()),
            uploader: Mutex::new(None),
            session: Mutex::new(None),
        }
    }

    /// The session that opened now carries command results.
    pub fn attach(&self, out: mpsc::Sender<AgentMessage>, epoch: u64) {
        *self.session.lock() = Some((out, epoch));
    }

    /// Sets where logs.collect uploads (called before each session).
    pub fn set_upload(&self, control_plane: String, tls: Arc<rustls::ClientConfig>) {
        *self.uploader.lock() = Some(crate::logs::upload::Uploader { control_plane, tls });
    }

    /// With node.reboot and logs.collect settings.
    pub fn with_ops(mut self, ops: crate::ops::OpsConfig) -> Self {
        self.ops = ops;
        self
    }

    /// Handles a Command from the gateway: re-reports a journaled one, else journals and runs it.
    pub fn on_command(self: &Arc<Self>, cmd: Command, out: mpsc::Sender<AgentMessage>, epoch: u64) {
        if let Some(e) = self.journal.get(&cmd.id) {
            if e.is_finished() {
                tracing::info!(command = %cmd.id, "command already ran; re-sending its result");
                send(&out, epoch, e.update());
            }
            return;
        }
        let args: Value = serde_json::from_slice(&cmd.args_json).unwrap_or_else(|_| json!({}));
        let mut entry = Entry {
            id: cmd.id.clone(),
            name: cmd.name.clone(),
            args: args.clone(),
            state: "accepted".to_owned(),
            result: None,
            error_code: None,
            error_message: None,
            accepted_at: now_ms(),
            finished_at: None,
            boot_id: self.boot_id.clone(),
        };
        if let Err(e) = self.journal.put(&entry) {
            // Without a journal entry we cannot promise not to run twice: refuse.
            tracing::error!(command = %cmd.id, error = %e, "cannot journal command; refusing it");
            send(
                &out,
                epoch,
                CommandUpdate {
                    id: cmd.id,
                    state: CommandState::Failed.into(),
                    progress: 0,
                    result_json: Vec::new(),
                    error: Some(bc_protocol::pb::ErrorInfo {
                        code: CommandErrorCode::JournalUnwritable.as_str().to_owned(),
                        message: e.to_string(),
                    }),
                },
            );
            return;
        }
        send(
            &out,
            epoch,
            CommandUpdate {
                id: cmd.id.clone(),
                state: CommandState::Running.into(),
                progress: 0,
                ..Default::default()
            },
        );
        let remaining = u64::try_from(cmd.deadline_ms.saturating_sub(now_ms()))
            .unwrap_or(0)
            .max(1);
        let this = Arc::clone(self);
        let id = cmd.id.clone();
        let task = tokio::spawn(async move {
            let run = execute(&cmd.id, &cmd.name, &args, &this, &out, epoch);
            let outcome = match tokio::time::timeout(Duration::from_millis(remaining), run).await {
                Ok(r) => r,
                Err(_) => Err((
                    CommandErrorCode::DeadlineExceeded,
                    "the command ran past its deadline".to_owned(),
                )),
            };
            entry.finished_at = Some(now_ms());
            match outcome {
                Ok(v) => {
                    entry.state = "succeeded".to_owned();
                    entry.result = Some(v);
                }
                Err((code, message)) => {
                    entry.state = "failed".to_owned();
                    entry.error_code = Some(code.as_str().to_owned());
                    entry.error_message = Some(message);
                }
            }
            if let Err(e) = this.journal.put(&entry) {
                tracing::error!(command = %entry.id, error = %e, "cannot journal the result");
            }
            tracing::info!(command = %entry.id, name = %entry.name, state = %entry.state, "command finished");
            crate::metrics::global().command_finished(&entry.name, &entry.state);
            // Report on the session live now; a closed one leaves the result in the journal for
            // the next Hello.
            let (o, e) = this.session.lock().clone().unwrap_or((out, epoch));
            send(&o, e, entry.update());
            this.running.lock().remove(&entry.id);
        });
        self.running.lock().insert(id, task.abort_handle());
    }

    /// Handles Cancel: stops a running command and journals it cancelled.
    pub fn on_cancel(&self, id: &str, out: &mpsc::Sender<AgentMessage>, epoch: u64) {
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
            crate::metrics::global().command_finished(&e.name, &e.state);
            send(out, epoch, e.update());
        }
    }
}

/// A typed result as the JSON value the journal keeps and the update carries.
fn to_result(v: &impl serde::Serialize) -> Result<Value, CommandFailure> {
    serde_json::to_value(v).map_err(|e| (CommandErrorCode::Internal, e.to_string()))
}

/// Runs one command. Unknown or not-yet-supported commands fail with `UNSUPPORTED`.
async fn execute(
    id: &str,
    name: &str,
    args: &Value,
    ex: &Executor,
    out: &mpsc::Sender<AgentMessage>,
    epoch: u64,
) -> Result<Value, CommandFailure> {
    let (root, nvml) = (&ex.root, &ex.nvml);
    let parsed: CommandName = name
        .parse()
        .map_err(|e: bc_protocol::ParseEnumError| (CommandErrorCode::Unsupported, e.to_string()))?;
    match parsed {
        CommandName::InventoryRefresh => {
            let inv = super::session::inventory_message(root, nvml)
                .await
                .map_err(|e| (CommandErrorCode::InventoryFailed, e))?;
            let hw = inv.hardware.clone().unwrap_or_default();
            let summary = InventoryRefreshResult::summarize(
                &inv.document_json,
                hw.trusted,
                hw.identifier_digests.len(),
            );
            out.send(AgentMessage {
                epoch,
                msg: Some(agent_message::Msg::Inventory(inv)),
            })
            .await
            .map_err(|_| {
                (
                    CommandErrorCode::SessionClosed,
                    "the session closed before the inventory was sent".to_owned(),
                )
            })?;
            to_result(&summary)
        }
        CommandName::DiagNvml => {
            let a: bcd_probes::nvml::DiagArgs =
                serde_json::from_value(args.clone()).map_err(|e| {
                    (
                        CommandErrorCode::InvalidArgument,
                        format!("diag.nvml args: {e}"),
                    )
                })?;
            let (cfg, root) = (nvml.clone(), root.clone());
            let report = tokio::task::spawn_blocking(move || {
                bcd_probes::nvml::diag(&cfg, a.expected_gpus.as_ref(), &root)
            })
            .await
            .map_err(|e| (CommandErrorCode::Internal, e.to_string()))?;
            crate::metrics::global().record_diag(&report);
            to_result(&report)
        }
        CommandName::GpuReset => {
            let a: bcd_probes::nvml::ResetArgs =
                serde_json::from_value(args.clone()).map_err(|e| {
                    (
                        CommandErrorCode::InvalidArgument,
                        format!("gpu.reset args: {e}"),
                    )
                })?;
            let (cfg, root) = (nvml.clone(), root.clone());
            let outcome =
                tokio::task::spawn_blocking(move || bcd_probes::nvml::reset(&cfg, &a.gpus, &root))
                    .await
                    .map_err(|e| (CommandErrorCode::Internal, e.to_string()))?;
            match outcome {
                Ok(report) => to_result(&report),
                Err(e) => {
                    let details = e
                        .details()
                        .map(|d| format!(" details: {d}"))
                        .unwrap_or_default();
                    Err((e.code(), format!("{e}{details}")))
                }
            }
        }
        CommandName::LogsCollect => {
            let mut ops = ex.ops.clone();
            if ops.upload.is_none() {
                ops.upload = ex.uploader.lock().clone();
            }
            let result = crate::logs::run_command(&ops, root, id, args, out, epoch)
                .await
                .map_err(|e| (e.code(), e.to_string()))?;
            to_result(&result)
        }
        CommandName::NodeReboot => {
            let a = crate::reboot::parse_args(args).map_err(|e| (e.code(), e.to_string()))?;
            let bye = crate::reboot::goodbye(epoch, &ex.boot_id);
            // reboot(2) does not return: say Goodbye first. A program (systemctl) returns once
            // the reboot is under way, so a failure can still be reported on this session.
            if ex.ops.reboot.is_syscall() {
                let _ = out.send(bye.clone()).await;
            }
            crate::reboot::start(&ex.ops.reboot, &a)
                .await
                .map_err(|e| (e.code(), e.to_string()))?;
            let _ = out.send(bye).await;
            // The result comes with the next boot (`reboot::complete_after_boot`), or the
            // control plane expires the command if the machine never comes back.
            std::future::pending::<Result<Value, CommandFailure>>().await
        }
        // Every name is served today; a new one fails clearly until it has an arm.
        #[allow(unreachable_patterns)]
        other => Err((
            CommandErrorCode::Unsupported,
            format!("{} is not supported by this agent build", other.as_str()),
        )),
    }
}
