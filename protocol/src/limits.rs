//! Bounds on the text an agent sends: every field the control plane keeps or shows has a size
//! limit, and a longer value is cut with [`MARKER`] (or, for JSON bytes, replaced by a small
//! JSON note) and counted.
//!
//! # Background
//! A joined node once sent a 15 MiB SpecStatus message; it was stored in a condition and printed
//! by `bcctl nodes get`. Only the whole session message had a limit
//! ([`crate::MAX_SESSION_MESSAGE_BYTES`]).
//!
//! # Design
//! [`Field`] names every bounded field with its limit (characters for text, bytes for JSON).
//! [`bound_agent_message`] and [`bound_join_request`] cut a message in place, field by field;
//! the gateway runs one of them on everything it reads before anything else looks at it. Text
//! the control plane derives from a report (a condition's message, the hostname in an inventory
//! document) goes through [`bound`] where it is made. Every cut adds one to the field's counter
//! ([`truncated_counts`]), which `bcctl serve` exposes as `bcctl_agent_text_truncated_total`.
//!
//! # Limitations
//! The counters are process-wide (atomics), so they also count in a process that only uses this
//! crate for its types (they stay at zero there). Text is cut, not cleaned: control characters
//! are kept and escaped where they are printed.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::pb::agent_message::Msg;
use crate::pb::{
    AgentMessage, CommandUpdate, ErrorInfo, HardwareIdentity, JoinRequest, PowerObservation,
};

/// What a cut text ends with. It counts toward the limit: a cut value is exactly as long as the
/// limit allows.
pub const MARKER: &str = "…[truncated]";

