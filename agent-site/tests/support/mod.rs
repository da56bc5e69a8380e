//! Shared pieces of the site agent's integration tests: a site with the real drivers and short
//! timeouts, assignments, and the command calls.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bc_protocol::commands::CommandFailure;
use bc_protocol::commands::bmc::{
    BmcFacts, BootDevice, BootDeviceArgs, BootDeviceResult, PowerAction, PowerArgs, PowerResult,
    VerifyArgs,
};
use bc_protocol::pb;
use bcd_site::bmc::RealConnector;
use bcd_site::config::SiteConfig;
use bcd_site::site::Site;
use bcd_site::test_utils::{PASSWORD, USER};

/// The epoch the tests' assignments grant.
pub const EPOCH: u64 = 3;

/// Settings with short timeouts, so failures show in seconds.
pub fn config() -> SiteConfig {
    SiteConfig {
        connect_timeout_ms: 1_000,
        request_timeout_ms: 3_000,
        read_retries: 1,
        retry_backoff_ms: 50,
        operation_timeout_ms: 20_000,
        ipmi_timeout_s: 1,
        ipmi_retries: 1,
        ipmi_command_timeout_ms: 10_000,
        ..SiteConfig::default()
    }
}

/// A site with the real drivers and `cfg`.
pub fn site(cfg: SiteConfig) -> Arc<Site> {
    Arc::new(Site::new(cfg.clone(), Arc::new(RealConnector::new(cfg))))
}

/// A BMC of an assignment with the harness's credentials (`password` overrides the password).
pub fn bmc(node: &str, address: &str, password: Option<&str>) -> pb::ManagedBmc {
    pb::ManagedBmc {
        node_id: node.to_owned(),
        endpoint: Some(endpoint(address, password.unwrap_or(PASSWORD))),
        candidate: None,
        sync_power: true,
        boot: None,
    }
}

/// An endpoint (pin mode, nothing pinned).
pub fn endpoint(address: &str, password: &str) -> pb::BmcEndpoint {
    pb::BmcEndpoint {
        address: address.to_owned(),
        username: USER.to_owned(),
        password: password.to_owned(),
        tls: pb::BmcTlsMode::Pin.into(),
        cert_sha256: String::new(),
    }
}

/// An assignment holding the lease of [`EPOCH`] with `bmcs`.
pub fn assignment(bmcs: Vec<pb::ManagedBmc>) -> pb::SiteAssignment {
    pb::SiteAssignment {
        site_id: "site_test".to_owned(),
        lease_held: true,
        lease_epoch: EPOCH,
        lease_ttl_ms: 600_000,
        bmcs,
        power_sync_interval_ms: 0,
        max_requests_per_bmc: 0,
        max_requests_per_site: 0,
    }
}

pub async fn verify(site: &Site, node: &str) -> Result<BmcFacts, CommandFailure> {
    verify_with(site, node, false).await
}

/// `bmc.verify` with the candidate credentials.
pub async fn verify_candidate(site: &Site, node: &str) -> Result<BmcFacts, CommandFailure> {
    verify_with(site, node, true).await
}

async fn verify_with(site: &Site, node: &str, candidate: bool) -> Result<BmcFacts, CommandFailure> {
    let v = bcd_site::commands::verify(
        site,
        VerifyArgs {
            node_id: node.to_owned(),
            lease_epoch: EPOCH,
            candidate,
        },
    )
    .await?;
    Ok(serde_json::from_value(v).unwrap())
}

pub async fn power(
    site: &Site,
    node: &str,
    action: PowerAction,
) -> Result<PowerResult, CommandFailure> {
    power_at(site, node, action, EPOCH).await
}

pub async fn power_at(
    site: &Site,
    node: &str,
    action: PowerAction,
    epoch: u64,
) -> Result<PowerResult, CommandFailure> {
    let v = bcd_site::commands::power(
        site,
        PowerArgs {
            node_id: node.to_owned(),
            lease_epoch: epoch,
            action,
            boot_device: None,
            network_boot: None,
        },
    )
    .await?;
    Ok(serde_json::from_value(v).unwrap())
}

pub async fn boot(
    site: &Site,
    node: &str,
    device: BootDevice,
    persistent: bool,
) -> Result<BootDeviceResult, CommandFailure> {
    let v = bcd_site::commands::boot_device(
        site,
        BootDeviceArgs {
            node_id: node.to_owned(),
            lease_epoch: EPOCH,
            device,
            persistent,
        },
    )
    .await?;
    Ok(serde_json::from_value(v).unwrap())
}
