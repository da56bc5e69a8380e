//! Real `bcd agent` processes and their state dir: one agent per state dir (a second one exits
//! naming the first one's pid), a broken identity named with what to do (and replaced with a
//! join token), a session the control plane refuses for good ending the reconnect loop, and
//! break-glass keys that expire with `spec.json` corrupt and the control plane down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bc_protocol::pb::{self, Spec, gateway_message};
use bc_protocol::spec::{BreakGlassSsh, NodeSpec, SshKey};
use bcd_core::test_utils::{Code, FakeControlPlane};

const WAIT: Duration = Duration::from_secs(30);
/// A pin no control plane has: joins to the dead address below fail before any token is sent.
const PIN: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// Nothing listens here.
const DEAD: &str = "https://127.0.0.1:1";
// A public key for the break-glass test; the private half was thrown away.
const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFoI/vRJxuXKIFpm08wZNESqDqg4OFGJz5u4IOqvbE7K";

/// A `bcd agent` process, killed when dropped; its stderr goes to a file.
struct Agent {
    child: Option<Child>,
    log: PathBuf,
}

impl Agent {
    fn start(root: &Path, state_dir: &Path, cp: &str, pin: &str, extra: &[&str]) -> Self {
        let log = state_dir.with_extension(format!("{}.log", rand_suffix()));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_bcd"))
            .args(["agent", "--control-plane", cp, "--ca-pin", pin])
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--root")
            .arg(root)
            .args(["--reconnect-base", "100ms", "--reconnect-max", "1s"])
            .args(extra)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("BCD_JOIN_TOKEN")
            .env("BCD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        Self {
            child: Some(child),
            log,
        }
    }
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Waits for the process to exit; `None` after `timeout`.
    fn exit_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A host root: boot id, hostname, and user `ops` (uid 4242 as root, the test's own otherwise).
fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let k = root.join("proc/sys/kernel");
    std::fs::create_dir_all(k.join("random")).unwrap();
    std::fs::write(k.join("random/boot_id"), "0f6c8a3e-boot-of-the-agent\n").unwrap();
    std::fs::write(k.join("hostname"), "agent-host\n").unwrap();
    let (uid, gid) = if nix::unistd::Uid::effective().is_root() {
        (4242, 4242)
    } else {
        (
            nix::unistd::Uid::effective().as_raw(),
            nix::unistd::Gid::effective().as_raw(),
        )
    };
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(
        root.join("etc/passwd"),
        format!("ops:x:{uid}:{gid}::/home/ops:/bin/sh\n"),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("home/ops")).unwrap();
    root
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status(state_dir: &Path) -> serde_json::Value {
    std::fs::read_to_string(state_dir.join("status.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// A fake control plane on its own runtime, so the test can take it down.
struct Cp {
    rt: Option<tokio::runtime::Runtime>,
    fake: FakeControlPlane,
}

impl Cp {
    fn start(script: Vec<gateway_message::Msg>, refuse: Option<(Code, String)>) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let fake = rt.block_on(FakeControlPlane::start_with(script, refuse));
        Self { rt: Some(rt), fake }
    }
    fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

/// Starts an agent that joins `cp` with a token and waits until it has an identity.
fn joined(root: &Path, state_dir: &Path, cp: &Cp) -> Agent {
    let agent = Agent::start(
        root,
        state_dir,
        &cp.fake.url,
        &cp.fake.pin,
        &["--join-token", "abcdef.0123456789abcdef"],
    );
    eventually("node.json", || {
        state_dir.join("node.json").exists().then_some(())
    });
    agent
}

#[test]
fn a_second_agent_on_the_same_state_dir_exits_naming_the_first_ones_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let dir = tmp.path().join("state");
    // Joins that can never succeed keep the first agent running (and retrying) for good.
    let args = ["--join-token", "abcdef.0123456789abcdef"];
    let mut first = Agent::start(&root, &dir, DEAD, PIN, &args);
    eventually("the first agent's status.json", || {
        (status(&dir)["pid"] == first.pid()).then_some(())
    });
    let mut second = Agent::start(&root, &dir, DEAD, PIN, &args);
    let exit = second.exit_within(WAIT);
    assert!(
        exit.is_some_and(|s| !s.success()),
        "the second agent kept running on the same state dir: {}",
        second.log()
    );
    let log = second.log();
    assert!(log.contains(&format!("pid {}", first.pid())), "{log}");
    assert!(log.contains(&dir.display().to_string()), "{log}");
    // The first one runs on, and status.json is still its own.
    assert!(first.exit_within(Duration::from_millis(300)).is_none());
    assert_eq!(status(&dir)["pid"], first.pid());

    // The lock lives as long as the process: after kill -9 a new agent takes over.
    first.kill();
    let third = Agent::start(&root, &dir, DEAD, PIN, &args);
    eventually("the third agent's status.json", || {
        (status(&dir)["pid"] == third.pid()).then_some(())
    });
}

#[test]
fn a_broken_identity_is_named_and_a_join_token_replaces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let dir = tmp.path().join("state");
    let cp = Cp::start(vec![], None);
    let mut agent = joined(&root, &dir, &cp);
    agent.kill();
    let cert = std::fs::read_to_string(dir.join("cert.pem")).unwrap();
    std::fs::write(dir.join("cert.pem"), &cert[..cert.len() / 2]).unwrap();

    // No token: the agent stops at once, naming the file and what to do.
    let mut agent = Agent::start(&root, &dir, &cp.fake.url, &cp.fake.pin, &[]);
    let exit = agent.exit_within(WAIT);
    let log = agent.log();
    assert!(exit.is_some_and(|s| !s.success()), "{log}");
    assert!(
        log.contains(&dir.join("cert.pem").display().to_string()) && log.contains("join token"),
        "{log}"
    );

    // A token file that is still empty: the agent waits, and `bcd status` says why.
    let token_file = tmp.path().join("token");
    std::fs::write(&token_file, "").unwrap();
    let token_arg = token_file.to_str().unwrap();
    let agent = Agent::start(
        &root,
        &dir,
        &cp.fake.url,
        &cp.fake.pin,
        &["--join-token-file", token_arg],
    );
    eventually("status broken", || {
        (status(&dir)["state"] == "broken").then_some(())
    });
    let out = Command::new(env!("CARGO_BIN_EXE_bcd"))
        .args(["status", "-o", "json", "--state-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(shown["state"], "broken", "{shown}");
    assert!(
        shown["message"]
            .as_str()
            .is_some_and(|m| m.contains("cert.pem")),
        "{shown}"
    );
    drop(agent);

    // With a token: the broken identity is moved aside and the node joins again.
    let joins_before = cp.fake.seen.lock().joins.len();
    let agent = Agent::start(
        &root,
        &dir,
        &cp.fake.url,
        &cp.fake.pin,
        &["--join-token", "ghijkl.0123456789abcdef"],
    );
    eventually("connected again", || {
        (status(&dir)["state"] == "connected").then_some(())
    });
    assert_eq!(cp.fake.seen.lock().joins.len(), joins_before + 1);
    let retired = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("cert.pem.retired-")
        });
    assert!(retired, "the broken cert.pem was not kept aside");
    drop(agent);
}

/// Issue 30.12: a state dir whose `node.json` is a directory, or whose `commands` is a file,
/// stops the agent with a message that names the path, says what is wrong with it and what to
/// do, not the bare OS error.
#[test]
fn a_state_dir_entry_of_the_wrong_kind_is_named_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let args = ["--join-token", "abcdef.0123456789abcdef"];

    let dir = tmp.path().join("state-a");
    std::fs::create_dir_all(dir.join("node.json")).unwrap();
    let mut agent = Agent::start(&root, &dir, DEAD, PIN, &args);
    let exit = agent.exit_within(WAIT);
    let log = agent.log();
    assert!(exit.is_some_and(|s| !s.success()), "{log}");
    let path = dir.join("node.json").display().to_string();
    assert!(
        log.contains(&path) && log.contains("is a directory") && log.contains("move it aside"),
        "{log}"
    );

    let dir = tmp.path().join("state-b");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("commands"), "not a directory").unwrap();
    let mut agent = Agent::start(&root, &dir, DEAD, PIN, &args);
    let exit = agent.exit_within(WAIT);
    let log = agent.log();
    assert!(exit.is_some_and(|s| !s.success()), "{log}");
    let path = dir.join("commands").display().to_string();
    assert!(
        log.contains(&path) && log.contains("is not a directory") && log.contains("move it aside"),
        "{log}"
    );
}

#[test]
fn a_session_refused_for_good_ends_the_reconnect_loop_with_a_clear_status() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let dir = tmp.path().join("state");
    let refusal = (
        Code::PermissionDenied,
        "Hello names node node_0 but the certificate is node node_7".to_owned(),
    );
    let cp = Cp::start(vec![], Some(refusal));
    // Not `joined`: the refused identity may be moved aside before node.json is ever seen.
    let _agent = Agent::start(
        &root,
        &dir,
        &cp.fake.url,
        &cp.fake.pin,
        &["--join-token", "abcdef.0123456789abcdef"],
    );
    eventually("status refused", || {
        (status(&dir)["state"] == "refused").then_some(())
    });
    let st = status(&dir);
    assert!(
        st["message"]
            .as_str()
            .is_some_and(|m| m.contains("node_7") && m.contains("join token")),
        "{st}"
    );
    // Several reconnect backoffs later (100 ms base): still the one attempt, and the identity
    // kept aside.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(cp.fake.seen.lock().session_attempts, 1);
    assert!(!dir.join("node.json").exists());
    let retired = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("node.json.retired-")
        });
    assert!(retired);
}

