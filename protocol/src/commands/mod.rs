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
//! [`xid`] holds the XID event and the recommended actions both `diag.nvml` and the event carry;
//! [`bmc`] the site agent's BMC commands (`bmc.verify`, `bmc.power`, `bmc.setBootDevice`);
//! [`clean`] the ramdisk's `disk.clean`, [`deploy`] its `image.write` and [`rescue`] its
//! `rescue.start`.
//! [`CommandName`] names the commands, [`CommandErrorCode`] the codes of a failed one and
//! [`CommandFailure`] a failure as `CommandUpdate.error` carries it; [`check_args`] holds a
//! command's arguments against its contract (the control plane refuses a bad one at
//! `commands.create`). The agent keeps results as a `serde_json::Value` (its journal does), so on
//! the wire every object's keys are sorted.
//!
//! # Limitations
//! Pure data and the small pure rules that belong to a type (the XID catalog's class of a number,
//! the order of recommended actions). Collecting the data is the agent's business (`bcd-probes`).

mod args;
pub mod bmc;
mod check;
pub mod clean;
pub mod deploy;
pub mod diag;
pub mod inventory;
pub mod logs;
pub mod reboot;
pub mod rescue;
pub mod reset;
pub mod xid;
pub mod xid_catalog;

pub use crate::types::CommandName;
pub use args::CommandArgs;
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
        /// `bmc.*`: this site agent does not hold the site lease the command was issued under
        /// (another appliance took over, or the lease lapsed); nothing was done.
        LeaseLost => "LEASE_LOST",
        /// `bmc.*`: the node is not among the BMCs this site agent was assigned.
        BmcUnknown => "BMC_UNKNOWN",
        /// `bmc.*`: the BMC did not answer (refused, unreachable, timed out).
        BmcUnreachable => "BMC_UNREACHABLE",
        /// `bmc.*`: the BMC refused the credentials.
        BmcAuthFailed => "BMC_AUTH_FAILED",
        /// `bmc.*`: the BMC's certificate is not the pinned one (or does not verify).
        BmcTlsMismatch => "BMC_TLS_MISMATCH",
        /// `bmc.verify`: the address does not name a system on that BMC (or names one of several
        /// without saying which).
        BmcNotASystem => "BMC_NOT_A_SYSTEM",
        /// `bmc.*`: the BMC answered with an error (5xx, a malformed body, an action it refused).
        BmcError => "BMC_ERROR",
        /// `bmc.*`: the BMC answered a change as done but reads back something else (the message
        /// names what was asked and what reads back).
        BmcNotApplied => "BMC_NOT_APPLIED",
        /// `bmc.power` into a network boot: the machine never asked the site's boot service for
        /// its script, however often it was powered on with PXE.
        NetworkBootNotRequested => "NETWORK_BOOT_NOT_REQUESTED",
        /// `disk.clean`: the machine's disks could not be listed at all (no `/sys/block`);
        /// a disk that fails is reported in the result, not here.
        CleanFailed => "CLEAN_FAILED",
        /// `image.write`: the image could not be fetched (refused, unreachable, an HTTP error,
        /// cut short); the disk's first and last MiB are zeroed.
        ImageUnreachable => "IMAGE_UNREACHABLE",
        /// `image.write`: the file's SHA-256 is not the one asked for; the disk's first and
        /// last MiB are zeroed.
        ChecksumMismatch => "CHECKSUM_MISMATCH",
        /// `image.write`: no disk matches the root-device hints, or none is large enough.
        NoRootDevice => "NO_ROOT_DEVICE",
        /// `image.write`: writing the disk or the config drive failed (EIO, a malformed image).
        ImageWriteFailed => "IMAGE_WRITE_FAILED",
        /// `rescue.start`: the SSH server could not be started (missing from the image, its
        /// keys not written, not listening).
        RescueFailed => "RESCUE_FAILED",
    }
}

/// A failed command: what `CommandUpdate.error` carries (`ErrorInfo{code, message}`), typed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CommandFailure {
    /// What kind of failure.
    pub code: CommandErrorCode,
    /// What went wrong with what, for people.
    pub message: String,
}

impl CommandFailure {
    /// A failure with `code` and `message`.
    pub fn new(code: CommandErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<CommandFailure> for crate::pb::ErrorInfo {
    fn from(f: CommandFailure) -> Self {
        Self {
            code: f.code.as_str().to_owned(),
            message: f.message,
        }
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
#[path = "commands_tests.rs"]
mod tests;