macro_rules! fields {
    ($($(#[$doc:meta])* $variant:ident => $name:literal, $max:expr;)+) => {
        /// A bounded field of what agents send, with its limit ([`Field::max`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Field {
            $($(#[$doc])* $variant),+
        }

        impl Field {
            /// Every field, in counter order.
            pub const ALL: &'static [Field] = &[$(Field::$variant),+];

            /// The field as docs/protocol.md names it (`specStatus.message`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Field::$variant => $name),+
                }
            }

            /// The limit: characters for text, bytes for JSON, entries for lists.
            pub const fn max(self) -> usize {
                match self {
                    $(Field::$variant => $max),+
                }
            }
        }
    };
}

fields! {
    /// `Hello.node_id`, characters (it must equal the certificate's anyway).
    HelloNodeId => "hello.nodeId", 128;
    /// `Hello.boot_id`, characters (a UUID is 36).
    HelloBootId => "hello.bootId", 64;
    /// `Hello.agent_version` and `JoinRequest.agent_version`, characters.
    AgentVersion => "agentVersion", 128;
    /// `SpecStatus.reason`, characters (a CamelCase word, the condition's reason).
    SpecStatusReason => "specStatus.reason", 128;
    /// `SpecStatus.message`, characters (the condition's message).
    SpecStatusMessage => "specStatus.message", 1024;
    /// `CommandUpdate.id`, characters.
    CommandId => "commandUpdate.id", 128;
    /// `CommandUpdate.error.code`, characters.
    CommandErrorCode => "commandUpdate.error.code", 64;
    /// `CommandUpdate.error.message`, characters (reset failures carry nvidia-smi's output).
    CommandErrorMessage => "commandUpdate.error.message", 16 * 1024;
    /// `CommandUpdate.result_json`, bytes; a larger result is replaced by
    /// `{"truncated": true, "bytes": <size>}`.
    CommandResult => "commandUpdate.resultJson", 1024 * 1024;
    /// `Event.type`, characters.
    EventType => "event.type", 64;
    /// `Event.message`, characters.
    EventMessage => "event.message", 1024;
    /// `Event.data_json`, bytes; larger data is replaced by `{"truncated": true, ...}`.
    EventData => "event.dataJson", 64 * 1024;
    /// `Goodbye.message`, characters.
    GoodbyeMessage => "goodbye.message", 1024;
    /// `HardwareIdentity.hardware_key`, characters (hex SHA-256 is 64); a longer key is dropped.
    HardwareKey => "hardware.hardwareKey", 128;
    /// `HardwareIdentity.identifier_digests`, entries; each longer than 128 characters is
    /// dropped, and entries past this count too.
    IdentifierDigests => "hardware.identifierDigests", 256;
    /// The hostname (`JoinRequest.hostname`, the inventory document's `hostname`), characters
    /// (DNS allows 253).
    Hostname => "hostname", 253;
    /// A condition's reason, characters (any owner; the last guard before the store).
    ConditionReason => "condition.reason", 128;
    /// A condition's message, characters (any owner; the last guard before the store).
    ConditionMessage => "condition.message", 1024;
    /// `PowerObservation.node_id` (a site agent's `PowerReport`), characters, as `hello.nodeId`.
    PowerNodeId => "powerReport.observations.nodeId", 128;
    /// `PowerObservation.power`, characters (`on`, `off` or `unknown`).
    PowerState => "powerReport.observations.power", 16;
    /// `PowerObservation.error`, characters (what the BMC answered: a status code and message).
    PowerError => "powerReport.observations.error", 1024;
    /// `PowerObservation.error_code`, characters (a command error code such as `BMC_UNREACHABLE`).
    PowerErrorCode => "powerReport.observations.errorCode", 64;
}

/// Longest identifier digest kept, characters (hex SHA-256 is 64).
pub const MAX_DIGEST_CHARS: usize = 128;

static COUNTS: [AtomicU64; Field::ALL.len()] = [const { AtomicU64::new(0) }; Field::ALL.len()];

fn index(field: Field) -> usize {
    Field::ALL.iter().position(|f| *f == field).unwrap_or(0)
}

fn count(field: Field) {
    COUNTS[index(field)].fetch_add(1, Ordering::Relaxed);
}

/// How many values of each field were cut in this process so far.
pub fn truncated_counts() -> Vec<(Field, u64)> {
    Field::ALL
        .iter()
        .map(|f| (*f, COUNTS[index(*f)].load(Ordering::Relaxed)))
        .collect()
}

/// `s` cut to `max` characters, ending with [`MARKER`], when it is longer; `None` when it fits.
pub fn cut(s: &str, max: usize) -> Option<String> {
    let mut chars = s.char_indices();
    let end = chars.nth(max).map(|(i, _)| i)?;
    let keep = max.saturating_sub(MARKER.chars().count());
    let at = s.char_indices().nth(keep).map_or(end, |(i, _)| i);
    let mut out = String::with_capacity(at + MARKER.len());
    out.push_str(&s[..at]);
    out.push_str(MARKER);
    Some(out)
}

/// Cuts `s` to `field`'s limit in place; counts and returns whether it was cut.
pub fn bound(field: Field, s: &mut String) -> bool {
    match cut(s, field.max()) {
        Some(short) => {
            *s = short;
            count(field);
            true
        }
        None => false,
    }
}

/// Replaces JSON `bytes` over `field`'s limit by `{"truncated": true, "bytes": <size>}`; counts
/// and returns whether it did.
fn bound_json(field: Field, bytes: &mut Vec<u8>) -> bool {
    if bytes.len() <= field.max() {
        return false;
    }
    let note = serde_json::json!({"truncated": true, "bytes": bytes.len()});
    *bytes = serde_json::to_vec(&note).unwrap_or_default();
    count(field);
    true
}

fn bound_error(e: &mut ErrorInfo, cut: &mut Vec<Field>) {
    if bound(Field::CommandErrorCode, &mut e.code) {
        cut.push(Field::CommandErrorCode);
    }
    if bound(Field::CommandErrorMessage, &mut e.message) {
        cut.push(Field::CommandErrorMessage);
    }
}

fn bound_update(u: &mut CommandUpdate, cut: &mut Vec<Field>) {
    if bound(Field::CommandId, &mut u.id) {
        cut.push(Field::CommandId);
    }
    if bound_json(Field::CommandResult, &mut u.result_json) {
        cut.push(Field::CommandResult);
    }
    if let Some(e) = u.error.as_mut() {
        bound_error(e, cut);
    }
}

fn bound_hardware(h: &mut HardwareIdentity, cut: &mut Vec<Field>) {
    if h.hardware_key.chars().count() > Field::HardwareKey.max() {
        h.hardware_key.clear();
        count(Field::HardwareKey);
        cut.push(Field::HardwareKey);
    }
    let before = h.identifier_digests.len();
    h.identifier_digests
        .retain(|d| d.chars().count() <= MAX_DIGEST_CHARS);
    h.identifier_digests
        .truncate(Field::IdentifierDigests.max());
    if h.identifier_digests.len() != before {
        count(Field::IdentifierDigests);
        cut.push(Field::IdentifierDigests);
    }
}

fn bound_power(o: &mut PowerObservation, cut: &mut Vec<Field>) {
    for (field, s) in [
        (Field::PowerNodeId, &mut o.node_id),
        (Field::PowerState, &mut o.power),
        (Field::PowerError, &mut o.error),
        (Field::PowerErrorCode, &mut o.error_code),
    ] {
        // Named once in the returned list however many observations were cut (a site reports
        // many nodes in one message); each cut is still counted.
        if bound(field, s) && !cut.contains(&field) {
            cut.push(field);
        }
    }
}

/// Cuts every bounded field of `m` in place (see [`Field`]); returns the fields that were cut.
pub fn bound_agent_message(m: &mut AgentMessage) -> Vec<Field> {
    let mut cut = Vec::new();
    let text = |field: Field, s: &mut String, cut: &mut Vec<Field>| {
        if bound(field, s) {
            cut.push(field);
        }
    };
    match m.msg.as_mut() {
        Some(Msg::Hello(h)) => {
            text(Field::HelloNodeId, &mut h.node_id, &mut cut);
            text(Field::HelloBootId, &mut h.boot_id, &mut cut);
            text(Field::AgentVersion, &mut h.agent_version, &mut cut);
            for u in &mut h.pending_results {
                bound_update(u, &mut cut);
            }
        }
        Some(Msg::SpecStatus(s)) => {
            text(Field::SpecStatusReason, &mut s.reason, &mut cut);
            text(Field::SpecStatusMessage, &mut s.message, &mut cut);
        }
        Some(Msg::CommandUpdate(u)) => bound_update(u, &mut cut),
        Some(Msg::Event(e)) => {
            text(Field::EventType, &mut e.r#type, &mut cut);
            text(Field::EventMessage, &mut e.message, &mut cut);
            if bound_json(Field::EventData, &mut e.data_json) {
                cut.push(Field::EventData);
            }
        }
        Some(Msg::Goodbye(g)) => text(Field::GoodbyeMessage, &mut g.message, &mut cut),
        Some(Msg::Inventory(i)) => {
            // The document has its own limit (MAX_INVENTORY_BYTES: dropped, not cut); the
            // hostname inside it is bounded where the control plane reads it.
            if let Some(h) = i.hardware.as_mut() {
                bound_hardware(h, &mut cut);
            }
        }
        Some(Msg::PowerReport(p)) => {
            // The number of observations is bounded by the session message limit only (a site
            // reports each node it manages); their text is bounded here.
            for o in &mut p.observations {
                bound_power(o, &mut cut);
            }
        }
        Some(Msg::Heartbeat(_)) | None => {}
    }
    cut
}

/// Cuts every bounded field of a join request in place (hostname, agent version, hardware
/// identity); returns the fields that were cut. The token and the CSR are checked, not cut.
pub fn bound_join_request(r: &mut JoinRequest) -> Vec<Field> {
    let mut cut = Vec::new();
    if bound(Field::Hostname, &mut r.hostname) {
        cut.push(Field::Hostname);
    }
    if bound(Field::AgentVersion, &mut r.agent_version) {
        cut.push(Field::AgentVersion);
    }
    if let Some(h) = r.hardware.as_mut() {
        bound_hardware(h, &mut cut);
    }
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{Event, Goodbye, Hello, PowerReport, SpecStatus};

    fn counted(field: Field) -> u64 {
        truncated_counts()
            .into_iter()
            .find(|(f, _)| *f == field)
            .map_or(0, |(_, n)| n)
    }

    #[test]
    fn cut_keeps_the_limit_in_characters_with_the_marker() {
        assert_eq!(cut("short", 10), None);
        assert_eq!(cut("exactly10!", 10), None);
        let long = "é".repeat(2000);
        let c = cut(&long, 1024).unwrap_or_default();
        assert_eq!(c.chars().count(), 1024);
        assert!(c.ends_with(MARKER) && c.starts_with("éé"));
        // A limit shorter than the marker still holds.
        assert_eq!(
            cut("abcdefghijklmnop", 3).map(|c| c.chars().count()),
            Some(MARKER.chars().count())
        );
    }

    #[test]
    fn a_15_mib_spec_status_message_is_cut_and_counted() {
        let before = counted(Field::SpecStatusMessage);
        let mut m = AgentMessage {
            epoch: 1,
            msg: Some(Msg::SpecStatus(SpecStatus {
                generation: 1,
                converged: false,
                reason: "R".repeat(200),
                message: "x".repeat(15 * 1024 * 1024),
            })),
        };
        let cut = bound_agent_message(&mut m);
        assert_eq!(cut, vec![Field::SpecStatusReason, Field::SpecStatusMessage]);
        let Some(Msg::SpecStatus(s)) = &m.msg else {
            panic!("not a SpecStatus");
        };
        assert_eq!(s.message.chars().count(), 1024);
        assert!(s.message.ends_with(MARKER));
        assert_eq!(s.reason.chars().count(), 128);
        assert!(counted(Field::SpecStatusMessage) > before);
    }

    #[test]
    fn every_agent_text_field_is_bounded() {
        let big = "y".repeat(100_000);
        let update = CommandUpdate {
            id: big.clone(),
            state: 0,
            progress: 0,
            result_json: vec![b' '; 2 * 1024 * 1024],
            error: Some(ErrorInfo {
                code: big.clone(),
                message: big.clone(),
            }),
        };
        let mut hello = AgentMessage {
            epoch: 0,
            msg: Some(Msg::Hello(Hello {
                node_id: big.clone(),
                boot_id: big.clone(),
                agent_version: big.clone(),
                pending_results: vec![update.clone()],
                ..Default::default()
            })),
        };
        let cut = bound_agent_message(&mut hello);
        for f in [
            Field::HelloNodeId,
            Field::HelloBootId,
            Field::AgentVersion,
            Field::CommandId,
            Field::CommandResult,
            Field::CommandErrorCode,
            Field::CommandErrorMessage,
        ] {
            assert!(cut.contains(&f), "{f:?} not cut: {cut:?}");
        }
        let Some(Msg::Hello(h)) = &hello.msg else {
            panic!("not a Hello");
        };
        let r: serde_json::Value =
            serde_json::from_slice(&h.pending_results[0].result_json).unwrap_or_default();
        assert_eq!(r["truncated"], true);
        assert_eq!(r["bytes"], 2 * 1024 * 1024);

        let mut ev = AgentMessage {
            epoch: 1,
            msg: Some(Msg::Event(Event {
                r#type: big.clone(),
                message: big.clone(),
                data_json: vec![b' '; 100_000],
                at_ms: 0,
            })),
        };
        assert_eq!(
            bound_agent_message(&mut ev),
            vec![Field::EventType, Field::EventMessage, Field::EventData]
        );
        let mut bye = AgentMessage {
            epoch: 1,
            msg: Some(Msg::Goodbye(Goodbye {
                reason: 0,
                message: big.clone(),
            })),
        };
        assert_eq!(bound_agent_message(&mut bye), vec![Field::GoodbyeMessage]);

        // A site agent's power report: every observation's text, each cut counted.
        let before = counted(Field::PowerError);
        let observation = PowerObservation {
            node_id: big.clone(),
            power: big.clone(),
            reachable: false,
            error: big.clone(),
            observed_at_ms: 1,
            error_code: big.clone(),
        };
        let mut power = AgentMessage {
            epoch: 1,
            msg: Some(Msg::PowerReport(PowerReport {
                lease_epoch: 1,
                observations: vec![observation.clone(), observation],
            })),
        };
        assert_eq!(
            bound_agent_message(&mut power),
            vec![
                Field::PowerNodeId,
                Field::PowerState,
                Field::PowerError,
                Field::PowerErrorCode
            ]
        );
        assert!(counted(Field::PowerError) >= before + 2);
        let Some(Msg::PowerReport(p)) = &power.msg else {
            panic!("not a PowerReport");
        };
        for o in &p.observations {
            assert_eq!(o.node_id.chars().count(), 128);
            assert_eq!(o.power.chars().count(), 16);
            assert_eq!(o.error.chars().count(), 1024);
            assert!(o.error.ends_with(MARKER));
        }

        let mut join = JoinRequest {
            hostname: big.clone(),
            agent_version: big.clone(),
            hardware: Some(HardwareIdentity {
                hardware_key: big.clone(),
                trusted: true,
                identifier_digests: (0..300)
                    .map(|i| format!("{i:064x}"))
                    .chain([big.clone()])
                    .collect(),
            }),
            ..Default::default()
        };
        let cut = bound_join_request(&mut join);
        assert_eq!(
            cut,
            vec![
                Field::Hostname,
                Field::AgentVersion,
                Field::HardwareKey,
                Field::IdentifierDigests
            ]
        );
        let hw = join.hardware.unwrap_or_default();
        assert!(hw.hardware_key.is_empty());
        assert_eq!(hw.identifier_digests.len(), 256);
        assert_eq!(join.hostname.chars().count(), 253);

        // Within the limits nothing changes and nothing is counted.
        let mut ok = AgentMessage {
            epoch: 1,
            msg: Some(Msg::SpecStatus(SpecStatus {
                generation: 1,
                converged: true,
                reason: "Converged".into(),
                message: "fine".into(),
            })),
        };
        let copy = ok.clone();
        assert!(bound_agent_message(&mut ok).is_empty());
        assert_eq!(ok, copy);
    }
}
