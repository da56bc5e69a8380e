//! A real `bcd site` process against the session core's scripted fake control plane
//! (`bcd_core::test_utils`) and a real sushy-emulator behind a recording proxy:
//! - it joins with mode SITE and holds a session;
//! - a SiteAssignment (lease epoch 7, one sushy system, one BMC with a wrong password) starts the
//!   power sync: every BMC is reported once, the wrong password as unreachable;
//! - `bmc.power on` (epoch 7) reaches the emulator and the sync loop reports the change; a change
//!   made straight on the emulator is reported too;
//! - `bmc.power` with a stale epoch is refused with LEASE_LOST and does nothing;
//! - a `bmc.power` the previous run journaled but never finished is reported AGENT_RESTARTED in
//!   Hello and, delivered again, is not run;
//! - when the control plane stops renewing, the lease lapses on the agent's own clock: the sync
//!   loop stops reading the BMC and commands are refused with LEASE_LOST;
//! - the BMC passwords appear nowhere: not in the log (at debug level), status.json, `bcd
//!   status`, the command journal, any file of the state dir, or any message sent.
//!
//! Without sushy-emulator the test says so and skips; under `CI=true` it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bc_protocol::pb::{self, AgentMessage, agent_message, gateway_message};
use bcd_core::test_utils::FakeControlPlane;
use bcd_site::test_utils::proxy::FaultProxy;
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use bcd_site::test_utils::{PASSWORD, USER};
use prost::Message as _;

const WAIT: Duration = Duration::from_secs(60);
const WRONG_PASSWORD: &str = "Wr0ng-but-still-Secret-77";
const NODE: &str = "node_0";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let k = root.join("proc/sys/kernel");
    std::fs::create_dir_all(k.join("random")).unwrap();
    std::fs::write(k.join("random/boot_id"), "5b1e-boot-of-the-site\n").unwrap();
    std::fs::write(k.join("hostname"), "site-appliance\n").unwrap();
    root
}

fn messages(fake: &FakeControlPlane) -> Vec<AgentMessage> {
    fake.seen
        .lock()
        .session(NODE)
        .map(<[AgentMessage]>::to_vec)
        .unwrap_or_default()
}

