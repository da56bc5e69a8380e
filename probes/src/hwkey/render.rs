//! Printing a [`HardwareKeyReport`] for `bcd hardware-key`: a table or JSON. Serials and UUIDs
//! are shown only with `show_values` (they end up in tickets and chat); MACs are always shown.

use std::fmt::Write as _;

use serde_json::json;

use super::{Candidate, HardwareKeyReport, Kind};

fn shown_value(c: &Candidate, show_values: bool) -> Option<String> {
    (show_values || c.kind == Kind::Mac)
        .then(|| c.raw.clone())
        .flatten()
}

fn counts_as(c: &Candidate, show_values: bool) -> Option<String> {
    let line = c.line.as_ref()?;
    if show_values || line.starts_with("mac:") {
        Some(line.clone())
    } else {
        line.split_once(':').map(|(k, _)| format!("{k}:…"))
    }
}

/// The report as JSON (camelCase).
pub fn render_json(r: &HardwareKeyReport, show_values: bool) -> serde_json::Value {
    let id = r.identity();
    let candidates: Vec<serde_json::Value> = r
        .candidates
        .iter()
        .map(|c| {
            let mut o = json!({
                "kind": c.kind.as_str(),
                "source": c.source,
                "kept": c.kept(),
            });
            if let Some(rej) = &c.rejection {
                o["reason"] = json!(rej.to_string());
            }
            if let Some(l) = &c.line {
                o["digest"] = json!(super::normalize::digest(l));
            }
            if let Some(a) = counts_as(c, show_values) {
                o["countsAs"] = json!(a);
            }
            if let Some(v) = shown_value(c, show_values) {
                o["value"] = json!(v);
            }
            o
        })
        .collect();
    json!({
        "hardwareKey": id.hardware_key,
        "hardwareKeyTrusted": id.trusted,
        "identifierDigests": id.identifier_digests,
        "identitySource": r.identity_source,
        "candidates": candidates,
        "notes": r.notes,
    })
}

/// The report as a human-readable table.
pub fn render_table(r: &HardwareKeyReport, show_values: bool) -> String {
    let mut s = String::new();
    let key = if r.hardware_key.is_empty() {
        "(none: no identifier survived)"
    } else {
        &r.hardware_key
    };
    let _ = writeln!(s, "hardwareKey:        {key}");
    let _ = writeln!(
        s,
        "hardwareKeyTrusted: {} ({} independent identifier{}; 2 needed)",
        r.trusted,
        r.lines.len(),
        if r.lines.len() == 1 { "" } else { "s" }
    );
    let _ = writeln!(s, "identity source:    {}", r.identity_source);
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<17} {:<28} {:<8} {:<44} VALUE",
        "KIND", "SOURCE", "VERDICT", "COUNTS AS / REASON"
    );
    for c in &r.candidates {
        let why = match (&c.rejection, counts_as(c, show_values)) {
            (Some(rej), _) => rej.to_string(),
            (None, Some(a)) => a,
            (None, None) => String::new(),
        };
        let value = shown_value(c, show_values).unwrap_or_else(|| {
            if c.raw.is_some() {
                "(hidden: --show-values)".into()
            } else {
                "-".into()
            }
        });
        let _ = writeln!(
            s,
            "{:<17} {:<28} {:<8} {:<44} {}",
            c.kind.as_str(),
            c.source,
            if c.kept() { "kept" } else { "rejected" },
            why,
            value
        );
    }
    if r.candidates.is_empty() {
        let _ = writeln!(s, "(no candidates)");
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "\nnotes:");
        for n in &r.notes {
            let _ = writeln!(s, "  - {n}");
        }
    }
    s
}
