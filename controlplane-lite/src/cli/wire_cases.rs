//! The cases of `wire_tests`: a command line, the method it calls, and the body `bcctl` sent for
//! it while it wrote its bodies by hand (transcribed from those `json!` bodies).

use cpl_core::verbs::Method;
use serde_json::{Value, json};

use super::wire_tests::CURRENT;

/// One case.
pub(super) struct Case {
    /// The command line, after `bcctl`.
    pub argv: Vec<String>,
    /// The method it calls.
    pub method: Method,
    /// The body `bcctl` sent for it before.
    pub old_body: Value,
}

/// The files the cases read: a BMC password file (`s3cr3t`) and a user-data file
/// (`#cloud-config`).
pub(super) struct Files {
    pub password: String,
    pub user_data: String,
}

/// A case: `line` split on whitespace, then `more` as they are (arguments with spaces).
fn case(line: &str, more: &[&str], method: Method, old_body: Value) -> Case {
    let argv = line.split_whitespace().chain(more.iter().copied());
    Case {
        argv: argv.map(str::to_owned).collect(),
        method,
        old_body,
    }
}

/// `bcctl nodes ...` but the bare-metal verbs.
#[rustfmt::skip] // A table: a case an entry, as written.
pub(super) fn node_cases() -> Vec<Case> {
    use Method as M;
    let v = CURRENT;
    let plain = json!({"nodeId": "n1", "version": v});
    vec![
        case("nodes list", &[], M::NodesList, json!({"poolId": null, "provisionState": null,
            "connectivity": null, "schedulable": null, "firmware": null})),
        case("nodes list --pool pool_a --provision-state ready --connectivity connected \
              --schedulable true --label rack=r7 --label tier= --firmware nvme=1B2QEXP7",
            &[], M::NodesList,
            json!({"poolId": "pool_a", "provisionState": "ready", "connectivity": "connected",
                   "schedulable": true, "firmware": "nvme=1B2QEXP7",
                   "labels": {"rack": "r7", "tier": ""}})),
        case("nodes get n1", &[], M::NodesGet, json!({"nodeId": "n1"})),
        case("nodes events n1", &[], M::NodesEvents, json!({"nodeId": "n1"})),
        case("nodes cordon n1", &[], M::NodesCordon, plain.clone()),
        case("nodes cordon n1 --version 3", &[], M::NodesCordon,
            json!({"nodeId": "n1", "version": 3})),
        case("nodes uncordon n1", &[], M::NodesUncordon, plain.clone()),
        case("nodes drain n1", &[], M::NodesDrain, plain.clone()),
        case("nodes adopt n1", &[], M::NodesAdopt, plain.clone()),
        case("nodes recover n1", &[], M::NodesRecover, plain.clone()),
        case("nodes retire n1", &[], M::NodesRetire, plain.clone()),
        case("nodes abort n1", &[], M::NodesAbort, plain.clone()),
        case("nodes revoke-identity n1", &[], M::NodesRevokeIdentity, plain.clone()),
        case("nodes delete n1", &[], M::NodesDelete, plain.clone()),
        case("nodes end-dedicated-root n1", &[], M::NodesEndDedicatedRoot, plain.clone()),
        case("nodes taint n1 gpu-bad --value x", &[], M::NodesTaint,
            json!({"nodeId": "n1", "version": v, "key": "gpu-bad", "value": "x"})),
        case("nodes taint n1 gpu-bad", &[], M::NodesTaint,
            json!({"nodeId": "n1", "version": v, "key": "gpu-bad", "value": ""})),
        case("nodes untaint n1 gpu-bad", &[], M::NodesUntaint,
            json!({"nodeId": "n1", "version": v, "key": "gpu-bad"})),
        case("nodes set-labels n1 rack=r7 tier=gold rack=r8", &[], M::NodesSetLabels,
            json!({"nodeId": "n1", "version": v, "labels": {"rack": "r8", "tier": "gold"}})),
        case("nodes remove-labels n1 rack tier", &[], M::NodesRemoveLabels,
            json!({"nodeId": "n1", "version": v, "keys": ["rack", "tier"]})),
        case("nodes set-maintenance n1 true --reason", &["disk swap"], M::NodesSetMaintenance,
            json!({"nodeId": "n1", "version": v, "maintenance": true, "reason": "disk swap"})),
        case("nodes set-maintenance n1 false", &[], M::NodesSetMaintenance,
            json!({"nodeId": "n1", "version": v, "maintenance": false, "reason": null})),
        case("nodes update-spec n1", &[r#"{"devices": {"gpus": []}}"#], M::NodesUpdateSpec,
            json!({"nodeId": "n1", "version": v, "spec": {"devices": {"gpus": []}}})),
        case("nodes start-dedicated-root n1 --tenant t1", &[], M::NodesStartDedicatedRoot,
            json!({"nodeId": "n1", "version": v, "tenantId": "t1"})),
        case("nodes approve-rejoin n1 rejoin_1", &[], M::NodesApproveRejoin,
            json!({"nodeId": "n1", "version": v, "requestId": "rejoin_1"})),
        case("nodes move n1 --pool pool_b", &[], M::NodesMove,
            json!({"nodeId": "n1", "version": v, "poolId": "pool_b"})),
        case("nodes run n1 diag.nvml --arg force=true --arg note=hi --timeout 90s", &[],
            M::CommandsCreate,
            json!({"nodeId": "n1", "name": "diag.nvml", "args": {"force": true, "note": "hi"},
                   "timeoutSeconds": 90})),
    ]
}

/// The bare-metal node verbs (`bcctl nodes enroll`, `deploy`, `power`, ...).
#[rustfmt::skip] // A table: a case an entry, as written.
pub(super) fn bare_metal_cases(files: &Files) -> Vec<Case> {
    use Method as M;
    let (pw, user_data) = (files.password.as_str(), files.user_data.as_str());
    let v = CURRENT;
    let sha = "a".repeat(64);
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a";
    let plain = json!({"nodeId": "n1", "version": v});
    vec![
        case("nodes enroll --site s1 --pool p1 --name m1 --bmc-address redfish+https://10.0.0.9 \
              --username admin --mac 52:54:00:12:34:56 --password-file", &[pw], M::NodesEnroll,
            json!({"siteId": "s1", "poolId": "p1", "name": "m1",
                   "bmc": {"address": "redfish+https://10.0.0.9", "username": "admin",
                           "password": "s3cr3t", "tls": "pin"},
                   "macs": ["52:54:00:12:34:56"], "inspect": true, "deployed": false})),
        case("nodes enroll --site s1 --bmc-address ipmi://10.0.0.9 --username admin \
              --tls insecure --no-inspect --password-file", &[pw], M::NodesEnroll,
            json!({"siteId": "s1", "poolId": null, "name": null,
                   "bmc": {"address": "ipmi://10.0.0.9", "username": "admin",
                           "password": "s3cr3t", "tls": "insecure"},
                   "macs": null, "inspect": false, "deployed": false})),
        case("nodes inspect n1", &[], M::NodesInspect, plain.clone()),
        case("nodes deploy n1 --image-url http://10.0.2.2/img.qcow2.zst --image-format qcow2 \
              --image-compression zstd --root-serial S1 --root-min-size 1000 --hostname h1",
            &["--image-sha256", &sha, "--ssh-key", key, "--user-data-file", user_data],
            M::NodesDeploy,
            json!({"nodeId": "n1", "version": v,
                   "image": {"url": "http://10.0.2.2/img.qcow2.zst", "sha256": sha,
                             "format": "qcow2", "compression": "zstd"},
                   "rootDevice": {"serial": "S1", "wwn": null, "name": null, "minSizeBytes": 1000},
                   "configDrive": {"hostname": "h1", "sshKeys": [key],
                                   "userData": "#cloud-config\n"}})),
        case("nodes deploy n1 --image-url https://x/img --image-sha256", &[&sha], M::NodesDeploy,
            json!({"nodeId": "n1", "version": v,
                   "image": {"url": "https://x/img", "sha256": sha, "format": "raw",
                             "compression": "none"},
                   "rootDevice": null, "configDrive": null})),
        case("nodes rescue n1 --ssh-key", &[key], M::NodesRescue,
            json!({"nodeId": "n1", "version": v, "sshKeys": [key]})),
        case("nodes unrescue n1", &[], M::NodesUnrescue, plain.clone()),
        case("nodes release n1", &[], M::NodesRelease, plain.clone()),
        case("nodes power n1 soft-off", &[], M::NodesPower,
            json!({"nodeId": "n1", "version": v, "action": "softOff"})),
        case("nodes power n1 on", &[], M::NodesPower,
            json!({"nodeId": "n1", "version": v, "action": "on"})),
        case("nodes boot-device n1 pxe --persistent", &[], M::NodesSetBootDevice,
            json!({"nodeId": "n1", "version": v, "device": "pxe", "persistent": true})),
        case("nodes update-bmc-credentials n1 --username root --password-file", &[pw],
            M::NodesUpdateBmcCredentials,
            json!({"nodeId": "n1", "version": v, "username": "root", "password": "s3cr3t"})),
    ]
}

/// `bcctl pools|sites|tokens|allocations|commands|status`.
#[rustfmt::skip] // A table: a case an entry, as written.
pub(super) fn fleet_cases() -> Vec<Case> {
    use Method as M;
    let profile = |model: Value| {
        json!({"expectedGpuCount": null, "expectedGpuModel": model, "pcieLinkDegraded": null,
               "minMemoryBytes": null, "expectedCpuModel": null, "minCpuThreads": null,
               "minLinkedNics": null})
    };
    let acceptance = |inspection: Value, power_off: Value, cleaning: Value| {
        json!({"requireTrustedKey": null, "deadlineSeconds": null,
               "inspectionDeadlineSeconds": inspection, "commissioningDeadlineSeconds": null,
               "powerOffWhenReady": power_off, "cleaning": cleaning,
               "cleaningDeadlineSeconds": null, "deployDeadlineSeconds": null,
               "rescueDeadlineSeconds": null})
    };
    vec![
        case("pools create --name gpu --kind metal-host --site s1 --expected-gpus 8 \
              --pcie-link-degraded noSchedule --min-memory 512G --inspection-deadline 30m \
              --cleaning full", &[], M::PoolsCreate,
            json!({"name": "gpu", "kind": "metal-host", "siteId": "s1", "agent": "bcd",
                   "ownerTenantId": null,
                   "hardwareProfile": {"expectedGpuCount": 8, "expectedGpuModel": null,
                       "pcieLinkDegraded": "noSchedule", "minMemoryBytes": 549_755_813_888_u64,
                       "expectedCpuModel": null, "minCpuThreads": null, "minLinkedNics": null},
                   "acceptance": acceptance(json!(1800), Value::Null, json!("full"))})),
        case("pools create --name vps --kind vps-host --agent none --owner-tenant t1", &[],
            M::PoolsCreate,
            json!({"name": "vps", "kind": "vps-host", "siteId": null, "agent": "none",
                   "ownerTenantId": "t1", "hardwareProfile": profile(Value::Null)})),
        case("pools list", &[], M::PoolsList, json!({})),
        case("pools get p1", &[], M::PoolsGet, json!({"poolId": "p1"})),
        case("pools capacity p1", &[], M::PoolsCapacity, json!({"poolId": "p1"})),
        case("pools update p1 --version 4 --name gpu2", &[], M::PoolsUpdate,
            json!({"poolId": "p1", "version": 4, "name": "gpu2",
                   "hardwareProfile": profile(Value::Null)})),
        case("pools update p1 --version 4 --name gpu2 --expected-gpu-model H100 \
              --power-off-when-ready false", &[], M::PoolsUpdate,
            json!({"poolId": "p1", "version": 4, "name": "gpu2",
                   "hardwareProfile": profile(json!("H100")),
                   "acceptance": acceptance(Value::Null, json!(false), Value::Null)})),
        case("pools delete p1 --version 4", &[], M::PoolsDelete,
            json!({"poolId": "p1", "version": 4})),
        case("pools set-remediation p1 --version 4",
            &[r#"{"mode": "auto", "maxConcurrent": 2, "drain": "evict"}"#],
            M::PoolsSetRemediation,
            json!({"poolId": "p1", "version": 4,
                   "remediation": {"mode": "auto", "maxConcurrent": 2, "drain": "evict"}})),
        case("pools resume-remediation p1 --version 4", &[], M::PoolsResumeRemediation,
            json!({"poolId": "p1", "version": 4})),
        case("remediations list --pool p1 --open", &[], M::RemediationsList,
            json!({"poolId": "p1", "nodeId": null, "openOnly": true, "limit": null})),
        case("remediations get rem_1", &[], M::RemediationsGet,
            json!({"remediationId": "rem_1", "nodeId": null})),
        case("remediations get --node n1", &[], M::RemediationsGet,
            json!({"remediationId": null, "nodeId": "n1"})),
        case("nodes set-remediation n1 true --reason", &["bad cable"], M::NodesSetRemediation,
            json!({"nodeId": "n1", "version": CURRENT, "suspended": true, "reason": "bad cable"})),
        case("sites create --name dc1", &[], M::SitesCreate,
            json!({"name": "dc1", "kind": "platform", "ownerTenantId": null})),
        case("sites create --name t --kind custom --owner-tenant t1", &[], M::SitesCreate,
            json!({"name": "t", "kind": "custom", "ownerTenantId": "t1"})),
        case("sites list", &[], M::SitesList, json!({})),
        case("sites get s1", &[], M::SitesGet, json!({"siteId": "s1"})),
        case("sites update s1 --version 2 --name dc2", &[], M::SitesUpdate,
            json!({"siteId": "s1", "version": 2, "name": "dc2"})),
        case("sites delete s1 --version 2", &[], M::SitesDelete,
            json!({"siteId": "s1", "version": 2})),
        case("tokens create --pool p1 --ttl 30m --uses 2 --description", &["rack 7"],
            M::TokensCreate,
            json!({"poolId": "p1", "siteId": null, "ttlSeconds": 1800, "maxUses": 2,
                   "description": "rack 7"})),
        case("tokens create --site s1", &[], M::TokensCreate,
            json!({"poolId": null, "siteId": "s1", "ttlSeconds": 3600, "maxUses": null,
                   "description": null})),
        case("tokens list", &[], M::TokensList, json!({})),
        case("tokens revoke tok_1", &[], M::TokensRevoke, json!({"tokenId": "tok_1"})),
        case("allocations create --pool p1 --gpus 2 --tenant t1", &[], M::AllocationsCreate,
            json!({"poolId": "p1", "gpus": 2, "tenantId": "t1"})),
        case("allocations create --pool p1 --gpus 8 --workload job-7", &[], M::AllocationsCreate,
            json!({"poolId": "p1", "gpus": 8, "workloadId": "job-7"})),
        case("allocations list --node n1 --active", &[], M::AllocationsList,
            json!({"poolId": null, "nodeId": "n1", "activeOnly": true})),
        case("allocations get a1", &[], M::AllocationsGet, json!({"allocationId": "a1"})),
        case("allocations release a1", &[], M::AllocationsRelease,
            json!({"allocationId": "a1"})),
        case("commands get c1", &[], M::CommandsGet, json!({"commandId": "c1"})),
        case("commands cancel c1", &[], M::CommandsCancel, json!({"commandId": "c1"})),
        case("commands list --node n1", &[], M::CommandsList, json!({"nodeId": "n1"})),
        case("commands list", &[], M::CommandsList, json!({"nodeId": null})),
        case("status", &[], M::ControlPlaneStatus, json!({})),
    ]
}
