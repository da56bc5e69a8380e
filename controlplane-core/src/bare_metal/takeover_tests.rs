//! Issue 30.1: a node agent with its pool's join token never takes over a machine enrolled
//! through a BMC. The machine's ramdisk joined (so the node holds its identifier digests); then
//! `Join(mode node, the pool's token, the same digests)` is refused — while `inspecting`, when
//! `ready`, and it spends no token — with an event on the node; the ramdisk of the next boot
//! still joins.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_protocol::{Mode, ProvisionState};
use cpl_store::NewToken;

use super::boot_tests::{MAC, SERIAL, TestResult, UUID, bed, digests};
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
    let f = JoinFacts {
        token: token.to_owned(),
        hardware_key: "ab".repeat(32),
        trusted: true,
        identifier_digests: digests(UUID, SERIAL, MAC),
        hostname: Some("impostor".into()),
        peer: Some("192.0.2.66".into()),
        mode: Mode::Node,
    };
    b.store.write_blocking(|tx| join(tx, &f, &|_| false))
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
