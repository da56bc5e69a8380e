//! Issue 18, items 6-8, against `tests/fake-nvml`: the field inputs (`shared/fixtures/field/`,
//! read in place) and inputs of the same kinds built here. A GPU that fell off the bus with no
//! Xid line, XID 154 announcing a recovery action, a GPU whose handle is lost, MIG mode.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bcd::hostroot::HostRoot;
use bcd::nvml::{
    CheckStatus, DiagReport, ExpectedGpus, NvmlConfig, RecommendedAction, XidClass, XidEvent,
    XidSource, diag, inventory_gpus, spawn_xid_watch,
};
use fake_nvml::{FakeNode, fixture_present, h100_node, xid_record};
use serde_json::{Value, json};

const FIELD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/field");

/// The field path, or `None` (loudly; a failure under `CI=true`) when it is missing.
fn field(rel: &str) -> Option<PathBuf> {
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

fn field_json(rel: &str) -> Option<Value> {
    Some(serde_json::from_slice(&std::fs::read(field(rel)?).unwrap()).unwrap())
}

fn expect8() -> ExpectedGpus {
    ExpectedGpus {
        count: 8,
        name: Some("H100".into()),
    }
}

fn node_check<'a>(r: &'a DiagReport, name: &str) -> &'a bcd::nvml::Check {
    r.node_checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no node check {name}"))
}

fn gpu_check<'a>(r: &'a DiagReport, gpu: usize, name: &str) -> &'a bcd::nvml::Check {
    r.gpus[gpu]
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name} on GPU {gpu}"))
}

/// The kernel log lines of a field file, as the fake node's `dev/kmsg` takes them.
fn field_lines(rel: &str) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(field(rel)?).unwrap();
    Some(text.lines().map(str::to_owned).collect())
}

