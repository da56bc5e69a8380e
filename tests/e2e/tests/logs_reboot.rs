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
    let token = cp.create_token(&["--pool", &cp.metal_host_pool()]);
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

/// The fake `journalctl`: its args, then lines holding a join token, a PEM private key, a bearer
/// token and an API token, then `extra` filler lines.
fn fake_journalctl(dir: &Path, extra: u32) -> String {
    script(
        &dir.join("journalctl"),
        &format!(
            r#"echo "journalctl args: $*"
echo "kubelet: joining with token abc123.0123456789abcdef"
echo "-----BEGIN RSA PRIVATE KEY-----"
echo "MIIEowIBAAKCAQEAsecretkeymaterial"
echo "-----END RSA PRIVATE KEY-----"
echo "curl -H 'Authorization: Bearer topsecretbearer'"
echo "bcctl --token bcapi_deadbeef00"
echo "sshd: the journal is fine"
i=0; while [ $i -lt {extra} ]; do echo "filler line $i of the journal"; i=$((i+1)); done"#
        ),
    )
}

/// Downloads the bundle with `bcctl nodes logs` and unpacks it; returns the unpack dir.
fn download(cp: &ControlPlane, node: &str, cmd: Option<&str>, dir: &Path) -> PathBuf {
    let file = dir.join("bundle.tar.gz");
    let f = file.to_str().unwrap();
    let mut args = vec!["nodes", "logs", node, "-f", f];
    if let Some(c) = cmd {
        args.extend(["--command", c]);
    }
    let (ok, _, err) = cp.bcctl(&args);
    assert!(ok, "bcctl nodes logs: {err}");
    let out = dir.join("unpacked");
    std::fs::create_dir_all(&out).unwrap();
    let st = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&file)
        .arg("-C")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "the bundle is a valid tar.gz");
    out
}

