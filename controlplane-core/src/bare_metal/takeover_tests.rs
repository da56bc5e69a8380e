//! Issue 30.1: a node agent with its pool's join token never takes over a machine enrolled
//! through a BMC. The machine's ramdisk joined (so the node holds its identifier digests); then
//! `Join(mode node, the pool's token, the same digests)` is refused — while `inspecting`, when
//! `ready`, and it spends no token — with an event on the node; the ramdisk of the next boot
//! still joins. A deploy issues the written system an identity of its own: it joins the node once
//! `deployed` (many times, never while a session is live, never from another machine), and from
//! then on no pool join token re-joins the node; releasing it drops the identity.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_protocol::{Mode, ProvisionState};
use cpl_store::{CommandState, NewToken};
use serde_json::json;

use super::boot_tests::{MAC, SERIAL, TestResult, UUID, bed, digests};
use super::deploy_identity::DeployRefusal;
use crate::join::{JoinError, JoinFacts, JoinOutcome, RefusalKind, join};

/// A token of the node's pool, `<id>.<secret>`.
fn pool_token(b: &super::boot_tests::Bed) -> Result<String, Box<dyn std::error::Error>> {
    let pool = b.node()?.pool_id.ok_or("node without a pool")?;
    let (_, secret) = b.store.write_blocking(|tx| {
        crate::ops::tokens::create(
            tx,
            &NewToken {
                pool_id: Some(pool.clone()),
                ttl_ms: 600_000,
                max_uses: Some(10),
                ..Default::default()
            },
        )
    })?;
    Ok(secret)
}

fn node_join(b: &super::boot_tests::Bed, token: &str) -> Result<JoinOutcome, JoinError> {
    node_join_as(b, token, digests(UUID, SERIAL, MAC), false)
}

/// A node-mode join with `token` showing `ids`; `live`: the node has a session.
fn node_join_as(
    b: &super::boot_tests::Bed,
    token: &str,
    ids: Vec<String>,
    live: bool,
) -> Result<JoinOutcome, JoinError> {
    let f = JoinFacts {
        token: token.to_owned(),
        hardware_key: "ab".repeat(32),
        trusted: true,
        identifier_digests: ids,
        hostname: Some("impostor".into()),
        peer: Some("192.0.2.66".into()),
        mode: Mode::Node,
    };
    b.store.write_blocking(|tx| join(tx, &f, &|_| live))
}

fn refused(out: Result<JoinOutcome, JoinError>) -> Result<String, Box<dyn std::error::Error>> {
    match out {
        Ok(JoinOutcome::Refused(r)) if r.kind == RefusalKind::BareMetal => Ok(r.message),
        other => Err(format!("expected a bare-metal refusal, got {other:?}").into()),
    }
}

