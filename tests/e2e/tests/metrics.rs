//! Prometheus metrics of `bcctl serve --metrics-listen` and `bcd agent --metrics-listen`, scraped
//! from the real processes while a node joins, heartbeats and runs a command.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// GET `url`; asserts 200 and the OpenMetrics content type; returns the body.
fn scrape(url: &str) -> String {
    let resp = reqwest::blocking::get(url).expect("metrics endpoint reachable");
    assert_eq!(resp.status().as_u16(), 200, "{url}");
    assert_eq!(
        resp.headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some(OPENMETRICS),
        "{url}"
    );
    let body = resp.text().unwrap();
    assert!(body.ends_with("# EOF\n"), "{body}");
    body
}

/// The value of the sample named exactly `series` (name plus labels as encoded).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn must(text: &str, series: &str) -> f64 {
    value(text, series).unwrap_or_else(|| panic!("no sample {series:?} in\n{text}"))
}

fn read_json(path: &std::path::Path) -> Option<Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

#[test]
fn serve_and_agent_metrics_follow_a_join_heartbeats_and_a_command() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(&tmp.path().join("cp"), &["--metrics-listen", "127.0.0.1:0"]);
    let cp_metrics = read_json(&cp.dir.join("endpoints.json")).unwrap()["metricsUrl"]
        .as_str()
        .expect("endpoints.json has metricsUrl")
        .to_owned();
    assert!(cp_metrics.starts_with("http://127.0.0.1:"), "{cp_metrics}");
    assert!(cp_metrics.ends_with("/metrics"), "{cp_metrics}");

    let before = scrape(&cp_metrics);
    assert_eq!(must(&before, "bcctl_sessions"), 0.0);
    assert_eq!(must(&before, "bcctl_join_total{outcome=\"new_node\"}"), 0.0);
    assert_eq!(
        must(&before, "bcctl_nodes{connectivity=\"connected\"}"),
        0.0
    );
    assert_eq!(must(&before, "bcctl_commands{state=\"succeeded\"}"), 0.0);

    // A refused join is counted as such and creates nothing.
    let pool = cp.metal_host_pool();
    let pool = pool.as_str();
    let mut bad = Agent::start(
        &cp,
        &tmp.path().join("bad"),
        Some("tok_nosuchtoken.0000000000000000"),
        &[],
    );
    bad.wait_exit(WAIT);
    let t = scrape(&cp_metrics);
    assert_eq!(
        must(&t, "bcctl_join_total{outcome=\"refused_token\"}"),
        1.0,
        "{}",
        bad.log_text()
    );
    assert_eq!(must(&t, "bcctl_join_total{outcome=\"new_node\"}"), 0.0);

    let token = cp.create_token(&["--pool", pool]);
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let id = agent.node_id();
    eventually(WAIT, "adopted and connected", || {
        let n = cp.node(&id);
        (n["provisionState"] == "adopted" && n["connectivity"] == "connected").then_some(())
    });
    let agent_metrics = eventually(WAIT, "status.json metricsUrl", || {
        read_json(&agent.state_dir.join("status.json"))?["metricsUrl"]
            .as_str()
            .map(str::to_owned)
    });
    assert!(
        agent_metrics.starts_with("http://127.0.0.1:"),
        "{agent_metrics}"
    );

    let t = scrape(&cp_metrics);
    assert_eq!(must(&t, "bcctl_sessions"), 1.0, "{t}");
    assert_eq!(must(&t, "bcctl_join_total{outcome=\"new_node\"}"), 1.0);
    assert_eq!(must(&t, "bcctl_join_total{outcome=\"rejoined\"}"), 0.0);
    assert_eq!(must(&t, "bcctl_nodes{connectivity=\"connected\"}"), 1.0);
    assert_eq!(
        must(
            &t,
            "bcctl_nodes_by_provision_state{provision_state=\"adopted\"}"
        ),
        1.0
    );
    assert_eq!(must(&t, "bcctl_nodes_gpu_unhealthy"), 0.0);
    // The inventory sent after Welcome was stored once at least.
    assert!(must(&t, "bcctl_inventory_record_duration_seconds_count") >= 1.0);
    // Heartbeats come every 150 ms: the counter is positive and grows between two scrapes.
    let beats = eventually(WAIT, "a heartbeat counted", || {
        let v = must(&scrape(&cp_metrics), "bcctl_heartbeats_total");
        (v >= 1.0).then_some(v)
    });
    eventually(WAIT, "the heartbeat counter growing", || {
        (must(&scrape(&cp_metrics), "bcctl_heartbeats_total") > beats).then_some(())
    });

    let (ok, out, err) = cp.bcctl(&[
        "nodes",
        "run",
        &id,
        "inventory.refresh",
        "--wait",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}\n{}", agent.log_text());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded", "{v}");

    let t = scrape(&cp_metrics);
    assert_eq!(must(&t, "bcctl_commands{state=\"succeeded\"}"), 1.0, "{t}");
    for other in [
        "queued",
        "sent",
        "running",
        "failed",
        "cancelled",
        "expired",
    ] {
        assert_eq!(
            must(&t, &format!("bcctl_commands{{state=\"{other}\"}}")),
            0.0,
            "{other}"
        );
    }
    // The refreshed inventory is stored too (it is sent before the result).
    eventually(WAIT, "the refreshed inventory stored", || {
        (must(
            &scrape(&cp_metrics),
            "bcctl_inventory_record_duration_seconds_count",
        ) >= 2.0)
            .then_some(())
    });

    let a = scrape(&agent_metrics);
    assert_eq!(must(&a, "bcd_session_connected"), 1.0, "{a}");
    assert!(must(&a, "bcd_heartbeats_sent_total") >= 1.0, "{a}");
    assert!(must(&a, "bcd_heartbeat_acks_total") >= 1.0, "{a}");
    assert_eq!(must(&a, "bcd_reconnects_total"), 0.0, "{a}");
    assert_eq!(
        must(
            &a,
            "bcd_commands_total{name=\"inventory.refresh\",outcome=\"succeeded\"}"
        ),
        1.0,
        "{a}"
    );
    // One inventory after Welcome, one for the command.
    assert!(
        must(&a, "bcd_inventory_collect_duration_seconds_count") >= 2.0,
        "{a}"
    );
    assert!(
        a.lines()
            .any(|l| l.starts_with("bcd_build_info{version=\"") && l.ends_with("\"} 1")),
        "{a}"
    );
}

#[test]
fn an_agent_whose_metrics_address_is_taken_exits_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some("tok_unused.0000000000000000"),
        &["--metrics-listen", &addr],
    );
    let status = agent.wait_exit(WAIT);
    assert!(!status.success());
    let log = agent.log_text();
    assert!(
        log.contains(&format!("cannot listen for metrics on {addr}")),
        "{log}"
    );
    // Nothing was joined: the listener is checked before the token is used.
    assert!(!agent.state_dir.join("node.json").exists());
}
