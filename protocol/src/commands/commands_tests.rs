//! Pins the JSON of every command contract to what the agent sent before the types existed: a
//! renamed field or a changed skip rule fails here, not in a control plane reading `null`.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::diag::{Check, CheckStatus, DiagArgs, DiagReport, ExpectedGpus, worst};
use super::inventory::InventoryRefreshResult;
use super::logs::{CollectArgs, CollectResult, Manifest, Source, SourceReport, SourceStatus};
use super::reboot::{RebootArgs, RebootMode, RebootResult};
use super::reset::{ResetArgs, ResetReport, ResetTarget};
use super::xid::{RecommendedAction, XidClass, XidEvent, XidSource};
use super::{CommandErrorCode, CommandName, EventType};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// `text` parses into `T` and serializes back to exactly `text`.
fn round_trips<T: Serialize + DeserializeOwned>(
    text: &str,
) -> Result<T, Box<dyn std::error::Error>> {
    let v: T = serde_json::from_str(text)?;
    assert_eq!(serde_json::to_string(&v)?, text);
    Ok(v)
}

#[test]
fn diag_report_keeps_its_json() -> TestResult {
    let text = r#"{"nvmlAvailable":true,"driverVersion":"550.54.15","nvmlVersion":"12.550.54.15","nodeChecks":[{"name":"nvml","status":"pass","value":"initialized","detail":"loaded libnvidia-ml.so.1","action":"none"},{"name":"gpuCount","status":"fail","value":7,"threshold":8,"unit":"count","detail":"1 GPU(s) missing","action":"service"}],"gpus":[{"index":0,"uuid":"GPU-1","pciBusId":"0000:1a:00.0","name":"NVIDIA H100 80GB HBM3","checks":[{"name":"temperature","status":"warn","value":88,"threshold":87,"unit":"C","action":"none"}],"verdict":"warn","action":"none"}],"verdict":"fail","action":"service","summary":"1 GPUs: fail; action: service; failing: gpuCount"}"#;
    let r: DiagReport = round_trips(text)?;
    assert_eq!(r.verdict, CheckStatus::Fail);
    assert_eq!(r.action, RecommendedAction::Service);
    // What the control plane's Health controller reads.
    let v = serde_json::to_value(&r)?;
    assert_eq!(v["nvmlAvailable"], true);
    assert_eq!(v["verdict"], "fail");
    assert_eq!(v["action"], "service");
    assert_eq!(v["summary"], r.summary.as_str());

    let unavailable = r#"{"nvmlAvailable":false,"unavailableReason":"NVML unavailable: cannot load x","nodeChecks":[{"name":"nvml","status":"warn","value":"cannot load x","detail":"NVML unavailable: cannot load x","action":"none"}],"gpus":[],"verdict":"warn","action":"none","summary":"NVML unavailable: cannot load x"}"#;
    round_trips::<DiagReport>(unavailable)?;
    Ok(())
}

#[test]
fn diag_args_parse_with_and_without_a_profile() -> TestResult {
    let a: DiagArgs =
        serde_json::from_value(json!({"expectedGpus": {"count": 8, "name": "H100"}}))?;
    assert_eq!(
        a.expected_gpus,
        Some(ExpectedGpus {
            count: 8,
            name: Some("H100".into())
        })
    );
    assert_eq!(
        serde_json::from_value::<DiagArgs>(json!({}))?,
        DiagArgs::default()
    );
    let a: DiagArgs = serde_json::from_value(json!({"expectedGpus": {"count": 2}}))?;
    assert_eq!(a.expected_gpus.map(|e| e.name), Some(None));
    Ok(())
}

#[test]
fn checks_pick_the_worst_status_and_strongest_action() {
    let checks = [
        Check::pass("a", 1),
        Check::warn("b", "x"),
        Check::fail("c", false, RecommendedAction::ResetGpu)
            .threshold(0)
            .unit("count"),
        Check::with_status("d", CheckStatus::Pass, 2, RecommendedAction::RebootNode),
    ];
    assert_eq!(
        worst(checks.iter()),
        (CheckStatus::Fail, RecommendedAction::ResetGpu)
    );
    // `with_status` applies the action only to a failure.
    assert_eq!(checks[3].action, RecommendedAction::None);
    assert_eq!(
        worst([].iter()),
        (CheckStatus::Pass, RecommendedAction::None)
    );
}

