//! `bcd agent` and `bcd sim` speak through one session core (`bcd-core`): a protocol field added
//! there reaches both without touching either mode.
//!
//! A scripted fake control plane (`bcd_core::test_utils`: Join and Gateway over TLS) records
//! what a real `bcd agent` process and a `bcd sim` process send: the JoinRequest, then each
//! session's messages. It answers Welcome, then a Spec and an `inventory.refresh` command, and acknowledges
//! heartbeats. The test asserts that both modes fill the same fields of JoinRequest and Hello
//! (read off the protobuf encoding, so a field nobody here knows of yet counts too), send the
//! same sequence of messages, and answer the Spec and the command with the same shapes. A mode
//! that built its own Hello (or skipped the core's builder for a new field) fails here; the
//! source scan below fails a second Hello/JoinRequest/Heartbeat builder anywhere in the daemon.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bc_protocol::pb::{AgentMessage, Command as PbCommand, Spec, agent_message, gateway_message};
use bcd_core::test_utils::{EPOCH, FakeControlPlane};
use prost::Message;

const WAIT: Duration = Duration::from_secs(60);

/// What the fake sends after Welcome: a Spec and an `inventory.refresh`.
fn script() -> Vec<gateway_message::Msg> {
    vec![
        gateway_message::Msg::Spec(Spec {
            generation: 1,
            spec: Some(Default::default()),
        }),
        gateway_message::Msg::Command(PbCommand {
            id: "cmd_refresh".to_owned(),
            name: "inventory.refresh".to_owned(),
            args_json: b"{}".to_vec(),
            deadline_ms: chrono::Utc::now().timestamp_millis() + 600_000,
        }),
    ]
}

/// The field numbers an encoded message carries at its top level: proto3 leaves out a scalar at
/// its default and an empty repeated field, so these are the fields the sender filled.
fn fields(bytes: &[u8]) -> BTreeSet<u64> {
    fn varint(b: &[u8], i: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[*i];
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let (mut out, mut i) = (BTreeSet::new(), 0);
    while i < bytes.len() {
        let key = varint(bytes, &mut i);
        out.insert(key >> 3);
        match key & 7 {
            0 => {
                varint(bytes, &mut i);
            }
            1 => i += 8,
            2 => {
                let len = usize::try_from(varint(bytes, &mut i)).unwrap();
                i += len;
            }
            5 => i += 4,
            wt => panic!("wire type {wt} in a bcd.v1 message"),
        }
    }
    out
}

fn kind(m: &AgentMessage) -> &'static str {
    match &m.msg {
        Some(agent_message::Msg::Hello(_)) => "Hello",
        Some(agent_message::Msg::Heartbeat(_)) => "Heartbeat",
        Some(agent_message::Msg::Inventory(_)) => "Inventory",
        Some(agent_message::Msg::SpecStatus(_)) => "SpecStatus",
        Some(agent_message::Msg::CommandUpdate(_)) => "CommandUpdate",
        Some(agent_message::Msg::Event(_)) => "Event",
        Some(agent_message::Msg::Goodbye(_)) => "Goodbye",
        Some(agent_message::Msg::PowerReport(_)) => "PowerReport",
        None => "empty",
    }
}

