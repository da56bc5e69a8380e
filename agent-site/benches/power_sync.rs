//! Benchmark: one power sync sweep of N simulated BMCs (default 1,000) by the site agent's real
//! code (`Site`, the Redfish driver through nv-redfish, the per-BMC and per-site limits, the sync
//! loop and its reports), against
//! 1. a light in-process fake Redfish service (keep-alive HTTP/1.1, one system document per
//!    BMC), without and with an answer latency per request — the site agent's own cost and the
//!    limits' effect;
//! 2. one sushy-emulator process holding N fake systems (when `BC_SUSHY_EMULATOR` or PATH has
//!    it) — a real Redfish implementation, single Python process, so it measures mostly sushy.
//!
//! Each BMC is its own address (`…/redfish/v1/Systems/<i>`), hence its own driver and HTTP
//! client. Figures per run: the first sweep (connects and reads each service root too), a second
//! sweep on the same drivers (connections reused where the server keeps them open), requests
//! per second, and this process's RSS (the in-process fake server included).
//!
//! Run: `cargo bench -p bcd-site --bench power_sync`. `BC_BENCH_BMCS` sets N. Prints figures;
//! asserts nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bc_protocol::pb;
use bcd_site::bmc::RealConnector;
use bcd_site::config::SiteConfig;
use bcd_site::site::Site;
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::sync::watch;

const PER_BMC: u32 = 4;
const PER_SITE: u32 = 64;

fn rss_mib() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// A fake Redfish service on a loopback port: the service root and `/redfish/v1/Systems/<i>`,
/// every answer after `latency`; counts requests.
async fn fake_redfish(latency: Duration) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    c.fetch_add(1, Ordering::Relaxed);
                    if !latency.is_zero() {
                        tokio::time::sleep(latency).await;
                    }
                    let body = if let Some(id) = path.strip_prefix("/redfish/v1/Systems/") {
                        format!(
                            "{{\"@odata.id\":\"/redfish/v1/Systems/{id}\",\"@odata.type\":\"#ComputerSystem.v1_10_0.ComputerSystem\",\"Id\":\"{id}\",\"Name\":\"system {id}\",\"PowerState\":\"On\"}}"
                        )
                    } else {
                        "{\"@odata.id\":\"/redfish/v1/\",\"@odata.type\":\"#ServiceRoot.v1_5_0.ServiceRoot\",\"Id\":\"Root\",\"Name\":\"Fake\",\"RedfishVersion\":\"1.6.0\",\"Systems\":{\"@odata.id\":\"/redfish/v1/Systems\"}}".to_owned()
                    };
                    let resp = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if sock.write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, count)
}

fn assignment(addresses: &[String]) -> pb::SiteAssignment {
    pb::SiteAssignment {
        site_id: "site_bench".into(),
        lease_held: true,
        lease_epoch: 1,
        lease_ttl_ms: 3_600_000,
        bmcs: addresses
            .iter()
            .enumerate()
            .map(|(i, a)| pb::ManagedBmc {
                node_id: format!("node_{i:05}"),
                endpoint: Some(pb::BmcEndpoint {
                    address: a.clone(),
                    username: "admin".into(),
                    password: bcd_site::test_utils::PASSWORD.into(),
                    tls: pb::BmcTlsMode::Pin.into(),
                    cert_sha256: String::new(),
                }),
                candidate: None,
                sync_power: true,
                boot: None,
            })
            .collect(),
        // One read per BMC per sweep: the next is an hour away.
        power_sync_interval_ms: 3_600_000,
        max_requests_per_bmc: PER_BMC,
        max_requests_per_site: PER_SITE,
    }
}

/// Waits until `n` observations were reported; returns (sweep time, how many were unreachable).
async fn sweep(site: &Site, n: usize) -> (Duration, usize) {
    let start = Instant::now();
    let (mut seen, mut bad) = (0, 0);
    while seen < n {
        let r = tokio::time::timeout(Duration::from_secs(600), site.reports.next())
            .await
            .expect("a sweep within 10 minutes");
        seen += r.observations.len();
        bad += r.observations.iter().filter(|o| !o.reachable).count();
    }
    (start.elapsed(), bad)
}

/// `requests` counts the server's requests; `None`: not counted, taken as 2 per BMC in the first
/// sweep (service root and system) and 1 in the second.
async fn run(label: &str, addresses: Vec<String>, requests: Option<&dyn Fn() -> usize>) {
    let count = |expected: usize| requests.map_or(expected, |f| f());
    let n = addresses.len();
    let cfg = SiteConfig {
        request_timeout_ms: 30_000,
        operation_timeout_ms: 120_000,
        ..SiteConfig::default()
    };
    let rss0 = rss_mib();
    let site = Arc::new(Site::new(cfg.clone(), Arc::new(RealConnector::new(cfg))));
    let (stop_tx, stop) = watch::channel(false);
    let sync = tokio::spawn(bcd_site::sync::run(Arc::clone(&site), stop));
    let before = count(0);
    site.apply(assignment(&addresses));
    let (first, bad1) = sweep(&site, n).await;
    let r1 = count(2 * n) - before;
    let rss1 = rss_mib();
    let before = count(0);
    site.apply(assignment(&addresses));
    let (second, bad2) = sweep(&site, n).await;
    let r2 = count(n) - before;
    let rss2 = rss_mib();
    let _ = stop_tx.send(true);
    let _ = sync.await;
    println!(
        "{label}: {n} BMCs, limits {PER_BMC}/BMC {PER_SITE}/site\n  first sweep  {:>8.2} s  {r1:>6} requests  {:>8.0} req/s  unreachable {bad1}\n  second sweep {:>8.2} s  {r2:>6} requests  {:>8.0} req/s  unreachable {bad2}\n  RSS {rss0:.1} MiB before, {rss1:.1} MiB after the first sweep, {rss2:.1} MiB after the second",
        first.as_secs_f64(),
        r1 as f64 / first.as_secs_f64(),
        second.as_secs_f64(),
        r2 as f64 / second.as_secs_f64(),
    );
}

fn main() {
    let n: usize = std::env::var("BC_BENCH_BMCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "load average before: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    rt.block_on(async {
        for latency in [Duration::ZERO, Duration::from_millis(50)] {
            let (port, count) = fake_redfish(latency).await;
            let addresses = (0..n)
                .map(|i| format!("redfish+http://127.0.0.1:{port}/redfish/v1/Systems/{i}"))
                .collect();
            run(
                &format!("in-process fake Redfish, {} ms per answer", latency.as_millis()),
                addresses,
                Some(&|| count.load(Ordering::Relaxed)),
            )
            .await;
        }
        let systems: Vec<FakeSystem> = (0..n)
            .map(|i| FakeSystem::numbered(u32::try_from(i).unwrap_or(0)))
            .collect();
        let started = Instant::now();
        if let Some(sushy) = Sushy::start("power sync benchmark", &systems, None).await {
            println!(
                "sushy-emulator with {n} systems answering after {:.1} s",
                started.elapsed().as_secs_f64()
            );
            let addresses = systems.iter().map(|s| sushy.address(&s.uuid)).collect();
            run("one sushy-emulator process", addresses, None).await;
            println!("  (sushy's requests are not counted: 2 per BMC taken in the first sweep, 1 in the second)");
        }
    });
    println!(
        "load average after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}
