//! `bcd_probes::nvml` against `tests/fake-nvml`: diag.nvml, inventory, gpu.reset and the XID watch on
//! an HGX H100 node described by NVIDIA's mock profile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use bcd_probes::nvml::{
    CheckStatus, DiagReport, ExpectedGpus, NvmlConfig, RecommendedAction, ResetTarget, diag,
    inventory_gpus, reset,
};
use fake_nvml::{FakeNode, fixture_present, h100_node, xid_record};
use serde_json::{Value, json};

fn expect8() -> ExpectedGpus {
    ExpectedGpus {
        count: 8,
        name: Some("H100".into()),
    }
}

fn run_diag(node: &FakeNode) -> DiagReport {
    diag(&node.cfg, Some(&expect8()), &node.root)
}

fn check<'a>(r: &'a DiagReport, gpu: usize, name: &str) -> &'a bcd_probes::nvml::Check {
    r.gpus[gpu]
        .checks
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name} on GPU {gpu}"))
}

#[test]
fn a_healthy_h100_node_passes() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let r = run_diag(&node);
    assert!(r.nvml_available, "{}", r.summary);
    assert_eq!(r.gpus.len(), 8);
    for g in &r.gpus {
        for c in &g.checks {
            assert_eq!(c.status, CheckStatus::Pass, "GPU {} {c:?}", g.index);
        }
    }
    assert_eq!(
        (r.verdict, r.action),
        (CheckStatus::Pass, RecommendedAction::None)
    );
    assert_eq!(r.driver_version.as_deref(), Some("550.163.01"));
    assert_eq!(check(&r, 0, "nvlink").value, json!("18/18 active"));
    assert_eq!(check(&r, 0, "temperature").threshold, Some(json!(87)));
    assert_eq!(r.gpus[4].pci_bus_id, "0000:8a:00.0");
    // The report is a command result: camelCase JSON.
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["nodeChecks"][0]["name"], "nvml");
    assert_eq!(v["gpus"][0]["pciBusId"], "0000:1a:00.0");
}

/// (what to break on GPU 3, check that must flip, status, action)
type Fault = (
    &'static str,
    fn(&mut Value),
    &'static str,
    CheckStatus,
    RecommendedAction,
);

#[test]
fn each_fault_flips_its_check_and_only_that_gpu() {
    if !fixture_present() {
        return;
    }
    use CheckStatus::{Fail, Warn};
    use RecommendedAction as A;
    let faults: Vec<Fault> = vec![
        (
            "volatile uncorrected ECC",
            |g| g["ecc"] = json!({"volatileUncorrected": 2, "aggregateUncorrected": 2}),
            "volatileUncorrectedEcc",
            Fail,
            A::ResetGpu,
        ),
        (
            "retired pages pending",
            |g| g["retiredPages"] = json!({"doubleBit": 1, "pending": true}),
            "retiredPagesPending",
            Fail,
            A::ResetGpu,
        ),
        (
            "remapped rows pending",
            |g| g["remappedRows"] = json!({"uncorrectable": 1, "pending": true}),
            "remappedRowsPending",
            Fail,
            A::ResetGpu,
        ),
        (
            "row remap failure",
            |g| g["remappedRows"] = json!({"uncorrectable": 512, "failure": true}),
            "remappedRowsFailure",
            Fail,
            A::Service,
        ),
        (
            "at slowdown temperature",
            |g| g["temperatureC"] = json!(88),
            "temperature",
            Fail,
            A::Service,
        ),
        (
            "near slowdown temperature",
            |g| g["temperatureC"] = json!(84),
            "temperature",
            Warn,
            A::None,
        ),
        (
            "power over the limit",
            |g| g["powerUsageMw"] = json!(712_000),
            "power",
            Warn,
            A::None,
        ),
        (
            "HW thermal slowdown",
            |g| g["throttleReasons"] = json!(8 | 64),
            "throttleReasons",
            Fail,
            A::Service,
        ),
        (
            "HW slowdown",
            |g| g["throttleReasons"] = json!(8),
            "throttleReasons",
            Warn,
            A::None,
        ),
        (
            "PCIe trained down",
            |g| g["pcie"]["currentGen"] = json!(3),
            "pcieLink",
            Warn,
            A::None,
        ),
        (
            "PCIe narrow",
            |g| g["pcie"]["currentWidth"] = json!(8),
            "pcieLink",
            Warn,
            A::None,
        ),
        (
            "NVLink down",
            |g| g["nvlinks"][5]["active"] = json!(false),
            "nvlink",
            Fail,
            A::DrainP2p,
        ),
        (
            "every NVLink down",
            |g| {
                for l in g["nvlinks"].as_array_mut().unwrap() {
                    l["active"] = json!(false);
                }
            },
            "nvlink",
            Warn,
            A::None,
        ),
        (
            "recovery action reset",
            |g| g["recoveryAction"] = json!(1),
            "recoveryAction",
            Fail,
            A::ResetGpu,
        ),
        (
            "recovery action reboot",
            |g| g["recoveryAction"] = json!(2),
            "recoveryAction",
            Fail,
            A::RebootNode,
        ),
        (
            "recovery action drain P2P",
            |g| g["recoveryAction"] = json!(3),
            "recoveryAction",
            Fail,
            A::DrainP2p,
        ),
        (
            "wrong model",
            |g| g["name"] = json!("NVIDIA A100-SXM4-80GB"),
            "present",
            Fail,
            A::Service,
        ),
    ];
    for (what, break_it, name, status, action) in faults {
        let node = FakeNode::new(&h100_node());
        node.update(|v| break_it(&mut v["gpus"][3]));
        let r = run_diag(&node);
        let c = check(&r, 3, name);
        assert_eq!((c.status, c.action), (status, action), "{what}: {c:?}");
        assert_eq!(
            (r.gpus[3].verdict, r.gpus[3].action),
            (status, action),
            "{what}"
        );
        assert_eq!((r.verdict, r.action), (status, action), "{what}: node");
        for g in r.gpus.iter().filter(|g| g.index != 3) {
            assert_eq!(g.verdict, CheckStatus::Pass, "{what}: GPU {} too", g.index);
        }
    }
}

