//! Cloud-init user data kept out of sight (issue 30.4).
//!
//! # Background
//! `nodes.deploy --user-data-file` carries whatever the operator's cloud-init needs: often
//! passwords, keys, tokens. The ramdisk's `image.write` must get it whole to write the config
//! drive; nobody else needs it.
//!
//! The deploy's identity for the written system (`deployToken`, issue 30.1) is withheld the
//! same way.
//!
//! # Design
//! [`withhold`] replaces `configDrive.userData` in a command's arguments by
//! `<withheld: N bytes, sha256:HEX>`: every `commands.*` answer shows that instead
//! (`crate::verbs::types::CommandView`), the stored `image.write` loses it once the command is
//! over, and the node's deployment once it is `deployed`.
//!
//! # Limitations
//! Until then it is in the store in clear (the node's deployment, the queued command), as the
//! ramdisk needs it, and a failed deploy keeps it for `nodes.recover`. The deployed system's
//! config drive holds it, as cloud-init writes it.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// What shows where user data was: `<withheld: N bytes, sha256:HEX>`.
pub fn placeholder(user_data: &str) -> String {
    format!(
        "<withheld: {} bytes, sha256:{}>",
        user_data.len(),
        hex::encode(Sha256::digest(user_data.as_bytes()))
    )
}

/// Whether `s` is what [`placeholder`] writes (withheld already).
fn is_placeholder(s: &str) -> bool {
    s.starts_with("<withheld: ") && s.ends_with('>')
}

/// `args` (an `image.write`'s, or a deployment's) with `configDrive.userData` and the deploy's
/// identity (`deployToken`, issue 30.1) replaced by their [`placeholder`]s; `None` when there is
/// none to withhold (other commands, neither present, or withheld already).
pub fn withhold(args: &Value) -> Option<Value> {
    let mut out = args.clone();
    let mut changed = false;
    if let Some(ud) = args
        .get("configDrive")
        .and_then(|c| c.get("userData"))
        .and_then(Value::as_str)
        .filter(|s| !is_placeholder(s))
    {
        out["configDrive"]["userData"] = Value::String(placeholder(ud));
        changed = true;
    }
    if let Some(t) = args
        .get("deployToken")
        .and_then(Value::as_str)
        .filter(|s| !is_placeholder(s))
    {
        out["deployToken"] = Value::String(placeholder(t));
        changed = true;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn user_data_is_replaced_once_and_nothing_else_changes() {
        let a = json!({"image": {"url": "http://h/i"}, "configDrive": {"hostname": "h", "userData": "pw: x"}});
        let w = withhold(&a).unwrap_or_default();
        assert_eq!(w["image"], a["image"]);
        assert_eq!(w["configDrive"]["hostname"], "h");
        let shown = w["configDrive"]["userData"].as_str().unwrap_or_default();
        assert!(shown.starts_with("<withheld: 5 bytes, sha256:"), "{shown}");
        assert!(!shown.contains("pw: x"));
        assert_eq!(withhold(&w), None, "withheld already");
        assert_eq!(withhold(&json!({"nodeId": "n"})), None);
        assert_eq!(withhold(&json!({"configDrive": {"hostname": "h"}})), None);
    }

    #[test]
    fn the_deploy_identity_is_withheld_with_or_without_user_data() {
        let a = json!({"configDrive": {"hostname": "h"}, "deployToken": "deploy_a.s3cret"});
        let w = withhold(&a).unwrap_or_default();
        let shown = w["deployToken"].as_str().unwrap_or_default();
        assert!(shown.starts_with("<withheld: 15 bytes"), "{shown}");
        assert!(!w.to_string().contains("s3cret"), "{w}");
        assert_eq!(withhold(&w), None, "withheld already");
        let both =
            json!({"configDrive": {"hostname": "h", "userData": "x"}, "deployToken": "deploy_a.s"});
        let w = withhold(&both).unwrap_or_default();
        assert!(!w.to_string().contains("deploy_a.s\""), "{w}");
        assert!(
            w["configDrive"]["userData"]
                .as_str()
                .unwrap_or_default()
                .starts_with("<withheld")
        );
    }
}
