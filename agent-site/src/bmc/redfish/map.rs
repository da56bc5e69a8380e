//! The pure parts of the Redfish driver: what a failed request was about, error text (what the
//! BMC said: its `@Message.ExtendedInfo`), the redirect policy, and the mappings between
//! Redfish values and the power axis's, with the documented fallback orders of reset types.

use bc_protocol::commands::bmc::{PowerAction, PowerState};
use nv_redfish::schema::resource::{PowerState as RfPower, ResetType};
use serde_json::Value;

use crate::bmc::PowerReading;

/// How much of a BMC's error body an error message quotes when it is no Redfish error.
pub(super) const BODY_EXCERPT: usize = 200;
/// How much of what a BMC said (its messages) an error message keeps.
const SAID_LIMIT: usize = 1000;
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
    Session,
    Task,
    ActionInfo,
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
            Self::Session => "session login",
            Self::Task => "task monitor",
            Self::ActionInfo => "reset action info",
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

/// What a BMC said in an error body: each `@Message.ExtendedInfo` entry as `MessageId:
/// Message` (DSP0266's error response), else `error.code: error.message`, else an excerpt of the
/// body as it came (not JSON, or another shape). Scrub the body before.
pub(super) fn bmc_said(body: &str) -> String {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return excerpt(body);
    };
    let err = v.get("error").unwrap_or(&v);
    let mut parts = messages(
        err.get("@Message.ExtendedInfo")
            .or_else(|| v.get("@Message.ExtendedInfo")),
    );
    if parts.is_empty()
        && let Some(m) = err.get("message").and_then(Value::as_str)
    {
        parts.push(match err.get("code").and_then(Value::as_str) {
            Some(c) => format!("{c}: {m}"),
            None => m.to_owned(),
        });
    }
    if parts.is_empty() {
        return excerpt(body);
    }
    cut(&parts.join("; "), SAID_LIMIT)
}

/// A list of Redfish `Message` objects as `MessageId: Message` lines (a Task's `Messages`, an
/// `@Message.ExtendedInfo`).
pub(super) fn messages(list: Option<&Value>) -> Vec<String> {
    let mut out = Vec::new();
    for m in list.and_then(Value::as_array).into_iter().flatten() {
        let id = m.get("MessageId").and_then(Value::as_str);
        let text = m.get("Message").and_then(Value::as_str).map(str::trim);
        match (id, text) {
            (Some(i), Some(t)) => out.push(format!("{i}: {t}")),
            (Some(i), None) => out.push(i.to_owned()),
            (None, Some(t)) => out.push(t.to_owned()),
            (None, None) => {}
        }
    }
    out
}

fn cut(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// The power axis's reading of a Redfish `PowerState` (DMTF `Resource.PowerState`): a
/// transition (`PoweringOn`, `PoweringOff`) reads as the state it heads to, marked settling.
pub fn reading_of(p: Option<RfPower>) -> PowerReading {
    match p {
        Some(RfPower::On) => PowerReading::settled(PowerState::On),
        Some(RfPower::Off) => PowerReading::settled(PowerState::Off),
        Some(RfPower::PoweringOn) => PowerReading {
            power: PowerState::On,
            settling: true,
        },
        Some(RfPower::PoweringOff) => PowerReading {
            power: PowerState::Off,
            settling: true,
        },
        _ => PowerReading::settled(PowerState::Unknown),
    }
}

/// The reset types that carry out `action`, in the order bcd tries them among those the BMC
/// lists (docs/bare-metal.md): `on` → `On`, `ForceOn`, `PushPowerButton` (from off only);
/// `off` → `ForceOff`, `GracefulShutdown`, `PushPowerButton` (from on only); `softOff` →
/// `GracefulShutdown`, `PushPowerButton`; `reboot` → `ForceRestart`, `PowerCycle`,
/// `GracefulRestart` (none listed: an `off`, then an `on`).
pub fn reset_candidates(action: PowerAction) -> &'static [&'static str] {
    match action {
        PowerAction::On => &["On", "ForceOn", "PushPowerButton"],
        PowerAction::Off => &["ForceOff", "GracefulShutdown", "PushPowerButton"],
        PowerAction::SoftOff => &["GracefulShutdown", "PushPowerButton"],
        PowerAction::Reboot => &["ForceRestart", "PowerCycle", "GracefulRestart"],
    }
}