#[test]
fn a_pool_join_token_never_rejoins_a_bmc_enrolled_machine_in_place() -> TestResult {
    let b = bed(None)?;
    let token = b.boot(Duration::from_secs(600))?;
    assert!(matches!(
        b.join(&token, Mode::Ramdisk, digests(UUID, SERIAL, MAC))?,
        JoinOutcome::Joined(_)
    ));
    let generation = b.node()?.identity_generation;
    let join_token = pool_token(&b)?;

    // Inspecting (its ramdisk gone): refused, the identity untouched, an event for operators.
    let message = refused(node_join(&b, &join_token))?;
    assert!(message.starts_with("BARE_METAL_NODE"), "{message}");
    assert!(message.contains(&b.node), "{message}");
    let n = b.node()?;
    assert_eq!(n.identity_generation, generation);
    assert_eq!(n.provision_state, ProvisionState::Inspecting);
    let events = b.store.read_blocking(|r| r.events(&b.node))?;
    let e = events
        .iter()
        .find(|e| e.kind == "joinRefused")
        .ok_or("no joinRefused event")?;
    assert!(e.message.contains("192.0.2.66"), "{}", e.message);
    let tokens = b.store.read_blocking(|r| r.tokens())?;
    assert!(
        tokens.iter().all(|t| t.uses == 0),
        "a refused join spends no token: {tokens:?}"
    );

    // Ready: refused as well.
    assert_eq!(
        b.report(br#"{"hostname":"ramdisk"}"#)?,
        Some(ProvisionState::Ready)
    );
    refused(node_join(&b, &join_token))?;
    assert_eq!(b.node()?.identity_generation, generation);
    Ok(())
}

/// The deploy-refusal of `out`, or an error naming what came instead.
fn deploy_refused(out: Result<JoinOutcome, JoinError>) -> Result<DeployRefusal, String> {
    match out {
        Err(JoinError::Deploy(r)) => Ok(r),
        other => Err(format!("expected a deploy-identity refusal, got {other:?}")),
    }
}

#[tokio::test]
async fn a_deploy_issues_the_written_system_its_own_identity_and_pool_tokens_lose_the_node()
-> TestResult {
    use super::deploy_tests::{
        bmc_step, boot_join_report, controller, finish, image, queue_write, ready, request, written,
    };
    let b = ready()?;
    let join_token = pool_token(&b)?;
    controller(&b)
        .deploy(request(&b, image())?, "operator:t")
        .await?;
    boot_join_report(&b)?;
    let cmd = queue_write(&b)?;
    let deploy_token = cmd.args["deployToken"]
        .as_str()
        .ok_or("image.write carries no deploy identity")?
        .to_owned();
    assert!(deploy_token.starts_with("deploy_"), "{deploy_token}");
    assert!(
        matches!(
            deploy_refused(node_join(&b, &deploy_token))?,
            DeployRefusal::NotDeployed {
                state: ProvisionState::Deploying,
                ..
            }
        ),
        "the identity joins only a deployed machine"
    );
    finish(&b, &cmd, CommandState::Succeeded, Some(written()), None)?;
    let stored = b
        .store
        .read_blocking(|r| r.command(&cmd.id))?
        .ok_or("no command")?;
    let shown = stored.args["deployToken"].as_str().unwrap_or_default();
    assert!(
        shown.starts_with("<withheld: ") && !stored.args.to_string().contains(&deploy_token),
        "the written command keeps no identity: {}",
        stored.args
    );
    for step in ["bmc.setBootDevice", "bmc.power"] {
        let c = bmc_step(&b, step)?;
        finish(&b, &c, CommandState::Succeeded, Some(json!({})), None)?;
    }
    assert_eq!(b.node()?.provision_state, ProvisionState::Deployed);

    // Deployed: the pool's join token is refused (it re-joined in place before issue 30.1's
    // deploy identity), the deploy's identity is the way in.
    let message = refused(node_join(&b, &join_token))?;
    assert!(message.contains("bcd-join-token"), "{message}");
    let other = digests(
        "11111111-2222-3333-4444-555555555555",
        "SER-OTHER",
        "00:1b:21:00:00:09",
    );
    assert!(matches!(
        deploy_refused(node_join_as(&b, &deploy_token, other, false))?,
        DeployRefusal::OtherMachine { .. }
    ));
    assert!(matches!(
        node_join_as(&b, &deploy_token, digests(UUID, SERIAL, MAC), true),
        Err(JoinError::Duplicate(_))
    ));
    let generation = b.node()?.identity_generation;
    for round in 1..=2u64 {
        match node_join(&b, &deploy_token)? {
            JoinOutcome::Joined(j) => {
                assert_eq!(j.node_id, b.node);
                assert!(j.rejoined);
                assert_eq!(j.identity_generation, generation + round);
            }
            other => return Err(format!("the deployed system did not join: {other:?}").into()),
        }
    }
    let d = b
        .store
        .read_blocking(|r| r.deploy_identity(&b.node))?
        .ok_or("no deploy identity")?;
    assert_eq!(d.uses, 2);
    let tokens = b.store.read_blocking(|r| r.tokens())?;
    assert!(tokens.iter().all(|t| t.uses == 0), "{tokens:?}");

    // Released: the identity is gone with the deployed system.
    let version = b.node()?.version;
    b.store
        .write_blocking(|tx| super::release::release(tx, &b.node, version, "operator:t"))?;
    assert!(matches!(
        deploy_refused(node_join(&b, &deploy_token))?,
        DeployRefusal::Unknown { .. }
    ));
    Ok(())
}
