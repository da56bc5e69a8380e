//! The scenarios: each fills the result object with its figures.

use cpl_core::text::Id;
use cpl_core::verbs::{CommandsCreateRequest, Request, SpecRequest};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use serde_json::{Value, json};

use cpl_store::now_ms;

use super::harness::{Harness, port_of, proc_usage};
use super::{BenchArgs, round2};

/// The join storm every scenario starts with; fills `out`.
pub(super) async fn join_storm(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let n = args.nodes as u64;
    let base = h.serve_usage();
    let t0 = Instant::now();
    h.start_sim()?;
    let mut peak_rss = 0u64;
    let pids = h.serve_pids();
    let adopted = h
        .wait_for(
            "all nodes adopted",
            t0,
            args.timeout,
            0,
            |_, _| {
                let rss: u64 = pids
                    .iter()
                    .filter_map(|p| proc_usage(*p))
                    .map(|(_, r)| r)
                    .sum();
                peak_rss = peak_rss.max(rss);
            },
            |c| c.adopted >= n && c.total >= n,
        )
        .await?;
    let connected = h
        .wait_for(
            "all nodes connected and converged",
            t0,
            args.timeout,
            0,
            |_, _| {},
            |c| c.connected >= n && c.converged >= n,
        )
        .await?;
    let after = h.serve_usage();
    // The sim writes its stats every second: wait for a file that has seen every join.
    let mut stats = h.sim_stats();
    let t1 = Instant::now();
    while stats["joined"].as_u64().unwrap_or(0) < n && t1.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        stats = h.sim_stats();
    }
    let errors =
        stats["joinErrors"].as_u64().unwrap_or(0) + stats["sessionErrors"].as_u64().unwrap_or(0);
    out.insert("joinAllAdoptedS".into(), json!(round2(adopted)));
    out.insert(
        "joinAllConnectedConvergedS".into(),
        json!(round2(connected)),
    );
    out.insert("joinErrors".into(), json!(stats["joinErrors"]));
    out.insert("sessionErrors".into(), json!(stats["sessionErrors"]));
    out.insert("errors".into(), json!(errors));
    out.insert("adopted".into(), json!(h.counts(0)?.adopted));
    if h.serves.len() > 1 {
        out.insert("sessionsPerReplica".into(), sessions_per_replica(h)?);
    }
    if let (Some((t0c, rss0)), Some((t1c, _))) = (base, after) {
        #[allow(clippy::cast_precision_loss)]
        let cpu_s = (t1c.saturating_sub(t0c)) as f64 / 100.0;
        out.insert("joinServeCpuS".into(), json!(round2(cpu_s)));
        out.insert("serveRssBeforeMiB".into(), json!(rss0 / (1 << 20)));
        out.insert("joinServePeakRssMiB".into(), json!(peak_rss / (1 << 20)));
    }
    Ok(())
}

pub(super) async fn steady(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
    rss_base: u64,
) -> anyhow::Result<()> {
    // Let the join storm's inventory writes drain, then measure one clean window.
    tokio::time::sleep(args.heartbeat_interval.min(Duration::from_secs(5))).await;
    h.signal_sims(Signal::SIGUSR1);
    let (c0, _) = h.serve_usage().context("reading /proc of serve")?;
    let t0 = Instant::now();
    let mut max_rss = 0u64;
    while t0.elapsed() < args.window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some((_, r)) = h.serve_usage() {
            max_rss = max_rss.max(r);
        }
    }
    let (c1, rss) = h.serve_usage().context("reading /proc of serve")?;
    // The stats file is written every second: wait for one written after the window.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let stats = h.sim_stats();
    #[allow(clippy::cast_precision_loss)]
    let cpu = (c1.saturating_sub(c0)) as f64 / 100.0 / t0.elapsed().as_secs_f64() * 100.0;
    let n = args.nodes.max(1) as u64;
    out.insert("windowS".into(), json!(args.window.as_secs()));
    out.insert("heartbeatAcks".into(), stats["latencySamples"].clone());
    out.insert(
        "heartbeatAckP50Ms".into(),
        stats["heartbeatAckP50Ms"].clone(),
    );
    out.insert(
        "heartbeatAckP99Ms".into(),
        stats["heartbeatAckP99Ms"].clone(),
    );
    out.insert(
        "heartbeatAckMaxMs".into(),
        stats["heartbeatAckMaxMs"].clone(),
    );
    out.insert("serveCpuPercent".into(), json!(round2(cpu)));
    out.insert("serveRssMiB".into(), json!(rss / (1 << 20)));
    out.insert(
        "serveRssPerSessionKiB".into(),
        json!(rss.saturating_sub(rss_base) / n / 1024),
    );
    out.insert("connected".into(), json!(h.counts(0)?.connected));
    scrape_metrics(h, out).await;
    Ok(())
}

