//! Issue 18, items 6 and 7, against `tests/fake-nvml`: the field inputs (`shared/fixtures/field/`,
//! read in place) and inputs of the same kinds built here. A GPU that fell off the bus with no
//! Xid line; XID 154 announcing a recovery action. Items 3 (NVML strings) and 8 are in
//! `nvml_field_gpus.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::{
    CheckStatus, RecommendedAction, XidClass, XidSource, diag, spawn_xid_watch,
};
use fake_nvml::field::{
    events_until, expect8, field, field_json, field_lines, gpu_check, node_check, without_nvml,
};
use fake_nvml::{FakeNode, fixture_present, h100_node, xid_record};
use serde_json::json;

// --- item 6: a GPU fell off the bus, and the driver said so without an Xid line ---------------

#[test]
fn a_gpu_that_fell_off_the_bus_without_an_xid_line_means_reboot() {
    let (Some(state), Some(root)) = (
        field_json("gpu-fell-off-bus/fake-nvml.json"),
        field("gpu-fell-off-bus/root"),
    ) else {
        return;
    };
    let node = FakeNode::new(&state);
    let r = diag(&node.cfg, Some(&expect8()), &HostRoot::new(root));
    let count = node_check(&r, "gpuCount");
    assert_eq!(
        (count.status, count.action),
        (CheckStatus::Fail, RecommendedAction::RebootNode),
        "{count:?}"
    );
    assert_eq!(count.value, json!(7));
    assert!(
        count
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("0000:b3:00.0"),
        "{count:?}"
    );
    assert_eq!(r.action, RecommendedAction::RebootNode);
}

/// The forms the driver's "fallen off the bus" message takes in a kernel log, for GPU 7 of the
/// H100 node (`0000:cb:00`).
fn fell_off_forms() -> Vec<Vec<String>> {
    vec![
        // /dev/kmsg: one record, newlines escaped.
        vec!["3,880,1843308145,-;NVRM: The NVIDIA GPU 0000:cb:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.".into()],
        // dmesg: three lines of one record.
        vec![
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:cb:00.0".into(),
            "[ 1843.308145] NVRM: (PCI ID: 10de:2330) installed in this system has".into(),
            "[ 1843.308145] NVRM: fallen off the bus and is not responding to commands.".into(),
        ],
        // journalctl: the later lines indented.
        vec![
            "[ 1843.308145] NVRM: The NVIDIA GPU 0000:cb:00.0".into(),
            "               NVRM: installed in this system has".into(),
            "               NVRM: fallen off the bus and is not responding to commands.".into(),
        ],
        // At run time, no Xid line beside it.
        vec!["4,881,2000000,-;NVRM: GPU 0000:cb:00.0: GPU has fallen off the bus.".into()],
        vec!["4,882,2000001,-;NVRM: GPU 0000:CB:00.0: GPU lost from the bus [NV_ERR_GPU_IS_LOST]".into()],
    ]
}

