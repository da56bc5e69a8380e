//! Benchmark: time from `nodes.enroll` to verified, through a real `bcctl serve`, a real
//! `bcd site` holding the site's lease, and one sushy-emulator process holding the machines' BMCs
//! (each machine its own address `…/redfish/v1/Systems/<uuid>`).
//!
//! Two scenarios, each on a fresh control plane, site agent and emulator:
//! 1. one at a time: `BC_BENCH_SEQUENTIAL` (default 10) machines, each enrolled only after the
//!    previous one was verified — the latency of a single enrollment;
//! 2. a burst: `BC_BENCH_BURST` (default 50) machines enrolled back to back through the API, then
//!    waited for — the same under load (the verifications queue at the site agent and the
//!    emulator).
//!
//! A machine's latency runs from just before its `nodes.enroll` request (this process's clock) to
//! the `bmc.verifiedAt` the control plane stamped (the same machine's clock, milliseconds), so
//! polling adds nothing to it. Prints median, p99, max and min of the latencies, the total from
//! the first enroll to the last verification, and how long the enroll requests themselves took
//! (the span from the first to the last one's start). Asserts nothing.
//!
//! Run: `cargo bench -p bc-e2e --bench enroll_verify --profile dev` (the debug binaries the
//! end-to-end tests use; without `--profile dev` it builds and measures release binaries).
//! Needs sushy-emulator (`BC_SUSHY_EMULATOR` or PATH).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/support/bare_metal.rs"]
mod support;

use std::time::{Duration, SystemTime};

use bc_e2e::{ControlPlane, eventually};
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use bcd_site::test_utils::{PASSWORD, USER};
use serde_json::json;
use support::{Seen, SiteAgent, WAIT};

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Milliseconds since the epoch of an RFC 3339 timestamp.
fn ms_of(rfc3339: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"))
        .timestamp_millis()
}

fn now_ms() -> i64 {
    let d = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap();
    i64::try_from(d.as_millis()).unwrap()
}

/// The value at quantile `q` (nearest rank) of sorted `v`.
fn quantile(v: &[i64], q: f64) -> i64 {
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

struct Bench {
    _rt: tokio::runtime::Runtime,
    sushy: Sushy,
    systems: Vec<FakeSystem>,
    cp: ControlPlane,
    _agent: SiteAgent,
    site: String,
    seen: Seen,
    _dir: tempfile::TempDir,
}

impl Bench {
    /// A control plane, a site agent holding the lease and an emulator with `n` systems.
    fn start(n: usize, base: u32) -> Option<Self> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let systems: Vec<FakeSystem> = (0..u32::try_from(n).unwrap())
            .map(|i| FakeSystem::numbered(base + i))
            .collect();
        let sushy = rt.block_on(Sushy::start("enroll_verify bench", &systems, None))?;
        // The emulator's first request loads its systems: not part of any enrollment.
        rt.block_on(sushy.system(&systems[0].uuid));
        let dir = tempfile::tempdir().unwrap();
        let cp = ControlPlane::start_with(&dir.path().join("cp"), &[]);
        let mut seen = Seen::default();
        let site = seen.ok(
            &cp,
            "sites.create",
            json!({"name": "bench", "kind": "platform"}),
        );
        let site = site["id"].as_str().unwrap().to_owned();
        let token = cp.create_token(&["--site", &site]);
        let agent = SiteAgent::start(&cp, dir.path(), "site-bench", &token);
        eventually(WAIT, "the site agent holding the lease", || {
            let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
            s["lease"]["holderNodeId"].is_string().then_some(())
        });
        Some(Self {
            _rt: rt,
            sushy,
            systems,
            cp,
            _agent: agent,
            site,
            seen,
            _dir: dir,
        })
    }

    /// Enrolls system `i`: (node id, this process's clock just before the request).
    fn enroll(&mut self, i: usize) -> (String, i64) {
        let address = self.sushy.address(&self.systems[i].uuid);
        let sent = now_ms();
        let n = self.seen.ok(
            &self.cp,
            "nodes.enroll",
            json!({"inspect": false, "siteId": self.site, "name": format!("m{i}"), "bmc": {
                "address": address, "username": USER, "password": PASSWORD}}),
        );
        (n["id"].as_str().unwrap().to_owned(), sent)
    }

    /// Waits until `id` is verified and returns its `bmc.verifiedAt` in ms.
    fn verified(&mut self, id: &str) -> i64 {
        let deadline = Duration::from_secs(600);
        let (cp, seen) = (&self.cp, &mut self.seen);
        eventually(deadline, &format!("{id} verified"), || {
            let n = seen.ok(cp, "nodes.get", json!({"nodeId": id}));
            if n["provisionState"] == "failed" {
                panic!("{id} failed: {n}");
            }
            n["bmc"]["verifiedAt"].as_str().map(ms_of)
        })
    }
}

fn report(what: &str, samples: &[(i64, i64)]) {
    let mut lat: Vec<i64> = samples.iter().map(|(s, v)| v - s).collect();
    lat.sort_unstable();
    let first = samples.iter().map(|(s, _)| *s).min().unwrap_or(0);
    let last = samples.iter().map(|(_, v)| *v).max().unwrap_or(0);
    let last_sent = samples.iter().map(|(s, _)| *s).max().unwrap_or(0);
    println!(
        "{what}: n={} median={} ms p99={} ms max={} ms min={} ms total={} ms (enroll requests over {} ms)",
        lat.len(),
        quantile(&lat, 0.5),
        quantile(&lat, 0.99),
        lat.last().copied().unwrap_or(0),
        lat.first().copied().unwrap_or(0),
        last - first,
        last_sent - first
    );
}

fn main() {
    let sequential = count("BC_BENCH_SEQUENTIAL", 10).max(1);
    let burst = count("BC_BENCH_BURST", 50).max(1);

    let Some(mut b) = Bench::start(sequential, 100) else {
        return;
    };
    let mut samples = Vec::new();
    for i in 0..sequential {
        let (id, sent) = b.enroll(i);
        let at = b.verified(&id);
        samples.push((sent, at));
    }
    report(&format!("one at a time ({sequential} machines)"), &samples);
    drop(b);

    let Some(mut b) = Bench::start(burst, 1000) else {
        return;
    };
    let sent: Vec<(String, i64)> = (0..burst).map(|i| b.enroll(i)).collect();
    let samples: Vec<(i64, i64)> = sent.iter().map(|(id, s)| (*s, b.verified(id))).collect();
    report(&format!("burst ({burst} machines at once)"), &samples);
}