#[test]
fn xids_in_the_kernel_log_are_judged_by_the_catalog() {
    if !fixture_present() {
        return;
    }
    use CheckStatus::{Fail, Pass, Warn};
    use RecommendedAction as A;
    for (xid, status, action) in [
        (95, Fail, A::ResetGpu),
        (119, Fail, A::ResetGpu),
        (79, Fail, A::RebootNode),
        (13, Warn, A::None),
        (43, Pass, A::None),
    ] {
        let node = FakeNode::new(&h100_node());
        // GPU 2 is 0000:4A:00.0; another GPU's XID must not count for it.
        node.kmsg(&[
            &xid_record(1, "0000:4a:00", xid),
            "6,2,2000,-;usb 1-1: new device",
        ]);
        let r = run_diag(&node);
        let c = check(&r, 2, "xids");
        assert_eq!((c.status, c.action), (status, action), "XID {xid}: {c:?}");
        assert_eq!(c.value, json!([xid]));
        assert_eq!(check(&r, 3, "xids").value, json!([]));
    }
}

#[test]
fn a_missing_gpu_fails_the_count_and_an_xid_79_says_reboot() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"].as_array_mut().unwrap().remove(7);
    });
    let r = run_diag(&node);
    let count = r.node_checks.iter().find(|c| c.name == "gpuCount").unwrap();
    assert_eq!(
        (count.status, count.action),
        (CheckStatus::Fail, RecommendedAction::Service)
    );
    assert_eq!(
        (count.value.clone(), count.threshold.clone()),
        (json!(7), Some(json!(8)))
    );

    node.kmsg(&[&xid_record(9, "0000:cb:00", 79)]);
    let r = run_diag(&node);
    assert_eq!(r.action, RecommendedAction::RebootNode);
}

#[test]
fn init_failures_are_failed_checks_not_crashes() {
    if !fixture_present() {
        return;
    }
    for (err, text, action) in [
        (
            "libRmVersionMismatch",
            "driver/library version mismatch",
            RecommendedAction::RebootNode,
        ),
        (
            "driverNotLoaded",
            "NVIDIA driver not loaded",
            RecommendedAction::Service,
        ),
        ("noPermission", "no permission", RecommendedAction::Service),
    ] {
        let mut cfg = h100_node();
        cfg["initError"] = json!(err);
        let node = FakeNode::new(&cfg);
        let r = run_diag(&node);
        assert!(!r.nvml_available);
        assert!(r.summary.starts_with("NVML unavailable: "), "{}", r.summary);
        assert!(r.summary.contains(text), "{}", r.summary);
        assert_eq!(r.node_checks[0].name, "nvml");
        assert_eq!((r.verdict, r.action), (CheckStatus::Fail, action), "{err}");
        assert!(inventory_gpus(&node.cfg).is_err());
    }
}

