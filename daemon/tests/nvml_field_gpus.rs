//! Issue 18, items 8 and 3 (NVML strings), against `tests/fake-nvml`: a GPU whose handle is lost
//! (`NVML_ERROR_GPU_IS_LOST`), MIG mode, and NVML strings through the identifier normalisation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use bcd_probes::nvml::{
    CheckStatus, NvmlConfig, RecommendedAction, XidSource, diag, inventory_gpus, spawn_xid_watch,
};
use fake_nvml::field::{events_until, expect8, gpu_check, node_check};
use fake_nvml::{FakeNode, fixture_present, h100_node};
use serde_json::{Value, json};

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
