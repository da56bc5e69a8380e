//! Helpers for the tests of issue 18's field inputs (`shared/fixtures/field/`, read in place).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bcd_probes::nvml::{DiagReport, ExpectedGpus, NvmlConfig, XidEvent};
use serde_json::Value;

use super::FakeNode;

/// The field inputs of issue 18.
pub const FIELD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/field");

/// The field path, or `None` (loudly; a failure under `CI=true`) when it is missing.
pub fn field(rel: &str) -> Option<PathBuf> {
    let p = Path::new(FIELD).join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "fixture {} is missing",
        p.display()
    );
    eprintln!("!!! FIXTURE MISSING: {} — test skipped", p.display());
    None
}

/// A field JSON file (a fake NVML state), parsed.
pub fn field_json(rel: &str) -> Option<Value> {
    Some(serde_json::from_slice(&std::fs::read(field(rel)?).unwrap()).unwrap())
}

/// What an HGX H100 node's hardware profile says: eight H100s.
pub fn expect8() -> ExpectedGpus {
    ExpectedGpus {
        count: 8,
        name: Some("H100".into()),
    }
}

/// The node check `name`.
pub fn node_check<'a>(r: &'a DiagReport, name: &str) -> &'a bcd_probes::nvml::Check {
    r.node_checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no node check {name}"))
}

/// GPU `gpu`'s check `name`.
pub fn gpu_check<'a>(r: &'a DiagReport, gpu: usize, name: &str) -> &'a bcd_probes::nvml::Check {
    r.gpus[gpu]
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name} on GPU {gpu}"))
}

/// The kernel log lines of a field file, as the fake node's `dev/kmsg` takes them.
pub fn field_lines(rel: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(field(rel)?).unwrap();
    Some(text.lines().map(str::to_owned).collect())
}

/// Events from `rx` until `enough` says so or 20 s pass.
pub async fn events_until(
    rx: &mut tokio::sync::mpsc::Receiver<XidEvent>,
    enough: impl Fn(&[XidEvent]) -> bool,
) -> Vec<XidEvent> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !enough(&got) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) => got.push(ev),
            _ => break,
        }
    }
    got
}

/// `node`'s config with a library that does not exist: the XID watch follows the kernel log.
pub fn without_nvml(node: &FakeNode) -> NvmlConfig {
    NvmlConfig {
        lib_path: Some(node.dir.join("missing.so")),
        ..node.cfg.clone()
    }
}