#[test]
fn a_host_without_nvml_reports_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = NvmlConfig {
        lib_path: Some(dir.path().join("libnvidia-ml.so.1")),
        ..NvmlConfig::default()
    };
    let root = bcd_probes::hostroot::HostRoot::new(dir.path());
    let r = diag(&cfg, None, &root);
    assert!(
        r.summary.starts_with("NVML unavailable: cannot load"),
        "{}",
        r.summary
    );
    assert_eq!(r.verdict, CheckStatus::Warn);
    let r = diag(&cfg, Some(&expect8()), &root);
    assert_eq!(r.verdict, CheckStatus::Fail);
}

#[test]
fn inventory_lists_the_gpus() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let gpus = inventory_gpus(&node.cfg).unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[7].uuid, "GPU-01000100-0000-0000-0000-000000000007");
    assert_eq!(gpus[7].pci_bus_id, "0000:cb:00.0");
    assert_eq!(gpus[7].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(gpus[7].memory_bytes, 85_899_345_920);
    assert_eq!(gpus[7].serial.as_deref(), Some("1562821083907"));
    // nvmlDeviceGetVbiosVersion, from the profile's device defaults.
    assert_eq!(gpus[7].vbios_version.as_deref(), Some("96.00.74.00.09"));
    assert_eq!(
        gpus[7].to_inventory().vbios_version.as_deref(),
        Some("96.00.74.00.09")
    );
    assert_eq!(gpus[7].pci_device_id, "0x233010de");
}

#[test]
fn a_reset_clears_a_reset_required_xid_and_restores_persistence() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        let g = &mut v["gpus"][2];
        g["recoveryAction"] = json!(1);
        g["ecc"] = json!({"volatileUncorrected": 1, "aggregateUncorrected": 1});
    });
    node.kmsg(&[&xid_record(1, "0000:4a:00", 119)]);
    let r = run_diag(&node);
    assert_eq!(
        (r.verdict, r.action),
        (CheckStatus::Fail, RecommendedAction::ResetGpu)
    );

    let target = ResetTarget::Gpus(vec!["GPU-01000100-0000-0000-0000-000000000002".into()]);
    let rep = reset(&node.cfg, &target, &node.root).unwrap();
    assert!(rep.verified);
    assert_eq!(rep.gpus.len(), 1);
    let g = &rep.gpus[0];
    assert_eq!(g.pci_bus_id, "0000:4a:00.0");
    assert_eq!(g.before.recovery_action.as_deref(), Some("gpuReset"));
    assert_eq!(g.before.volatile_uncorrected_ecc, Some(1));
    let after = g.after.as_ref().unwrap();
    assert_eq!(after.uuid, g.before.uuid);
    assert_eq!(after.recovery_action.as_deref(), Some("none"));
    assert_eq!(after.volatile_uncorrected_ecc, Some(0));
    assert!(after.persistence_mode);
    assert_eq!(g.persistence_mode_restored, Some(true));
    assert!(rep.nvidia_smi_output.contains("was successfully reset"));

    let state = node.read();
    assert_eq!(state["gpus"][2]["resetCount"], 1);
    assert_eq!(state["gpus"][2]["persistenceMode"], true);
    assert_eq!(state["gpus"][3]["resetCount"], 0);

    let r = run_diag(&node);
    assert_eq!(
        (r.verdict, r.action),
        (CheckStatus::Pass, RecommendedAction::None),
        "{}",
        r.summary
    );
    assert!(
        check(&r, 2, "xids")
            .detail
            .as_deref()
            .unwrap()
            .contains("cleared by gpu.reset")
    );
}

#[test]
fn a_reset_with_running_processes_is_refused() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"][5]["processes"] = json!([{"pid": 4242, "usedMemoryBytes": 1024}]);
    });
    // One NVML round first: the fake rewrites its file in normalized form on init.
    inventory_gpus(&node.cfg).unwrap();
    let before = node.read();
    let err = reset(&node.cfg, &ResetTarget::All, &node.root).unwrap_err();
    assert_eq!(err.code().as_str(), "GPU_BUSY");
    assert!(err.to_string().contains("4242"), "{err}");
    assert_eq!(err.details().unwrap()[0]["pids"], json!([4242]));
    assert_eq!(err.details().unwrap()[0]["pciBusId"], "0000:8b:00.0");
    assert_eq!(node.read(), before, "a refused reset changes nothing");
}

#[test]
fn a_failed_reset_still_restores_persistence_mode() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| v["gpus"][1]["resetFails"] = json!(true));
    let target = ResetTarget::Gpus(vec!["0000:1B:00.0".into()]);
    let err = reset(&node.cfg, &target, &node.root).unwrap_err();
    assert_eq!(err.code().as_str(), "RESET_FAILED", "{err}");
    let details = err.details().unwrap();
    assert_eq!(details["gpus"][0]["persistenceModeRestored"], true);
    assert!(
        details["nvidiaSmiOutput"]
            .as_str()
            .unwrap()
            .contains("could not be reset")
    );
    let state = node.read();
    assert_eq!(state["gpus"][1]["persistenceMode"], true);
    assert_eq!(state["gpus"][1]["resetCount"], 0);
}

