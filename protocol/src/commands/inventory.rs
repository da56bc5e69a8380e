//! `inventory.refresh`: the agent collects its inventory again and sends it as an `Inventory`
//! message; the command's result is a summary of what was sent.

use serde::{Deserialize, Serialize};

/// The args of `inventory.refresh`: none (`{}`). The agent does not read them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryRefreshArgs {}

/// The result of `inventory.refresh` (camelCase JSON). Every key is always present; a count the
/// document does not have is `null`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryRefreshResult {
    /// Logical CPUs (`cpu.threads` of the inventory document).
    pub cpu_threads: Option<u64>,
    /// Disks in the document.
    pub disks: Option<usize>,
    /// Whether the hardware key is trusted (at least two identifiers survived).
    pub hardware_key_trusted: bool,
    /// Identifier digests sent with the hardware key.
    pub identifiers: usize,
    /// Memory, bytes (`memory.totalBytes`).
    pub memory_bytes: Option<u64>,
    /// NICs in the document.
    pub nics: Option<usize>,
    /// Notes (sections left out or unreadable).
    pub notes: Option<usize>,
}

impl InventoryRefreshResult {
    /// The summary of an inventory document as sent (`Inventory.document_json`, possibly shrunk
    /// to fit) and of its hardware identity. A document that does not parse gives `null` counts.
    pub fn summarize(document_json: &[u8], hardware_key_trusted: bool, identifiers: usize) -> Self {
        use serde_json::Value;
        let doc: Value = serde_json::from_slice(document_json).unwrap_or(Value::Null);
        let count = |key: &str| doc.get(key).and_then(Value::as_array).map(Vec::len);
        Self {
            cpu_threads: doc.pointer("/cpu/threads").and_then(Value::as_u64),
            disks: count("disks"),
            hardware_key_trusted,
            identifiers,
            memory_bytes: doc.pointer("/memory/totalBytes").and_then(Value::as_u64),
            nics: count("nics"),
            notes: count("notes"),
        }
    }
}
