//! A broken identity in the state dir (each file truncated, of the wrong kind, missing, or not
//! matching the others) is named with what to do; with a join token it is moved aside and the
//! node joins again; without one the agent stops (or waits for a token file) instead of
//! retrying. A control plane that refuses the identity for good stops the reconnect loop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType, string::Ia5String,
};
use tokio::sync::watch;

use super::tests::{Recorder, TestMachine, Token, config, until};
use super::*;
use crate::identity::{IdentityStore, MemoryIdentity};
use crate::journal::Journal;
use crate::state::{NodeFile, StateDir};
use crate::test_utils::{EPOCH, FakeControlPlane};

/// A CA and what it issues, as the control plane would.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

fn ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// Key and certificate of `node` at `generation`, SAN as the control plane writes it.
fn leaf(ca: &Ca, node: &str, generation: u64) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    let uri = format!("spiffe://bc.test/node/{node}/gen/{generation}");
    params
        .subject_alt_names
        .push(SanType::URI(Ia5String::try_from(uri).unwrap()));
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    (key.serialize_pem(), cert.pem())
}

fn node_file(node: &str) -> NodeFile {
    NodeFile {
        node_id: node.to_owned(),
        identity_generation: 1,
        control_plane: "https://127.0.0.1:1".to_owned(),
        trust_domain: "bc.test".to_owned(),
        joined_at: "2026-01-01T00:00:00Z".to_owned(),
    }
}

/// Ways to break one file, and the file the message must name.
const CASES: [(&str, &str); 12] = [
    ("key.pem truncated", "key.pem"),
    ("key.pem holds a certificate", "key.pem"),
    ("key.pem is another key", "key.pem"),
    ("key.pem missing", "key.pem"),
    ("cert.pem truncated", "cert.pem"),
    ("cert.pem holds a key", "cert.pem"),
    ("cert.pem missing", "cert.pem"),
    ("ca.pem truncated", "ca.pem"),
    ("ca.pem holds a key", "ca.pem"),
    ("ca.pem is another CA", "ca.pem"),
    ("node.json truncated", "node.json"),
    ("node.json of another node", "node.json"),
];

/// A state dir in `dir` with a good identity of `node_a`, then broken as `case` says.
fn broken_state_dir(dir: &Path, case: &str) -> StateDir {
    let sd = StateDir::open(dir).unwrap();
    let ca = ca();
    let (key, cert) = leaf(&ca, "node_a", 1);
    let id = Identity {
        node: node_file("node_a"),
        key_pem: key.clone(),
        cert_pem: cert.clone(),
        ca_pem: ca.pem.clone(),
    };
    sd.save_identity(&id).unwrap();
    assert!(
        sd.load_checked().is_ok_and(|i| i.is_some()),
        "the good identity must load"
    );
    let half = |s: &str| s[..s.len() / 2].to_owned();
    let (file, content) = match case {
        "key.pem truncated" => ("key.pem", Some(half(&key))),
        "key.pem holds a certificate" => ("key.pem", Some(cert.clone())),
        "key.pem is another key" => ("key.pem", Some(leaf(&ca, "node_a", 1).0)),
        "key.pem missing" => ("key.pem", None),
        "cert.pem truncated" => ("cert.pem", Some(half(&cert))),
        "cert.pem holds a key" => ("cert.pem", Some(key.clone())),
        "cert.pem missing" => ("cert.pem", None),
        "ca.pem truncated" => ("ca.pem", Some(half(&ca.pem))),
        "ca.pem holds a key" => ("ca.pem", Some(key.clone())),
        "ca.pem is another CA" => ("ca.pem", Some(self::ca().pem)),
        "node.json truncated" => {
            let json = std::fs::read_to_string(dir.join("node.json")).unwrap();
            ("node.json", Some(half(&json)))
        }
        "node.json of another node" => (
            "node.json",
            Some(serde_json::to_string(&node_file("node_b")).unwrap()),
        ),
        other => panic!("unknown case {other}"),
    };
    match content {
        Some(c) => std::fs::write(dir.join(file), c).unwrap(),
        None => std::fs::remove_file(dir.join(file)).unwrap(),
    }
    sd
}

