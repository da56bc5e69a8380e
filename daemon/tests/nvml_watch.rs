//! The XID watch against `tests/fake-nvml`: NVML events, the kernel-log fallback, and the watch
//! letting go of NVML while `gpu.reset` runs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use std::time::Duration;

use bcd_probes::nvml::{
    NvmlConfig, RecommendedAction, ResetTarget, XidSource, reset, spawn_xid_watch,
};
use fake_nvml::{FakeNode, fixture_present, h100_node, xid_record};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn the_xid_watch_delivers_nvml_events_as_they_happen() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    node.update(|v| v["gpus"][5]["xidEvents"] = json!([79]));
    let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an XID event")
        .unwrap();
    assert_eq!(ev.xid, 79);
    assert_eq!(ev.source, XidSource::Nvml);
    assert_eq!(
        ev.uuid.as_deref(),
        Some("GPU-01000100-0000-0000-0000-000000000005")
    );
    assert_eq!(ev.pci_bus_id.as_deref(), Some("0000:8b:00.0"));
    assert_eq!(ev.action, RecommendedAction::RebootNode);
    assert_eq!(
        node.read()["gpus"][5]["xidEvents"],
        json!([]),
        "delivered once"
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_nvml_the_xid_watch_follows_the_kernel_log() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.kmsg(&[&xid_record(1, "0000:1a:00", 13)]);
    let cfg = NvmlConfig {
        lib_path: Some(node.dir.join("missing.so")),
        ..node.cfg.clone()
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let watch = spawn_xid_watch(&cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Kmsg);
    // Only records logged after the watch started count.
    node.kmsg(&[&xid_record(2, "0000:ca:00", 95)]);
    let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an XID event")
        .unwrap();
    assert_eq!((ev.xid, ev.source), (95, XidSource::Kmsg));
    assert_eq!(ev.pci_bus_id.as_deref(), Some("0000:ca:00.0"));
    assert_eq!(ev.action, RecommendedAction::ResetGpu);
    assert_eq!(ev.message.as_deref(), Some("test"));
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_proceeds_while_the_xid_watch_runs_and_the_watch_resumes() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    assert_eq!(node.read()["nvmlClients"], 1, "the watch holds NVML open");

    // The fake nvidia-smi, like the real one, refuses while any process has NVML open; the
    // reset must get the watch to let go first.
    let (cfg, root) = (node.cfg.clone(), node.root.clone());
    let target = ResetTarget::Gpus(vec!["0000:ca:00.0".into()]);
    let rep = tokio::task::spawn_blocking(move || reset(&cfg, &target, &root))
        .await
        .unwrap()
        .unwrap();
    assert!(rep.verified);
    assert_eq!(node.read()["gpus"][6]["resetCount"], 1);

    node.update(|v| v["gpus"][6]["xidEvents"] = json!([95]));
    let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an XID event after the reset")
        .unwrap();
    assert_eq!(
        (ev.xid, ev.pci_bus_id.as_deref()),
        (95, Some("0000:ca:00.0"))
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
    assert_eq!(
        node.read()["nvmlClients"],
        0,
        "a stopped watch lets go of NVML"
    );
}
