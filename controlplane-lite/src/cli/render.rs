//! Tables for API answers, read from the JSON the API returns (so `-o json` and the table always
//! show the same facts).

use serde_json::Value;

use super::table;

/// A cell: strings as they are, null as `-`, arrays joined with `,`, other JSON compact.
pub fn cell(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "-".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.is_empty() => "-".to_owned(),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(","),
        Some(other) => other.to_string(),
    }
}

/// Renders `items` with `(header, JSON pointer)` columns.
pub fn list(items: &[Value], cols: &[(&str, &str)]) -> String {
    let headers: Vec<&str> = cols.iter().map(|(h, _)| *h).collect();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|it| cols.iter().map(|(_, p)| cell(it.pointer(p))).collect())
        .collect();
    table::render(&headers, &rows)
}

/// Renders an object as `key: value` lines; nested objects flatten to `a.b`.
pub fn object(v: &Value) -> String {
    let mut pairs: Vec<(String, String)> = Vec::new();
    flatten("", v, &mut pairs);
    let refs: Vec<(&str, String)> = pairs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    table::render_kv(&refs)
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        // An empty object (a node without labels) shows as `-`, as an empty array does.
        Value::Object(map) if map.is_empty() && !prefix.is_empty() => {
            out.push((prefix.to_owned(), "-".to_owned()));
        }
        Value::Object(map) if prefix.split('.').count() < 3 => {
            for (k, val) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, val, out);
            }
        }
        Value::Array(a) if a.iter().all(Value::is_object) && !a.is_empty() => {
            // Conditions and NICs read best one per line.
            for (i, item) in a.iter().enumerate() {
                let summary = item
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .filter(|(k, _)| !matches!(k.as_str(), "lastTransitionTime" | "owner"))
                            .map(|(k, v)| format!("{k}={}", cell(Some(v))))
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                out.push((format!("{prefix}[{i}]"), summary));
            }
        }
        Value::Number(n) if prefix.ends_with("At") => {
            // Some API objects (sites, pools, tokens) carry times as epoch milliseconds.
            let text = n
                .as_i64()
                .and_then(chrono::DateTime::from_timestamp_millis)
                .map_or_else(
                    || n.to_string(),
                    |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                );
            out.push((prefix.to_owned(), text));
        }
        other => out.push((prefix.to_owned(), cell(Some(other)))),
    }
}

/// The node table of `nodes list`.
pub fn nodes(items: &[Value]) -> String {
    list(
        items,
        &[
            ("ID", "/id"),
            ("POOL", "/poolId"),
            ("ROLE", "/role"),
            ("PROVISION", "/provisionState"),
            ("CONNECTIVITY", "/connectivity"),
            ("CORDONED", "/cordoned"),
            ("MAINT", "/maintenance"),
            ("SCHEDULABLE", "/schedulable"),
            ("BUCKET", "/capacityBucket"),
            ("GEN", "/observedGeneration"),
            ("NOSCHEDULE", "/noScheduleReasons"),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_flatten_and_nulls_show_as_dashes() {
        let v = serde_json::json!({"id": "n1", "session": {"epoch": 2, "gatewayId": null}, "reasons": ["a", "b"]});
        let text = object(&v);
        assert!(text.contains("session.epoch:"), "{text}");
        assert!(text.contains("session.gatewayId:"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("reasons:") && l.ends_with("a,b")),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("session.gatewayId:") && l.ends_with('-')),
            "{text}"
        );
    }

    #[test]
    fn labels_show_one_per_line_and_none_as_a_dash() {
        let text = object(&serde_json::json!({"labels": {"rack": "r7", "tier": "gold"}}));
        assert!(
            text.lines()
                .any(|l| l.starts_with("labels.rack:") && l.ends_with("r7")),
            "{text}"
        );
        let none = object(&serde_json::json!({"id": "n", "labels": {}}));
        assert!(
            none.lines()
                .any(|l| l.starts_with("labels:") && l.ends_with('-')),
            "{none}"
        );
    }

    #[test]
    fn epoch_millisecond_times_read_as_dates() {
        let text = object(&serde_json::json!({"createdAt": 1796025257375_i64, "version": 3}));
        assert!(text.contains("2026-11-30T07:54:17.375Z"), "{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("version:") && l.ends_with('3')),
            "{text}"
        );
    }
}
