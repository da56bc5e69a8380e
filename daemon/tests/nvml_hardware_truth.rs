//! Issue 32, items 3, 4 and 6, against `tests/fake-nvml`: NVLink by what the product has (the
//! field input `nvlink-h100-nvl/`, read in place), the NVLink fabric, and what real drivers
//! answer that the fake now does too (a lost GPU's `NVML_ERROR_UNKNOWN`, NVLink error counters,
//! the XID's words on the NVML path).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fake_nvml;

use bcd_probes::nvml::{
    CheckStatus, DiagArgs, RecommendedAction, XidClass, XidSource, diag, diag_args, inventory_gpus,
    spawn_xid_watch,
};
use fake_nvml::field::{events_until, expect8, field_json, gpu_check};
use fake_nvml::{FakeNode, fixture_present, h100_node, profile_node};
use serde_json::{Value, json};

/// diag with the hardware profile's `expectedNvlinksPerGpu` (and no GPU count).
fn diag_nvlinks(node: &FakeNode, nvlinks: Option<u32>) -> bcd_probes::nvml::DiagReport {
    let args = DiagArgs {
        expected_gpus: None,
        expected_nvlinks_per_gpu: nvlinks,
    };
    diag_args(&node.cfg, &args, &node.root)
}

// --- item 3: NVLink health by what the product has ---------------------------------------------

#[test]
fn an_h100_nvl_pair_with_12_of_18_links_is_healthy() {
    let Some(state) = field_json("nvlink-h100-nvl/fake-nvml.json") else {
        return;
    };
    let node = FakeNode::new(&state);
    let r = diag_nvlinks(&node, None);
    for g in 0..2 {
        let c = gpu_check(&r, g, "nvlink");
        assert_eq!(c.status, CheckStatus::Pass, "GPU {g}: {c:?}");
        assert_eq!(c.value, json!("12/18 active"));
        assert_eq!(c.threshold, Some(json!("12 active")));
        assert!(
            c.detail.as_deref().unwrap_or("").contains("not a fault"),
            "{c:?}"
        );
        assert_eq!(r.gpus[g].verdict, CheckStatus::Pass, "{:?}", r.gpus[g]);
    }
    assert_eq!(r.verdict, CheckStatus::Pass, "{}", r.summary);
}

/// The field state with link `link` of GPU 0 down.
fn nvl_with_link_down(state: &Value, link: usize) -> Value {
    let mut s = state.clone();
    s["gpus"][0]["nvlinks"][link]["active"] = json!(false);
    s
}

#[test]
fn a_link_that_should_be_up_fails_and_the_profile_overrides_the_table() {
    let Some(state) = field_json("nvlink-h100-nvl/fake-nvml.json") else {
        return;
    };
    // One of the 12 wired links down: 11 active where 12 should be.
    let node = FakeNode::new(&nvl_with_link_down(&state, 0));
    let r = diag_nvlinks(&node, None);
    let c = gpu_check(&r, 0, "nvlink");
    assert_eq!(
        (c.status, c.action),
        (CheckStatus::Fail, RecommendedAction::DrainP2p),
        "{c:?}"
    );
    let d = c.detail.clone().unwrap_or_default();
    assert!(
        d.starts_with(
            "1 link(s) that should be up are down (NVIDIA H100 NVL is built with 12 active)"
        ) && d.contains("[0, 4, 5, 10, 11, 16, 17]"),
        "{d}"
    );
    assert_eq!(gpu_check(&r, 1, "nvlink").status, CheckStatus::Pass);
    // The pool's profile wins over the table: 18 expected fails the healthy pair, 0 expected
    // (NVLink not used by this pool) passes even the broken link.
    let node = FakeNode::new(&state);
    let r = diag_nvlinks(&node, Some(18));
    let c = gpu_check(&r, 0, "nvlink");
    assert_eq!(c.status, CheckStatus::Fail, "{c:?}");
    assert!(
        c.detail
            .as_deref()
            .unwrap_or("")
            .contains("the hardware profile's expectedNvlinksPerGpu"),
        "{c:?}"
    );
    let node = FakeNode::new(&nvl_with_link_down(&state, 0));
    assert_eq!(
        gpu_check(&diag_nvlinks(&node, Some(0)), 0, "nvlink").status,
        CheckStatus::Pass
    );
    // With the profile saying 12, every link down fails (the table alone only warns: a PCIe
    // card may run without its bridges).
    let mut none = state.clone();
    for l in none["gpus"][0]["nvlinks"].as_array_mut().unwrap() {
        l["active"] = json!(false);
    }
    let node = FakeNode::new(&none);
    assert_eq!(
        gpu_check(&diag_nvlinks(&node, None), 0, "nvlink").status,
        CheckStatus::Warn
    );
    assert_eq!(
        gpu_check(&diag_nvlinks(&node, Some(12)), 0, "nvlink").status,
        CheckStatus::Fail
    );
    // A product the table does not know keeps the older rule: all links reported should be up.
    let mut unknown = state.clone();
    unknown["gpus"][0]["name"] = json!("NVIDIA Frobnitz 96GB");
    let node = FakeNode::new(&unknown);
    assert_eq!(
        gpu_check(&diag_nvlinks(&node, None), 0, "nvlink").status,
        CheckStatus::Fail
    );
}