#[test]
fn every_broken_identity_file_is_named_with_what_to_do() {
    for (case, file) in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let sd = broken_state_dir(&tmp.path().join("bcd"), case);
        let err = sd.load_checked().err();
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(
            err.as_ref().is_some_and(StateError::is_broken),
            "{case}: {err:?}"
        );
        let path = tmp.path().join("bcd").join(file);
        assert!(text.contains(&path.display().to_string()), "{case}: {text}");
        assert!(text.contains("join token"), "{case}: {text}");
    }
}

#[derive(Debug)]
struct NoToken;

impl TokenSource for NoToken {
    fn token(&self) -> Option<String> {
        None
    }
    fn can_wait(&self) -> bool {
        false
    }
}

#[tokio::test]
async fn without_a_token_a_broken_identity_stops_the_agent_naming_the_file() {
    let fake = FakeControlPlane::start(vec![]).await;
    for (case, file) in CASES {
        let tmp = tempfile::tempdir().unwrap();
        let sd = broken_state_dir(&tmp.path().join("bcd"), case);
        let executor = Arc::new(Executor::new(
            Arc::new(TestMachine::default()),
            Journal::memory(),
        ));
        let cfg = config(&fake);
        let mut hooks = Recorder::default();
        let (_stop_tx, stop) = watch::channel(false);
        let lc = Lifecycle {
            config: &cfg,
            executor: &executor,
            store: &sd,
            tokens: &NoToken,
        };
        let out = tokio::time::timeout(Duration::from_secs(10), run(&lc, &mut hooks, stop)).await;
        let text = match out {
            Ok(Err(e)) => e.to_string(),
            other => panic!("{case}: the agent did not stop with an error: {other:?}"),
        };
        assert!(text.contains(file), "{case}: {text}");
        assert!(text.contains("join token"), "{case}: {text}");
        assert!(fake.seen.lock().joins.is_empty(), "{case}: joined");
    }
    assert_eq!(fake.seen.lock().session_attempts, 0);
}

#[tokio::test]
async fn with_a_token_a_broken_identity_is_moved_aside_and_the_node_joins_again() {
    for (case, file) in CASES {
        let fake = FakeControlPlane::start(vec![]).await;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bcd");
        let sd = broken_state_dir(&dir, case);
        let executor = Arc::new(Executor::new(
            Arc::new(TestMachine::default()),
            Journal::memory(),
        ));
        let cfg = config(&fake);
        let mut hooks = Recorder::default();
        let events = Arc::clone(&hooks.events);
        let (stop_tx, stop) = watch::channel(false);
        let store = sd.clone();
        let node = tokio::spawn(async move {
            let lc = Lifecycle {
                config: &cfg,
                executor: &executor,
                store: &store,
                tokens: &Token,
            };
            run(&lc, &mut hooks, stop).await
        });
        until(&format!("{case}: a session with the new identity"), || {
            events.lock().iter().any(|e| *e == format!("open {EPOCH}"))
        })
        .await;
        stop_tx.send(true).unwrap();
        node.await.unwrap().unwrap();
        assert_eq!(
            events.lock()[..2],
            ["broken, rejoining".to_owned(), "joined node_0".to_owned()],
            "{case}"
        );
        let id = sd.load_identity().unwrap().unwrap();
        assert_eq!(id.node.node_id, "node_0", "{case}");
        // The broken identity was moved aside, with a note naming the file.
        let notes: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("retired-") && n.ends_with(".txt")
            })
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .collect();
        assert_eq!(notes.len(), 1, "{case}");
        assert!(notes[0].contains(file), "{case}: {}", notes[0]);
    }
}

#[tokio::test]
async fn a_session_refused_for_good_stops_retrying_and_waits_for_a_new_token() {
    let refusal = (
        tonic::Code::PermissionDenied,
        "Hello names node node_9 but the certificate is node node_0".to_owned(),
    );
    let fake = FakeControlPlane::start_with(vec![], Some(refusal)).await;
    let executor = Arc::new(Executor::new(
        Arc::new(TestMachine::default()),
        Journal::memory(),
    ));
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
    // Well past several reconnect backoffs (50 ms base): no retry loop.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fake.seen.lock().session_attempts, 1);
    assert!(store.load().unwrap().is_none(), "the identity is retired");
    stop_tx.send(true).unwrap();
    node.await.unwrap().unwrap();
    assert_eq!(
        events.lock().as_slice(),
        ["joined node_0", "refused", "waiting", "stopped"]
    );
}
