//! Tests of the metrics: exact exposition lines, scrape-time gauges, the HTTP endpoint.
#![allow(clippy::unwrap_used)]

use super::*;
use cpl_store::{NewNode, Tx};

fn node(id: &str) -> NewNode {
    NewNode {
        id: id.to_owned(),
        site_id: None,
        pool_id: None,
        owner_tenant_id: None,
        role: bc_protocol::NodeRole::Unassigned,
        trust: bc_protocol::Trust::Platform,
        adapter: bc_protocol::Adapter::BcdV1,
        drivers: serde_json::Map::new(),
        hostname: None,
        hardware_key: None,
        hardware_key_trusted: false,
        identifier_digests: Vec::new(),
    }
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no line {prefix:?} in\n{text}"))
}

#[test]
fn counters_and_histograms_encode_with_their_values() {
    let m = Metrics::new();
    m.heartbeat();
    m.heartbeat();
    m.heartbeat();
    m.join(JoinOutcome::NewNode);
    m.join(JoinOutcome::RefusedToken);
    m.join(JoinOutcome::RefusedToken);
    m.observe_inventory(Duration::from_millis(3));
    m.observe_inventory(Duration::from_millis(1));
    let text = m.encode().unwrap();
    assert_eq!(
        line(&text, "bcctl_heartbeats_total"),
        "bcctl_heartbeats_total 3"
    );
    assert_eq!(
        line(&text, "bcctl_join_total{outcome=\"new_node\"}"),
        "bcctl_join_total{outcome=\"new_node\"} 1"
    );
    assert_eq!(
        line(&text, "bcctl_join_total{outcome=\"refused_token\"}"),
        "bcctl_join_total{outcome=\"refused_token\"} 2"
    );
    // Outcomes that never happened are there at 0 (rate() needs the series to exist).
    assert_eq!(
        line(&text, "bcctl_join_total{outcome=\"rejoined\"}"),
        "bcctl_join_total{outcome=\"rejoined\"} 0"
    );
    assert_eq!(
        line(&text, "bcctl_inventory_record_duration_seconds_count"),
        "bcctl_inventory_record_duration_seconds_count 2"
    );
    assert_eq!(
        line(&text, "bcctl_inventory_record_duration_seconds_sum"),
        "bcctl_inventory_record_duration_seconds_sum 0.004"
    );
    assert!(text.contains("# TYPE bcctl_heartbeat_flush_duration_seconds histogram"));
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[tokio::test]
async fn fleet_gauges_come_from_the_store_at_scrape_time() {
    use cpl_store::CommandRecord;
    // Fields other writers own, set without their paths: this test is about the gauges.
    fn force(
        c: &Tx<'_>,
        id: &str,
        f: impl FnOnce(&mut cpl_store::NodeRecord),
    ) -> Result<(), StoreError> {
        let before = c.node(id)?.ok_or_else(|| StoreError::Task(id.to_owned()))?;
        let mut after = before.clone();
        f(&mut after);
        c.update_node(&before, &after, false, 1)?;
        Ok(())
    }
    let store = cpl_store::testing::store().unwrap();
    store
        .write(|c| {
            for id in ["node_a", "node_b", "node_c"] {
                c.insert_node(&node(id), 1)?;
            }
            for id in ["node_a", "node_b"] {
                force(c, id, |n| {
                    n.connectivity = bc_protocol::Connectivity::Connected
                })?;
            }
            force(c, "node_c", |n| {
                n.provision_state = bc_protocol::ProvisionState::Ready
            })?;
            // node_a: GpuUnhealthy true; node_b: GpuUnhealthy false; node_c: another
            // condition true.
            let cond = |t: &str, s: bc_protocol::ConditionStatus| bc_protocol::Condition {
                type_: t.to_owned(),
                status: s,
                reason: "r".into(),
                message: "m".into(),
                last_transition_time: "2026-01-01T00:00:00Z".into(),
                owner: "Health".into(),
                gpus: Vec::new(),
            };
            for (id, t, s) in [
                ("node_a", "GpuUnhealthy", bc_protocol::ConditionStatus::True),
                (
                    "node_b",
                    "GpuUnhealthy",
                    bc_protocol::ConditionStatus::False,
                ),
                ("node_c", "XidCritical", bc_protocol::ConditionStatus::True),
            ] {
                force(c, id, |n| n.conditions = vec![cond(t, s)])?;
            }
            for (id, state) in [
                ("cmd_1", CommandState::Succeeded),
                ("cmd_2", CommandState::Succeeded),
                ("cmd_3", CommandState::Queued),
            ] {
                c.insert_command(&CommandRecord {
                    id: id.into(),
                    node_id: "node_a".into(),
                    name: bc_protocol::CommandName::InventoryRefresh,
                    args: serde_json::json!({}),
                    state,
                    progress: 0,
                    result: None,
                    error_code: None,
                    error_message: None,
                    actor: "operator".into(),
                    created_at: 1,
                    sent_at: None,
                    started_at: None,
                    finished_at: None,
                    deadline_at: 10,
                    subject_node_id: None,
                })?;
            }
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    let m = Metrics::new();
    let sessions = Sessions::default();
    let text = m.scrape(&store, &sessions).await.unwrap();
    for want in [
        "bcctl_sessions 0",
        "bcctl_commands{state=\"succeeded\"} 2",
        "bcctl_commands{state=\"queued\"} 1",
        "bcctl_commands{state=\"expired\"} 0",
        "bcctl_commands{state=\"running\"} 0",
        "bcctl_nodes{connectivity=\"connected\"} 2",
        "bcctl_nodes{connectivity=\"disconnected\"} 1",
        "bcctl_nodes{connectivity=\"lost\"} 0",
        "bcctl_nodes_by_provision_state{provision_state=\"adopting\"} 2",
        "bcctl_nodes_by_provision_state{provision_state=\"ready\"} 1",
        "bcctl_nodes_by_provision_state{provision_state=\"retired\"} 0",
        "bcctl_nodes_gpu_unhealthy 1",
    ] {
        assert!(
            text.lines().any(|l| l == want),
            "no line {want:?} in\n{text}"
        );
    }
    // Scrape-time values follow the store: the queued command finishes.
    store
        .write(|c| {
            c.apply_command_update("cmd_3", "node_a", CommandState::Failed, 0, None, None, 2)?;
            Ok::<_, StoreError>(())
        })
        .await
        .unwrap();
    let text = m.scrape(&store, &sessions).await.unwrap();
    assert!(
        text.lines()
            .any(|l| l == "bcctl_commands{state=\"queued\"} 0"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "bcctl_commands{state=\"failed\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn serves_get_metrics_with_the_openmetrics_content_type() {
    let store = cpl_store::testing::store().unwrap();
    let m = Metrics::new();
    m.heartbeat();
    let (_stop_tx, stop) = watch::channel(false);
    let (addr, _task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        m,
        store,
        Arc::new(Sessions::default()),
        stop,
    )
    .await
    .unwrap();
    let resp = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some(CONTENT_TYPE)
    );
    let body = resp.text().await.unwrap();
    assert!(
        body.lines().any(|l| l == "bcctl_heartbeats_total 1"),
        "{body}"
    );
}

#[tokio::test]
async fn an_address_in_use_is_a_bind_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let (_tx, stop) = watch::channel(false);
    let err = serve(
        addr,
        Metrics::new(),
        cpl_store::testing::store().unwrap(),
        Arc::new(Sessions::default()),
        stop,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MetricsError::Bind { .. }), "{err}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[test]
fn cut_agent_text_is_counted_by_field() {
    let m = Metrics::new();
    let mut s = "x".repeat(5000);
    bc_protocol::limits::bound(bc_protocol::limits::Field::SpecStatusMessage, &mut s);
    let text = m.encode().unwrap();
    let l = line(
        &text,
        "bcctl_agent_text_truncated_total{field=\"specStatus.message\"}",
    );
    let n: u64 = l.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(n >= 1, "{l}");
    // Every field has its series, at zero until something is cut.
    assert!(text.contains("bcctl_agent_text_truncated_total{field=\"goodbye.message\"}"));
}
