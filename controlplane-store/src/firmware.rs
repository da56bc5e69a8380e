//! The firmware filter of `nodes.list` (issue 20.5): which firmware a node's stored inventory
//! document names, as an SQL condition over the document's JSON (SQLite's JSON functions;
//! PostgreSQL's `jsonb` has the same paths), so the store, not the control plane, scans it.

/// The SQL condition matching nodes whose inventory document (JSON) names firmware `?4` for
/// `component`, where the document keeps it (`system.biosVersion`; `bmc.firmware`; NVMe disks' `firmware`;
/// physical NICs' `firmwareVersion`; `infiniband[].firmware`; `gpus[].vbiosVersion`); `None`
/// for an unknown component. SQLite's JSON functions here; PostgreSQL's `jsonb` has the same
/// paths.
pub fn firmware_sql(component: &str) -> Option<&'static str> {
    Some(match component {
        "bios" => "json_extract(n.inventory, '$.system.biosVersion') = ?4",
        "bmc" => "json_extract(n.inventory, '$.bmc.firmware') = ?4",
        "nvme" => {
            "EXISTS (SELECT 1 FROM json_each(n.inventory, '$.disks') j \
             WHERE json_extract(j.value, '$.nvme') = 1 AND json_extract(j.value, '$.firmware') = ?4)"
        }
        "nic" => {
            "EXISTS (SELECT 1 FROM json_each(n.inventory, '$.nics') j \
             WHERE json_extract(j.value, '$.physical') = 1 \
             AND json_extract(j.value, '$.firmwareVersion') = ?4)"
        }
        "infiniband" => {
            "EXISTS (SELECT 1 FROM json_each(n.inventory, '$.infiniband') j \
             WHERE json_extract(j.value, '$.firmware') = ?4)"
        }
        "gpu" => {
            "EXISTS (SELECT 1 FROM json_each(n.inventory, '$.gpus') j \
             WHERE json_extract(j.value, '$.vbiosVersion') = ?4)"
        }
        _ => return None,
    })
}
