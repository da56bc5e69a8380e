//! The Redfish documents the simulator writes itself: error bodies with
//! `@Message.ExtendedInfo` (pretty-printed, as iDRAC and iLO send them), tasks, sessions, the
//! account service and the reset action info, and the overlay on the emulator's system.

use std::time::Instant;

use serde_json::{Value, json};

use crate::state::{BootOverride, MacStyle, State};

/// Base registry messages the simulator answers with.
pub const GENERAL_ERROR: &str = "Base.1.8.GeneralError";

/// A DMTF error body: a long general message first (so the first 200 characters of the
/// pretty-printed body hold no `MessageId`), then `@Message.ExtendedInfo` with `message_id` and
/// `message`.
pub fn error(message_id: &str, message: &str) -> Vec<u8> {
    let v = json!({
        "error": {
            "code": GENERAL_ERROR,
            "message": "A general error has occurred. See Resolution for information on how to resolve the error, or @Message.ExtendedInfo if Resolution is not provided. The request could not be completed by this management controller as it was sent.",
            "@Message.ExtendedInfo": [{
                "@odata.type": "#Message.v1_1_1.Message",
                "MessageId": message_id,
                "Message": message,
                "MessageArgs": [],
                "Severity": "Warning",
                "Resolution": "Correct the request body and resubmit the request if the operation failed."
            }]
        }
    });
    serde_json::to_vec_pretty(&v).unwrap_or_default()
}

/// The Task resource of task `id`, in `state`.
pub fn task(id: u32, state: &str, failed: bool) -> Value {
    let mut messages = Vec::new();
    if failed {
        messages.push(json!({
            "MessageId": "Base.1.8.InternalError",
            "Message": "The request failed due to an internal service error.  The service is still operational.",
            "Severity": "Critical"
        }));
    }
    json!({
        "@odata.type": "#Task.v1_4_3.Task",
        "@odata.id": format!("/redfish/v1/TaskService/Tasks/{id}"),
        "Id": id.to_string(),
        "Name": "Simulated BMC task",
        "TaskState": state,
        "TaskStatus": if failed { "Critical" } else { "OK" },
        "TaskMonitor": format!("/redfish/v1/TaskService/TaskMonitors/{id}"),
        "Messages": messages,
    })
}

/// The session resource `id`.
pub fn session(id: u32, user: &str) -> Value {
    json!({
        "@odata.type": "#Session.v1_3_0.Session",
        "@odata.id": format!("/redfish/v1/SessionService/Sessions/{id}"),
        "Id": id.to_string(),
        "Name": "User Session",
        "UserName": user,
    })
}

/// `/redfish/v1/SessionService`.
pub fn session_service() -> Value {
    json!({
        "@odata.type": "#SessionService.v1_1_8.SessionService",
        "@odata.id": "/redfish/v1/SessionService",
        "Id": "SessionService",
        "Name": "Session Service",
        "ServiceEnabled": true,
        "SessionTimeout": 1800,
        "Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"},
    })
}

/// `/redfish/v1/SessionService/Sessions`.
pub fn sessions(st: &State) -> Value {
    let mut ids: Vec<u32> = st.sessions.keys().copied().collect();
    ids.sort_unstable();
    let members: Vec<Value> = ids
        .iter()
        .map(|i| json!({"@odata.id": format!("/redfish/v1/SessionService/Sessions/{i}")}))
        .collect();
    json!({
        "@odata.type": "#SessionCollection.SessionCollection",
        "@odata.id": "/redfish/v1/SessionService/Sessions",
        "Name": "Session Collection",
        "Members@odata.count": members.len(),
        "Members": members,
    })
}

/// `/redfish/v1/AccountService`: the lockout policy.
pub fn account_service(st: &State) -> Value {
    json!({
        "@odata.type": "#AccountService.v1_10_0.AccountService",
        "@odata.id": "/redfish/v1/AccountService",
        "Id": "AccountService",
        "Name": "Account Service",
        "AccountLockoutThreshold": st.b.lockout_threshold,
        "AccountLockoutDuration": st.b.lockout_duration.as_secs(),
        "AccountLockoutCounterResetAfter": st.b.lockout_window.as_secs(),
    })
}

