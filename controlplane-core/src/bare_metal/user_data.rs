//! Cloud-init user data kept out of sight (issue 30.4).
//!
//! # Background
//! `nodes.deploy --user-data-file` carries whatever the operator's cloud-init needs: often
//! passwords, keys, tokens. The ramdisk's `image.write` must get it whole to write the config
//! drive; nobody else needs it.
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

/// `args` (an `image.write`'s, or a deployment's) with `configDrive.userData` replaced by its
/// [`placeholder`]; `None` when there is none to withhold (other commands, no user data, or
/// withheld already).
pub fn withhold(args: &Value) -> Option<Value> {
    let ud = args.get("configDrive")?.get("userData")?.as_str()?;
    if is_placeholder(ud) {
        return None;
    }
    let mut out = args.clone();
    out["configDrive"]["userData"] = Value::String(placeholder(ud));
    Some(out)
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
}