/// Events from `rx` until `enough` says so or 20 s pass.
async fn events_until(
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

fn without_nvml(node: &FakeNode) -> NvmlConfig {
    NvmlConfig {
        lib_path: Some(node.dir.join("missing.so")),
        ..node.cfg.clone()
    }
}

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

// --- item 8: a lost GPU, MIG mode ---------------------------------------------------------------

#[test]
fn a_gpu_whose_handle_is_lost_means_reboot_for_its_bus_id() {
    if !fixture_present() {
        return;
    }
    for lost in [3usize, 6] {
        let node = FakeNode::new(&h100_node());
        node.update(|v| v["gpus"][lost]["lost"] = json!(true));
        let want = ["0000:4b:00.0", "0000:ca:00.0"][usize::from(lost == 6)];
        let r = diag(&node.cfg, Some(&expect8()), &node.root);
        assert_eq!(
            (r.verdict, r.action),
            (CheckStatus::Fail, RecommendedAction::RebootNode)
        );
        let g = &r.gpus[lost];
        assert_eq!(g.pci_bus_id, want);
        assert_eq!(g.action, RecommendedAction::RebootNode);
        let detail = gpu_check(&r, lost, "present")
            .detail
            .clone()
            .unwrap_or_default();
        assert!(
            detail.contains("Unable to determine the device handle") && detail.contains(want),
            "{detail}"
        );
        for o in r.gpus.iter().filter(|o| o.index as usize != lost) {
            assert_eq!(o.verdict, CheckStatus::Pass, "GPU {}", o.index);
        }
        assert_eq!(node_check(&r, "gpuCount").status, CheckStatus::Pass);
    }
    // Without nvidia-smi, the driver's own list of GPUs names it.
    let node = FakeNode::new(&h100_node());
    node.update(|v| v["gpus"][3]["lost"] = json!(true));
    let gpus = node.read()["gpus"].clone();
    for g in gpus.as_array().unwrap() {
        let bus = g["pciBusId"].as_str().unwrap().to_lowercase();
        std::fs::create_dir_all(node.root.path(format!("/proc/driver/nvidia/gpus/{bus}"))).unwrap();
    }
    let cfg = NvmlConfig {
        nvidia_smi: node.dir.join("no-nvidia-smi"),
        ..node.cfg.clone()
    };
    let r = diag(&cfg, Some(&expect8()), &node.root);
    assert_eq!(r.gpus[3].pci_bus_id, "0000:4b:00.0");
    assert_eq!(r.gpus[3].action, RecommendedAction::RebootNode);
}

#[test]
fn the_fake_nvidia_smi_names_a_lost_gpu() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| v["gpus"][3]["lost"] = json!(true));
    let out = std::process::Command::new(&node.cfg.nvidia_smi)
        .args(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Unable to determine the device handle for GPU3: 0000:4B:00.0: GPU is lost"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(15));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_xid_watch_keeps_the_other_gpus_when_one_is_lost() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| v["gpus"][3]["lost"] = json!(true));
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    node.update(|v| v["gpus"][5]["xidEvents"] = json!([95]));
    let got = events_until(&mut rx, |e| !e.is_empty()).await;
    assert_eq!(
        got.first().map(|e| (e.xid, e.pci_bus_id.clone())),
        Some((95, Some("0000:8b:00.0".into())))
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

fn mig_devices(n: usize) -> Value {
    let profiles = ["1g.10gb", "2g.20gb", "3g.40gb"];
    json!(
        (0..n)
            .map(|i| json!({
                "uuid": format!("MIG-5c4a9b1e-0d2f-5a3c-9e7b-00000000000{i}"),
                "name": format!("NVIDIA H100 80GB HBM3 MIG {}", profiles[i % 3]),
                "memoryTotalBytes": 10_737_418_240u64 * (1 << (i % 3)),
                "gpuInstanceId": i + 1,
                "computeInstanceId": 0,
            }))
            .collect::<Vec<_>>()
    )
}

#[test]
fn mig_devices_are_inventoried_and_diag_checks_the_parent() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        for g in v["gpus"].as_array_mut().unwrap() {
            g["migMode"] = json!(false);
        }
        v["gpus"][0]["migMode"] = json!(true);
        v["gpus"][0]["migDevices"] = mig_devices(3);
        v["gpus"][4]["migMode"] = json!(true);
        v["gpus"][4]["migDevices"] = mig_devices(7);
    });
    let gpus = inventory_gpus(&node.cfg).unwrap();
    assert_eq!(gpus.len(), 8, "MIG devices are not GPUs");
    assert_eq!(gpus[0].mig_enabled, Some(true));
    assert_eq!(gpus[0].mig_devices.len(), 3);
    assert_eq!(gpus[4].mig_devices.len(), 7);
    let m = &gpus[0].mig_devices[1];
    assert_eq!(
        (
            m.index,
            m.uuid.as_deref(),
            m.name.as_deref(),
            m.memory_bytes
        ),
        (
            1,
            Some("MIG-5c4a9b1e-0d2f-5a3c-9e7b-000000000001"),
            Some("NVIDIA H100 80GB HBM3 MIG 2g.20gb"),
            Some(21_474_836_480)
        )
    );
    assert_eq!(gpus[1].mig_enabled, Some(false));
    assert!(gpus[1].mig_devices.is_empty());
    // The inventory document carries them.
    let doc = serde_json::to_value(gpus[0].to_inventory()).unwrap();
    assert_eq!(doc["migEnabled"], true);
    assert_eq!(
        doc["migDevices"][2]["uuid"],
        "MIG-5c4a9b1e-0d2f-5a3c-9e7b-000000000002"
    );
    // diag.nvml runs on the 8 parents, and every check passes.
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    assert_eq!(r.gpus.len(), 8);
    assert_eq!(
        (r.verdict, r.action),
        (CheckStatus::Pass, RecommendedAction::None),
        "{}",
        serde_json::to_string_pretty(&r).unwrap()
    );
    let c = gpu_check(&r, 0, "migMode");
    assert_eq!(c.value, json!("enabled"));
    assert!(c.detail.as_deref().unwrap_or("").contains("3 MIG devices"));
    assert_eq!(gpu_check(&r, 1, "migMode").value, json!("disabled"));
    // A mode change waiting for a reset is worth a look.
    node.update(|v| v["gpus"][1]["migModePending"] = json!(true));
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    assert_eq!(gpu_check(&r, 1, "migMode").status, CheckStatus::Warn);
}

// --- item 3 on the NVML path: strings through the one normalisation ----------------------------

#[test]
fn nvml_strings_are_clean() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"][0]["serial"] = json!("\t 1562821083900   ");
        v["gpus"][0]["name"] = json!("NVIDIA H100 80GB HBM3\t  ");
        v["gpus"][0]["uuid"] = json!(" GPU-01000100-0000-0000-0000-000000000000\r\n");
    });
    let gpus = inventory_gpus(&node.cfg).unwrap();
    assert_eq!(gpus[0].serial.as_deref(), Some("1562821083900"));
    assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(gpus[0].uuid, "GPU-01000100-0000-0000-0000-000000000000");
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    assert_eq!(
        (r.gpus[0].name.as_str(), r.gpus[0].uuid.as_str()),
        (
            "NVIDIA H100 80GB HBM3",
            "GPU-01000100-0000-0000-0000-000000000000"
        )
    );
}