/// The reset action's ActionInfo.
pub fn reset_action_info(system: &str, st: &State) -> Value {
    json!({
        "@odata.type": "#ActionInfo.v1_1_2.ActionInfo",
        "@odata.id": format!("{system}/ResetActionInfo"),
        "Id": "ResetActionInfo",
        "Name": "Reset Action Info",
        "Parameters": [{
            "Name": "ResetType",
            "Required": true,
            "DataType": "String",
            "AllowableValues": st.b.reset_types,
        }],
    })
}

/// The service root with the session and account services.
pub fn overlay_root(doc: &mut Value, st: &State) {
    if !st.b.sessions {
        return;
    }
    if let Some(o) = doc.as_object_mut() {
        o.insert(
            "SessionService".into(),
            json!({"@odata.id": "/redfish/v1/SessionService"}),
        );
        o.insert(
            "AccountService".into(),
            json!({"@odata.id": "/redfish/v1/AccountService"}),
        );
        let links = o.entry("Links").or_insert_with(|| json!({}));
        if let Some(l) = links.as_object_mut() {
            l.insert(
                "Sessions".into(),
                json!({"@odata.id": "/redfish/v1/SessionService/Sessions"}),
            );
        }
    }
}

/// The boot override as the `Boot` object reports it.
fn boot_object(st: &State) -> Value {
    let BootOverride {
        target,
        enabled,
        mode,
    } = &st.boot;
    let mut boot = json!({
        "BootSourceOverrideEnabled": enabled,
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideTarget@Redfish.AllowableValues": st.b.targets,
    });
    if let Some(values) = &st.b.enabled_values {
        boot["BootSourceOverrideEnabled@Redfish.AllowableValues"] = json!(values);
    }
    if let Some(reported) = mode.as_ref().or(st.b.mode.as_ref()) {
        boot["BootSourceOverrideMode"] = json!(reported);
        boot["BootSourceOverrideMode@Redfish.AllowableValues"] = json!(["UEFI", "Legacy"]);
    }
    boot
}

/// The emulator's system document as this BMC reports it: its boot override, reset types,
/// ETag and a transitional power state.
pub fn overlay_system(doc: &mut Value, system: &str, st: &State, now: Instant) {
    let Some(o) = doc.as_object_mut() else {
        return;
    };
    o.insert("Boot".into(), boot_object(st));
    let target = format!("{system}/Actions/ComputerSystem.Reset");
    let reset = if st.b.reset_action_info {
        json!({"target": target, "@Redfish.ActionInfo": format!("{system}/ResetActionInfo")})
    } else {
        json!({"target": target, "ResetType@Redfish.AllowableValues": st.b.reset_types})
    };
    o.insert("Actions".into(), json!({"#ComputerSystem.Reset": reset}));
    if let Some((until, state)) = st.transition
        && now < until
    {
        o.insert("PowerState".into(), json!(state));
    }
    if st.b.etags {
        o.insert("@odata.etag".into(), json!(etag(st)));
    } else {
        o.remove("@odata.etag");
    }
}

/// The system's current ETag (strong).
pub fn etag(st: &State) -> String {
    format!("\"sim-{}\"", st.etag)
}

/// A NIC document with its MAC spelled the BMC's way.
pub fn overlay_nic(doc: &mut Value, style: MacStyle) {
    let Some(o) = doc.as_object_mut() else {
        return;
    };
    for key in ["MACAddress", "PermanentMACAddress"] {
        if let Some(mac) = o.get(key).and_then(Value::as_str).map(str::to_owned) {
            let hex: String = mac.chars().filter(char::is_ascii_hexdigit).collect();
            let spelled = match style {
                MacStyle::Colons => mac,
                MacStyle::DashesUpper => hex
                    .to_ascii_uppercase()
                    .as_bytes()
                    .chunks(2)
                    .map(|c| String::from_utf8_lossy(c).into_owned())
                    .collect::<Vec<_>>()
                    .join("-"),
                MacStyle::Bare => hex.to_ascii_uppercase(),
            };
            o.insert(key.into(), json!(spelled));
        }
    }
}
