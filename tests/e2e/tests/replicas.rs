//! Issue 17 item 2, the agent's side: an agent configured with several control-plane gateway
//! URLs (one per replica) joins and holds its session with whichever answers. Real `bcctl serve`
//! and `bcd agent` processes on loopback; a URL at a port nothing listens on stands in for a
//! replica that is down (a second `bcctl serve` on its own state dir would have its own CA, so
//! it cannot stand in for a replica of the same control plane).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually, free_port};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

/// The node once it is adopted and connected with a session epoch above `after`.
fn connected_after(cp: &ControlPlane, id: &str, after: u64) -> Value {
    eventually(WAIT, "adopted and connected in a new session", || {
        let n = cp.node(id);
        let fresh = n["session"]["epoch"].as_u64().is_some_and(|e| e > after);
        (n["provisionState"] == "adopted" && n["connectivity"] == "connected" && fresh).then_some(n)
    })
}

/// What `bcd status -o json` would show: the agent's status.json, once `pred` holds.
fn status_when(agent: &Agent, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    eventually(WAIT, what, || {
        let text = std::fs::read_to_string(agent.state_dir.join("status.json")).ok()?;
        let v: Value = serde_json::from_str(&text).ok()?;
        pred(&v).then_some(v)
    })
}

fn connected_at(url: &str) -> impl Fn(&Value) -> bool + '_ {
    move |s| s["state"] == "connected" && s["controlPlane"] == url
}

#[test]
fn a_dead_url_in_the_list_is_skipped_whatever_its_place() {
    bc_e2e::ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let dead = format!("https://127.0.0.1:{}", free_port());
    let orders = [
        format!("{dead},{}", cp.gateway_url),
        format!("{},{dead}", cp.gateway_url),
    ];
    for (i, list) in orders.iter().enumerate() {
        let token = cp.create_token(&["--uses", "1"]);
        let dir = tmp.path().join(format!("agent{i}"));
        let agent = Agent::start_at(&[list], &dir, Some(&token), &cp.ca_pin, &[]);
        let id = agent.node_id();
        connected_after(&cp, &id, 0);
        let node_json: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("node.json")).unwrap()).unwrap();
        assert_eq!(
            node_json["controlPlane"], cp.gateway_url,
            "joined at the live one"
        );
        status_when(
            &agent,
            "status.json names the live URL",
            connected_at(&cp.gateway_url),
        );
        let log = agent.log_text();
        assert!(
            log.lines()
                .any(|l| l.contains("session open") && l.contains(&cp.gateway_url)),
            "the session-open log line names the URL:\n{log}"
        );
    }
    assert_eq!(cp.nodes().len(), 2, "one node per agent, one join each");
}

#[test]
fn the_agent_follows_a_control_plane_that_moved_to_another_url_of_its_list() {
    bc_e2e::ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let mut cp = ControlPlane::start(&tmp.path().join("cp"));
    let old = cp.gateway_url.clone();
    let next_port = free_port();
    let new = format!("https://127.0.0.1:{next_port}");
    let token = cp.create_token(&["--uses", "1"]);
    let dir = tmp.path().join("agent");
    // Repeated flags; the second URL is dead until the control plane comes back there.
    let mut agent = Agent::start_at(&[&old, &new], &dir, Some(&token), &cp.ca_pin, &[]);
    let id = agent.node_id();
    let first = connected_after(&cp, &id, 0)["session"]["epoch"]
        .as_u64()
        .unwrap();
    status_when(&agent, "connected at the first URL", connected_at(&old));

    cp.kill9();
    cp.restart_with_gateway(&format!("127.0.0.1:{next_port}"), &[]);
    assert_eq!(cp.gateway_url, new);
    let second = connected_after(&cp, &id, first)["session"]["epoch"]
        .as_u64()
        .unwrap();
    status_when(&agent, "connected at the new URL", connected_at(&new));
    assert!(
        agent
            .log_text()
            .lines()
            .any(|l| l.contains("session open") && l.contains(&new)),
        "{}",
        agent.log_text()
    );

    // Restarted with the list the other way round and its stored identity (no token): the
    // dead URL is passed over again.
    agent.sigterm();
    let agent = Agent::start_at(&[&new, &old], &dir, None, &cp.ca_pin, &[]);
    connected_after(&cp, &id, second);
    status_when(&agent, "connected at the new URL again", connected_at(&new));
    assert_eq!(cp.nodes().len(), 1, "the same node throughout");
}
