//! The firmware filter of `nodes.list` (issue 20.5): which firmware a node's stored inventory
//! document names, as an SQL condition over the document's JSON, so the store, not the control
//! plane, scans it. SQLite's JSON functions (`json_extract`, `json_each`) or PostgreSQL's
//! `jsonb` operators over the same paths; an array that is missing or not an array matches
//! nothing on both.

/// The SQL condition matching nodes whose inventory document (JSON, column `n.inventory`) names
/// firmware `?4` for `component`, where the document keeps it (`system.biosVersion`;
/// `bmc.firmware`; NVMe disks' `firmware`; physical NICs' `firmwareVersion`;
/// `infiniband[].firmware`; `gpus[].vbiosVersion`); `None` for an unknown component.
pub fn firmware_sql(component: &str, postgres: bool) -> Option<String> {
    // (array in the document, the element's fields that must be JSON `true`, the version field)
    let (array, flag, field) = match component {
        "bios" | "bmc" => {
            let (object, field) = if component == "bios" {
                ("system", "biosVersion")
            } else {
                ("bmc", "firmware")
            };
            return Some(if postgres {
                format!("(n.inventory::jsonb #>> '{{{object},{field}}}') = ?4")
            } else {
                format!("json_extract(n.inventory, '$.{object}.{field}') = ?4")
            });
        }
        "nvme" => ("disks", Some("nvme"), "firmware"),
        "nic" => ("nics", Some("physical"), "firmwareVersion"),
        "infiniband" => ("infiniband", None, "firmware"),
        "gpu" => ("gpus", None, "vbiosVersion"),
        _ => return None,
    };
    Some(if postgres {
        let flag = flag
            .map(|f| format!("(j ->> '{f}') = 'true' AND "))
            .unwrap_or_default();
        format!(
            "EXISTS (SELECT 1 FROM jsonb_array_elements(CASE WHEN \
             jsonb_typeof(n.inventory::jsonb -> '{array}') = 'array' \
             THEN n.inventory::jsonb -> '{array}' ELSE '[]'::jsonb END) j \
             WHERE {flag}(j ->> '{field}') = ?4)"
        )
    } else {
        let flag = flag
            .map(|f| format!("json_extract(j.value, '$.{f}') = 1 AND "))
            .unwrap_or_default();
        format!(
            "EXISTS (SELECT 1 FROM json_each(n.inventory, '$.{array}') j \
             WHERE {flag}json_extract(j.value, '$.{field}') = ?4)"
        )
    })
}