/// `{replica gateway id: connected nodes}` from the sessions' rows.
fn sessions_per_replica(h: &Harness) -> anyhow::Result<Value> {
    let rows = h.db.read_blocking(|r| r.sessions_per_gateway())?;
    Ok(Value::Object(
        rows.into_iter().map(|(gw, n)| (gw, json!(n))).collect(),
    ))
}

/// One Prometheus scrape of the first replica at full load: how long it took and what it said
/// about sessions and heartbeats (the fleet gauges are computed from the store at scrape time);
/// with several replicas, also the sessions each one holds by its own count.
async fn scrape_metrics(h: &Harness, out: &mut serde_json::Map<String, Value>) {
    // One scrape per replica (each reads the fleet gauges from the store); the first one's is
    // the timed one.
    let (mut scrapes, mut first_ms) = (Vec::new(), 0.0);
    for s in &h.serves {
        let t = Instant::now();
        let body = match reqwest::get(&s.metrics_url).await {
            Ok(r) => Ok(r.text().await.unwrap_or_default()),
            Err(e) => Err(e.to_string()),
        };
        if scrapes.is_empty() {
            first_ms = t.elapsed().as_secs_f64() * 1000.0;
        }
        scrapes.push(body);
    }
    let value_of = |name: &'static str| {
        scrapes
            .iter()
            .map(move |b| b.as_deref().ok().and_then(|b| metric_value(b, name)))
    };
    // Node writes that ran again under the global lock, all replicas (PostgreSQL).
    let escalations: f64 = value_of("bcctl_store_node_write_escalations_total")
        .flatten()
        .sum();
    out.insert("storeNodeWriteEscalations".into(), json!(escalations));
    if h.serves.len() > 1 {
        let per = value_of("bcctl_sessions").map(|v| json!(v)).collect();
        out.insert("metricsSessionsPerReplica".into(), Value::Array(per));
    }
    if h.serves.first().is_none_or(|s| s.metrics_url.is_empty()) {
        return;
    }
    let body = match scrapes.first() {
        Some(Ok(body)) => body,
        Some(Err(e)) => {
            out.insert("metricsError".into(), json!(e));
            return;
        }
        None => return,
    };
    let value = |name: &str| metric_value(body, name);
    out.insert("metricsScrapeMs".into(), json!(round2(first_ms)));
    out.insert("metricsSessions".into(), json!(value("bcctl_sessions")));
    out.insert(
        "metricsHeartbeatsTotal".into(),
        json!(value("bcctl_heartbeats_total")),
    );
    out.insert(
        "metricsNodesConnected".into(),
        json!(value("bcctl_nodes{connectivity=\"connected\"}")),
    );
}