#[test]
fn xid_event_keeps_its_json() -> TestResult {
    let text = r#"{"xid":79,"pciBusId":"0000:1a:00.0","uuid":null,"class":"rebootRequired","action":"rebootNode","description":"GPU has fallen off the bus","message":"NVRM: Xid (PCI:0000:1a:00): 79, GPU has fallen off the bus.","pid":null,"source":"kmsg","observedAt":"2026-01-02T03:04:05Z"}"#;
    let e: XidEvent = round_trips(text)?;
    assert_eq!(e.class, XidClass::RebootRequired);
    assert_eq!(e.source, XidSource::Kmsg);
    let nvml = r#"{"xid":48,"pciBusId":null,"uuid":"GPU-1","class":"unknown","action":"none","description":null,"message":null,"pid":7,"source":"nvml","observedAt":"2026-01-02T03:04:05.123Z"}"#;
    round_trips::<XidEvent>(nvml)?;
    assert_eq!(EventType::Xid.as_str(), "xid");
    Ok(())
}

#[test]
fn catalog_classes_follow_the_catalogs_buckets() {
    // Resolved by a GPU reset (48: WORKFLOW_XID_48, 74: the NVLink workflow, 144-150: NVLink5).
    for x in [
        46, 48, 62, 64, 74, 95, 109, 119, 120, 136, 140, 143, 144, 150, 155, 158,
    ] {
        assert_eq!(XidClass::of(x).action(), RecommendedAction::ResetGpu, "{x}");
        assert!(XidClass::of(x).is_critical());
    }
    for x in [79, 151, 160] {
        assert_eq!(
            XidClass::of(x).action(),
            RecommendedAction::RebootNode,
            "{x}"
        );
        assert!(XidClass::of(x).is_critical());
    }
    for x in [8, 13, 31, 94, 159] {
        assert_eq!(XidClass::of(x), XidClass::ApplicationFault, "{x}");
        assert!(!XidClass::of(x).is_critical());
    }
    for x in [43, 45, 63, 92, 121, 161] {
        assert_eq!(XidClass::of(x), XidClass::Informational, "{x}");
    }
    for x in [1, 54, 78, 90, 125] {
        assert_eq!(XidClass::of(x), XidClass::ServiceRequired, "{x}");
        assert_eq!(XidClass::of(x).action(), RecommendedAction::Service);
        assert!(XidClass::of(x).is_critical());
    }
    // 154 is judged by what it announces; an Xid the catalog does not list is unknown.
    assert_eq!(XidClass::of(154), XidClass::Unknown);
    for x in [0, 163, 999] {
        assert_eq!(XidClass::of(x), XidClass::Unknown, "{x}");
        assert_eq!(XidClass::of(x).action(), RecommendedAction::None);
    }
    for c in [
        XidClass::ServiceRequired,
        XidClass::DrainP2pRequired,
        XidClass::Unknown,
    ] {
        assert_eq!(
            serde_json::to_value(c).unwrap_or_default(),
            serde_json::json!(c.as_str())
        );
    }
}

#[test]
fn actions_order_by_disruption_and_map_from_nvml() -> TestResult {
    assert!(RecommendedAction::Service > RecommendedAction::RebootNode);
    assert!(RecommendedAction::RebootNode > RecommendedAction::ResetGpu);
    assert!(RecommendedAction::ResetGpu > RecommendedAction::DrainP2p);
    assert_eq!(
        RecommendedAction::from_nvml_recovery_action(4),
        RecommendedAction::ResetGpu
    );
    assert_eq!(
        RecommendedAction::from_nvml_recovery_action(2),
        RecommendedAction::RebootNode
    );
    for a in [
        RecommendedAction::None,
        RecommendedAction::DrainP2p,
        RecommendedAction::ResetGpu,
        RecommendedAction::RebootNode,
        RecommendedAction::Service,
    ] {
        assert_eq!(serde_json::to_value(a)?, json!(a.as_str()));
    }
    for s in [CheckStatus::Pass, CheckStatus::Warn, CheckStatus::Fail] {
        assert_eq!(serde_json::to_value(s)?, json!(s.as_str()));
    }
    Ok(())
}

