//! The `remediation` scenario: a share of the simulated fleet fails at once under the pool's
//! circuit breaker ([`remediation`]).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cpl_core::text::Id;
use cpl_core::verbs::Request;
use cpl_store::now_ms;
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::harness::Harness;
use super::{BenchArgs, round2};

/// The pool the bench's nodes join.
const BENCH_POOL: &str = crate::cli::dev::DEV_POOL;

/// What the remediation scenario reads off the store at one moment.
struct RemediationSnapshot {
    /// When the pool's breaker opened (Unix ms of `RemediationPaused`'s transition), if it did.
    tripped_at_ms: Option<i64>,
    /// Its message (the numbers).
    breaker_message: Option<String>,
    /// Nodes whose XID Health records now (`XidCritical` true): the faulted share not healed
    /// yet, as the control plane knows it.
    xid_nodes: std::collections::BTreeSet<String>,
    /// Every remediation of the pool (open or ended).
    remediations: Vec<cpl_store::RemediationRecord>,
    /// Nodes cordoned now.
    cordoned: std::collections::BTreeSet<String>,
}

fn remediation_snapshot(h: &Harness) -> anyhow::Result<RemediationSnapshot> {
    use bc_protocol::ConditionStatus;
    let (pool, nodes, remediations) = h.db.read_blocking(|r| {
        Ok::<_, cpl_store::StoreError>((
            r.pool(BENCH_POOL)?,
            r.nodes()?,
            r.remediations(&cpl_store::RemediationFilter {
                pool_id: Some(BENCH_POOL.to_owned()),
                node_id: None,
                open_only: false,
                limit: 100_000,
            })?,
        ))
    })?;
    let paused = pool.as_ref().and_then(|p| {
        p.conditions.iter().find(|c| {
            c.type_ == cpl_core::remediation::breaker::REMEDIATION_PAUSED
                && c.status == ConditionStatus::True
        })
    });
    let tripped_at_ms = paused.and_then(|c| {
        chrono::DateTime::parse_from_rfc3339(&c.last_transition_time)
            .ok()
            .map(|t| t.timestamp_millis())
    });
    let xid_nodes = nodes
        .iter()
        .filter(|n| {
            n.conditions.iter().any(|c| {
                c.type_ == cpl_core::health::XID_CRITICAL && c.status == ConditionStatus::True
            })
        })
        .map(|n| n.id.clone())
        .collect();
    let cordoned = nodes
        .iter()
        .filter(|n| n.cordoned)
        .map(|n| n.id.clone())
        .collect();
    Ok(RemediationSnapshot {
        tripped_at_ms,
        breaker_message: paused.map(|c| c.message.clone()),
        xid_nodes,
        remediations,
        cordoned,
    })
}