#[test]
fn without_bcd_switching_persistence_off_nvidia_smi_refuses() {
    if !fixture_present() {
        return;
    }
    // The fake nvidia-smi behaves as the real one: persistence mode holds the GPU.
    let node = FakeNode::new(&h100_node());
    let out = std::process::Command::new(&node.cfg.nvidia_smi)
        .args(["-r", "-i", "0000:1a:00.0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    assert!(String::from_utf8_lossy(&out.stdout).contains("In use by another client"));
}

#[test]
fn direct_nvlink_peers_are_reset_together() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    // GPUs 0 and 1 bridged directly (no NVSwitch), as on PCIe cards with an NVLink bridge.
    node.update(|v| {
        v["gpus"][0]["nvlinks"] = json!([{"active": true, "remotePciBusId": "0000:1B:00.0"}]);
        v["gpus"][1]["nvlinks"] = json!([{"active": true, "remotePciBusId": "0000:1A:00.0"}]);
    });
    let target = ResetTarget::Gpus(vec!["0000:1a:00.0".into()]);
    let rep = reset(&node.cfg, &target, &node.root).unwrap();
    let who: Vec<(&str, bool)> = rep
        .gpus
        .iter()
        .map(|g| (g.pci_bus_id.as_str(), g.requested))
        .collect();
    assert_eq!(who, vec![("0000:1a:00.0", true), ("0000:1b:00.0", false)]);
    let state = node.read();
    assert_eq!(
        (
            state["gpus"][0]["resetCount"].clone(),
            state["gpus"][1]["resetCount"].clone()
        ),
        (json!(1), json!(1))
    );
    // NVSwitch-attached GPUs are reset alone.
    let target = ResetTarget::Gpus(vec!["0000:4a:00.0".into()]);
    assert_eq!(reset(&node.cfg, &target, &node.root).unwrap().gpus.len(), 1);
}

#[test]
fn unknown_gpus_are_not_found() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let err = reset(
        &node.cfg,
        &ResetTarget::Gpus(vec!["GPU-nope".into()]),
        &node.root,
    )
    .unwrap_err();
    assert_eq!(err.code().as_str(), "NOT_FOUND");
}

#[test]
fn bcd_gpu_diag_and_reset_from_the_command_line() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| v["gpus"][0]["processes"] = json!([{"pid": 77}]));
    let bcd = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_bcd"))
            .arg("gpu")
            .arg("--nvml-lib")
            .arg(node.cfg.lib_path.as_ref().unwrap())
            .arg("--nvidia-smi")
            .arg(&node.cfg.nvidia_smi)
            .arg("--root")
            .arg(node.root.root())
            .args(args)
            .output()
            .unwrap()
    };
    let out = bcd(&["diag", "--expect-count", "8", "--expect-name", "H100"]);
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verdict"], "pass");
    assert_eq!(report["gpus"].as_array().unwrap().len(), 8);

    let out = bcd(&["reset", "0000:1a:00.0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GPU_BUSY") && err.contains("77"), "{err}");

    let out = bcd(&["reset", "0000:1b:00.0"]);
    assert!(out.status.success(), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["verified"], true);
}

#[test]
fn every_mock_profile_builds_a_healthy_node() {
    if !fixture_present() {
        return;
    }
    for profile in fake_nvml::PROFILES {
        let cfg = fake_nvml::profile_node(profile);
        let count = cfg["gpus"].as_array().unwrap().len() as u32;
        let name = cfg["gpus"][0]["name"].as_str().unwrap().to_owned();
        let node = FakeNode::new(&cfg);
        let expected = ExpectedGpus {
            count,
            name: Some(name),
        };
        let r = diag(&node.cfg, Some(&expected), &node.root);
        assert_eq!(
            (r.verdict, r.action),
            (CheckStatus::Pass, RecommendedAction::None),
            "{profile}: {}",
            serde_json::to_string_pretty(&r).unwrap()
        );
        let nvlink = check(&r, 0, "nvlink").value.clone();
        let has_links = !cfg["gpus"][0]["nvlinks"].as_array().unwrap().is_empty();
        assert_eq!(
            nvlink == json!("notSupported"),
            !has_links,
            "{profile}: {nvlink}"
        );
    }
}
