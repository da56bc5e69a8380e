//! `bcctl bench` over `bcd sim`: 50 simulated agents join one control plane at once, the control
//! plane is killed with SIGKILL and restarted, and every node comes back without being marked
//! unreachable; and 100 simulated nodes of which 30 start failing at once trip the remediation
//! breaker at its limit. Timing figures are printed, never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use bc_e2e::bins;
use serde_json::Value;

/// Runs `bcctl bench <args> -o json` over `bcd sim` in a fresh state dir; asserts it succeeded
/// (showing its output and the simulator's and control plane's logs if not) and returns the
/// printed JSON.
fn bench(args: &[&str]) -> Value {
    let (bcctl, bcd) = bins();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bcctl)
        .arg("bench")
        .args(args)
        .args(["-o", "json"])
        .arg("--bcd")
        .arg(bcd)
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .expect("running bcctl bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
    assert!(
        out.status.success(),
        "bcctl bench failed:\n{stdout}\n{stderr}\n--- sim.log ---\n{}\n--- serve.log ---\n{}",
        log("sim-0.log"),
        log("serve.log")
    );
    let v: Value = serde_json::from_str(&stdout).expect("bench -o json prints JSON");
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
    v
}

#[test]
fn fifty_simulated_agents_join_and_survive_a_control_plane_restart() {
    let v = bench(&["restart", "--nodes", "50", "--timeout", "60s"]);
    assert_eq!(v["scenario"], "restart");
    assert_eq!(v["nodes"], 50);
    assert_eq!(v["adopted"], 50, "every simulated node is adopted");
    assert_eq!(
        v["errors"], 0,
        "no join or session errors in the join storm"
    );
    assert_eq!(v["joinErrors"], 0);
    assert_eq!(
        v["wronglyUnreachable"], 0,
        "nobody marked unreachable across the restart"
    );
    let series = v["reconnectSeries"].as_array().expect("a reconnect series");
    assert_eq!(
        series.last().and_then(|p| p[1].as_u64()),
        Some(50),
        "all 50 reconnected"
    );
    // Each node joined with its own identity: 50 distinct nodes, 50 sessions opened before the kill.
    assert!(
        v["sim"]["joined"].as_u64() == Some(50),
        "the simulator joined 50 nodes: {}",
        v["sim"]
    );
}

/// `bcctl bench remediation` over `bcd sim --fault-xid`: 100 simulated nodes in a pool whose
/// remediation is `auto` (N = 4, P = 10 %), 30 of them report XID 79 at once. The breaker trips
/// at its limit, no more than 4 remediations start, and nothing touches a node that never
/// faulted. Timing figures are printed, never asserted.
#[test]
fn thirty_percent_of_a_simulated_fleet_failing_at_once_trips_the_breaker_at_its_limit() {
    let v = bench(&[
        "remediation",
        "--nodes",
        "100",
        "--fault-xid",
        "79",
        "--fault-fraction",
        "0.3",
        "--remediation-max-concurrent",
        "4",
        "--remediation-max-percent",
        "10",
        "--window",
        "3s",
        "--timeout",
        "90s",
    ]);
    assert_eq!(v["scenario"], "remediation");
    assert_eq!(v["faultedNodes"], 30);
    assert_eq!(
        v["faultsInjected"], 30,
        "every faulted node reported its XID"
    );
    assert_eq!(v["xidsRecorded"], 30, "Health recorded each one: {v}");
    assert_eq!(v["breakerTripped"], true, "{v}");
    assert_eq!(v["remediationLimit"], 4);
    assert_eq!(
        v["remediationsStarted"], 4,
        "the breaker let exactly its limit start: {v}"
    );
    assert!(
        v["breakerMessage"]
            .as_str()
            .is_some_and(|m| m.contains("the limit is 4")),
        "{v}"
    );
    assert_eq!(v["falseRemediations"], 0, "{v}");
    assert_eq!(
        v["commandsToHealthy"], 0,
        "no command reached a healthy node: {v}"
    );
    assert_eq!(
        v["cordoned"], 4,
        "only the nodes in remediation are cordoned: {v}"
    );
    assert_eq!(v["cordonedWithoutRemediation"], 0, "{v}");
    // The same, as `bcctl serve`'s /metrics says it.
    assert_eq!(v["metricsRemediationsActive"], 4.0, "{v}");
    assert_eq!(v["metricsBreakerTrips"], 1.0, "{v}");
    assert!(
        v["commandsToFaulted"].as_u64().unwrap_or(0) >= 4,
        "the remediated nodes were sent their steps: {v}"
    );
}
