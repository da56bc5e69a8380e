//! A whole boot (without early boot) against the core's scripted fake control plane.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bc_protocol::pb::{self, agent_message, gateway_message};
use bcd_core::test_utils::{Code, FakeControlPlane};

use super::*;

fn config(url: &str, pin: &str, root: &Path) -> BootConfig {
    let line =
        format!("console=ttyS0 bcd.url={url} bcd.pin={pin} bcd.token=tok.secret bcd.node=node_rd");
    BootConfig {
        params: crate::cmdline::parse(&line).unwrap(),
        root: HostRoot::new(root),
        setup: None,
        nvml: NvmlConfig {
            lib_path: Some(root.join("no-libnvidia-ml.so.1")),
            nvidia_smi: root.join("no-nvidia-smi"),
        },
        rescue: crate::rescue::RescueConfig::default(),
        log_file: None,
        reconnect_base: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
    }
}

/// Polls `f` every 20 ms for up to 20 s.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

#[tokio::test]
async fn the_ramdisk_joins_with_its_token_and_reports_in_mode_ramdisk() {
    let spec = gateway_message::Msg::Spec(pb::Spec {
        generation: 3,
        ..Default::default()
    });
    let cp = FakeControlPlane::start(vec![spec]).await;
    let dir = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let boot = tokio::spawn(run(config(&cp.url, &cp.pin, dir.path()), stop));
    eventually("a session with a SpecStatus", || {
        cp.seen.lock().session("node_0").is_some_and(|m| {
            m.iter()
                .any(|m| matches!(m.msg, Some(agent_message::Msg::SpecStatus(_))))
        })
    })
    .await;
    stop_tx.send(true).unwrap();
    boot.await.unwrap().unwrap();

    let seen = cp.seen.lock();
    let join = &seen.joins[0];
    assert_eq!(join.token, "tok.secret");
    assert_eq!(join.mode, pb::AgentMode::Ramdisk as i32);
    assert_eq!(join.hostname, "node_rd");
    let msgs = seen.session("node_0").unwrap();
    let Some(agent_message::Msg::Hello(hello)) = &msgs[0].msg else {
        panic!("first message is not Hello: {:?}", msgs[0]);
    };
    assert_eq!(hello.mode, pb::AgentMode::Ramdisk as i32);
    assert_eq!(hello.observed_generation, 0);
    assert!(
        msgs.iter()
            .any(|m| matches!(m.msg, Some(agent_message::Msg::Inventory(_)))),
        "no inventory"
    );
    let status = msgs
        .iter()
        .find_map(|m| match &m.msg {
            Some(agent_message::Msg::SpecStatus(s)) => Some(s),
            _ => None,
        })
        .unwrap();
    assert_eq!((status.generation, status.converged), (3, false));
    assert_eq!(status.reason, crate::hooks::NOT_CONVERGED_REASON);
}

#[tokio::test]
async fn a_refused_identity_ends_the_boot_with_an_error() {
    let cp = FakeControlPlane::start_with(
        vec![],
        Some((Code::PermissionDenied, "node node_0 was deleted".into())),
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (_stop_tx, stop) = watch::channel(false);
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        run(config(&cp.url, &cp.pin, dir.path()), stop),
    )
    .await
    .expect("the boot did not end")
    .unwrap_err();
    assert!(matches!(err, BootError::Ended(_)), "{err:?}");
    assert!(err.to_string().contains("node node_0 was deleted"), "{err}");
}

#[tokio::test]
async fn an_unreachable_control_plane_is_retried_until_stopped() {
    // A port nobody listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let (stop_tx, stop) = watch::channel(false);
    let boot = tokio::spawn(run(
        config(&format!("https://127.0.0.1:{port}"), pin, dir.path()),
        stop,
    ));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        !boot.is_finished(),
        "the boot gave up on a dead control plane"
    );
    stop_tx.send(true).unwrap();
    boot.await.unwrap().unwrap();
}

#[test]
fn a_missing_cmdline_file_is_named() {
    let err = read_params(Path::new("/nonexistent/cmdline")).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/cmdline"), "{err}");
}

#[tokio::test]
async fn the_lldp_wait_is_only_on_a_live_root_and_a_stop_cuts_it_short() {
    let (_tx, stop) = watch::channel(false);
    let fixture = tempfile::tempdir().unwrap();
    assert!(
        start_lldp(
            &HostRoot::new(fixture.path()),
            Duration::from_secs(60),
            stop
        )
        .await
        .is_none(),
        "a root prefix's links are not this namespace's"
    );
    // On this machine: however many physical, up links it has, a stop ends the wait at once.
    let (_tx, stop) = watch::channel(true);
    let started = std::time::Instant::now();
    let w = start_lldp(&HostRoot::default(), Duration::from_secs(60), stop).await;
    assert!(w.is_some());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Without a stop, the wait ends at its bound at the latest (no LLDP speaker here).
    let (_tx, stop) = watch::channel(false);
    let started = std::time::Instant::now();
    let w = start_lldp(&HostRoot::default(), Duration::from_secs(1), stop).await;
    assert!(w.is_some());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}