#[test]
fn reset_args_and_report_keep_their_json() -> TestResult {
    let a: ResetArgs = round_trips(r#"{"gpus":"all"}"#)?;
    assert_eq!(a.gpus, ResetTarget::All);
    let a: ResetArgs = round_trips(r#"{"gpus":["GPU-1","0000:1a:00.0"]}"#)?;
    assert_eq!(
        a.gpus,
        ResetTarget::Gpus(vec!["GPU-1".into(), "0000:1a:00.0".into()])
    );
    assert!(serde_json::from_str::<ResetArgs>(r#"{"gpus":"some"}"#).is_err());
    assert!(serde_json::from_str::<ResetArgs>(r#"{"gpus":"all","x":1}"#).is_err());

    let report = r#"{"gpus":[{"pciBusId":"0000:1a:00.0","requested":true,"before":{"uuid":"GPU-1","persistenceMode":true,"volatileCorrectedEcc":3,"volatileUncorrectedEcc":0,"recoveryAction":"gpuReset"},"after":{"uuid":"GPU-1","persistenceMode":true,"volatileCorrectedEcc":0,"volatileUncorrectedEcc":0,"recoveryAction":"none"},"persistenceModeRestored":true,"problems":[]},{"pciBusId":"0000:1b:00.0","requested":false,"before":{"uuid":"GPU-2","persistenceMode":false,"volatileCorrectedEcc":null,"volatileUncorrectedEcc":null,"recoveryAction":null},"after":null,"persistenceModeRestored":null,"problems":["GPU not found at its bus id after reset"]}],"nvidiaSmiOutput":"GPU 00000000:1A:00.0 was successfully reset.\n","verified":false}"#;
    round_trips::<ResetReport>(report)?;
    Ok(())
}

fn manifest() -> Manifest {
    Manifest {
        version: 1,
        created_at: "2026-01-02T03:04:05Z".into(),
        since: None,
        max_bytes: 100,
        truncated: true,
        sources: vec![
            SourceReport {
                source: Source::Kernel,
                file: Some("kernel.log".into()),
                status: SourceStatus::Truncated,
                bytes: 100,
                redactions: 2,
                reason: Some("cut at maxBytes".into()),
            },
            SourceReport {
                source: Source::NvidiaBugReport,
                file: None,
                status: SourceStatus::Missing,
                bytes: 0,
                redactions: 0,
                reason: Some("not installed".into()),
            },
        ],
    }
}

#[test]
fn logs_collect_args_manifest_and_result_keep_their_json() -> TestResult {
    let a: CollectArgs = serde_json::from_value(
        json!({"since": "2h", "sources": ["journal", "nvidiaBugReport"], "maxBytes": 10}),
    )?;
    assert_eq!(
        a.sources,
        Some(vec![Source::Journal, Source::NvidiaBugReport])
    );
    assert!(serde_json::from_value::<CollectArgs>(json!({"sources": ["syslog"]})).is_err());
    assert!(serde_json::from_value::<CollectArgs>(json!({"maxbytes": 1})).is_err());

    let m = manifest();
    let text = r#"{"version":1,"createdAt":"2026-01-02T03:04:05Z","since":null,"maxBytes":100,"truncated":true,"sources":[{"source":"kernel","file":"kernel.log","status":"truncated","bytes":100,"redactions":2,"reason":"cut at maxBytes"},{"source":"nvidiaBugReport","file":null,"status":"missing","bytes":0,"redactions":0,"reason":"not installed"}]}"#;
    assert_eq!(serde_json::to_string(&m)?, text);
    round_trips::<Manifest>(text)?;

    // The result as the agent built it before it had a type.
    let before = serde_json::to_string(&json!({
        "bundleBytes": 1234,
        "sha256": "ab",
        "truncated": m.truncated,
        "manifest": m,
    }))?;
    let typed = CollectResult {
        bundle_bytes: 1234,
        manifest: manifest(),
        sha256: "ab".into(),
        truncated: true,
    };
    // Results travel as a `serde_json::Value` (the journal keeps them so): keys sorted at every
    // level, whatever the field order.
    assert_eq!(
        serde_json::to_string(&serde_json::to_value(&typed)?)?,
        before
    );
    let back: CollectResult = serde_json::from_str(&before)?;
    assert_eq!(back, typed);
    Ok(())
}

#[test]
fn reboot_args_and_result_keep_their_json() -> TestResult {
    let a: RebootArgs = serde_json::from_value(json!({"mode": "force", "delaySeconds": 2}))?;
    assert_eq!(a.mode, RebootMode::Force);
    assert_eq!(a.delay_seconds, 2);
    assert_eq!(
        serde_json::from_value::<RebootArgs>(json!({}))?,
        RebootArgs::default()
    );
    assert!(serde_json::from_value::<RebootArgs>(json!({"mode": "sideways"})).is_err());
    assert!(serde_json::from_value::<RebootArgs>(json!({"delay": 1})).is_err());
    assert_eq!(RebootMode::Force.as_str(), "force");

    let before = serde_json::to_string(&json!({
        "previousBootId": "boot-old",
        "bootId": "boot-a",
    }))?;
    let typed = RebootResult {
        boot_id: "boot-a".into(),
        previous_boot_id: "boot-old".into(),
    };
    assert_eq!(serde_json::to_string(&typed)?, before);
    Ok(())
}

#[test]
fn inventory_refresh_result_is_the_summary_the_agent_sent() -> TestResult {
    // The expression the agent evaluated before the type existed.
    fn before(doc: &serde_json::Value, trusted: bool, ids: usize) -> serde_json::Value {
        use serde_json::Value;
        json!({
            "hardwareKeyTrusted": trusted,
            "identifiers": ids,
            "cpuThreads": doc.pointer("/cpu/threads"),
            "memoryBytes": doc.pointer("/memory/totalBytes"),
            "nics": doc.get("nics").and_then(Value::as_array).map(Vec::len),
            "disks": doc.get("disks").and_then(Value::as_array).map(Vec::len),
            "notes": doc.get("notes").and_then(Value::as_array).map(Vec::len),
        })
    }
    for doc in [
        json!({"cpu": {"threads": 64}, "memory": {"totalBytes": 1024}, "nics": [1, 2], "disks": [], "notes": [{"source": "pci"}]}),
        json!({"hostname": "h"}),
        json!(null),
    ] {
        let bytes = serde_json::to_vec(&doc)?;
        let typed = InventoryRefreshResult::summarize(&bytes, true, 5);
        assert_eq!(
            serde_json::to_string(&typed)?,
            serde_json::to_string(&before(&doc, true, 5))?
        );
    }
    let garbage = InventoryRefreshResult::summarize(b"{not json", false, 0);
    assert_eq!(
        serde_json::to_string(&garbage)?,
        serde_json::to_string(&before(&serde_json::Value::Null, false, 0))?
    );
    Ok(())
}

#[test]
fn command_names_and_error_codes_keep_their_spelling() {
    let names: Vec<&str> = CommandName::ALL.iter().map(|n| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "inventory.refresh",
            "diag.nvml",
            "logs.collect",
            "gpu.reset",
            "node.reboot",
            "bmc.verify",
            "bmc.power",
            "bmc.setBootDevice",
            "disk.clean",
            "image.write",
            "rescue.start"
        ]
    );
    for c in CommandErrorCode::ALL {
        assert_eq!(c.as_str().parse::<CommandErrorCode>(), Ok(*c));
        assert!(
            c.as_str()
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch == '_'),
            "{c}"
        );
    }
    for (code, text) in [
        (CommandErrorCode::Unsupported, "UNSUPPORTED"),
        (CommandErrorCode::JournalUnwritable, "JOURNAL_UNWRITABLE"),
        (CommandErrorCode::AgentRestarted, "AGENT_RESTARTED"),
        (CommandErrorCode::DeadlineExceeded, "DEADLINE_EXCEEDED"),
        (CommandErrorCode::Cancelled, "CANCELLED"),
        (CommandErrorCode::ResetNotVerified, "RESET_NOT_VERIFIED"),
        (CommandErrorCode::UploadFailed, "UPLOAD_FAILED"),
    ] {
        assert_eq!(code.as_str(), text);
    }
}

// Moved from the daemon's `nvml/reset.rs` with the types.
#[test]
fn targets_parse_from_all_or_a_list() -> TestResult {
    let all: ResetTarget = serde_json::from_str(r#""all""#)?;
    assert_eq!(all, ResetTarget::All);
    let l: ResetTarget = serde_json::from_str(r#"["GPU-1","0000:1a:00.0"]"#)?;
    assert_eq!(
        l,
        ResetTarget::Gpus(vec!["GPU-1".into(), "0000:1a:00.0".into()])
    );
    assert!(serde_json::from_str::<ResetTarget>(r#""some""#).is_err());
    Ok(())
}

#[test]
fn command_args_parse() -> TestResult {
    let a: ResetArgs = serde_json::from_str(r#"{"gpus":"all"}"#)?;
    assert_eq!(a.gpus, ResetTarget::All);
    assert!(serde_json::from_str::<ResetArgs>(r#"{"gpus":"all","x":1}"#).is_err());
    Ok(())
}

#[test]
fn bmc_commands_keep_their_json() -> TestResult {
    use super::bmc::{
        BmcFacts, BmcNic, BootDevice, BootDeviceArgs, BootDeviceResult, NetworkBootCheck,
        NetworkBootSeen, PowerAction, PowerArgs, PowerResult, PowerState, VerifyArgs,
    };
    /// `value` serializes to exactly `expect` and parses back to itself.
    fn pins<T>(value: &T, expect: serde_json::Value) -> TestResult
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        assert_eq!(serde_json::to_value(value)?, expect);
        assert_eq!(&serde_json::from_value::<T>(expect)?, value);
        Ok(())
    }
    pins(
        &PowerArgs {
            node_id: "node_a".into(),
            lease_epoch: 3,
            action: PowerAction::SoftOff,
            boot_device: None,
            network_boot: None,
        },
        json!({"nodeId": "node_a", "leaseEpoch": 3, "action": "softOff"}),
    )?;
    pins(
        &PowerArgs {
            node_id: "node_a".into(),
            lease_epoch: 3,
            action: PowerAction::On,
            boot_device: Some(BootDevice::Pxe),
            network_boot: Some(NetworkBootCheck {
                within_ms: 300_000,
                attempts: 3,
            }),
        },
        json!({"nodeId": "node_a", "leaseEpoch": 3, "action": "on", "bootDevice": "pxe",
               "networkBoot": {"withinMs": 300_000, "attempts": 3}}),
    )?;
    pins(
        &PowerResult {
            power: PowerState::On,
            network_boot: Some(NetworkBootSeen {
                mac: "52:54:00:00:00:01".into(),
                attempt: 2,
                persistent: false,
            }),
            transient_faults: 1,
        },
        json!({"power": "on", "networkBoot": {"mac": "52:54:00:00:00:01", "attempt": 2,
               "persistent": false}, "transientFaults": 1}),
    )?;
    pins(
        &PowerResult {
            power: PowerState::Off,
            network_boot: None,
            transient_faults: 0,
        },
        json!({"power": "off"}),
    )?;
    pins(
        &BootDeviceResult {
            device: Some(BootDevice::None),
            persistent: Some(false),
            note: None,
            transient_faults: 0,
        },
        json!({"device": "none", "persistent": false}),
    )?;
    pins(
        &BootDeviceArgs {
            node_id: "node_a".into(),
            lease_epoch: 3,
            device: BootDevice::Pxe,
            persistent: false,
        },
        json!({"nodeId": "node_a", "leaseEpoch": 3, "device": "pxe", "persistent": false}),
    )?;
    let v: VerifyArgs = serde_json::from_value(json!({"nodeId": "n", "leaseEpoch": 1}))?;
    assert!(!v.candidate, "candidate defaults to false");
    assert!(
        serde_json::from_value::<PowerArgs>(
            json!({"nodeId": "n", "leaseEpoch": 1, "action": "on", "password": "x"})
        )
        .is_err(),
        "credentials (or any unknown key) are refused in a command's args"
    );
    pins(
        &BmcFacts {
            system_path: "/redfish/v1/Systems/1".into(),
            uuid: Some("0b2d3c3e-0000-4000-8000-000000000001".into()),
            serial: Some("SER1".into()),
            manufacturer: None,
            model: None,
            nics: vec![BmcNic {
                id: "1".into(),
                mac: "52:54:00:00:00:01".into(),
            }],
            power: PowerState::Off,
            cert_sha256: None,
            note: None,
        },
        json!({"systemPath": "/redfish/v1/Systems/1",
               "uuid": "0b2d3c3e-0000-4000-8000-000000000001", "serial": "SER1",
               "manufacturer": null, "model": null,
               "nics": [{"id": "1", "mac": "52:54:00:00:00:01"}], "power": "off",
               "certSha256": null}),
    )?;
    for (name, text) in [
        (CommandName::BmcVerify, "bmc.verify"),
        (CommandName::BmcPower, "bmc.power"),
        (CommandName::BmcSetBootDevice, "bmc.setBootDevice"),
    ] {
        assert_eq!(name.as_str(), text);
    }
    assert_eq!(CommandErrorCode::LeaseLost.as_str(), "LEASE_LOST");
    assert_eq!(
        CommandErrorCode::NetworkBootNotRequested.as_str(),
        "NETWORK_BOOT_NOT_REQUESTED"
    );
    assert_eq!(CommandErrorCode::BmcNotApplied.as_str(), "BMC_NOT_APPLIED");
    Ok(())
}