// --- item 4: the NVLink fabric -------------------------------------------------------------------

#[test]
fn a_gpu_not_registered_with_the_fabric_fails_with_what_to_do() {
    if !fixture_present() {
        return;
    }
    // NVIDIA's HGX H100 profile: every GPU registered (fabric manager running).
    let node = FakeNode::new(&h100_node());
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    let c = gpu_check(&r, 0, "fabric");
    assert_eq!(
        (c.status, c.value.clone()),
        (CheckStatus::Pass, json!("completed"))
    );
    assert_eq!(
        c.detail.as_deref(),
        Some("clique 0, cluster 00000000-0000-0000-0000-000000000001")
    );
    assert_eq!(r.verdict, CheckStatus::Pass, "{}", r.summary);
    // The fabric manager not running, still registering, and registered with a failure.
    for (state, status, want_value, want_detail) in [
        ("notStarted", 0, "notStarted", "start nvidia-fabricmanager"),
        ("inProgress", 0, "inProgress", "has not completed"),
        (
            "completed",
            999,
            "completed",
            "registered the GPU with a failure (an internal driver error occurred (NVML status 999))",
        ),
    ] {
        let node = FakeNode::new(&h100_node());
        node.update(|v| {
            v["gpus"][2]["fabric"]["state"] = json!(state);
            v["gpus"][2]["fabric"]["status"] = json!(status);
        });
        let r = diag(&node.cfg, Some(&expect8()), &node.root);
        let c = gpu_check(&r, 2, "fabric");
        assert_eq!(
            (c.status, c.action, c.value.clone()),
            (
                CheckStatus::Fail,
                RecommendedAction::Service,
                json!(want_value)
            ),
            "{state}: {c:?}"
        );
        let d = c.detail.clone().unwrap_or_default();
        assert!(
            d.contains(want_detail) && d.contains("error 802"),
            "{state}: {d}"
        );
        assert_eq!(r.gpus[1].verdict, CheckStatus::Pass, "only GPU 2 fails");
    }
    // An A100 has no fabric registration at all (the call answers NOT_SUPPORTED).
    let node = FakeNode::new(&profile_node("a100"));
    let r = diag(&node.cfg, None, &node.root);
    assert_eq!(gpu_check(&r, 0, "fabric").value, json!("notSupported"));
    assert_eq!(gpu_check(&r, 0, "fabric").status, CheckStatus::Pass);
}

#[test]
fn the_inventory_shows_each_gpus_clique() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"][4]["fabric"]["cliqueId"] = json!(7);
        v["gpus"][5]["fabric"]["state"] = json!("notStarted");
    });
    let gpus = inventory_gpus(&node.cfg).unwrap();
    let doc = serde_json::to_value(gpus[4].to_inventory()).unwrap();
    assert_eq!(
        doc["fabric"],
        json!({"state": "completed", "cliqueId": 7,
               "clusterUuid": "00000000-0000-0000-0000-000000000001"})
    );
    assert_eq!(
        serde_json::to_value(gpus[5].to_inventory()).unwrap()["fabric"],
        json!({"state": "notStarted"})
    );
    let a100 = FakeNode::new(&profile_node("a100"));
    let doc = serde_json::to_value(inventory_gpus(&a100.cfg).unwrap()[0].to_inventory()).unwrap();
    assert!(doc.get("fabric").is_none(), "{doc}");
}

