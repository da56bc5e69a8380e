//! The XID catalog's descriptions and the names of NVML's recovery actions (field 230,
//! `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`). The classes and recommended actions themselves are
//! contract types in `bc_protocol::commands::xid`, re-exported here; the catalog (every Xid with
//! its resolution bucket, and the catalog's version) is data in
//! `bc_protocol::commands::xid_catalog`.

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

/// XID 154, "GPU recovery action changed" (R550+ drivers): the driver announces what the GPU
/// needs, the same value NVML reports as field 230 (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`). Its
/// message reads `GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)`;
/// drivers word the value differently (`0x2 (OS Reboot)`, `0x1 (PF FLR)`), the number is what
/// counts.
pub const RECOVERY_ACTION_CHANGED: u64 = 154;

/// The recovery action value (`nvmlDeviceGpuRecoveryAction_t`, 0-4) an XID 154 message
/// announces: the number after `to`, else the words of the value. `None` when the text names
/// none.
pub fn announced_recovery_action(text: &str) -> Option<u64> {
    let lower = text.to_ascii_lowercase();
    // The new value is what follows the last " to ".
    let after = &lower[lower.rfind(" to ").map_or(0, |i| i + 4)..];
    let num = after.trim_start();
    let (digits, radix) = match num.strip_prefix("0x") {
        Some(h) => (h, 16),
        None => (num, 10),
    };
    let end = digits
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(digits.len());
    if let Ok(v) = u64::from_str_radix(&digits[..end], radix) {
        return Some(v);
    }
    // No number: the words.
    [
        ("drain and reset", 4),
        ("drain p2p", 3),
        ("reboot", 2),
        ("reset", 1),
        ("flr", 1),
        ("none", 0),
    ]
    .iter()
    .find(|(w, _)| after.contains(w))
    .map(|(_, v)| *v)
}

/// What an NVML recovery action value asks for, in words (NVIDIA's XID catalog, XID 154).
pub fn recovery_action_description(v: u64) -> &'static str {
    match v {
        0 => "no recovery action needed",
        1 => "GPU reset required",
        2 => "node reboot required",
        3 => "drain peer-to-peer traffic",
        4 => "drain peer-to-peer traffic, then reset the GPU",
        _ => "unknown recovery action",
    }
}

/// Class, action and description of an XID. For XID 154, `announced` is the recovery action it
/// announces (from its message, or from NVML field 230); any other XID is judged by the
/// catalog.
pub fn judge(xid: u64, announced: Option<u64>) -> (XidClass, RecommendedAction, Option<String>) {
    match (xid, announced) {
        (RECOVERY_ACTION_CHANGED, Some(v)) => {
            let action = RecommendedAction::from_nvml_recovery_action(v);
            (
                XidClass::announcing(action),
                action,
                Some(format!(
                    "GPU recovery action changed: {} (0x{v:x})",
                    recovery_action_description(v)
                )),
            )
        }
        _ => {
            let class = XidClass::of(xid);
            (class, class.action(), describe(xid).map(str::to_owned))
        }
    }
}

/// A short description of an XID: the catalog's words, else its mnemonic
/// (`bc_protocol::commands::xid_catalog`); `None` for an XID the catalog does not list.
pub fn describe(xid: u64) -> Option<&'static str> {
    bc_protocol::commands::xid_catalog::catalog()
        .get(xid)
        .and_then(|e| e.words())
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
        assert_eq!(describe(1), Some("ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD"));
        assert_eq!(describe(999), None);
    }

    #[test]
    fn xid_154_announces_its_action() {
        for (text, want) in [
            (
                "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
                Some(2),
            ),
            (
                "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
                Some(1),
            ),
            (
                "GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
                Some(2),
            ),
            (
                "GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
                Some(1),
            ),
            (
                "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
                Some(0),
            ),
            ("GPU recovery action changed to Drain P2P", Some(3)),
            (
                "GPU recovery action changed from None to Drain and Reset",
                Some(4),
            ),
            ("GPU recovery action changed", None),
        ] {
            assert_eq!(announced_recovery_action(text), want, "{text}");
        }
        let (class, action, desc) = judge(154, Some(2));
        assert_eq!(
            (class, action),
            (XidClass::RebootRequired, RecommendedAction::RebootNode)
        );
        assert!(desc.is_some_and(|d| d.contains("node reboot required")));
        assert_eq!(judge(154, Some(1)).0, XidClass::ResetRequired);
        assert_eq!(judge(154, Some(3)).1, RecommendedAction::DrainP2p);
        assert_eq!(judge(154, Some(0)).1, RecommendedAction::None);
        assert_eq!(
            judge(154, None),
            (
                XidClass::Unknown,
                RecommendedAction::None,
                Some("GPU recovery action changed".into())
            )
        );
        assert_eq!(judge(79, Some(1)).1, RecommendedAction::RebootNode);
    }
}
