//! The lifecycle against the scripted fake control plane, with a test machine: a command run
//! once although delivered twice, a spec answered through the hooks, Goodbye on stop, and a
//! revoked identity retired with its token never tried again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bc_protocol::commands::CommandFailure;
use bc_protocol::pb::{
    self, Command, Goodbye, GoodbyeReason, HardwareIdentity, Inventory, SpecStatus, agent_message,
    gateway_message,
};
use bc_protocol::{CommandName, Mode};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::*;
use crate::executor::CommandRun;
use crate::identity::MemoryIdentity;
use crate::journal::Journal;
use crate::test_utils::{EPOCH, FakeControlPlane};

#[derive(Debug, Default)]
pub(super) struct TestMachine {
    runs: AtomicUsize,
}

impl Machine for TestMachine {
    fn mode(&self) -> Mode {
        Mode::Node
    }
    fn boot_id(&self) -> &str {
        "boot-1"
    }
    fn hostname(&self) -> String {
        "test-host".to_owned()
    }
    async fn hardware(&self) -> Result<HardwareIdentity, String> {
        Ok(HardwareIdentity {
            hardware_key: "k".to_owned(),
            trusted: false,
            identifier_digests: Vec::new(),
        })
    }
    fn observed_generation(&self) -> u64 {
        0
    }
    async fn inventory(&self) -> Result<Inventory, String> {
        Ok(Inventory {
            hardware: None,
            document_json: b"{}".to_vec(),
            collected_at_ms: 1,
        })
    }
    async fn run_command(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let n = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(json!({"name": run.name.as_str(), "run": n}))
    }
}

/// Hooks that converge at once and write down what they were told.
#[derive(Debug, Default)]
pub(super) struct Recorder {
    pub(super) events: Arc<Mutex<Vec<String>>>,
    /// The gateway URL of each session that opened, in order.
    pub(super) opened_at: Arc<Mutex<Vec<String>>>,
}

impl Recorder {
    fn note(&self, e: impl Into<String>) {
        self.events.lock().push(e.into());
    }
}

impl SessionHooks for Recorder {
    fn on_spec(&mut self, generation: u64, _spec: pb::NodeSpec) -> Option<SpecStatus> {
        self.note(format!("spec {generation}"));
        Some(SpecStatus {
            generation,
            converged: true,
            reason: "Converged".to_owned(),
            message: String::new(),
        })
    }
}

impl Observer for Recorder {
    fn joined(&mut self, identity: &Identity) {
        self.note(format!("joined {}", identity.node.node_id));
    }
    fn session_open(&mut self, epoch: u64, _gateway_id: &str, control_plane: &str) {
        self.note(format!("open {epoch}"));
        self.opened_at.lock().push(control_plane.to_owned());
    }
    fn revoked(&mut self, _why: &str) {
        self.note("revoked");
    }
    fn refused(&mut self, _why: &str) {
        self.note("refused");
    }
    fn identity_broken(&mut self, _why: &str, rejoining: bool) {
        self.note(if rejoining {
            "broken, rejoining"
        } else {
            "broken"
        });
    }
    fn waiting_for_token(&mut self, _why: &str) {
        self.note("waiting");
    }
    fn stopped(&mut self) {
        self.note("stopped");
    }
}

#[derive(Debug)]
pub(super) struct Token;

impl TokenSource for Token {
    fn token(&self) -> Option<String> {
        Some("tok.secret".to_owned())
    }
    fn can_wait(&self) -> bool {
        true
    }
}

pub(super) fn config(fake: &FakeControlPlane) -> LifecycleConfig {
    LifecycleConfig {
        control_planes: vec![fake.url.clone()],
        ca_pin: Some(fake.pin.clone()),
        reconnect_base: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
        retry_refused_joins: false,
        outbound_capacity: 16,
    }
}

pub(super) async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn command(id: &str) -> gateway_message::Msg {
    gateway_message::Msg::Command(Command {
        id: id.to_owned(),
        name: CommandName::DiagNvml.as_str().to_owned(),
        args_json: b"{}".to_vec(),
        deadline_ms: chrono::Utc::now().timestamp_millis() + 60_000,
    })
}

