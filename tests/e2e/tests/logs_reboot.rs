//! node.reboot and logs.collect end to end: real `bcctl serve` and `bcd agent` processes, a fixture
//! host root made in a temp dir, and scripts standing in for `systemctl reboot` and `journalctl`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// A host root holding only `proc/sys/kernel/random/boot_id` = `boot`.
fn fixture_root(dir: &Path, boot: &str) -> PathBuf {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("proc/sys/kernel/random")).unwrap();
    std::fs::write(
        root.join("proc/sys/kernel/random/boot_id"),
        format!("{boot}\n"),
    )
    .unwrap();
    root
}

fn script(path: &Path, body: &str) -> String {
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn join(cp: &ControlPlane, dir: &Path, extra: &[&str]) -> (Agent, String) {
    let site = cp.ok("sites.create", json!({"name": "s1", "kind": "platform"}));
    let pool = cp.ok(
        "pools.create",
        json!({"name": "p1", "kind": "metal-host", "siteId": site["id"]}),
    );
    let token = cp.create_token(&["--pool", pool["id"].as_str().unwrap()]);
    let agent = Agent::start(cp, dir, Some(&token), extra);
    let id = agent.node_id();
    eventually(WAIT, "node connected", || {
        (cp.node(&id)["connectivity"] == "connected").then_some(())
    });
    (agent, id)
}

fn command(cp: &ControlPlane, id: &Value) -> Value {
    cp.ok("commands.get", json!({"commandId": id}))
}

#[test]
fn node_reboot_succeeds_when_the_agent_returns_with_a_new_boot_id() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let root = fixture_root(tmp.path(), "11111111-1111-1111-1111-111111111111");
    let marker = tmp.path().join("rebooted");
    // "Rebooting" writes a new boot id into the fixture root and records the mode it was asked for.
    let reboot = script(
        &tmp.path().join("reboot.sh"),
        &format!(
            "echo 22222222-2222-2222-2222-222222222222 > {}/proc/sys/kernel/random/boot_id\necho \"$BCD_REBOOT_MODE\" > {}",
            root.display(),
            marker.display()
        ),
    );
    let dir = tmp.path().join("agent");
    let root_s = root.to_str().unwrap().to_owned();
    let flags = ["--root", &root_s, "--reboot-command", &reboot];
    let (mut agent, id) = join(&cp, &dir, &flags);

    // Without a cordon the control plane refuses it.
    let (status, body) = cp.call(
        "commands.create",
        json!({"nodeId": id, "name": "node.reboot"}),
    );
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("INVALID_STATE")),
        "{body}"
    );
    assert!(!marker.exists(), "nothing ran");

    let (ok, _, err) = cp.bcctl(&["nodes", "cordon", &id]);
    assert!(ok, "{err}");
    let cmd = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "node.reboot", "args": {"mode": "force"}, "timeoutSeconds": 60}),
    );
    eventually(WAIT, "reboot command ran", || marker.exists().then_some(()));
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "force");
    // Journaled with the boot id it was accepted under; not over until the machine is back.
    let journal: Value = serde_json::from_str(
        &std::fs::read_to_string(
            dir.join("commands")
                .join(format!("{}.json", cmd["id"].as_str().unwrap())),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(journal["state"], "accepted");
    assert_eq!(journal["bootId"], "11111111-1111-1111-1111-111111111111");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !command(&cp, &cmd["id"])["state"]
            .as_str()
            .is_some_and(|s| s == "succeeded" || s == "failed"),
        "not final before the reboot"
    );
    assert!(
        agent.log_text().contains("rebooting the machine"),
        "{}",
        agent.log_text()
    );

    // Play the reboot: the agent process stops and starts again under the new boot id.
    agent.kill9();
    let _agent = Agent::start(&cp, &dir, None, &flags);
    let done = eventually(WAIT, "node.reboot succeeded", || {
        let c = command(&cp, &cmd["id"]);
        (c["state"] == "succeeded").then_some(c)
    });
    assert_eq!(
        done["result"],
        json!({"previousBootId": "11111111-1111-1111-1111-111111111111",
               "bootId": "22222222-2222-2222-2222-222222222222"}),
        "{done}"
    );
}

#[test]
fn node_reboot_expires_when_the_machine_never_comes_back() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let root = fixture_root(tmp.path(), "33333333-3333-3333-3333-333333333333");
    let marker = tmp.path().join("rebooted");
    let reboot = script(
        &tmp.path().join("reboot.sh"),
        &format!("touch {}", marker.display()),
    );
    let dir = tmp.path().join("agent");
    let root_s = root.to_str().unwrap().to_owned();
    let flags = ["--root", &root_s, "--reboot-command", &reboot];
    let (mut agent, id) = join(&cp, &dir, &flags);
    // `force` stands in for the cordon.
    let cmd = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "node.reboot", "args": {"force": true}, "timeoutSeconds": 3}),
    );
    eventually(WAIT, "reboot command ran", || marker.exists().then_some(()));
    agent.kill9();
    let c = eventually(WAIT, "node.reboot expired", || {
        let c = command(&cp, &cmd["id"]);
        (c["state"] == "expired").then_some(c)
    });
    assert_eq!(c["error"]["code"], "DEADLINE_EXCEEDED");

    // An agent that restarts in the same boot does not call it a success.
    let _agent = Agent::start(&cp, &dir, None, &flags);
    eventually(WAIT, "node reconnected", || {
        (cp.node(&id)["connectivity"] == "connected").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(command(&cp, &cmd["id"])["state"], "expired");
    let journal = std::fs::read_to_string(
        dir.join("commands")
            .join(format!("{}.json", cmd["id"].as_str().unwrap())),
    )
    .unwrap();
    assert!(journal.contains("\"accepted\""), "{journal}");
}

#[test]
fn a_failing_reboot_command_fails_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let root = fixture_root(tmp.path(), "44444444-4444-4444-4444-444444444444");
    let reboot = script(
        &tmp.path().join("reboot.sh"),
        "echo no reboot for you >&2; exit 3",
    );
    let root_s = root.to_str().unwrap().to_owned();
    let (_agent, id) = join(
        &cp,
        &tmp.path().join("agent"),
        &["--root", &root_s, "--reboot-command", &reboot],
    );
    let cmd = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "node.reboot", "args": {"force": true}}),
    );
    let c = eventually(WAIT, "node.reboot failed", || {
        let c = command(&cp, &cmd["id"]);
        (c["state"] == "failed").then_some(c)
    });
    assert_eq!(c["error"]["code"], "REBOOT_FAILED");
    assert!(
        c["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no reboot for you"),
        "{c}"
    );
}