/// `--fault-fraction` of the nodes start failing at once (`bcd sim --fault-xid`, started by
/// SIGUSR2) in a pool whose remediation is `auto` under the breaker's limits: how long until the
/// breaker trips, how many remediations started (never more than the limit), and what touched a
/// node that never faulted (false remediations, commands to healthy nodes, cordons: all 0).
pub(super) async fn remediation(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let client = h.client();
    let pool: Value = client
        .request(&Request::PoolsGet(cpl_core::verbs::PoolRef {
            pool_id: Id::unchecked(BENCH_POOL),
        }))
        .await
        .context("pools.get")?;
    let version = pool["version"].as_u64().unwrap_or(0);
    let policy = cpl_store::RemediationPolicy {
        mode: Some(cpl_store::RemediationMode::Auto),
        max_concurrent: Some(args.remediation_max_concurrent),
        max_concurrent_percent: Some(args.remediation_max_percent),
        // No allocations on simulated nodes: nothing to wait for.
        drain_grace_seconds: Some(0),
        ..Default::default()
    };
    let _: Value = client
        .request(&Request::PoolsSetRemediation(
            cpl_core::remediation::view::PoolRemediationRequest {
                pool_id: Id::unchecked(BENCH_POOL),
                version,
                remediation: policy.clone(),
            },
        ))
        .await
        .context("pools.setRemediation")?;
    let faulted = h.sim_faulted();
    let limit = cpl_core::remediation::breaker::concurrency_limit(
        &cpl_core::remediation::policy::Policy::of(Some(&policy)),
        args.nodes as u64,
    );
    let t0_ms = now_ms();
    let t0 = Instant::now();
    h.signal_sims(Signal::SIGUSR2);
    // Until the breaker tripped and Health recorded every faulted node's XID.
    // A node a reset healed (XID 48) is `XidCritical` false again; the poll (every 200 ms)
    // is faster than a heal (drain, reset, diag: several 1 s passes), so the union of the
    // snapshots holds every node whose XID was recorded.
    let mut snap = remediation_snapshot(h)?;
    let mut ever = snap.xid_nodes.clone();
    let mut tripped_seen_s = None;
    loop {
        if tripped_seen_s.is_none() && snap.tripped_at_ms.is_some() {
            tripped_seen_s = Some(t0.elapsed().as_secs_f64());
        }
        if tripped_seen_s.is_some() && ever.len() >= faulted {
            break;
        }
        if t0.elapsed() > args.timeout {
            bail!(
                "after {:?}: breaker tripped {}, {} of {faulted} faulted nodes' XIDs recorded, {} remediations",
                args.timeout,
                snap.tripped_at_ms.is_some(),
                ever.len(),
                snap.remediations.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        snap = remediation_snapshot(h)?;
        ever.extend(snap.xid_nodes.iter().cloned());
    }
    let all_xids_s = t0.elapsed().as_secs_f64();
    // A window more: nothing else may start while the breaker is open.
    tokio::time::sleep(args.window).await;
    let snap = remediation_snapshot(h)?;
    ever.extend(snap.xid_nodes.iter().cloned());
    // The sims write their stats every second.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stats = h.sim_stats();
    let false_remediations = snap
        .remediations
        .iter()
        .filter(|r| !ever.contains(&r.node_id))
        .count();
    let remediated: std::collections::BTreeSet<&String> =
        snap.remediations.iter().map(|r| &r.node_id).collect();
    let cordoned_without = snap
        .cordoned
        .iter()
        .filter(|n| !remediated.contains(n))
        .count();
    #[allow(clippy::cast_precision_loss)]
    let trip_s = snap
        .tripped_at_ms
        .map(|t| round2(t.saturating_sub(t0_ms) as f64 / 1000.0));
    out.insert("faultXid".into(), json!(args.fault_xid));
    out.insert("faultedNodes".into(), json!(faulted));
    out.insert("xidsRecorded".into(), json!(ever.len()));
    out.insert("xidsStillRecorded".into(), json!(snap.xid_nodes.len()));
    out.insert(
        "remediationsSucceeded".into(),
        json!(
            snap.remediations
                .iter()
                .filter(|r| r.state == cpl_store::RemediationState::Succeeded)
                .count()
        ),
    );
    out.insert("allXidsRecordedS".into(), json!(round2(all_xids_s)));
    out.insert("remediationLimit".into(), json!(limit));
    out.insert("breakerTripped".into(), json!(snap.tripped_at_ms.is_some()));
    out.insert("breakerTripS".into(), json!(trip_s));
    out.insert("breakerTripSeenS".into(), json!(tripped_seen_s.map(round2)));
    out.insert("breakerMessage".into(), json!(snap.breaker_message));
    out.insert("remediationsStarted".into(), json!(snap.remediations.len()));
    out.insert(
        "remediationsOpen".into(),
        json!(
            snap.remediations
                .iter()
                .filter(|r| r.ended_at.is_none())
                .count()
        ),
    );
    out.insert("falseRemediations".into(), json!(false_remediations));
    out.insert("cordoned".into(), json!(snap.cordoned.len()));
    out.insert("cordonedWithoutRemediation".into(), json!(cordoned_without));
    out.insert("faultsInjected".into(), stats["faultsInjected"].clone());
    out.insert(
        "commandsToFaulted".into(),
        stats["commandsToFaulted"].clone(),
    );
    out.insert(
        "commandsToHealthy".into(),
        stats["commandsToHealthy"].clone(),
    );
    scrape_remediation_metrics(h, out).await;
    Ok(())
}

/// The remediation series of the first replica's `/metrics` (the controller runs there with
/// one replica): remediations active and succeeded, breaker trips, steps taken.
async fn scrape_remediation_metrics(h: &Harness, out: &mut serde_json::Map<String, Value>) {
    let Some(url) = h.serves.first().map(|s| s.metrics_url.clone()) else {
        return;
    };
    let body = match reqwest::get(&url).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => {
            out.insert("metricsError".into(), json!(e.to_string()));
            return;
        }
    };
    let value = |name: &str| super::scenarios::metric_value(&body, name);
    out.insert(
        "metricsRemediationsActive".into(),
        json!(value("bcctl_remediations{mode=\"auto\",state=\"active\"}")),
    );
    out.insert(
        "metricsRemediationsSucceeded".into(),
        json!(value(
            "bcctl_remediations{mode=\"auto\",state=\"succeeded\"}"
        )),
    );
    out.insert(
        "metricsBreakerTrips".into(),
        json!(value("bcctl_remediation_breaker_trips")),
    );
    let steps: f64 = body
        .lines()
        .filter(|l| l.starts_with("bcctl_remediation_steps{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .fold(0.0, |a, b| a + b);
    out.insert("metricsRemediationSteps".into(), json!(steps));
}
