//! Issue 32, item 5: every Xid of NVIDIA's catalog (`bc_protocol::commands::xid_catalog`, data
//! compiled in) walked through both paths of the XID watch, against `tests/fake-nvml`: the
//! kernel log (`/dev/kmsg` under a host root) and NVML events (with the driver's line logged
//! beside each, as real drivers do). Each event must carry the class and action of its
//! catalog bucket and the catalog's words; an Xid the catalog does not list is `unknown`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use bc_protocol::commands::xid_catalog::{self, Bucket};
use bcd_probes::nvml::{RecommendedAction, XidClass, XidEvent, XidSource, spawn_xid_watch};
use fake_nvml::field::{events_until, without_nvml};
use fake_nvml::{FakeNode, fixture_present, h100_node};
use serde_json::{Value, json};

/// An Xid newer than the catalog bcd carries, and the number NVML gives an Xid the driver
/// cannot name.
const UNLISTED: [u64; 2] = [170, 999];
/// XID 154's words, announcing a GPU reset.
const ANNOUNCE_RESET: &str =
    "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)";

/// The class an event of `xid` must have.
fn want_class(xid: u64) -> XidClass {
    match xid_catalog::catalog().get(xid).map(|e| e.bucket) {
        Some(Bucket::Ignore) => XidClass::Informational,
        Some(Bucket::RestartApp) => XidClass::ApplicationFault,
        Some(Bucket::ResetGpu) => XidClass::ResetRequired,
        Some(Bucket::RebootNode) => XidClass::RebootRequired,
        Some(Bucket::DrainAndService) => XidClass::ServiceRequired,
        // Every 154 here announces a reset.
        Some(Bucket::Announced) => XidClass::ResetRequired,
        None => XidClass::Unknown,
    }
}

/// The words the driver logs after the number, per Xid.
fn text(xid: u64) -> String {
    if xid == 154 {
        ANNOUNCE_RESET.to_owned()
    } else {
        format!("catalog walk {xid}")
    }
}

/// Every Xid of the catalog, then one it does not list.
fn walk() -> Vec<u64> {
    let mut xids: Vec<u64> = xid_catalog::catalog()
        .entries
        .iter()
        .map(|e| e.xid)
        .collect();
    xids.extend(UNLISTED);
    xids
}

/// Checks one event per Xid of [`walk`], in order, from `source`.
fn check_walk(got: &[XidEvent], source: XidSource) {
    let xids = walk();
    assert_eq!(
        got.iter().map(|e| e.xid).collect::<Vec<_>>(),
        xids,
        "one event per Xid, in order"
    );
    for (ev, xid) in got.iter().zip(&xids) {
        let class = want_class(*xid);
        assert_eq!(
            (ev.source, ev.class, ev.action),
            (source, class, class.action()),
            "Xid {xid}: {ev:?}"
        );
        let words = xid_catalog::catalog().get(*xid).and_then(|e| e.words());
        if *xid == 154 {
            assert!(
                ev.description
                    .as_deref()
                    .is_some_and(|d| d.contains("GPU reset required")),
                "{ev:?}"
            );
        } else {
            assert_eq!(ev.description.as_deref(), words, "Xid {xid}");
        }
        assert_eq!(
            ev.message.as_deref(),
            Some(text(*xid).as_str()),
            "Xid {xid}"
        );
        assert_eq!(ev.pci_bus_id.as_deref(), Some("0000:1a:00.0"));
    }
    assert_eq!(got.last().map(|e| e.action), Some(RecommendedAction::None));
}

#[tokio::test(flavor = "multi_thread")]
async fn every_catalog_xid_through_the_kernel_log() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(512);
    let watch = spawn_xid_watch(&without_nvml(&node), &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Kmsg);
    let lines: Vec<String> = walk()
        .iter()
        .enumerate()
        .map(|(i, x)| {
            format!(
                "4,{},{},-;NVRM: Xid (PCI:0000:1a:00): {x}, pid=77, {}",
                i + 10,
                (i + 10) * 1000,
                text(*x)
            )
        })
        .collect();
    node.kmsg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let n = walk().len();
    let got = events_until(&mut rx, |e| e.len() >= n).await;
    check_walk(&got, XidSource::Kmsg);
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn every_catalog_xid_through_nvml_events() {
    if !fixture_present() {
        return;
    }
    // One GPU: the fake re-reads its whole state on every call, and 163 events make many calls.
    let mut one = h100_node();
    one["gpus"].as_array_mut().unwrap().truncate(1);
    let node = FakeNode::new(&one);
    let kmsg = node.root.path("/dev/kmsg");
    node.update(|v| v["kmsgPath"] = json!(kmsg));
    let (tx, mut rx) = tokio::sync::mpsc::channel(512);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    let queued: Vec<Value> = walk()
        .iter()
        .map(|x| json!({"xid": x, "pid": 77, "text": text(*x)}))
        .collect();
    node.update(|v| v["gpus"][0]["xidEvents"] = json!(queued));
    let n = walk().len();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(90);
    while got.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) => got.push(ev),
            _ => break,
        }
    }
    check_walk(&got, XidSource::Nvml);
    assert!(got.iter().all(|e| e.pid == Some(77)));
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}