/// The first of `candidates` the BMC lists in `allowed` (`None`: it lists nothing, so every
/// standard value is taken as offered).
pub fn choose<'a>(candidates: &[&'a str], allowed: Option<&[String]>) -> Option<&'a str> {
    candidates
        .iter()
        .copied()
        .find(|c| allowed.is_none_or(|a| a.iter().any(|x| x == c)))
}

/// The typed `ResetType` of a value the BMC listed (`None` for a value the schema does not
/// know: the generated enum reads it as its catch-all, which cannot be sent back).
pub fn reset_type(name: &str) -> Option<ResetType> {
    let t: ResetType = serde_json::from_value(Value::String(name.to_owned())).ok()?;
    let back = serde_json::to_value(t).ok()?;
    (back.as_str() == Some(name)).then_some(t)
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
    fn power_states_read_as_settled_or_settling() {
        let r = reading_of(Some(RfPower::PoweringOn));
        assert_eq!((r.power, r.settling), (PowerState::On, true));
        let r = reading_of(Some(RfPower::PoweringOff));
        assert_eq!((r.power, r.settling), (PowerState::Off, true));
        assert_eq!(
            reading_of(Some(RfPower::On)),
            PowerReading::settled(PowerState::On)
        );
        assert_eq!(reading_of(Some(RfPower::Paused)).power, PowerState::Unknown);
        assert_eq!(reading_of(None).power, PowerState::Unknown);
    }

    #[test]
    fn only_listed_reset_types_are_chosen_in_the_documented_order() {
        let listed = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let reboot = reset_candidates(PowerAction::Reboot);
        assert_eq!(choose(reboot, None), Some("ForceRestart"));
        let no_force = listed(&["On", "ForceOff", "PowerCycle", "GracefulRestart"]);
        assert_eq!(choose(reboot, Some(&no_force)), Some("PowerCycle"));
        assert_eq!(choose(reboot, Some(&listed(&["On", "ForceOff"]))), None);
        assert_eq!(
            choose(
                reset_candidates(PowerAction::On),
                Some(&listed(&["ForceOn"]))
            ),
            Some("ForceOn")
        );
        assert_eq!(reset_type("PowerCycle"), Some(ResetType::PowerCycle));
        assert_eq!(reset_type("Bogus"), None);
    }

    #[test]
    fn errors_say_the_message_id_and_message() {
        let pretty = serde_json::to_string_pretty(&serde_json::json!({"error": {
            "code": "Base.1.8.GeneralError",
            "message": "A general error has occurred. See ExtendedInfo for more information. ".repeat(4),
            "@Message.ExtendedInfo": [
                {"MessageId": "Base.1.8.PropertyMissing",
                 "Message": "The property BootSourceOverrideMode is a required property."},
                {"MessageId": "Base.1.8.Other"}
            ]}}))
        .unwrap_or_default();
        assert_eq!(
            bmc_said(&pretty),
            "Base.1.8.PropertyMissing: The property BootSourceOverrideMode is a required property.; Base.1.8.Other"
        );
        assert_eq!(
            bmc_said(r#"{"error": {"code": "Base.1.0.GeneralError", "message": "injected 500"}}"#),
            "Base.1.0.GeneralError: injected 500"
        );
        assert_eq!(
            bmc_said(" Missing the BootSourceOverrideTarget "),
            "Missing the BootSourceOverrideTarget"
        );
    }

    #[test]
    fn long_error_bodies_are_cut() {
        let long = "x".repeat(1000);
        assert!(excerpt(&long).chars().count() <= BODY_EXCERPT + 1);
        assert_eq!(excerpt(" short "), "short");
    }
}
