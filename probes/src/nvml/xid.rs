//! The XID catalog's descriptions and the names of NVML's recovery actions (field 230,
//! `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`). The classes and recommended actions themselves are
//! contract types in `bc_protocol::commands::xid`, re-exported here.
//!
//! Classes follow NVIDIA's XID catalog ("XID Errors", GPU deployment and management
//! documentation) and its recovery-action table: the XIDs whose documented resolution is a GPU
//! reset, the one that needs a node reboot (79, fallen off the bus), the ones caused by the
//! application rather than the GPU, and the purely informational ones.

pub use bc_protocol::commands::xid::{RecommendedAction, XidClass};

/// The name of an NVML recovery action value, as reported.
pub fn recovery_action_name(v: u64) -> &'static str {
    match v {
        0 => "none",
        1 => "gpuReset",
        2 => "nodeReboot",
        3 => "drainP2p",
        4 => "drainAndReset",
        _ => "unknown",
    }
}

/// A short description of the XIDs bcd knows (NVIDIA's catalog wording, shortened).
pub fn describe(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        48 => "double-bit ECC error",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping recording event",
        64 => "ECC page retirement or row remapping recording failure",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        121 => "C2C link corrected error",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // The catalog's classes and the order of actions are tested with their types in
    // bc-protocol (`commands_tests.rs`).
    #[test]
    fn recovery_actions_have_names_and_known_xids_descriptions() {
        assert_eq!(recovery_action_name(3), "drainP2p");
        assert_eq!(recovery_action_name(0), "none");
        assert_eq!(recovery_action_name(9), "unknown");
        assert_eq!(describe(79), Some("GPU has fallen off the bus"));
        assert_eq!(describe(1), None);
    }
}