#[tokio::test]
async fn a_command_delivered_twice_runs_once_and_stop_says_goodbye() {
    let spec = gateway_message::Msg::Spec(pb::Spec {
        generation: 3,
        spec: Some(pb::NodeSpec::default()),
    });
    let fake = FakeControlPlane::start(vec![spec, command("cmd_1"), command("cmd_1")]).await;
    let machine = Arc::new(TestMachine::default());
    let executor = Arc::new(Executor::new(Arc::clone(&machine), Journal::memory()));
    let (cfg, store) = (config(&fake), MemoryIdentity::default());
    let mut hooks = Recorder::default();
    let events = Arc::clone(&hooks.events);
    let (stop_tx, stop) = watch::channel(false);
    let node = tokio::spawn(async move {
        let lc = Lifecycle {
            config: &cfg,
            executor: &executor,
            store: &store,
            tokens: &Token,
        };
        run(&lc, &mut hooks, stop).await
    });
    let seen = Arc::clone(&fake.seen);
    let finals = |msgs: &[pb::AgentMessage]| {
        msgs.iter()
            .filter(|m| matches!(&m.msg, Some(agent_message::Msg::CommandUpdate(u)) if u.progress == 100))
            .count()
    };
    until("the result of cmd_1", || {
        seen.lock()
            .session("node_0")
            .is_some_and(|m| finals(m) == 1)
    })
    .await;
    // The second delivery came while the first ran: journaled as accepted, so not run again;
    // its result is the one result.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(machine.runs.load(Ordering::SeqCst), 1, "cmd_1 ran twice");
    assert_eq!(finals(seen.lock().session("node_0").unwrap()), 1);
    stop_tx.send(true).unwrap();
    node.await.unwrap().unwrap();

    let seen = seen.lock();
    let msgs = seen.session("node_0").unwrap();
    assert!(matches!(&msgs[0].msg, Some(agent_message::Msg::Hello(h)) if h.boot_id == "boot-1"));
    assert!(msgs[1..].iter().all(|m| m.epoch == EPOCH));
    assert!(msgs.iter().any(
        |m| matches!(&m.msg, Some(agent_message::Msg::SpecStatus(s)) if s.generation == 3 && s.converged)
    ));
    assert!(
        matches!(&msgs.last().unwrap().msg, Some(agent_message::Msg::Goodbye(g)) if g.reason == i32::from(GoodbyeReason::Shutdown)),
        "{msgs:?}"
    );
    let events = events.lock();
    assert_eq!(
        events.as_slice(),
        [
            "joined node_0",
            &format!("open {EPOCH}"),
            "spec 3",
            "stopped"
        ]
    );
}

#[tokio::test]
async fn a_revoked_identity_is_retired_and_its_token_never_tried_again() {
    let bye = gateway_message::Msg::Goodbye(Goodbye {
        reason: GoodbyeReason::Revoked.into(),
        message: "revoked by an operator".to_owned(),
    });
    let fake = FakeControlPlane::start(vec![bye]).await;
    let machine = Arc::new(TestMachine::default());
    let executor = Arc::new(Executor::new(machine, Journal::memory()));
    let cfg = config(&fake);
    let store = Arc::new(MemoryIdentity::default());
    let mut hooks = Recorder::default();
    let events = Arc::clone(&hooks.events);
    let (stop_tx, stop) = watch::channel(false);
    let node_store = Arc::clone(&store);
    let node = tokio::spawn(async move {
        let lc = Lifecycle {
            config: &cfg,
            executor: &executor,
            store: node_store.as_ref(),
            tokens: &Token,
        };
        run(&lc, &mut hooks, stop).await
    });
    until("waiting for a new token", || {
        events.lock().iter().any(|e| e == "waiting")
    })
    .await;
    assert!(
        store.load().unwrap().is_none(),
        "the revoked identity is retired"
    );
    assert_eq!(
        fake.seen.lock().joins.len(),
        1,
        "the same token was tried again"
    );
    stop_tx.send(true).unwrap();
    node.await.unwrap().unwrap();
    assert_eq!(
        events.lock().as_slice(),
        [
            "joined node_0",
            &format!("open {EPOCH}"),
            "revoked",
            "waiting",
            "stopped"
        ]
    );
}
