//! `node.reboot {mode: graceful|force, delaySeconds}`: its arguments and the result the agent
//! reports once the machine is back (`{previousBootId, bootId}`).

use serde::{Deserialize, Serialize};

/// Longest `delaySeconds` accepted, s.
pub const MAX_DELAY_SECONDS: u64 = 3600;

/// `graceful` (stop services first) or `force` (skip the service manager's stop jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RebootMode {
    /// Stop services first (`systemctl reboot`).
    #[default]
    Graceful,
    /// Skip the service manager's stop jobs (`systemctl reboot --force`).
    Force,
}

impl RebootMode {
    /// The JSON spelling (`graceful`, `force`).
    pub fn as_str(self) -> &'static str {
        match self {
            RebootMode::Graceful => "graceful",
            RebootMode::Force => "force",
        }
    }
}

/// The args of `node.reboot` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RebootArgs {
    /// How to reboot; default graceful.
    #[serde(default)]
    pub mode: RebootMode,
    /// Wait before rebooting, s (so the Goodbye and the acknowledgement get out); at most
    /// [`MAX_DELAY_SECONDS`].
    #[serde(default)]
    pub delay_seconds: u64,
}

/// The result of `node.reboot`, reported from the next boot (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebootResult {
    /// `/proc/sys/kernel/random/boot_id` of the boot the machine came back in.
    pub boot_id: String,
    /// The boot id when the command was accepted.
    pub previous_boot_id: String,
}
