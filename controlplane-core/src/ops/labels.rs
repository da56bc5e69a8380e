//! `nodes.setLabels` and `nodes.removeLabels`: the operator's labels on a node (spec NodeDetail
//! "labels"). Keys are [`Key`]s, values [`ShortText`]s (`crate::text`), at most
//! [`MAX_LABELS`] per node. Labels never change scheduling: they are for the operator's own
//! selection (`nodes.list {labels}`), not a reason in `noScheduleReasons`.

use std::collections::BTreeMap;

use cpl_store::{NodeRecord, Tx};
use serde_json::Value;

use crate::edit::Edit;
use crate::error::OpError;
use crate::text::{Key, MAX_LABELS, ShortText};

/// The event kind of label `key`.
fn kind(key: &str) -> String {
    format!("label:{key}")
}

/// `nodes.setLabels`: sets each of `labels` (adding or replacing; other labels stay). A label set
/// to the value it has changes nothing. Refused (`INVALID_ARGUMENT`) when the node would carry more
/// than [`MAX_LABELS`].
pub fn set_labels(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    labels: &BTreeMap<Key, ShortText>,
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    let added = labels
        .keys()
        .filter(|k| !edit.node.labels.contains_key(k.as_str()))
        .count();
    let total = edit.node.labels.len() + added;
    if total > MAX_LABELS {
        return Err(OpError::InvalidArgument(format!(
            "labels: node {node_id} would carry {total} labels, at most {MAX_LABELS} are allowed"
        )));
    }
    for (k, v) in labels {
        let to = Value::String(v.to_string());
        let before = edit.node.labels.insert(k.to_string(), to);
        let from = before.as_ref().and_then(Value::as_str).map(str::to_owned);
        if from.as_deref() != Some(v.as_str()) {
            edit.event(&kind(k), from, Some(v.to_string()), "nodes.setLabels");
        }
    }
    edit.save(tx)
}

/// `nodes.removeLabels`: removes each of `keys`; a key the node does not carry is skipped
/// (removing twice is not an error).
pub fn remove_labels(
    tx: &Tx<'_>,
    node_id: &str,
    expected_version: u64,
    actor: &str,
    keys: &[Key],
) -> Result<NodeRecord, OpError> {
    let mut edit = Edit::begin(tx, node_id, Some(expected_version), actor)?;
    for k in keys {
        if let Some(before) = edit.node.labels.remove(k.as_str()) {
            let from = before.as_str().map(str::to_owned);
            edit.event(&kind(k), from, None, "nodes.removeLabels");
        }
    }
    edit.save(tx)
}

/// Whether `node` carries every label of `selector` with exactly its value (an empty selector
/// matches every node).
pub fn matches(node: &NodeRecord, selector: &BTreeMap<Key, ShortText>) -> bool {
    selector
        .iter()
        .all(|(k, v)| node.labels.get(k.as_str()).and_then(Value::as_str) == Some(v.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::node;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<Key, ShortText> {
        pairs
            .iter()
            .map(|(k, v)| (Key::from(*k), ShortText::from(*v)))
            .collect()
    }

    #[test]
    fn labels_are_set_replaced_removed_with_version_and_events() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|c| -> Result<(), OpError> {
            let n = node(c, "node_a", None)?;
            let a = set_labels(
                c,
                "node_a",
                n.version,
                "op",
                &map(&[("rack", "r7"), ("tier", "gold")]),
            )?;
            assert_eq!(a.labels.get("rack"), Some(&Value::from("r7")));
            assert_eq!(a.version, n.version + 1);
            // The version is checked.
            let stale = set_labels(c, "node_a", n.version, "op", &map(&[("rack", "r8")]));
            assert!(matches!(stale, Err(OpError::Conflict { .. })));
            // The same value again changes nothing; a new one is replaced.
            let same = set_labels(c, "node_a", a.version, "op", &map(&[("rack", "r7")]))?;
            assert_eq!(same.version, a.version);
            let b = set_labels(c, "node_a", a.version, "op", &map(&[("rack", "r8")]))?;
            assert_eq!(b.labels.get("rack"), Some(&Value::from("r8")));
            assert_eq!(
                b.labels.get("tier"),
                Some(&Value::from("gold")),
                "other labels stay"
            );
            let r = remove_labels(
                c,
                "node_a",
                b.version,
                "op",
                &[Key::from("tier"), Key::from("nope")],
            )?;
            assert!(!r.labels.contains_key("tier"));
            assert!(matches(&r, &map(&[("rack", "r8")])));
            assert!(!matches(&r, &map(&[("rack", "r7")])));
            assert!(matches(&r, &BTreeMap::new()));
            let kinds: Vec<(String, Option<String>, Option<String>)> = c
                .events("node_a")?
                .into_iter()
                .filter(|e| e.kind.starts_with("label:"))
                .map(|e| (e.kind, e.from, e.to))
                .collect();
            assert_eq!(
                kinds,
                vec![
                    ("label:rack".into(), None, Some("r7".into())),
                    ("label:tier".into(), None, Some("gold".into())),
                    ("label:rack".into(), Some("r7".into()), Some("r8".into())),
                    ("label:tier".into(), Some("gold".into()), None),
                ]
            );
            Ok(())
        })
    }

    #[test]
    fn a_node_carries_at_most_max_labels() -> Result<(), OpError> {
        let store = cpl_store::testing::store()?;
        store.write_blocking(|c| -> Result<(), OpError> {
            let n = node(c, "node_a", None)?;
            let full: BTreeMap<Key, ShortText> = (0..MAX_LABELS)
                .map(|i| (Key::from(format!("k{i}")), ShortText::from("v")))
                .collect();
            let n = set_labels(c, "node_a", n.version, "op", &full)?;
            let over = set_labels(c, "node_a", n.version, "op", &map(&[("one-more", "v")]));
            assert!(matches!(over, Err(OpError::InvalidArgument(_))));
            // Replacing an existing label is fine at the limit.
            set_labels(c, "node_a", n.version, "op", &map(&[("k0", "w")]))?;
            Ok(())
        })
    }
}