#[test]
fn break_glass_keys_expire_with_spec_json_corrupt_and_the_control_plane_down() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let dir = tmp.path().join("state");
    let keys_file = root.join("home/ops/.ssh/authorized_keys");
    let expires = chrono::Utc::now() + chrono::Duration::seconds(6);
    let spec = NodeSpec {
        break_glass_ssh: Some(BreakGlassSsh {
            user: "ops".to_owned(),
            keys: vec![SshKey {
                public_key: KEY.to_owned(),
                comment: "brief".to_owned(),
                expires_at: Some(expires),
            }],
        }),
        ..NodeSpec::default()
    };
    let script = vec![gateway_message::Msg::Spec(Spec {
        generation: 1,
        spec: Some(pb::NodeSpec::from(&spec)),
    })];
    let mut cp = Cp::start(script, None);
    let mut agent = joined(&root, &dir, &cp);
    eventually("the key installed", || {
        std::fs::read_to_string(&keys_file)
            .ok()
            .filter(|t| t.contains("brief"))
    });
    let text = std::fs::read_to_string(&keys_file).unwrap();
    assert!(text.contains("expiry-time=\""), "{text}");

    // The agent stops, the control plane goes down, spec.json is corrupted.
    agent.kill();
    cp.stop();
    std::fs::write(dir.join("spec.json"), b"{\"observedGeneration\": 1, \"last").unwrap();
    let _agent = Agent::start(&root, &dir, &cp.fake.url, &cp.fake.pin, &[]);
    eventually("the expired key removed", || {
        let text = std::fs::read_to_string(&keys_file).unwrap_or_default();
        (!text.contains("brief")).then_some(())
    });
    assert!(chrono::Utc::now() >= expires, "removed before its expiry");
}