#[test]
fn every_form_of_the_drivers_message_is_evidence_in_diag() {
    if !fixture_present() {
        return;
    }
    for lines in fell_off_forms() {
        let node = FakeNode::new(&h100_node());
        node.update(|v| {
            v["gpus"].as_array_mut().unwrap().remove(7);
        });
        node.kmsg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let r = diag(&node.cfg, Some(&expect8()), &node.root);
        let count = node_check(&r, "gpuCount");
        assert_eq!(
            (
                count.action,
                count
                    .detail
                    .as_deref()
                    .unwrap_or("")
                    .contains("0000:cb:00.0")
            ),
            (RecommendedAction::RebootNode, true),
            "{lines:?}: {count:?}"
        );
    }
    // The same message about a GPU NVML still lists fails that GPU's xids check, as Xid 79 does.
    let node = FakeNode::new(&h100_node());
    node.kmsg(&["4,9,2000000,-;NVRM: GPU 0000:4b:00.0: GPU has fallen off the bus."]);
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    let x = gpu_check(&r, 3, "xids");
    assert_eq!(
        (x.status, x.action),
        (CheckStatus::Fail, RecommendedAction::RebootNode)
    );
    assert_eq!(x.value, json!([79]));
    // After an Xid 79 line, the driver's message is the same failure, not a second one.
    let node = FakeNode::new(&h100_node());
    node.kmsg(&[
        &xid_record(10, "0000:4b:00", 79),
        "4,11,2000000,-;NVRM: GPU 0000:4b:00.0: GPU has fallen off the bus.",
    ]);
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    assert_eq!(gpu_check(&r, 3, "xids").value, json!([79]));
    // Other driver messages naming a GPU are no such evidence.
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"].as_array_mut().unwrap().remove(7);
    });
    node.kmsg(&[
        "3,12,100,-;NVRM: GPU 0000:cb:00.0: RmInitAdapter failed! (0x22:0x56:667)",
        "6,13,101,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  Mon Jun  2 13:13:04 UTC 2025",
    ]);
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    assert_eq!(
        node_check(&r, "gpuCount").action,
        RecommendedAction::Service
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kernel_log_watch_reports_a_gpu_that_fell_off_the_bus() {
    let Some(lines) = field_lines("gpu-fell-off-bus/root/dev/kmsg") else {
        return;
    };
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watch = spawn_xid_watch(&without_nvml(&node), &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Kmsg);
    node.kmsg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let got = events_until(&mut rx, |e| !e.is_empty()).await;
    let ev = got
        .first()
        .expect("an event for the GPU that fell off the bus");
    assert_eq!(ev.pci_bus_id.as_deref(), Some("0000:b3:00.0"));
    assert_eq!((ev.xid, ev.action), (79, RecommendedAction::RebootNode));
    assert_eq!(ev.class, XidClass::RebootRequired);
    assert!(ev.driver_message);
    let v = serde_json::to_value(ev).unwrap();
    assert_eq!(v["driverMessage"], true);
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_nvml_events_the_watch_still_reads_the_drivers_messages() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    // An Xid line is NVML's to deliver; the driver's message has no NVML event.
    node.kmsg(&[
        &xid_record(1, "0000:1a:00", 13),
        "4,2,2000000,-;NVRM: GPU 0000:8a:00.0: GPU has fallen off the bus.",
    ]);
    let got = events_until(&mut rx, |e| !e.is_empty()).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].pci_bus_id.as_deref(), Some("0000:8a:00.0"));
    assert_eq!(
        (got[0].source, got[0].action),
        (XidSource::Kmsg, RecommendedAction::RebootNode)
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

// --- item 7: XID 154 announces the recovery action ---------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn xid_154_in_the_kernel_log_announces_its_action() {
    let Some(lines) = field_lines("xid154/appended.kmsg") else {
        return;
    };
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watch = spawn_xid_watch(&without_nvml(&node), &node.root, tx).unwrap();
    node.kmsg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    // A synthetic one of the same kind: the driver's other wording of a reboot.
    node.kmsg(&[
        "4,5106,92000000,-;NVRM: Xid (PCI:0000:4a:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
    ]);
    let got = events_until(&mut rx, |e| e.iter().filter(|e| e.xid == 154).count() >= 3).await;
    let x154: Vec<(Option<&str>, RecommendedAction, XidClass)> = got
        .iter()
        .filter(|e| e.xid == 154)
        .map(|e| (e.pci_bus_id.as_deref(), e.action, e.class))
        .collect();
    assert_eq!(
        x154,
        vec![
            (
                Some("0000:06:00.0"),
                RecommendedAction::RebootNode,
                XidClass::RebootRequired
            ),
            (
                Some("0000:2a:00.0"),
                RecommendedAction::ResetGpu,
                XidClass::ResetRequired
            ),
            (
                Some("0000:4a:00.0"),
                RecommendedAction::RebootNode,
                XidClass::RebootRequired
            ),
        ],
        "{got:?}"
    );
    let d = got
        .iter()
        .find(|e| e.xid == 154)
        .and_then(|e| e.description.clone())
        .unwrap_or_default();
    assert!(d.contains("node reboot required"), "{d}");
    // The Xid 79 and the driver's message right after it are one event.
    assert_eq!(got.iter().filter(|e| e.xid == 79).count(), 1, "{got:?}");
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn xid_154_from_nvml_takes_the_action_from_field_230() {
    let Some(state) = field_json("xid154/fake-nvml.json") else {
        return;
    };
    // The field state (recovery action 1 after Xids 120 and 154), and one of the same kind
    // announcing a node reboot.
    let mut reboot = state.clone();
    reboot["gpus"][0]["recoveryAction"] = json!(2);
    reboot["gpus"][0]["xidEvents"] = json!([154]);
    for (state, want) in [
        (state, RecommendedAction::ResetGpu),
        (reboot, RecommendedAction::RebootNode),
    ] {
        let node = FakeNode::new(&state);
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
        assert_eq!(watch.source(), XidSource::Nvml);
        let got = events_until(&mut rx, |e| e.iter().any(|e| e.xid == 154)).await;
        let ev = got
            .iter()
            .find(|e| e.xid == 154)
            .expect("the XID 154 event");
        assert_eq!(ev.action, want, "{ev:?}");
        assert_eq!(ev.class, XidClass::announcing(want));
        assert_eq!(ev.pci_bus_id.as_deref(), Some("0000:2a:00.0"));
        assert!(
            ev.description
                .as_deref()
                .is_some_and(|d| d.starts_with("GPU recovery action changed: ")),
            "{ev:?}"
        );
        tokio::task::spawn_blocking(move || watch.stop())
            .await
            .unwrap();
    }
}

#[test]
fn diag_judges_xid_154_by_the_action_it_announces() {
    if !fixture_present() {
        return;
    }
    let line = |seq: u64, to: &str| {
        format!(
            "4,{seq},{},-;NVRM: Xid (PCI:0000:4a:00): 154, GPU recovery action changed from 0x0 (None) to {to}",
            seq * 1000
        )
    };
    for (lines, status, action) in [
        (
            vec![line(1, "0x2 (Node Reboot Required)")],
            CheckStatus::Fail,
            RecommendedAction::RebootNode,
        ),
        (
            vec![line(1, "0x1 (PF FLR)")],
            CheckStatus::Fail,
            RecommendedAction::ResetGpu,
        ),
        (
            vec![line(1, "0x3 (Drain P2P)")],
            CheckStatus::Fail,
            RecommendedAction::DrainP2p,
        ),
        // The latest 154 is the current action.
        (
            vec![line(1, "0x1 (GPU Reset Required)"), line(2, "0x0 (None)")],
            CheckStatus::Pass,
            RecommendedAction::None,
        ),
    ] {
        let node = FakeNode::new(&h100_node());
        node.kmsg(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        let r = diag(&node.cfg, Some(&expect8()), &node.root);
        let c = gpu_check(&r, 2, "xids");
        assert_eq!((c.status, c.action), (status, action), "{lines:?}: {c:?}");
    }
    // The field log read in place: GPU 0000:2a:00 (the field state's) must reset.
    let (Some(state), Some(root)) = (field_json("xid154/fake-nvml.json"), field("xid154/root"))
    else {
        return;
    };
    let node = FakeNode::new(&state);
    let r = diag(&node.cfg, None, &HostRoot::new(root));
    let x = gpu_check(&r, 0, "xids");
    assert_eq!(
        (x.status, x.action),
        (CheckStatus::Fail, RecommendedAction::ResetGpu)
    );
    assert!(
        x.detail
            .as_deref()
            .unwrap_or("")
            .contains("GPU reset required"),
        "{x:?}"
    );
    let ra = gpu_check(&r, 0, "recoveryAction");
    assert_eq!(ra.action, RecommendedAction::ResetGpu);
    assert!(
        ra.detail
            .as_deref()
            .unwrap_or("")
            .contains("GPU reset required")
    );
}