fn run_collect(cp: &ControlPlane, node: &str, extra: &[&str]) -> Value {
    let mut args = vec!["nodes", "run", node, "logs.collect", "--wait", "-o", "json"];
    args.extend_from_slice(extra);
    let (ok, out, err) = cp.bcctl(&args);
    assert!(ok, "logs.collect: {err}\n{out}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn logs_collect_bundles_redacted_logs_with_a_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let root = fixture_root(tmp.path(), "55555555-5555-5555-5555-555555555555");
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(
        root.join("dev/kmsg"),
        "6,1,100,-;Linux version 6.8.0\n4,2,200,-;NVRM: Xid (PCI:0000:1a:00): 79, pid=0\n",
    )
    .unwrap();
    let journalctl = fake_journalctl(tmp.path(), 0);
    let dir = tmp.path().join("agent");
    let agent_log = dir.with_extension("log");
    let (root_s, log_s) = (
        root.to_str().unwrap().to_owned(),
        agent_log.to_str().unwrap().to_owned(),
    );
    let (agent, id) = join(
        &cp,
        &dir,
        &[
            "--root",
            &root_s,
            "--journalctl",
            &journalctl,
            "--log-file",
            &log_s,
        ],
    );

    let v = run_collect(&cp, &id, &["--arg", "since=1h"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let r = &v["result"];
    assert_eq!(r["truncated"], false, "{r}");
    assert_eq!(r["sha256"].as_str().unwrap().len(), 64);
    let bundle = cp
        .dir
        .join("bundles")
        .join(format!("{}.tar.gz", v["id"].as_str().unwrap()));
    assert_eq!(
        std::fs::metadata(&bundle).unwrap().len(),
        r["bundleBytes"].as_u64().unwrap(),
        "the control plane stored what the agent sent"
    );

    let out = download(&cp, &id, None, tmp.path());
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest, r["manifest"]);
    assert!(manifest["since"].is_string(), "{manifest}");
    let status: Vec<(String, String)> = manifest["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap().to_owned(),
                s["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        status,
        vec![
            ("journal".to_owned(), "collected".to_owned()),
            ("kernel".to_owned(), "collected".to_owned()),
            ("agent".to_owned(), "collected".to_owned()),
        ]
    );
    assert_eq!(manifest["sources"][0]["redactions"], 4, "{manifest}");

    let journal = std::fs::read_to_string(out.join("journal.log")).unwrap();
    assert!(journal.contains("sshd: the journal is fine"), "{journal}");
    assert!(
        journal.contains("--since=@"),
        "since reaches journalctl: {journal}"
    );
    for secret in [
        "0123456789abcdef",
        "secretkeymaterial",
        "topsecretbearer",
        "deadbeef00",
    ] {
        assert!(!journal.contains(secret), "{secret} leaked: {journal}");
    }
    assert!(journal.contains("[REDACTED PRIVATE KEY]"));
    let kernel = std::fs::read_to_string(out.join("kernel.log")).unwrap();
    assert!(kernel.contains("NVRM: Xid"), "{kernel}");
    let own = std::fs::read_to_string(out.join("agent.log")).unwrap();
    assert!(own.contains("command received"), "{own}");
    // The agent's staging area is cleaned up after the upload.
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
    drop(agent);
}

#[test]
fn logs_collect_notes_missing_sources_and_cuts_at_max_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let root = fixture_root(tmp.path(), "66666666-6666-6666-6666-666666666666");
    let journalctl = fake_journalctl(tmp.path(), 20_000);
    let dir = tmp.path().join("agent");
    let root_s = root.to_str().unwrap().to_owned();
    let (_agent, id) = join(&cp, &dir, &["--root", &root_s, "--journalctl", &journalctl]);

    let v = run_collect(&cp, &id, &["--arg", "maxBytes=4096"]);
    let r = &v["result"];
    assert_eq!(r["truncated"], true, "{r}");
    let m = &r["manifest"];
    assert_eq!(m["sources"][0]["status"], "truncated", "{m}");
    assert_eq!(m["sources"][1]["status"], "missing", "no dev/kmsg: {m}");
    assert_eq!(m["sources"][2]["status"], "missing", "no --log-file: {m}");
    assert!(
        m["sources"][2]["reason"]
            .as_str()
            .unwrap()
            .contains("--log-file")
    );
    let out = download(&cp, &id, v["id"].as_str(), tmp.path());
    let journal = std::fs::metadata(out.join("journal.log")).unwrap().len();
    assert!(journal <= 4096 && journal > 3000, "{journal} bytes");
    assert!(!out.join("kernel.log").exists());

    // Without journalctl the command still succeeds and says why the journal is missing.
    let tmp2 = tempfile::tempdir().unwrap();
    let cp2 = ControlPlane::start(&tmp2.path().join("cp"));
    let (_agent2, id2) = join(
        &cp2,
        &tmp2.path().join("agent"),
        &["--root", &root_s, "--journalctl", "/nonexistent/journalctl"],
    );
    let v = run_collect(&cp2, &id2, &["--arg", r#"sources=["journal"]"#]);
    let j = &v["result"]["manifest"]["sources"][0];
    assert_eq!(j["status"], "missing", "{v}");
    assert!(
        j["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/journalctl"),
        "{j}"
    );
    // A node with no bundle yet, or a wrong command id, is a clear error.
    let (ok, _, err) = cp2.bcctl(&[
        "nodes",
        "logs",
        &id2,
        "--command",
        "cmd_nope",
        "-f",
        "/dev/null",
    ]);
    assert!(!ok && err.contains("not found"), "{err}");
}

/// A `journalctl` that counts its runs in `counter` and takes `secs` seconds.
fn counting_journalctl(dir: &Path, counter: &Path, secs: u32) -> String {
    script(
        &dir.join("slow-journalctl"),
        &format!(
            "echo run >> {}\nsleep {secs}\necho 'sshd: slow journal'",
            counter.display()
        ),
    )
}

fn runs(counter: &Path) -> usize {
    std::fs::read_to_string(counter)
        .unwrap_or_default()
        .lines()
        .count()
}

#[test]
fn kill9_of_the_control_plane_mid_command_loses_nothing_and_runs_it_once() {
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("runs");
    let journalctl = counting_journalctl(tmp.path(), &counter, 3);
    let mut cp = ControlPlane::start(&tmp.path().join("cp"));
    let dir = tmp.path().join("agent");
    let (agent, id) = join(&cp, &dir, &["--journalctl", &journalctl]);
    let c = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "logs.collect", "args": {"sources": ["journal"]}, "timeoutSeconds": 120}),
    );
    eventually(WAIT, "command running", || {
        (runs(&counter) == 1).then_some(())
    });
    // The control plane dies while the agent works; the result finds it after the restart.
    cp.kill9();
    cp.restart(&[]);
    let deadline = std::time::Instant::now() + WAIT;
    let done = loop {
        let c = command(&cp, &c["id"]);
        if matches!(c["state"].as_str(), Some("succeeded" | "failed")) {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not finished: {c}\n{}",
            agent.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The upload needs the control plane: either it made it, or it failed cleanly; never twice.
    assert!(
        done["state"] == "succeeded" || done["error"]["code"].is_string(),
        "{done}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(runs(&counter), 1, "the command ran exactly once");
}

#[test]
fn kill9_of_the_agent_mid_command_reports_it_failed_and_never_reruns_it() {
    let tmp = tempfile::tempdir().unwrap();
    let counter = tmp.path().join("runs");
    let journalctl = counting_journalctl(tmp.path(), &counter, 3);
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let dir = tmp.path().join("agent");
    let (mut agent, id) = join(&cp, &dir, &["--journalctl", &journalctl]);
    let c = cp.ok(
        "commands.create",
        json!({"nodeId": id, "name": "logs.collect", "args": {"sources": ["journal"]}, "timeoutSeconds": 120}),
    );
    eventually(WAIT, "command running", || {
        (runs(&counter) == 1).then_some(())
    });
    agent.kill9();
    let _agent = Agent::start(&cp, &dir, None, &["--journalctl", &journalctl]);
    let done = eventually(WAIT, "command reported after the agent restart", || {
        let c = command(&cp, &c["id"]);
        (c["state"] == "failed").then_some(c)
    });
    assert_eq!(done["error"]["code"], "AGENT_RESTARTED", "{done}");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(runs(&counter), 1, "an interrupted command is never re-run");
}
