//! Typed contracts of the commands the control plane sends a node (`Command{name, args_json}`)
//! and of what comes back (`CommandUpdate{result_json | error}`), plus the payload of the XID
//! event (`Event{type: "xid", data_json}`).
//!
//! # Background
//! Arguments, results and events travel as JSON inside protobuf bytes fields, so the compiler
//! cannot check a key that one side spells and the other reads. These types are the one spelling
//! of every key: the agent builds its results from them and the control plane reads them back
//! through them. Each serde shape is pinned by a test against the JSON the agent sends today
//! (`commands_tests.rs`).
//!
//! # Design
//! One module per command, named after it: [`diag`] (`diag.nvml`), [`reset`] (`gpu.reset`),
//! [`logs`] (`logs.collect`), [`reboot`] (`node.reboot`), [`inventory`] (`inventory.refresh`);
//! [`xid`] holds the XID event and the recommended actions both `diag.nvml` and the event carry.
//! [`CommandName`] names the commands and [`CommandErrorCode`] the codes of a failed one;
//! [`check_args`] holds a command's arguments against its contract (the control plane refuses a
//! bad one at `commands.create`).
//!
//! # Limitations
//! Pure data and the small pure rules that belong to a type (the XID catalog's class of a number,
//! the order of recommended actions). Collecting the data is the agent's business (`bcd-probes`).

mod check;
pub mod diag;
pub mod inventory;
pub mod logs;
pub mod reboot;
pub mod reset;
pub mod xid;

pub use crate::types::CommandName;
pub use check::{ArgsError, check_args};

crate::string_enum! {
    /// `CommandUpdate.error.code` of a failed or cancelled command.
    CommandErrorCode, "command error code" {
        /// The agent does not serve this command name.
        Unsupported => "UNSUPPORTED",
        /// The arguments do not parse or are out of range.
        InvalidArgument => "INVALID_ARGUMENT",
        /// An internal task of the agent failed (a panicked blocking task, a serialization error).
        Internal => "INTERNAL",
        /// The command ran past its deadline and was stopped.
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        /// The control plane cancelled the command.
        Cancelled => "CANCELLED",
        /// The agent could not journal the command, so it refused to run it (it could not promise
        /// to run it only once).
        JournalUnwritable => "JOURNAL_UNWRITABLE",
        /// The agent stopped while the command ran; it is reported failed, never re-run.
        AgentRestarted => "AGENT_RESTARTED",
        /// The session closed before the command's output could be sent.
        SessionClosed => "SESSION_CLOSED",
        /// `inventory.refresh`: the inventory could not be collected or does not fit.
        InventoryFailed => "INVENTORY_FAILED",
        /// `gpu.reset`: NVML could not be loaded or initialized.
        NvmlUnavailable => "NVML_UNAVAILABLE",
        /// `gpu.reset`: no GPU has the UUID or bus id asked for.
        NotFound => "NOT_FOUND",
        /// `gpu.reset`: compute processes run on the GPUs; nothing was changed.
        GpuBusy => "GPU_BUSY",
        /// `gpu.reset`: `nvidia-smi -r` (or persistence mode handling around it) failed.
        ResetFailed => "RESET_FAILED",
        /// `gpu.reset`: the reset ran but a GPU did not come back as expected.
        ResetNotVerified => "RESET_NOT_VERIFIED",
        /// `logs.collect`: the bundle could not be built.
        CollectFailed => "COLLECT_FAILED",
        /// `logs.collect`: the bundle could not be uploaded, or the gateway stored other bytes.
        UploadFailed => "UPLOAD_FAILED",
        /// `node.reboot`: the reboot command could not be started or failed.
        RebootFailed => "REBOOT_FAILED",
    }
}

crate::string_enum! {
    /// `Event.type` of an event the agent sends on its session.
    EventType, "event type" {
        /// An XID error of a GPU; `data_json` is an [`xid::XidEvent`].
        Xid => "xid",
    }
}

#[cfg(test)]
mod commands_tests;
