//! What the model reads from a node's inventory JSON (`nodes.inventory`, the camelCase document of
//! `bc_protocol::inventory::Inventory`): the GPU atoms placement books, and the summary NodeDetail
//! shows.
//!
//! GPUs are read from a top-level `gpus` array; each entry's atom id is its `uuid` (NVML
//! `nvmlDeviceGetUUID`) when present, else `gpu<index>` from its `index` (NVML device index), else
//! `gpu<position in the array>`. A node without a `gpus` array has no atoms.

use serde::Serialize;
use serde_json::Value;

/// The node's GPUs as atom ids, sorted and deduplicated.
pub fn gpu_atoms(inventory: Option<&Value>) -> Vec<String> {
    let Some(gpus) = inventory
        .and_then(|i| i.get("gpus"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    let mut atoms: Vec<String> = gpus
        .iter()
        .enumerate()
        .map(|(pos, g)| {
            if let Some(uuid) = g
                .get("uuid")
                .and_then(Value::as_str)
                .filter(|u| !u.is_empty())
            {
                uuid.to_owned()
            } else if let Some(index) = g.get("index").and_then(Value::as_u64) {
                format!("gpu{index}")
            } else {
                format!("gpu{pos}")
            }
        })
        .collect();
    atoms.sort();
    atoms.dedup();
    atoms
}

/// GPU model names from the `gpus` array (`name`, else `model`), in array order.
pub fn gpu_models(inventory: Option<&Value>) -> Vec<String> {
    let Some(gpus) = inventory
        .and_then(|i| i.get("gpus"))
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    gpus.iter()
        .filter_map(|g| {
            g.get("name")
                .or_else(|| g.get("model"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// A physical NIC in the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NicSummary {
    pub name: String,
    /// Current MAC as `aa:bb:cc:dd:ee:ff`, if the collector read one.
    pub mac: Option<String>,
}

/// The inventory summary in NodeDetail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InventorySummary {
    /// `cpu.model` (`/proc/cpuinfo` "model name").
    pub cpu_model: Option<String>,
    /// `cpu.threads`: logical CPUs.
    pub cpu_threads: Option<u64>,
    /// `memory.totalBytes` (`/proc/meminfo` MemTotal), bytes.
    pub memory_bytes: Option<u64>,
    /// `nics[]` with `physical: true` (NICs without the flag are kept: older documents).
    pub nics: Vec<NicSummary>,
    /// Number of GPUs (atoms).
    pub gpus: u32,
}

/// Summarizes an inventory document. Missing or mistyped fields are `None`, never an error.
pub fn summary(inventory: &Value) -> InventorySummary {
    let nics = inventory
        .get("nics")
        .and_then(Value::as_array)
        .map(|nics| {
            nics.iter()
                .filter(|n| n.get("physical").and_then(Value::as_bool) != Some(false))
                .filter_map(|n| {
                    Some(NicSummary {
                        name: n.get("name")?.as_str()?.to_owned(),
                        mac: n.get("mac").and_then(Value::as_str).map(str::to_owned),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    InventorySummary {
        cpu_model: inventory
            .pointer("/cpu/model")
            .and_then(Value::as_str)
            .map(str::to_owned),
        cpu_threads: inventory.pointer("/cpu/threads").and_then(Value::as_u64),
        memory_bytes: inventory
            .pointer("/memory/totalBytes")
            .and_then(Value::as_u64),
        nics,
        gpus: u32::try_from(gpu_atoms(Some(inventory)).len()).unwrap_or(u32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn atoms_prefer_uuid_then_index_then_position() {
        let inv = json!({"gpus": [{"uuid": "GPU-b"}, {"index": 3}, {}, {"uuid": "GPU-b"}]});
        assert_eq!(gpu_atoms(Some(&inv)), vec!["GPU-b", "gpu2", "gpu3"]);
        assert!(gpu_atoms(Some(&json!({"cpu": {}}))).is_empty());
        assert!(gpu_atoms(None).is_empty());
    }

    #[test]
    fn summary_reads_the_documented_fields() {
        let inv = json!({
            "cpu": {"model": "AMD EPYC 9654", "threads": 192},
            "memory": {"totalBytes": 1_099_511_627_776_u64},
            "nics": [
                {"name": "eno1", "mac": "aa:bb:cc:dd:ee:01", "physical": true},
                {"name": "bond0", "mac": "aa:bb:cc:dd:ee:01", "physical": false}
            ],
            "gpus": [{"uuid": "GPU-1"}, {"uuid": "GPU-2"}]
        });
        let s = summary(&inv);
        assert_eq!(s.cpu_model.as_deref(), Some("AMD EPYC 9654"));
        assert_eq!(s.cpu_threads, Some(192));
        assert_eq!(s.memory_bytes, Some(1_099_511_627_776));
        assert_eq!(s.nics.len(), 1);
        assert_eq!(s.nics[0].name, "eno1");
        assert_eq!(s.gpus, 2);
        let empty = summary(&json!({"cpu": {"threads": "many"}}));
        assert_eq!(empty.cpu_threads, None);
        assert!(empty.nics.is_empty());
    }
}