// --- item 6: what real drivers answer ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_gpu_under_an_older_driver_answers_unknown_and_is_still_found() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    node.update(|v| {
        v["gpus"][3]["lost"] = json!(true);
        v["gpus"][3]["lostError"] = json!("unknown");
    });
    // The fake's nvidia-smi words it as those drivers do.
    let out = std::process::Command::new(&node.cfg.nvidia_smi)
        .args(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Unable to determine the device handle for GPU0000:4B:00.0: Unknown Error"),
        "{text}"
    );
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    let g = &r.gpus[3];
    assert_eq!(g.pci_bus_id, "0000:4b:00.0");
    assert_eq!(
        (g.verdict, g.action),
        (CheckStatus::Fail, RecommendedAction::RebootNode)
    );
    assert!(
        gpu_check(&r, 3, "present")
            .detail
            .as_deref()
            .unwrap_or("")
            .contains("Unknown"),
        "{g:?}"
    );
    // The XID watch still registers the other seven with NVML and hears them.
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    node.update(|v| v["gpus"][5]["xidEvents"] = json!([48]));
    let got = events_until(&mut rx, |e| !e.is_empty()).await;
    assert_eq!(
        got.first().map(|e| (e.xid, e.source)),
        Some((48, XidSource::Nvml))
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}

#[test]
fn nvlink_error_counters_warn_naming_each_link() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    let c = gpu_check(&r, 0, "nvlinkErrors");
    assert_eq!((c.status, c.value.clone()), (CheckStatus::Pass, json!(0)));
    node.update(|v| {
        v["gpus"][0]["nvlinks"][3]["replayErrors"] = json!(7);
        v["gpus"][0]["nvlinks"][3]["crcDataErrors"] = json!(2);
        v["gpus"][0]["nvlinks"][11]["recoveryErrors"] = json!(1);
        v["gpus"][1]["nvlinks"][0]["crcFlitErrors"] = json!(5);
    });
    let r = diag(&node.cfg, Some(&expect8()), &node.root);
    let c = gpu_check(&r, 0, "nvlinkErrors");
    assert_eq!(
        (c.status, c.value.clone()),
        (CheckStatus::Warn, json!(10)),
        "{c:?}"
    );
    assert_eq!(
        c.detail.as_deref(),
        Some("link 3: replay 7, crcData 2; link 11: recovery 1")
    );
    assert_eq!(
        gpu_check(&r, 1, "nvlinkErrors").detail.as_deref(),
        Some("link 0: crcFlit 5")
    );
    // A card without NVLink has no counters.
    let l40s = FakeNode::new(&profile_node("l40s"));
    let r = diag(&l40s.cfg, None, &l40s.root);
    assert_eq!(
        gpu_check(&r, 0, "nvlinkErrors").value,
        json!("notSupported")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_nvml_xid_event_carries_the_drivers_words() {
    if !fixture_present() {
        return;
    }
    let node = FakeNode::new(&h100_node());
    // The fake driver logs each Xid it raises, as the real one does.
    let kmsg = node.root.path("/dev/kmsg");
    node.update(|v| v["kmsgPath"] = json!(kmsg));
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let watch = spawn_xid_watch(&node.cfg, &node.root, tx).unwrap();
    assert_eq!(watch.source(), XidSource::Nvml);
    // Field 230 says a GPU reset; the 154's own words announce a node reboot: the words count.
    node.update(|v| {
        v["gpus"][2]["recoveryAction"] = json!(1);
        v["gpus"][2]["xidEvents"] = json!([
            {"xid": 31, "pid": 4242, "text": "name=python3, Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_0 faulted @ 0x7f01_23456000"},
            {"xid": 154, "text": "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"},
        ]);
    });
    let got = events_until(&mut rx, |e| e.len() >= 2).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].xid, got[0].source, got[0].pid),
        (31, XidSource::Nvml, Some(4242))
    );
    assert!(
        got[0]
            .message
            .as_deref()
            .unwrap_or("")
            .contains("MMU Fault: ENGINE GRAPHICS"),
        "{:?}",
        got[0]
    );
    assert_eq!(got[0].class, XidClass::ApplicationFault);
    assert_eq!(
        (got[1].xid, got[1].class, got[1].action),
        (154, XidClass::RebootRequired, RecommendedAction::RebootNode),
        "{:?}",
        got[1]
    );
    assert!(
        got[1]
            .message
            .as_deref()
            .unwrap_or("")
            .starts_with("GPU recovery action changed"),
        "{:?}",
        got[1]
    );
    // Without the driver's line (no log), the event still comes, with field 230's action.
    node.update(|v| {
        v["kmsgPath"] = Value::Null;
        v["gpus"][2]["xidEvents"] = json!([154]);
    });
    let got = events_until(&mut rx, |e| !e.is_empty()).await;
    assert_eq!(
        got.first().map(|e| (e.action, e.message.clone())),
        Some((RecommendedAction::ResetGpu, None))
    );
    tokio::task::spawn_blocking(move || watch.stop())
        .await
        .unwrap();
}
