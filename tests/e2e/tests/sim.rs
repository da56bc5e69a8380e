//! `bcctl bench` over `bcd sim`: 50 simulated agents join one control plane at once, the control
//! plane is killed with SIGKILL and restarted, and every node comes back without being marked
//! unreachable. Timing figures are printed, never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use bc_e2e::bins;
use serde_json::Value;

#[test]
fn fifty_simulated_agents_join_and_survive_a_control_plane_restart() {
    let (bcctl, bcd) = bins();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bcctl)
        .args([
            "bench",
            "restart",
            "--nodes",
            "50",
            "-o",
            "json",
            "--timeout",
            "60s",
        ])
        .arg("--bcd")
        .arg(bcd)
        .arg("--state-dir")
        .arg(dir.path())
        .output()
        .expect("running bcctl bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bcctl bench failed:\n{stdout}\n{stderr}\n--- sim.log ---\n{}",
        std::fs::read_to_string(dir.path().join("sim-0.log")).unwrap_or_default()
    );
    let v: Value = serde_json::from_str(&stdout).expect("bench -o json prints JSON");
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
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
