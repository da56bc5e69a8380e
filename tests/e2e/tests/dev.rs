//! `bcctl dev` as README's first command runs it: the control plane embedded and a real agent on
//! this machine, until the node is adopted; and again on the same `--state-dir`, where the
//! restarted control plane listens on new ports and the agent must follow its configured address
//! rather than the one stored when it joined.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use bc_e2e::bins;

/// Runs `bcctl dev --once` on `state`, returns (success, stdout, stderr).
fn dev_once(state: &std::path::Path) -> (bool, String, String) {
    let (bcctl, bcd) = bins();
    let out = Command::new(bcctl)
        .args([
            "dev",
            "--once",
            "--heartbeat-interval",
            "200ms",
            "--timeout",
            "60s",
        ])
        .arg("--state-dir")
        .arg(state)
        .arg("--bcd")
        .arg(bcd)
        .output()
        .expect("running bcctl dev");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The node id `bcctl dev` printed (`node node_… is adopted`).
fn node_id(stdout: &str) -> Option<String> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("node "))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
}

#[test]
fn dev_adopts_the_node_and_a_second_run_on_the_same_state_keeps_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let state = tmp.path().join("dev");
    let (ok, out, err) = dev_once(&state);
    assert!(ok, "first bcctl dev failed:\n{out}\n{err}");
    let first = node_id(&out).expect("node id in the first run's output");
    // A laptop, VM or container often has no trusted hardware key: the dev pool accepts one and
    // says so, or the node would wait in `adopting` for its deadline.
    assert!(
        out.contains("accepts an untrusted hardware key (acceptance.requireTrustedKey: false"),
        "{out}"
    );
    let (ok, out2, err2) = dev_once(&state);
    assert!(
        ok,
        "second bcctl dev on the same state dir failed:\n{out2}\n{err2}"
    );
    assert_eq!(node_id(&out2).as_deref(), Some(first.as_str()), "{out2}");
}