/// The value of the sample `name` (with its labels, if any) in a Prometheus text exposition.
pub(super) fn metric_value(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

/// Index of the running replica that holds a live controller lease (the store's lease row
/// against each replica's endpoints.json `replicaId`; one read, where scraping every replica's
/// `/metrics` would count the whole fleet on each).
fn leader(h: &Harness) -> anyhow::Result<Option<(usize, String)>> {
    let lease =
        h.db.read_blocking(|r| r.controller_lease(cpl_store::CONTROLLERS_LEASE))?;
    Ok(lease.filter(|l| l.expires_at > now_ms()).and_then(|l| {
        h.serves
            .iter()
            .position(|s| s.child.is_some() && s.replica_id == l.holder)
            .map(|i| (i, l.holder))
    }))
}

/// `kill -9` of `bcctl serve` and its restart on the same ports and state: time until it listens
/// again, until every node has a session opened after the kill, and nodes wrongly marked
/// unreachable. With several replicas, [`restart_leader`] instead.
pub(super) async fn restart(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    if h.serves.len() > 1 {
        return restart_leader(h, args, out).await;
    }
    let n = args.nodes as u64;
    let listen = format!("127.0.0.1:{}", port_of(&h.serves[0].gateway_url));
    let api = format!("127.0.0.1:{}", port_of(&h.serves[0].api_url));
    let t_kill = now_ms();
    let t0 = Instant::now();
    if let Some(mut s) = h.serves[0].child.take() {
        let _ = s.start_kill();
        let _ = s.wait().await;
    }
    h.start_serve(0, &listen, &api).await?;
    let up = t0.elapsed().as_secs_f64();
    let mut series: Vec<(f64, u64, u64)> = Vec::new();
    let mut wrongly_unreachable = 0u64;
    let settled = h
        .wait_for(
            "all nodes reconnected",
            t0,
            args.timeout,
            t_kill,
            |t, c| {
                wrongly_unreachable = wrongly_unreachable.max(c.unreachable);
                series.push((round2(t), c.reconnected, c.unreachable));
            },
            |c| c.reconnected >= n,
        )
        .await?;
    wrongly_unreachable = wrongly_unreachable.max(watch_unreachable(h, t_kill).await?);
    out.insert("restartServeUpS".into(), json!(round2(up)));
    out.insert("restartAllReconnectedS".into(), json!(round2(settled)));
    out.insert("wronglyUnreachable".into(), json!(wrongly_unreachable));
    out.insert("reconnectSeries".into(), thin(&series));
    Ok(())
}

/// Watches 3 s more after a storm settled: a node marked unreachable late still counts.
async fn watch_unreachable(h: &Harness, since_ms: i64) -> anyhow::Result<u64> {
    let (t1, mut most) = (Instant::now(), 0u64);
    while t1.elapsed() < Duration::from_secs(3) {
        most = most.max(h.counts(since_ms)?.unreachable);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(most)
}

/// At most ~100 points of `(t, up, down)`, the last one kept.
fn thin(series: &[(f64, u64, u64)]) -> Value {
    let step = (series.len() / 100).max(1);
    Value::Array(
        series
            .iter()
            .enumerate()
            .filter(|(i, _)| i % step == 0 || *i + 1 == series.len())
            .map(|(_, (t, up, down))| json!([t, up, down]))
            .collect(),
    )
}

/// With several replicas: `kill -9` of the replica leading the controllers and its restart on
/// the same ports (a new gateway id), measured at once: until it listens again, until another
/// replica (or it, restarted) holds the controller lease (`failoverS`, from the store's lease
/// row), until none of its nodes is left on it and every node is connected, and nodes wrongly
/// marked unreachable. The series counts connected nodes not on the dead replica.
async fn restart_leader(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let n = args.nodes as u64;
    let t = Instant::now();
    let (victim, dead) = loop {
        if let Some(found) = leader(h)? {
            break found;
        }
        if t.elapsed() > Duration::from_secs(60) {
            bail!("no running replica holds a live controller lease after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let on = |h: &Harness, gw: &str| -> anyhow::Result<u64> {
        Ok(h.db
            .read_blocking(|r| r.sessions_per_gateway())?
            .into_iter()
            .find(|(g, _)| g == gw)
            .map_or(0, |(_, k)| k))
    };
    let held = on(h, &dead)?;
    let listen = format!("127.0.0.1:{}", port_of(&h.serves[victim].gateway_url));
    let api = format!("127.0.0.1:{}", port_of(&h.serves[victim].api_url));
    let t_kill = now_ms();
    let t0 = Instant::now();
    if let Some(mut s) = h.serves[victim].child.take() {
        let _ = s.start_kill();
        let _ = s.wait().await;
    }
    h.start_serve(victim, &listen, &api).await?;
    let up = t0.elapsed().as_secs_f64();
    let (mut failover, mut back) = (None, None);
    let mut series: Vec<(f64, u64, u64)> = Vec::new();
    let mut wrongly_unreachable = 0u64;
    loop {
        let t = t0.elapsed().as_secs_f64();
        if failover.is_none() {
            let lease =
                h.db.read_blocking(|r| r.controller_lease(cpl_store::CONTROLLERS_LEASE))?;
            if lease.is_some_and(|l| l.holder != dead && l.expires_at > now_ms()) {
                failover = Some(t);
            }
        }
        let left = on(h, &dead)?;
        let c = h.counts(t_kill)?;
        wrongly_unreachable = wrongly_unreachable.max(c.unreachable);
        series.push((round2(t), c.connected.saturating_sub(left), c.unreachable));
        if back.is_none() && left == 0 && c.connected >= n {
            back = Some(t);
        }
        if let (Some(f), Some(b)) = (failover, back) {
            out.insert("failoverS".into(), json!(round2(f)));
            out.insert("restartAllReconnectedS".into(), json!(round2(b)));
            break;
        }
        if t0.elapsed() > args.timeout {
            bail!(
                "after {:?}: {left} nodes still on the killed replica, lease moved: {}",
                args.timeout,
                failover.is_some()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wrongly_unreachable = wrongly_unreachable.max(watch_unreachable(h, t_kill).await?);
    out.insert("killedReplicaLed".into(), json!(true));
    out.insert("killedReplicaSessions".into(), json!(held));
    out.insert("restartServeUpS".into(), json!(round2(up)));
    out.insert("wronglyUnreachable".into(), json!(wrongly_unreachable));
    out.insert("reconnectSeries".into(), thin(&series));
    out.insert("sessionsPerReplica".into(), sessions_per_replica(h)?);
    Ok(())
}

/// Calls the operator API once per node, 32 calls in flight (what an operator's script would
/// do); `call` gives the method and body for `(node id, version)`. Returns the number of
/// failed calls and the first failure.
async fn per_node(
    h: &Harness,
    ids: Vec<(String, u64)>,
    call: impl Fn(&str, u64) -> Request,
) -> (u64, Option<String>) {
    let client = h.client();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut set = tokio::task::JoinSet::new();
    for (id, version) in ids {
        let req = call(&id, version);
        let (c, sem) = (client.clone(), std::sync::Arc::clone(&sem));
        set.spawn(async move {
            let _permit = sem.acquire().await;
            c.request::<Value>(&req).await.map(|_| ())
        });
    }
    let (mut errors, mut first) = (0u64, None);
    while let Some(r) = set.join_next().await {
        let failure = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        errors += 1;
        first.get_or_insert(failure);
    }
    (errors, first)
}

pub(super) async fn fanout(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let ids = h.node_ids()?;
    let since = now_ms();
    let t0 = Instant::now();
    let (create_errors, _) = per_node(h, ids, |id, _| {
        Request::CommandsCreate(CommandsCreateRequest {
            node_id: Id::unchecked(id),
            name: Id::unchecked("inventory.refresh"),
            args: Some(Value::Object(serde_json::Map::new())),
            timeout_seconds: Some(600),
        })
    })
    .await;
    let created = t0.elapsed().as_secs_f64();
    let n = args.nodes as u64;
    loop {
        let done: u64 =
            h.db.read_blocking(|r| r.succeeded_commands_since("inventory.refresh", since))?;
        if done + create_errors >= n {
            break;
        }
        if t0.elapsed() > args.timeout {
            bail!("fan-out: {done} of {n} results in {:?}", args.timeout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = t0.elapsed().as_secs_f64();
    let lat: Vec<i64> =
        h.db.read_blocking(|r| r.command_latencies_ms("inventory.refresh", since))?;
    let p = |q: f64| -> i64 {
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let i = ((lat.len().saturating_sub(1)) as f64 * q).round() as usize;
        lat.get(i).copied().unwrap_or(0)
    };
    out.insert("fanoutCreatedS".into(), json!(round2(created)));
    out.insert("fanoutAllResultsS".into(), json!(round2(all)));
    out.insert("fanoutCommandP50Ms".into(), json!(p(0.5)));
    out.insert("fanoutCommandP99Ms".into(), json!(p(0.99)));
    out.insert("fanoutCreateErrors".into(), json!(create_errors));
    Ok(())
}

pub(super) async fn rollout(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let ids = h.node_ids()?;
    let t0 = Instant::now();
    let (update_errors, first_error) = per_node(h, ids, |id, version| {
        Request::NodesUpdateSpec(SpecRequest {
            node_id: Id::unchecked(id),
            version,
            spec: json!({"devices": {"gpus": []}}),
        })
    })
    .await;
    let updated = t0.elapsed().as_secs_f64();
    let n = args.nodes as u64;
    let all = h
        .wait_for(
            "every observedGeneration matches",
            t0,
            args.timeout,
            0,
            |_, _| {},
            |c| c.converged >= n,
        )
        .await?;
    let gens: u64 = h.db.read_blocking(|r| r.min_generation())?;
    out.insert("rolloutUpdatedS".into(), json!(round2(updated)));
    out.insert("rolloutAllObservedS".into(), json!(round2(all)));
    out.insert("rolloutMinGeneration".into(), json!(gens));
    out.insert("rolloutUpdateErrors".into(), json!(update_errors));
    if let Some(e) = first_error {
        out.insert("rolloutFirstError".into(), json!(e));
    }
    Ok(())
}
