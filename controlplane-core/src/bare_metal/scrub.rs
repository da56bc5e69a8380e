//! The control plane's own scrub of what site agents report (issue 30.5).
//!
//! # Background
//! The site agent scrubs a BMC's answer of the password it holds before the answer leaves the
//! appliance. The control plane stored what a site agent reported as it came: a site agent of an
//! older version, one with a bug, or a BMC answer the site's scrub missed would put a password
//! the control plane itself holds into a command's result, a condition, an event and the store.
//!
//! # Design
//! Before a site agent's `CommandUpdate` or `PowerReport` is applied, every text in it (a
//! command's error message, each string of its result, each observation's error) is run through
//! `bc_protocol::scrub` — the site agent's own scrub — with the passwords the control plane
//! holds for the BMC it is about: the stored pair's and a rotation's candidate. The plain
//! password becomes `[redacted]`; a text holding it in any encoding the scrub knows (base64 of it
//! or of `user:password` at any alignment, percent-encoding, JSON `\u` escapes, HTML character
//! references, hex, one inside another) is withheld whole.
//!
//! # Limitations
//! Only the BMC a report names: a password of another node's BMC in it is not looked for. An
//! `Event` report is only logged, and is not scrubbed. Encodings the scrub does not know (a
//! hash, a cipher, a changed case) pass.

use bc_protocol::pb;
use cpl_store::Reader;
use serde_json::Value;

use super::BareMetal;
use super::credentials::CredentialKey;
use crate::error::OpError;

/// The BMC passwords the control plane holds for `node_id`: its stored pair's and a rotation's
/// candidate, where they open. Empty for a node without a BMC.
pub(crate) fn passwords(
    r: &Reader<'_>,
    key: &CredentialKey,
    node_id: &str,
) -> Result<Vec<String>, OpError> {
    let Some(bmc) = r.bmc(node_id)? else {
        return Ok(Vec::new());
    };
    Ok([Some(bmc.credentials), bmc.candidate]
        .into_iter()
        .flatten()
        .filter_map(|sealed| key.open(node_id, &sealed).ok())
        .map(|c| c.password)
        .filter(|p| !p.is_empty())
        .collect())
}

/// `text` scrubbed of each of `secrets`.
pub fn text(secrets: &[String], text: &str) -> String {
    bc_protocol::scrub::scrub_all(secrets.iter().map(String::as_str), text)
}

/// Every string in `v` (values and keys, at any depth) scrubbed of each of `secrets`.
pub fn json(secrets: &[String], v: &mut Value) {
    match v {
        Value::String(s) => *s = text(secrets, s),
        Value::Array(items) => items.iter_mut().for_each(|i| json(secrets, i)),
        Value::Object(map) => {
            let old = std::mem::take(map);
            for (k, mut item) in old {
                json(secrets, &mut item);
                map.insert(text(secrets, &k), item);
            }
        }
        _ => {}
    }
}

/// `u` scrubbed of `secrets`: its error message and every string of its result (a result that
/// is not JSON is scrubbed as text).
pub fn update(secrets: &[String], mut u: pb::CommandUpdate) -> pb::CommandUpdate {
    if secrets.is_empty() {
        return u;
    }
    if let Some(e) = u.error.as_mut() {
        e.message = text(secrets, &e.message);
    }
    if !u.result_json.is_empty() {
        u.result_json = match serde_json::from_slice::<Value>(&u.result_json) {
            Ok(mut v) => {
                json(secrets, &mut v);
                serde_json::to_vec(&v).unwrap_or_default()
            }
            Err(_) => text(secrets, &String::from_utf8_lossy(&u.result_json)).into_bytes(),
        };
    }
    u
}

impl BareMetal {
    /// A `CommandUpdate` from `agent_id` scrubbed of the BMC passwords of the node its command is
    /// about (`subjectNodeId`); as it came for a command about no BMC. A store error leaves
    /// the texts withheld rather than unchecked.
    pub async fn scrub_update(&self, agent_id: &str, u: pb::CommandUpdate) -> pb::CommandUpdate {
        if u.result_json.is_empty() && u.error.is_none() {
            return u;
        }
        let (id, agent, key) = (u.id.clone(), agent_id.to_owned(), self.key.clone());
        let secrets = self
            .store
            .read(move |r| {
                let subject = r
                    .command(&id)?
                    .filter(|c| c.node_id == agent)
                    .and_then(|c| c.subject_node_id);
                match subject {
                    Some(node) => passwords(r, &key, &node),
                    None => Ok(Vec::new()),
                }
            })
            .await;
        match secrets {
            Ok(s) => update(&s, u),
            Err(e) => {
                tracing::warn!(error = %e, "scrubbing a command update: the store failed; its texts are withheld");
                withheld(u)
            }
        }
    }

    /// A `PowerReport` scrubbed: each observation's error of the BMC passwords of its node.
    /// Only the nodes of observations that carry an error are looked up (a sync round reports
    /// every BMC of the site, most of them without one).
    pub async fn scrub_power(&self, mut report: pb::PowerReport) -> pb::PowerReport {
        let erred = |o: &pb::PowerObservation| !o.error.is_empty();
        if !report.observations.iter().any(erred) {
            return report;
        }
        let key = self.key.clone();
        let nodes: Vec<String> = report
            .observations
            .iter()
            .filter(|o| erred(o))
            .map(|o| o.node_id.clone())
            .collect();
        let secrets = self
            .store
            .read(move |r| {
                nodes
                    .iter()
                    .map(|n| passwords(r, &key, n))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await;
        match secrets {
            Ok(all) => {
                let with_errors = report.observations.iter_mut().filter(|o| erred(o));
                for (o, s) in with_errors.zip(all) {
                    o.error = text(&s, &o.error);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "scrubbing a power report: the store failed; its errors are withheld");
                for o in &mut report.observations {
                    if !o.error.is_empty() {
                        o.error = bc_protocol::scrub::WITHHELD.to_owned();
                    }
                }
            }
        }
        report
    }
}

/// `u` with its error message and result replaced: nothing in it could be checked.
fn withheld(mut u: pb::CommandUpdate) -> pb::CommandUpdate {
    if let Some(e) = u.error.as_mut() {
        e.message = bc_protocol::scrub::WITHHELD.to_owned();
    }
    if !u.result_json.is_empty() {
        u.result_json = serde_json::to_vec(&Value::String(bc_protocol::scrub::WITHHELD.to_owned()))
            .unwrap_or_default();
    }
    u
}