/// A node's first session, once it has said everything the script asked of it.
fn complete(msgs: &[AgentMessage]) -> bool {
    let spec = msgs
        .iter()
        .any(|m| matches!(&m.msg, Some(agent_message::Msg::SpecStatus(s)) if s.converged));
    let command = msgs
        .iter()
        .any(|m| matches!(&m.msg, Some(agent_message::Msg::CommandUpdate(u)) if u.progress == 100));
    let heartbeats = msgs.iter().filter(|m| kind(m) == "Heartbeat").count();
    spec && command && heartbeats >= 2
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bcd(args: &[&str], log: &Path) -> Killed {
    let log = std::fs::File::create(log).unwrap();
    Killed(
        Command::new(env!("CARGO_BIN_EXE_bcd"))
            .args(args)
            .env_remove("NOTIFY_SOCKET")
            .env("BCD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// A host root with what the agent reads about itself: boot id and hostname.
fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let k = root.join("proc/sys/kernel");
    std::fs::create_dir_all(k.join("random")).unwrap();
    std::fs::write(k.join("random/boot_id"), "0f6c8a3e-boot-of-the-agent\n").unwrap();
    std::fs::write(k.join("hostname"), "agent-host\n").unwrap();
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_sim_send_what_the_one_session_core_builds() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeControlPlane::start(script()).await;
    let (url, pin, seen) = (fake.url.clone(), fake.pin.clone(), fake.seen.clone());
    let root = host_root(dir.path());
    let agent_dir = dir.path().join("agent");
    let _agent = bcd(
        &[
            "agent",
            "--control-plane",
            &url,
            "--ca-pin",
            &pin,
            "--join-token",
            "tok.secret",
            "--state-dir",
            agent_dir.to_str().unwrap(),
            "--root",
            root.to_str().unwrap(),
            "--config",
            "/dev/null",
            "--nvml-lib",
            "/nonexistent/libnvidia-ml.so.1",
        ],
        &dir.path().join("agent.log"),
    );
    // One at a time, so the join order says which node is which.
    let deadline = Instant::now() + WAIT;
    while seen.lock().joins.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the agent never joined: {}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _sim = bcd(
        &[
            "sim",
            "--control-plane",
            &url,
            "--ca-pin",
            &pin,
            "--join-token",
            "tok.secret",
            "--nodes",
            "1",
        ],
        &dir.path().join("sim.log"),
    );
    loop {
        {
            let s = seen.lock();
            if s.sessions.len() == 2 && s.sessions.iter().all(|(_, m)| complete(m)) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not every node finished its script: {:#?}\nagent log:\n{}\nsim log:\n{}",
            seen.lock().sessions,
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default(),
            std::fs::read_to_string(dir.path().join("sim.log")).unwrap_or_default(),
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let s = seen.lock();
    let (agent_join, sim_join) = (&s.joins[0], &s.joins[1]);
    assert_eq!(agent_join.hostname, "agent-host");
    assert!(
        sim_join.hostname.starts_with("sim-"),
        "{}",
        sim_join.hostname
    );
    let join_fields = fields(&agent_join.encode_to_vec());
    assert_eq!(join_fields, fields(&sim_join.encode_to_vec()));
    assert_eq!(
        join_fields,
        BTreeSet::from([1, 2, 3, 4, 5, 6]),
        "every JoinRequest field is filled"
    );

    let (agent, sim) = (s.session("node_0").unwrap(), s.session("node_1").unwrap());
    let hello = |m: &[AgentMessage]| match &m[0].msg {
        Some(agent_message::Msg::Hello(h)) => h.clone(),
        other => panic!("first message is not Hello: {other:?}"),
    };
    let (agent_hello, sim_hello) = (hello(agent), hello(sim));
    assert_eq!(agent_hello.boot_id, "0f6c8a3e-boot-of-the-agent");
    assert_eq!(agent_hello.agent_version, sim_hello.agent_version);
    assert_eq!(agent_hello.mode, sim_hello.mode);
    let hello_fields = fields(&agent_hello.encode_to_vec());
    assert_eq!(
        hello_fields,
        fields(&sim_hello.encode_to_vec()),
        "Hello of the agent {agent_hello:?} and of the sim {sim_hello:?} fill different fields"
    );
    // node_id, boot_id, agent_version, mode; observed_generation (0) and pending_results (none)
    // are at their defaults on a node's first session.
    assert_eq!(hello_fields, BTreeSet::from([1, 2, 3, 4]));

    // The same conversation: Hello at epoch 0, then everything at Welcome's epoch, starting with
    // the inventory; the spec converged and the command reported running, then succeeded with
    // the same result keys.
    for (who, msgs) in [("agent", agent), ("sim", sim)] {
        assert_eq!(msgs[0].epoch, 0, "{who}");
        assert!(
            msgs[1..].iter().all(|m| m.epoch == EPOCH),
            "{who}: {msgs:?}"
        );
        assert_eq!(kind(&msgs[1]), "Inventory", "{who}: {msgs:?}");
    }
    let updates = |msgs: &[AgentMessage]| -> Vec<(i32, u32, BTreeSet<String>)> {
        msgs.iter()
            .filter_map(|m| match &m.msg {
                Some(agent_message::Msg::CommandUpdate(u)) => {
                    let keys = serde_json::from_slice::<serde_json::Value>(&u.result_json)
                        .ok()
                        .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
                        .unwrap_or_default();
                    Some((u.state, u.progress, keys))
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(updates(agent), updates(sim));
    let kinds =
        |msgs: &[AgentMessage]| -> BTreeSet<&'static str> { msgs.iter().map(kind).collect() };
    assert_eq!(kinds(agent), kinds(sim));
}

/// Each message the session core builds has one builder: Hello and Heartbeat in
/// `agent-core/src/session.rs`, JoinRequest in `agent-core/src/join.rs`. A mode that builds its
/// own would bypass the core (and the test above would catch it only for the fields it drops).
#[test]
fn protocol_messages_have_one_builder_in_the_daemon() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let builders = [
        ("Hello {", "agent-core/src/session.rs"),
        ("Heartbeat {", "agent-core/src/session.rs"),
        ("JoinRequest {", "agent-core/src/join.rs"),
    ];
    let mut files = Vec::new();
    for dir in [
        "daemon/src",
        "agent-core/src",
        "agent-site/src",
        "agent-ramdisk/src",
        "probes/src",
    ] {
        collect_rs(&workspace.join(dir), &mut files);
    }
    assert!(
        files.len() > 20,
        "source files not found under {}",
        workspace.display()
    );
    for (pattern, home) in builders {
        let found: Vec<String> = files
            .iter()
            .filter(|f| {
                std::fs::read_to_string(f).unwrap().lines().any(|l| {
                    let code = l.trim_start();
                    !code.starts_with("//") && code.contains(pattern)
                })
            })
            .map(|f| f.strip_prefix(&workspace).unwrap().display().to_string())
            .collect();
        assert_eq!(found, [home], "`{pattern}` is built outside {home}");
    }
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect_rs(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}
