//! The one builder of command records: every command the control plane queues — an operator's
//! (`commands.create`), a BMC task for a site agent, a workflow's step for a ramdisk — is made
//! here from [`Args`], so no record holds arguments its agent would refuse.

use bc_protocol::CommandName;
use bc_protocol::commands::{ArgsError, CommandArgs};
use cpl_store::{CommandRecord, CommandState};
use serde_json::Value;

/// A fresh command id: `cmd_` and 20 characters of `[a-z0-9]`.
pub fn new_command_id() -> String {
    format!("cmd_{}", cpl_store::random_lowercase(20))
}

/// A new command's name and arguments, as they are stored and sent (`Command.args_json`): built
/// from the typed contract ([`CommandArgs`], the control plane's own commands: a renamed field
/// fails to compile), or an operator's JSON held to that contract and kept as given (the agent
/// reads exactly what was asked).
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    name: CommandName,
    json: Value,
}

impl From<CommandArgs> for Args {
    fn from(a: CommandArgs) -> Self {
        Self {
            name: a.name(),
            json: a.to_value(),
        }
    }
}

impl Args {
    /// An operator's `json` for `name` (without the control plane's own `force`), checked
    /// against the command's contract. Errors: [`ArgsError`] naming the key and what is wrong.
    pub fn checked(name: CommandName, json: Value) -> Result<Self, ArgsError> {
        CommandArgs::parse(name, &json)?;
        Ok(Self { name, json })
    }

    /// The command.
    pub fn name(&self) -> CommandName {
        self.name
    }
}

/// Who runs a new command, for whom, and how long it may take.
#[derive(Debug, Clone, Copy)]
pub struct Queue<'a> {
    /// The node whose agent runs it (a site agent for `bmc.*`, a ramdisk for its workflow's
    /// steps).
    pub node_id: &'a str,
    /// The bare-metal node a `bmc.*` command acts on.
    pub subject: Option<&'a str>,
    /// Who asked (`operator`, `BareMetalWorkflow`, `Enrollment`).
    pub actor: &'a str,
    /// Its deadline from `now`, ms; queue time counts.
    pub timeout_ms: i64,
}

/// The record of `args` queued at `now` (ms since the Unix epoch) as `to` says.
pub fn queued(to: Queue<'_>, args: Args, now: i64) -> CommandRecord {
    CommandRecord {
        id: new_command_id(),
        node_id: to.node_id.to_owned(),
        name: args.name,
        args: args.json,
        state: CommandState::Queued,
        progress: 0,
        result: None,
        error_code: None,
        error_message: None,
        actor: to.actor.to_owned(),
        created_at: now,
        sent_at: None,
        started_at: None,
        finished_at: None,
        deadline_at: now.saturating_add(to.timeout_ms),
        subject_node_id: to.subject.map(str::to_owned),
    }
}
