//! The site's rules with fake BMCs, on tokio's paused clock: the lease (epoch, lapse, margin,
//! renewal, loss), the limits shared by commands and the sync loop, change-only reports, and
//! what an assignment keeps and drops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::bmc::{PowerAction, PowerArgs, PowerState};
use bc_protocol::pb;
use tokio::sync::watch;

use crate::bmc::fake::FakeConnector;
use crate::config::SiteConfig;
use crate::site::Site;

const TTL_MS: u32 = 10_000;

fn address(i: usize) -> String {
    format!("redfish+http://bmc{i}.test/redfish/v1/Systems/1")
}

fn managed(i: usize, password: &str) -> pb::ManagedBmc {
    pb::ManagedBmc {
        node_id: format!("node_{i}"),
        endpoint: Some(pb::BmcEndpoint {
            address: address(i),
            username: "admin".into(),
            password: password.into(),
            tls: 0,
            cert_sha256: String::new(),
        }),
        candidate: None,
        sync_power: true,
        boot: None,
    }
}

fn assignment(epoch: u64, n: usize, per_bmc: u32) -> pb::SiteAssignment {
    pb::SiteAssignment {
        site_id: "site_a".into(),
        lease_held: true,
        lease_epoch: epoch,
        lease_ttl_ms: TTL_MS,
        bmcs: (0..n).map(|i| managed(i, "pw")).collect(),
        power_sync_interval_ms: 1_000,
        max_requests_per_bmc: per_bmc,
        max_requests_per_site: 0,
    }
}

fn site() -> (Arc<Site>, Arc<FakeConnector>) {
    let connector = Arc::new(FakeConnector::default());
    let cfg = SiteConfig {
        lease_margin_ms: 2_000,
        ..SiteConfig::default()
    };
    (
        Arc::new(Site::new(cfg, Arc::clone(&connector) as _)),
        connector,
    )
}

async fn power(site: &Site, node: &str, epoch: u64) -> Result<(), CommandErrorCode> {
    crate::commands::power(
        site,
        PowerArgs {
            node_id: node.into(),
            lease_epoch: epoch,
            action: PowerAction::On,
            boot_device: None,
            network_boot: None,
        },
    )
    .await
    .map(drop)
    .map_err(|f| f.code)
}

/// Starts the sync loop; stops it when the returned sender drops.
fn start_sync(site: &Arc<Site>) -> watch::Sender<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(crate::sync::run(Arc::clone(site), rx));
    tx
}

async fn next_report(site: &Site) -> Option<pb::PowerReport> {
    tokio::time::timeout(Duration::from_secs(30), site.reports.next())
        .await
        .ok()
}

#[tokio::test(start_paused = true)]
async fn commands_run_only_under_a_valid_lease_of_their_epoch() {
    let (site, conn) = site();
    assert_eq!(
        power(&site, "node_0", 5).await,
        Err(CommandErrorCode::LeaseLost)
    );
    site.apply(assignment(5, 1, 0));
    let bmc = conn.bmc(&address(0));
    assert_eq!(power(&site, "node_0", 5).await, Ok(()));
    assert_eq!(
        power(&site, "node_0", 4).await,
        Err(CommandErrorCode::LeaseLost)
    );
    assert_eq!(
        power(&site, "node_9", 5).await,
        Err(CommandErrorCode::BmcUnknown)
    );
    assert_eq!(bmc.actions(), ["power on"], "refused commands did nothing");

    // The lease lapses at ttl - margin after the grant, on the local clock.
    tokio::time::advance(Duration::from_millis(7_900)).await;
    assert_eq!(power(&site, "node_0", 5).await, Ok(()));
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(
        power(&site, "node_0", 5).await,
        Err(CommandErrorCode::LeaseLost)
    );
    // A renewal (dated by its heartbeat's send time) brings it back.
    site.heartbeat_sent(1);
    site.heartbeat_acked(&pb::HeartbeatAck {
        seq: 1,
        site_lease_expires_at_ms: 1,
    });
    assert_eq!(power(&site, "node_0", 5).await, Ok(()));
    // An ack for a heartbeat this process never sent renews nothing.
    tokio::time::advance(Duration::from_millis(8_100)).await;
    site.heartbeat_acked(&pb::HeartbeatAck {
        seq: 77,
        site_lease_expires_at_ms: 1,
    });
    assert_eq!(
        power(&site, "node_0", 5).await,
        Err(CommandErrorCode::LeaseLost)
    );
    site.heartbeat_sent(2);
    site.heartbeat_acked(&pb::HeartbeatAck {
        seq: 2,
        site_lease_expires_at_ms: 1,
    });
    assert_eq!(power(&site, "node_0", 5).await, Ok(()));
    // The control plane says this appliance is no longer the holder.
    site.heartbeat_sent(3);
    site.heartbeat_acked(&pb::HeartbeatAck {
        seq: 3,
        site_lease_expires_at_ms: 0,
    });
    assert_eq!(
        power(&site, "node_0", 5).await,
        Err(CommandErrorCode::LeaseLost)
    );
    assert_eq!(bmc.actions().len(), 4, "exactly the commands allowed ran");
}

