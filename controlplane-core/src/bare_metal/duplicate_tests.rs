//! One machine, one enrollment (issue 30.8): every spelling of a BMC address that reaches the
//! same BMC (`localhost`, `127.1`, `0x7f000001`, a leading-zero port, an IPv4-mapped IPv6
//! address, upper case, the system path left out) is refused, on any site; and a BMC that
//! reports the system UUID or serial another node's BMC reported is refused at verification
//! (two names of one BMC, or one machine behind two BMC addresses).

use std::sync::Arc;

use bc_protocol::{ConditionStatus, ProvisionState, SiteKind};
use cpl_store::now_ms;

use super::bare_metal_tests::{SITE, TestResult, World, condition, facts, succeeded, world};
use super::enroll::{BmcInput, EnrollRequest, Secret, TlsMode};
use crate::error::OpError;

const OTHER_SITE: &str = "site_u";

fn enroll_at(w: &World, site: &str, address: &str) -> Result<String, OpError> {
    let req = EnrollRequest {
        site_id: site.into(),
        pool_id: None,
        name: None,
        bmc: BmcInput {
            address: address.to_owned(),
            username: "admin".into(),
            password: serde_json::from_value::<Secret>(serde_json::json!("pw-pw-pw"))
                .map_err(|e| OpError::Internal(e.to_string()))?,
            tls: TlsMode::Pin,
        },
        macs: None,
        inspect: false,
        deployed: false,
    };
    let key = Arc::clone(&w.bm.key);
    let n = w
        .store
        .write_blocking(|tx| super::enroll::enroll(tx, &key, &req, "operator:t"))?;
    Ok(n.id)
}

fn second_site(w: &World) -> TestResult {
    w.store.write_blocking(|tx| {
        tx.insert_site(&cpl_store::Site {
            id: OTHER_SITE.into(),
            name: "u".into(),
            kind: SiteKind::Platform,
            owner_tenant_id: None,
            version: 1,
            created_at: 1,
        })
    })?;
    Ok(())
}

#[test]
fn one_bmc_is_enrolled_once_however_its_address_is_spelled_and_on_any_site() -> TestResult {
    let w = world()?;
    second_site(&w)?;
    let first = enroll_at(
        &w,
        SITE,
        "redfish+https://127.0.0.1:8443/redfish/v1/Systems/1",
    )?;
    for (site, spelling) in [
        (SITE, "redfish+https://localhost:8443/redfish/v1/Systems/1"),
        (SITE, "redfish+https://127.1:8443/redfish/v1/Systems/1"),
        (SITE, "redfish+https://0x7f000001:8443/redfish/v1/Systems/1"),
        (SITE, "redfish+https://127.0.0.1:08443/redfish/v1/Systems/1"),
        (
            SITE,
            "redfish+https://[::ffff:127.0.0.1]:8443/redfish/v1/Systems/1",
        ),
        (SITE, "redfish+https://LOCALHOST:8443/redfish/v1/Systems/1"),
        (SITE, "redfish+https://127.0.0.1:8443"),
        (
            OTHER_SITE,
            "redfish+https://127.0.0.1:8443/redfish/v1/Systems/1",
        ),
        (OTHER_SITE, "redfish+https://localhost:8443/"),
    ] {
        match enroll_at(&w, site, spelling) {
            Err(OpError::InvalidState(m)) => {
                assert!(m.contains(&first), "{spelling}: {m}");
            }
            other => panic!("{spelling} on {site}: {other:?}"),
        }
    }
    // Another system of the same BMC, another port or host: other machines.
    enroll_at(
        &w,
        SITE,
        "redfish+https://127.0.0.1:8443/redfish/v1/Systems/2",
    )?;
    enroll_at(
        &w,
        OTHER_SITE,
        "redfish+https://127.0.0.1:8444/redfish/v1/Systems/1",
    )?;
    // A DNS name, in any case and with the default port written or not.
    enroll_at(&w, SITE, "redfish+https://bmc-7.example.net")?;
    assert!(matches!(
        enroll_at(
            &w,
            OTHER_SITE,
            "redfish+https://BMC-7.Example.NET:443/redfish/v1/Systems/9"
        ),
        Err(OpError::InvalidState(_))
    ));
    Ok(())
}

/// Verifies `node`'s BMC with `f` through the lease holder `node_sa`.
async fn verify(w: &World, node: &str, f: bc_protocol::commands::bmc::BmcFacts) -> TestResult {
    w.bm.issue_verifications(SITE).await;
    let cmd = w
        .sessions
        .commands("node_sa")
        .into_iter()
        .rev()
        .find(|c| String::from_utf8_lossy(&c.args_json).contains(node))
        .ok_or("no bmc.verify")?;
    w.bm.commands
        .update("node_sa", succeeded(&cmd.id, serde_json::to_value(f)?))
        .await;
    Ok(())
}

#[tokio::test]
async fn a_bmc_reporting_another_nodes_system_uuid_or_serial_is_refused_at_verification()
-> TestResult {
    let w = world()?;
    let now = now_ms();
    w.agent("node_sa", now)?;
    w.bm.sweep_leases(now, false).await?;
    // One BMC by its IP address, then by a name that resolves to it (the control plane
    // resolves no names: only what the BMC reports can tell).
    let a = enroll_at(&w, SITE, "redfish+https://10.0.4.7")?;
    verify(&w, &a, facts()).await?;
    assert_eq!(
        condition(&w.node(&a)?, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    let b = enroll_at(&w, SITE, "redfish+https://bmc-7.example.net")?;
    verify(&w, &b, facts()).await?;
    let n = w.node(&b)?;
    assert_eq!(n.provision_state, ProvisionState::Failed, "{n:?}");
    let c = condition(&n, "BmcVerified").ok_or("BmcVerified")?;
    assert_eq!(c.status, ConditionStatus::False);
    assert_eq!(c.reason, "DuplicateMachine");
    assert!(
        c.message.contains(&a) && c.message.contains("system UUID"),
        "{}",
        c.message
    );
    let bmc = w.store.read_blocking(|r| r.bmc(&b))?.ok_or("bmc")?;
    assert!(bmc.verified_at.is_none() && bmc.identifiers.is_empty());
    // The serial alone is enough (a UUID the firmware left blank, or another one).
    let mut same_serial = facts();
    same_serial.uuid = Some("0D1C1B2A-0000-4000-8000-000000000001".into());
    same_serial.nics.clear();
    let c2 = enroll_at(&w, SITE, "redfish+https://10.0.4.8")?;
    verify(&w, &c2, same_serial).await?;
    let c = condition(&w.node(&c2)?, "BmcVerified").ok_or("BmcVerified")?;
    assert_eq!(
        (c.status, c.reason.as_str()),
        (ConditionStatus::False, "DuplicateMachine")
    );
    assert!(c.message.contains("system serial"), "{}", c.message);
    // The first node is untouched, and another machine verifies.
    assert_eq!(
        condition(&w.node(&a)?, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    let mut other = facts();
    other.uuid = Some("0D1C1B2A-0000-4000-8000-000000000002".into());
    other.serial = Some("SN-OTHER-1".into());
    other.nics.clear();
    let d = enroll_at(&w, SITE, "redfish+https://10.0.4.9")?;
    verify(&w, &d, other).await?;
    assert_eq!(
        condition(&w.node(&d)?, "BmcVerified").map(|c| c.status),
        Some(ConditionStatus::True)
    );
    Ok(())
}