async fn wait_for<T>(what: &str, log: &Path, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; site agent log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn observations(msgs: &[AgentMessage]) -> Vec<(u64, pb::PowerObservation)> {
    msgs.iter()
        .filter_map(|m| match &m.msg {
            Some(agent_message::Msg::PowerReport(r)) => Some(
                r.observations
                    .iter()
                    .map(|o| (r.lease_epoch, o.clone()))
                    .collect::<Vec<_>>(),
            ),
            _ => None,
        })
        .flatten()
        .collect()
}

fn command_result(msgs: &[AgentMessage], id: &str) -> Option<pb::CommandUpdate> {
    msgs.iter().find_map(|m| match &m.msg {
        Some(agent_message::Msg::CommandUpdate(u)) if u.id == id && u.progress == 100 => {
            Some(u.clone())
        }
        _ => None,
    })
}

fn command(id: &str, name: &str, args: serde_json::Value) -> gateway_message::Msg {
    gateway_message::Msg::Command(pb::Command {
        id: id.to_owned(),
        name: name.to_owned(),
        args_json: serde_json::to_vec(&args).unwrap(),
        deadline_ms: chrono::Utc::now().timestamp_millis() + 60_000,
    })
}

fn endpoint(address: &str, password: &str) -> pb::BmcEndpoint {
    pb::BmcEndpoint {
        address: address.to_owned(),
        username: USER.to_owned(),
        password: password.to_owned(),
        tls: pb::BmcTlsMode::Pin.into(),
        cert_sha256: String::new(),
    }
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_agent_holds_a_session_drives_a_bmc_under_its_lease_and_leaks_no_credential() {
    let system = FakeSystem::numbered(42);
    let uuid = system.uuid.clone();
    let Some(sushy) = Sushy::start("site session", &[system], None).await else {
        return;
    };
    let proxy = FaultProxy::start(sushy.socket()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = host_root(dir.path());
    let state = dir.path().join("state");
    let log = dir.path().join("site.log");
    let fake = FakeControlPlane::start(vec![]).await;
    // A bmc.power the previous run of the agent accepted but never finished (it died).
    std::fs::create_dir_all(state.join("commands")).unwrap();
    std::fs::write(
        state.join("commands/cmd_interrupted.json"),
        serde_json::to_vec(&serde_json::json!({
            "id": "cmd_interrupted", "name": "bmc.power",
            "args": {"nodeId": "node_bm", "leaseEpoch": 7, "action": "on"},
            "state": "accepted", "result": null, "errorCode": null, "errorMessage": null,
            "acceptedAt": chrono::Utc::now().timestamp_millis() - 1_000, "finishedAt": null,
            "bootId": "5b1e-boot-of-the-site"
        }))
        .unwrap(),
    )
    .unwrap();
    let _site = Killed(
        Command::new(env!("CARGO_BIN_EXE_bcd"))
            .args(["site", "--control-plane", &fake.url, "--ca-pin", &fake.pin])
            .args(["--join-token", "tok.secret", "--config", "/dev/null"])
            .arg("--state-dir")
            .arg(&state)
            .arg("--root")
            .arg(&root)
            .env_remove("NOTIFY_SOCKET")
            .env("BCD_LOG", "debug")
            .env("BCD_SITE_LEASE_MARGIN_MS", "1000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );

    // Joins as a site agent and opens a session.
    let join = wait_for("the join", &log, || fake.seen.lock().joins.first().cloned()).await;
    assert_eq!(join.mode, i32::from(pb::AgentMode::Site));
    wait_for("the session", &log, || {
        messages(&fake)
            .iter()
            .any(|m| matches!(m.msg, Some(agent_message::Msg::Inventory(_))))
            .then_some(())
    })
    .await;
    let hello = messages(&fake).first().cloned().unwrap();
    let Some(agent_message::Msg::Hello(hello)) = hello.msg else {
        panic!("{hello:?}");
    };
    assert_eq!(hello.mode, i32::from(pb::AgentMode::Site));
    // The interrupted command is reported failed, never re-run.
    let interrupted = hello
        .pending_results
        .iter()
        .find(|u| u.id == "cmd_interrupted")
        .expect("the interrupted command in Hello");
    assert_eq!(
        interrupted.error.as_ref().map(|e| e.code.as_str()),
        Some("AGENT_RESTARTED")
    );

    // The lease (epoch 7, 3 s without renewal; every acknowledged heartbeat renews it).
    fake.set_site_lease_expiry(chrono::Utc::now().timestamp_millis() + 3_600_000);
    fake.push(gateway_message::Msg::SiteAssignment(pb::SiteAssignment {
        site_id: "site_a".into(),
        lease_held: true,
        lease_epoch: 7,
        lease_ttl_ms: 3_000,
        bmcs: vec![
            pb::ManagedBmc {
                node_id: "node_bm".into(),
                endpoint: Some(endpoint(
                    &proxy.address(&format!("/redfish/v1/Systems/{uuid}")),
                    PASSWORD,
                )),
                candidate: None,
                sync_power: true,
                boot: None,
            },
            pb::ManagedBmc {
                node_id: "node_badpw".into(),
                endpoint: Some(endpoint(&sushy.address(&uuid), WRONG_PASSWORD)),
                candidate: None,
                sync_power: true,
                boot: None,
            },
        ],
        power_sync_interval_ms: 300,
        max_requests_per_bmc: 2,
        max_requests_per_site: 8,
    }));
    let seen_once = wait_for("every BMC reported once", &log, || {
        let o = observations(&messages(&fake));
        (o.len() >= 2).then_some(o)
    })
    .await;
    let good = seen_once
        .iter()
        .find(|(_, o)| o.node_id == "node_bm")
        .unwrap();
    assert_eq!(
        (good.0, good.1.power.as_str(), good.1.reachable),
        (7, "off", true)
    );
    let bad = seen_once
        .iter()
        .find(|(_, o)| o.node_id == "node_badpw")
        .unwrap();
    assert!(!bad.1.reachable && bad.1.error.contains("401"), "{bad:?}");
    assert_eq!(bad.1.error_code, "BMC_AUTH_FAILED");

    // Delivered again under a valid lease, the interrupted command still does not run.
    fake.push(command(
        "cmd_interrupted",
        "bmc.power",
        serde_json::json!({"nodeId": "node_bm", "leaseEpoch": 7, "action": "on"}),
    ));
    let again = wait_for("the interrupted command's result again", &log, || {
        command_result(&messages(&fake), "cmd_interrupted")
    })
    .await;
    assert_eq!(
        again.error.as_ref().map(|e| e.code.as_str()),
        Some("AGENT_RESTARTED")
    );
    assert_eq!(
        sushy.power(&uuid).await,
        "Off",
        "a journaled command never runs twice"
    );

    // bmc.power under the lease's epoch reaches the emulator; the sync loop sees the change.
    fake.push(command(
        "cmd_on",
        "bmc.power",
        serde_json::json!({"nodeId": "node_bm", "leaseEpoch": 7, "action": "on"}),
    ));
    let done = wait_for("bmc.power", &log, || {
        command_result(&messages(&fake), "cmd_on")
    })
    .await;
    assert_eq!(
        done.state,
        i32::from(pb::CommandState::Succeeded),
        "{done:?}"
    );
    let result: serde_json::Value = serde_json::from_slice(&done.result_json).unwrap();
    assert_eq!(result["power"], "on");
    assert_eq!(sushy.power(&uuid).await, "On");
    // The command's result told the control plane "on" (the state read back once the BMC
    // settled), so the sync loop, which reports what differs from what the control plane was
    // last told (issue 31, rule 10), has nothing to add. A change made behind the site agent's
    // back is noticed: a new observation of node_bm, "off", after the power-on.
    let before = observations(&messages(&fake))
        .iter()
        .filter(|(_, o)| o.node_id == "node_bm")
        .count();
    sushy.reset(&uuid, "ForceOff").await;
    wait_for("the out-of-band change reported", &log, || {
        let o = observations(&messages(&fake));
        let mine: Vec<_> = o.iter().filter(|(_, o)| o.node_id == "node_bm").collect();
        mine[before..]
            .iter()
            .any(|(_, o)| o.power == "off")
            .then_some(())
    })
    .await;

    // A command of another epoch is refused and does nothing.
    fake.push(command(
        "cmd_stale",
        "bmc.power",
        serde_json::json!({"nodeId": "node_bm", "leaseEpoch": 6, "action": "on"}),
    ));
    let stale = wait_for("the stale command", &log, || {
        command_result(&messages(&fake), "cmd_stale")
    })
    .await;
    assert_eq!(stale.state, i32::from(pb::CommandState::Failed));
    assert_eq!(
        stale.error.as_ref().map(|e| e.code.as_str()),
        Some("LEASE_LOST"),
        "{stale:?}"
    );
    assert_eq!(sushy.power(&uuid).await, "Off", "nothing was done");
    // The journal's log line of a failed command says why (issue 30.12), not only `state=failed`.
    let finished = wait_for("the stale command's log line", &log, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .find(|l| l.contains("cmd_stale") && l.contains("command finished"))
            .map(str::to_owned)
    })
    .await;
    assert!(
        finished.contains("LEASE_LOST") && finished.contains("epoch 6"),
        "{finished}"
    );

    // bcd status shows the site (and no credential).
    let status = wait_for("status.json with the site", &log, || {
        let out = Command::new(env!("CARGO_BIN_EXE_bcd"))
            .args(["status", "-o", "json", "--state-dir"])
            .arg(&state)
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        (v["site"]["leaseHeld"] == true && v["site"]["bmcs"] == 2).then_some(v)
    })
    .await;
    assert_eq!(status["site"]["siteId"], "site_a");
    assert_eq!(status["site"]["leaseEpoch"], 7);
    let table = Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args(["status", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    assert!(table.contains("held (epoch 7)"), "{table}");

    // The control plane stops renewing: the lease lapses on the agent's clock (3 s - 1 s margin
    // after the last renewal) and all BMC work stops.
    fake.pause_acks(true);
    wait_for("the lapse", &log, || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("site lease lapsed")
            .then_some(())
    })
    .await;
    let polls = proxy.total();
    fake.push(command(
        "cmd_lapsed",
        "bmc.power",
        serde_json::json!({"nodeId": "node_bm", "leaseEpoch": 7, "action": "on"}),
    ));
    let lapsed = wait_for("the command after the lapse", &log, || {
        command_result(&messages(&fake), "cmd_lapsed")
    })
    .await;
    assert_eq!(
        lapsed.error.as_ref().map(|e| e.code.as_str()),
        Some("LEASE_LOST"),
        "{lapsed:?}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        proxy.total(),
        polls,
        "no request reached the BMC after the lapse"
    );
    assert_eq!(sushy.power(&uuid).await, "Off");

    // Nothing the site agent wrote or sent carries a password.
    drop(_site);
    if std::env::var_os("BC_KEEP_LOG").is_some() {
        let _ = std::fs::copy(&log, "/tmp/site-session.log");
    }
    let mut checked = vec![log.clone()];
    checked.extend(files(&state));
    assert!(
        checked
            .iter()
            .any(|p| p.to_string_lossy().contains("cmd_on")),
        "the journal was checked: {checked:?}"
    );
    for p in &checked {
        let text = String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
        for secret in [PASSWORD, WRONG_PASSWORD] {
            assert!(
                !text.contains(secret),
                "{} holds a BMC password",
                p.display()
            );
        }
    }
    for m in messages(&fake) {
        let bytes = m.encode_to_vec();
        for secret in [PASSWORD, WRONG_PASSWORD] {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "a message sent to the control plane holds a BMC password: {m:?}"
            );
        }
    }
    for out in [table, status.to_string()] {
        assert!(!out.contains(PASSWORD) && !out.contains(WRONG_PASSWORD));
    }
}