#[tokio::test(start_paused = true)]
async fn an_assignment_keeps_unchanged_drivers_and_a_standby_one_drops_them_all() {
    let (site, conn) = site();
    site.apply(assignment(1, 2, 0));
    assert_eq!(conn.connects(), 2);
    site.apply(assignment(1, 2, 0));
    assert_eq!(
        conn.connects(),
        2,
        "same endpoints: the drivers (connections) are kept"
    );
    let mut changed = assignment(1, 2, 0);
    changed.bmcs[1] = managed(1, "rotated");
    site.apply(changed);
    assert_eq!(conn.connects(), 3, "new credentials: a new driver");
    let bmc0 = conn.bmc(&address(0));
    assert!(Arc::strong_count(&bmc0) > 2, "held by the assignment");
    site.apply(pb::SiteAssignment {
        site_id: "site_a".into(),
        lease_held: false,
        ..Default::default()
    });
    let a = site.assignment().unwrap();
    assert!(a.bmcs.is_empty() && !a.held);
    assert_eq!(
        Arc::strong_count(&bmc0),
        2,
        "only the fake connector and this test still hold the driver (and its credentials)"
    );
    assert_eq!(
        power(&site, "node_0", 1).await,
        Err(CommandErrorCode::LeaseLost)
    );
}

#[tokio::test(start_paused = true)]
async fn sync_reports_every_bmc_once_then_only_changes() {
    let (site, conn) = site();
    site.apply(assignment(2, 3, 0));
    let _stop = start_sync(&site);
    let first = next_report(&site).await.unwrap();
    assert_eq!(first.lease_epoch, 2);
    let mut got: Vec<(String, String, bool)> = first
        .observations
        .iter()
        .map(|o| (o.node_id.clone(), o.power.clone(), o.reachable))
        .collect();
    while got.len() < 3 {
        let more = next_report(&site).await.unwrap();
        got.extend(
            more.observations
                .iter()
                .map(|o| (o.node_id.clone(), o.power.clone(), o.reachable)),
        );
    }
    got.sort();
    assert_eq!(
        got,
        (0..3)
            .map(|i| (format!("node_{i}"), "off".to_owned(), true))
            .collect::<Vec<_>>()
    );
    // Several periods with nothing new: no report.
    let polls = conn.bmc(&address(0)).calls();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(conn.bmc(&address(0)).calls() >= polls + 3, "still polling");
    assert!(
        site.reports.take().is_none(),
        "nothing changed, nothing reported"
    );

    conn.bmc(&address(1)).set_power(PowerState::On);
    let r = next_report(&site).await.unwrap();
    assert_eq!(r.observations.len(), 1, "{r:?}");
    assert_eq!(
        (
            r.observations[0].node_id.as_str(),
            r.observations[0].power.as_str()
        ),
        ("node_1", "on")
    );

    let b2 = conn.bmc(&address(2));
    b2.fail_with(Some(b2.unreachable()));
    let r = next_report(&site).await.unwrap();
    let o = &r.observations[0];
    assert_eq!(
        (o.node_id.as_str(), o.power.as_str(), o.reachable),
        ("node_2", "unknown", false)
    );
    assert!(
        o.error.contains(&address(2)),
        "the BMC is named: {}",
        o.error
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        site.reports.take().is_none(),
        "still unreachable is no news"
    );
    assert_eq!(site.view().unreachable, 1);

    // A new assignment: everything once again.
    b2.fail_with(None);
    site.apply(assignment(2, 3, 0));
    let mut n = 0;
    while n < 3 {
        n += next_report(&site).await.unwrap().observations.len();
    }
}

