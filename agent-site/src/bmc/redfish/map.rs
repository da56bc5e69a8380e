//! The pure parts of the Redfish driver: what a failed request was about, error text, the
//! redirect policy, and the mappings between Redfish values and the power axis's.

use bc_protocol::commands::bmc::{PowerAction, PowerState};
use nv_redfish::schema::resource::{PowerState as RfPower, ResetType};

/// How much of a BMC's error body an error message quotes.
pub(super) const BODY_EXCERPT: usize = 200;
/// Same-origin redirects followed at most.
const MAX_REDIRECTS: usize = 5;

/// What a failing request was about: a 404 means "not a system" only for the system itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum What {
    Root,
    Systems,
    System,
    Nics,
    Reset,
    Boot,
}

impl What {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Root => "service root",
            Self::Systems => "systems collection",
            Self::System => "system",
            Self::Nics => "EthernetInterfaces",
            Self::Reset => "ComputerSystem.Reset",
            Self::Boot => "boot override",
        }
    }
}

/// A redirect policy that follows at most [`MAX_REDIRECTS`] redirects and only within `origin`.
pub(super) fn same_origin(origin: url::Origin) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else if attempt.url().origin() == origin {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// The error chain of `e` as one line: reqwest's own message hides the cause (refused, reset,
/// timed out) in its sources.
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        cur = s.source();
    }
    out
}

pub(super) fn excerpt(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(BODY_EXCERPT) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

/// The power axis's reading of a Redfish `PowerState` (DMTF `Resource.PowerState`): a system
/// powering off still counts as on, one powering on as off.
pub fn power_of(p: Option<RfPower>) -> PowerState {
    match p {
        Some(RfPower::On | RfPower::PoweringOff) => PowerState::On,
        Some(RfPower::Off | RfPower::PoweringOn) => PowerState::Off,
        _ => PowerState::Unknown,
    }
}

/// The Redfish `ResetType` of a power action.
pub fn reset_type(a: PowerAction) -> ResetType {
    match a {
        PowerAction::On => ResetType::On,
        PowerAction::Off => ResetType::ForceOff,
        PowerAction::SoftOff => ResetType::GracefulShutdown,
        PowerAction::Reboot => ResetType::ForceRestart,
    }
}

/// Lowercase, colon-separated MAC (`52:54:00:AB:CD:EF` and `525400abcdef` both become
/// `52:54:00:ab:cd:ef`); `None` when it is not 12 hex digits.
pub fn normalize_mac(mac: &str) -> Option<String> {
    let hex: String = mac
        .chars()
        .filter(|c| !matches!(c, ':' | '-' | '.'))
        .collect::<String>()
        .to_ascii_lowercase();
    if hex.len() != 12 || !hex.chars().all(|c| c.is_ascii_hexdigit()) || hex == "000000000000" {
        return None;
    }
    let pairs: Vec<&str> = (0..6).map(|i| &hex[i * 2..i * 2 + 2]).collect();
    Some(pairs.join(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_normalized_and_junk_is_dropped() {
        assert_eq!(
            normalize_mac("52:54:00:AB:CD:EF").as_deref(),
            Some("52:54:00:ab:cd:ef")
        );
        assert_eq!(
            normalize_mac("5254-00ab-cdef").as_deref(),
            Some("52:54:00:ab:cd:ef")
        );
        assert_eq!(normalize_mac("00:00:00:00:00:00"), None);
        assert_eq!(normalize_mac("not a mac"), None);
        assert_eq!(normalize_mac(""), None);
    }

    #[test]
    fn power_states_and_actions_map_to_redfish() {
        assert_eq!(power_of(Some(RfPower::PoweringOff)), PowerState::On);
        assert_eq!(power_of(Some(RfPower::PoweringOn)), PowerState::Off);
        assert_eq!(power_of(Some(RfPower::Paused)), PowerState::Unknown);
        assert_eq!(power_of(None), PowerState::Unknown);
        assert_eq!(
            reset_type(PowerAction::SoftOff),
            ResetType::GracefulShutdown
        );
        assert_eq!(reset_type(PowerAction::Reboot), ResetType::ForceRestart);
        assert_eq!(reset_type(PowerAction::Off), ResetType::ForceOff);
    }

    #[test]
    fn long_error_bodies_are_cut() {
        let long = "x".repeat(1000);
        assert!(excerpt(&long).chars().count() <= BODY_EXCERPT + 1);
        assert_eq!(excerpt(" short "), "short");
    }
}
