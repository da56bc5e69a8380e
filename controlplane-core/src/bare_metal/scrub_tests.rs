//! Issue 30.5 at the control plane: a site agent's report that carries a BMC password the control
//! plane holds — plainly, or in an encoding HTTP and JSON use — leaves no form of it in a
//! condition, an event, a command's result or error, or a store column. The site agent here is
//! the test: it reports what an unscrubbing one would.

use bc_protocol::pb::{PowerObservation, PowerReport};
use cpl_store::now_ms;
use serde_json::json;

use super::bare_metal_tests::{SITE, TestResult, core_of, facts, failed, succeeded, world};
use crate::agent_report::AgentReport;

const PW: &str = "Ech0/ed+Pa:ss-9";

/// The forms an echo takes: plain, hex, JSON `\u` escapes, HTML character references.
fn forms() -> Vec<String> {
    vec![
        PW.to_owned(),
        hex::encode(PW),
        PW.encode_utf16().map(|u| format!("\\u{u:04x}")).collect(),
        PW.chars()
            .map(|c| format!("&#x{:x};", u32::from(c)))
            .collect(),
    ]
}

/// Everything the store holds about `node` and its commands, as text.
fn stored(
    w: &super::bare_metal_tests::World,
    node: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let n = w.node(node)?;
    let events = w.events(node)?;
    let bmc = w.store.read_blocking(|r| r.bmc(node))?.ok_or("no bmc")?;
    let commands = w
        .store
        .read_blocking(|r| r.commands(Some("node_sa"), 500))?;
    Ok(format!(
        "{:?}\n{:?}\n{:?} {:?} {:?}\n{:?}",
        n.conditions, events, bmc.facts, bmc.last_error, bmc.address, commands
    ))
}

fn assert_no_form(text: &str) {
    for f in forms() {
        assert!(!text.contains(&f), "{f} survived in {text}");
    }
}

/// Recovers the failed `node` (back to `enrolling`) and has its verification issued again;
/// returns the new `bmc.verify`'s id.
async fn reverify(
    w: &super::bare_metal_tests::World,
    node: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let n = w.node(node)?;
    let n = w
        .store
        .write_blocking(|tx| super::abort::recover(tx, node, n.version, "operator:t"))?;
    assert_eq!(n.provision_state, bc_protocol::ProvisionState::Enrolling);
    w.bm.issue_verifications(SITE).await;
    Ok(w.sessions
        .commands("node_sa")
        .last()
        .map(|c| c.id.clone())
        .ok_or("no bmc.verify")?)
}

#[tokio::test]
async fn an_echoed_password_reaches_no_condition_event_result_or_column() -> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    let node = w.enroll(PW)?;
    w.bm.issue_verifications(SITE).await;
    let core = core_of(&w);
    let cmds = w.sessions.commands("node_sa");
    let id = cmds.first().map(|c| c.id.clone()).ok_or("no bmc.verify")?;
    // A refusal whose message echoes the password plainly and in every form: the plain one is
    // redacted, an encoded one withholds the message.
    let echo = format!("401 Unauthorized: bad password {PW}");
    core.report(
        "node_sa",
        1,
        AgentReport::CommandUpdate(failed(&id, "BMC_AUTH_FAILED", &echo)),
    )
    .await?;
    let c =
        super::bare_metal_tests::condition(&w.node(&node)?, "BmcVerified").ok_or("no condition")?;
    assert!(c.message.contains("[redacted]"), "{}", c.message);
    for f in forms().into_iter().skip(1) {
        let id = reverify(&w, &node).await?;
        let echo = format!(r#"{{"error": {{"message": "login failed for {f}"}}}}"#);
        core.report(
            "node_sa",
            1,
            AgentReport::CommandUpdate(failed(&id, "BMC_AUTH_FAILED", &echo)),
        )
        .await?;
        let c = super::bare_metal_tests::condition(&w.node(&node)?, "BmcVerified")
            .ok_or("no condition")?;
        assert!(
            c.message.contains(bc_protocol::scrub::WITHHELD),
            "{f}: {}",
            c.message
        );
    }

    // A verification whose result echoes it in the BMC's facts (stored on the BMC's row).
    let id = reverify(&w, &node).await?;
    let mut result = serde_json::to_value(facts())?;
    result["model"] = json!(format!(
        "Model X (user admin, password {})",
        hex::encode(PW)
    ));
    core.report(
        "node_sa",
        1,
        AgentReport::CommandUpdate(succeeded(&id, result)),
    )
    .await?;
    assert_eq!(
        super::bare_metal_tests::condition(&w.node(&node)?, "BmcVerified").map(|c| c.status),
        Some(bc_protocol::ConditionStatus::True)
    );

    // The power sync's observation of a refusal echoing it.
    let report = PowerReport {
        lease_epoch: 1,
        observations: vec![PowerObservation {
            node_id: node.clone(),
            power: "unknown".into(),
            reachable: false,
            error: format!("HTTP 401: {}", forms()[2]),
            observed_at_ms: now_ms(),
            error_code: "BMC_AUTH_FAILED".into(),
        }],
    };
    core.report("node_sa", 1, AgentReport::Power(report))
        .await?;
    let c = super::bare_metal_tests::condition(&w.node(&node)?, "BmcReachable")
        .ok_or("no BmcReachable")?;
    assert_eq!(c.message, bc_protocol::scrub::WITHHELD);

    assert_no_form(&stored(&w, &node)?);
    Ok(())
}
