//! The lifecycle with several gateway URLs (control-plane replicas), against fake replicas that
//! share one CA: an unreachable URL is skipped by the join and the session, a refused join is
//! not retried at the other replicas, a pin mismatch at every URL is fatal and names a URL, and
//! a replica that will not hold sessions is left for the next one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use tokio::sync::watch;

use super::tests::{Recorder, TestMachine, Token, config, until};
use super::*;
use crate::identity::MemoryIdentity;
use crate::journal::Journal;
use crate::test_utils::{Code, FakeControlPlane};

/// `https://127.0.0.1:<port>` where nothing listens: the port was bound and released.
async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    format!("https://127.0.0.1:{}", l.local_addr().unwrap().port())
}

type Records = Arc<parking_lot::Mutex<Vec<String>>>;

/// Runs a node with `cfg` until `stop`; returns its hooks' events, the URLs its sessions opened
/// at, and the run's task.
fn spawn_node(
    cfg: LifecycleConfig,
    stop: watch::Receiver<bool>,
) -> (
    Records,
    Records,
    tokio::task::JoinHandle<Result<(), LifecycleError>>,
) {
    let mut hooks = Recorder::default();
    let (events, opened_at) = (Arc::clone(&hooks.events), Arc::clone(&hooks.opened_at));
    let task = tokio::spawn(async move {
        let executor = Arc::new(Executor::new(
            Arc::new(TestMachine::default()),
            Journal::memory(),
        ));
        let store = MemoryIdentity::default();
        let lc = Lifecycle {
            config: &cfg,
            executor: &executor,
            store: &store,
            tokens: &Token,
        };
        run(&lc, &mut hooks, stop).await
    });
    (events, opened_at, task)
}

#[tokio::test]
async fn an_unreachable_url_is_skipped_by_the_join_and_the_session() {
    let fake = FakeControlPlane::start(vec![]).await;
    // The order is shuffled per run: enough runs see the dead URL first (1 in 2 each).
    for _ in 0..6 {
        let mut cfg = config(&fake);
        cfg.control_planes = vec![dead_url().await, fake.url.clone()];
        let (stop_tx, stop) = watch::channel(false);
        let (events, opened_at, node) = spawn_node(cfg, stop);
        until("a session", || !opened_at.lock().is_empty()).await;
        stop_tx.send(true).unwrap();
        node.await.unwrap().unwrap();
        assert_eq!(opened_at.lock().as_slice(), std::slice::from_ref(&fake.url));
        assert!(
            events
                .lock()
                .first()
                .is_some_and(|e| e.starts_with("joined ")),
            "{:?}",
            events.lock()
        );
    }
    assert_eq!(
        fake.seen.lock().join_attempts,
        6,
        "one join per node, none repeated"
    );
}

#[tokio::test]
async fn a_refused_join_is_not_tried_at_the_other_replicas() {
    let a = FakeControlPlane::start(vec![]).await;
    let b = a.replica(None).await;
    a.refuse_joins(Some((Code::PermissionDenied, "token used up")));
    b.refuse_joins(Some((Code::PermissionDenied, "token used up")));
    let mut cfg = config(&a);
    cfg.control_planes = vec![dead_url().await, a.url.clone(), b.url.clone()];
    let (_stop_tx, stop) = watch::channel(false);
    let (_, _, node) = spawn_node(cfg, stop);
    let outcome = node.await.unwrap();
    assert!(
        matches!(&outcome, Err(LifecycleError::Join(JoinError::Refused(s))) if s.code() == Code::PermissionDenied),
        "{outcome:?}"
    );
    assert_eq!(
        a.seen.lock().join_attempts,
        1,
        "the token went to one replica only"
    );
}

#[tokio::test]
async fn a_pin_mismatch_at_every_url_is_fatal_and_names_one() {
    let (x, y) = (
        FakeControlPlane::start(vec![]).await,
        FakeControlPlane::start(vec![]).await,
    );
    let other = FakeControlPlane::start(vec![]).await;
    let mut cfg = config(&other);
    cfg.control_planes = vec![x.url.clone(), y.url.clone()];
    let (_stop_tx, stop) = watch::channel(false);
    let (_, _, node) = spawn_node(cfg, stop);
    let outcome = node.await.unwrap();
    match &outcome {
        Err(LifecycleError::Join(e @ JoinError::PinMismatch { control_plane, .. })) => {
            assert!([&x.url, &y.url].contains(&control_plane), "{control_plane}");
            assert!(e.to_string().contains(control_plane.as_str()), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let sent = x.seen.lock().join_attempts + y.seen.lock().join_attempts;
    assert_eq!(
        sent, 0,
        "the token was sent to a control plane that failed the pin"
    );
}

#[tokio::test]
async fn a_replica_that_will_not_hold_sessions_is_left_for_the_next() {
    let draining =
        FakeControlPlane::start_with(vec![], Some((Code::Unavailable, "draining".to_owned())))
            .await;
    let serving = draining.replica(None).await;
    let mut cfg = config(&draining);
    cfg.control_planes = vec![draining.url.clone(), serving.url.clone()];
    let (stop_tx, stop) = watch::channel(false);
    let (_, opened_at, node) = spawn_node(cfg, stop);
    until("a session", || !opened_at.lock().is_empty()).await;
    stop_tx.send(true).unwrap();
    node.await.unwrap().unwrap();
    assert_eq!(
        opened_at.lock().as_slice(),
        std::slice::from_ref(&serving.url)
    );
    // Both replicas count in one record: one refusal at most, then the session.
    assert!(
        draining.seen.lock().session_attempts <= 2,
        "the draining replica was asked again before the serving one"
    );
}