#[tokio::test(start_paused = true)]
async fn sync_stops_when_the_lease_lapses_and_resumes_after_a_renewal() {
    let (site, conn) = site();
    site.apply(assignment(4, 1, 0));
    let _stop = start_sync(&site);
    let bmc = conn.bmc(&address(0));
    next_report(&site).await.unwrap();
    // Valid for ttl - margin = 8 s: then the polls stop.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let at_lapse = bmc.calls();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(bmc.calls(), at_lapse, "no BMC work without a valid lease");
    assert!(
        (6..=10).contains(&at_lapse),
        "polled about once a second until then: {at_lapse}"
    );
    site.heartbeat_sent(1);
    site.heartbeat_acked(&pb::HeartbeatAck {
        seq: 1,
        site_lease_expires_at_ms: 1,
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(bmc.calls() > at_lapse, "polling resumed after the renewal");
}

#[tokio::test(start_paused = true)]
async fn commands_and_sync_share_the_per_bmc_limit() {
    let (site, conn) = site();
    let mut a = assignment(1, 2, 2);
    a.power_sync_interval_ms = 10;
    site.apply(a);
    let (b0, b1) = (conn.bmc(&address(0)), conn.bmc(&address(1)));
    b0.set_delay(Duration::from_millis(100));
    b1.set_delay(Duration::from_millis(100));
    let _stop = start_sync(&site);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let s = Arc::clone(&site);
        tasks.spawn(async move { power(&s, "node_0", 1).await });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.unwrap(), Ok(()));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        b0.max_in_flight(),
        2,
        "commands and polls together never pass the limit"
    );
    assert!(b1.max_in_flight() <= 2);
    assert!(
        b0.calls() >= 20,
        "10 commands (action + read-back) and polls ran"
    );
}

#[tokio::test]
async fn a_bmcs_limit_outlives_a_lapse_and_a_standby_interlude() {
    let (site, _conn) = site();
    site.apply(assignment(1, 1, 2));
    let first = Arc::clone(&site.assignment().unwrap().bmcs["node_0"]);
    // Two operations started under the first assignment hold the BMC's two permits.
    let held = (
        first.limit.acquire().await.unwrap(),
        first.limit.acquire().await.unwrap(),
    );
    // The lease lapses (a standby assignment), then comes back with a new epoch.
    site.apply(pb::SiteAssignment {
        site_id: "site_a".into(),
        lease_held: false,
        ..Default::default()
    });
    site.apply(assignment(2, 1, 2));
    let again = Arc::clone(&site.assignment().unwrap().bmcs["node_0"]);
    // The BMC is still serving the two earlier requests: a third waits.
    let third = tokio::time::timeout(Duration::from_millis(50), again.limit.acquire()).await;
    assert!(
        third.is_err(),
        "a new assignment must not hand out permits the BMC's earlier requests still hold"
    );
    drop(held);
    assert!(again.limit.acquire().await.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_stops_waiting_keeps_the_bmcs_permit_until_its_requests_end() {
    let (site, conn) = site();
    site.apply(assignment(1, 1, 1));
    conn.bmc(&address(0)).set_delay(Duration::from_secs(1));
    let start = tokio::time::Instant::now();
    // A caller (a cancelled command, a sync round cut short) gives up after 100 ms; its request
    // is still at the BMC for another 900 ms.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(100),
        site.with_bmc(1, "node_0", false, |b| b.power_state()),
    )
    .await;
    assert!(gave_up.is_err());
    // The next operation starts only once that request is over: with a limit of 1 the BMC never
    // serves two at once, whoever stopped waiting.
    site.with_bmc(1, "node_0", false, |b| b.power_state())
        .await
        .unwrap();
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "the second operation ran beside the first one's request ({:?})",
        start.elapsed()
    );
    assert_eq!(conn.bmc(&address(0)).max_in_flight(), 1);
}
