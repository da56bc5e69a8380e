//! An inventory larger than gRPC's default 4 MiB message limit (but within the protocol's 8 MiB)
//! is stored on the first session; it must not end the stream and make the agent reconnect in a
//! loop with the node stuck in `adopting`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn a_five_mib_inventory_is_stored_on_the_first_session() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    // A host root whose os-release makes the inventory document about 5.5 MB.
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let pretty = "A".repeat(5_500_000);
    std::fs::write(
        root.join("etc/os-release"),
        format!("PRETTY_NAME=\"{pretty}\"\nID=big\nVERSION_ID=1\n"),
    )
    .unwrap();
    let token = cp.create_token(&["--pool", &cp.metal_host_pool()]);
    let root_s = root.to_str().unwrap().to_owned();
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--root", &root_s],
    );
    let id = agent.node_id();
    let node = eventually(WAIT, "node adopted with its inventory", || {
        let n = cp.node(&id);
        (n["provisionState"] == "adopted").then_some(n)
    });
    // Still the first session a moment later: the big message did not end the stream.
    std::thread::sleep(Duration::from_secs(2));
    let again = cp.node(&id);
    assert_eq!(again["connectivity"], "connected", "{again}");
    assert_eq!(
        again["session"]["epoch"], 1,
        "the agent reconnected: {again}"
    );
    assert_eq!(node["session"]["epoch"], 1);
}
