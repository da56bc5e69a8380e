//! The bench's processes: real `bcctl serve` replicas (one, or `--replicas N` on one PostgreSQL
//! database) and `bcd sim` processes (as many as keep each under the open-file limit), and what
//! is read off them (the store, read-only; the sims' stats files; `/proc/<pid>`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::process::{Child, Command};

use cpl_store::{BenchCounts, Store};

use super::BenchArgs;

/// Counts over the nodes table.
pub(super) type Counts = BenchCounts;

/// One `bcctl serve` process of the bench: a replica, with its own state dir (the first one's is
/// the bench's dir; the others' are `replica-<i>/` in it, with copies of its CA and keys).
pub(super) struct ServeProc {
    pub(super) dir: PathBuf,
    pub(super) child: Option<Child>,
    pub(super) gateway_url: String,
    pub(super) api_url: String,
    /// Its Prometheus endpoint (`--metrics-listen 127.0.0.1:0`).
    pub(super) metrics_url: String,
    /// Its replica id (endpoints.json `replicaId`): the controller lease's holder while it leads.
    pub(super) replica_id: String,
}

/// The running `bcctl serve` replicas plus the `bcd sim` processes.
pub(super) struct Harness {
    pub(super) dir: PathBuf,
    /// This `bcctl`, resolved once: a rebuild during a run replaces the file and
    /// `/proc/self/exe` then names a deleted one.
    pub(super) exe: PathBuf,
    pub(super) _temp: Option<tempfile::TempDir>,
    pub(super) bcd: PathBuf,
    pub(super) nodes: usize,
    /// Replicas, in start order (`--replicas`, 1 without it).
    pub(super) serves: Vec<ServeProc>,
    /// Simulators: as many as keep each under the open-file limit (one socket per node).
    pub(super) sims: Vec<Child>,
    /// How many simulators [`Harness::start_sim`] starts.
    pub(super) sim_count: usize,
    /// Extra `bcd sim` flags (the remediation scenario's fault injection).
    pub(super) sim_extra: Vec<String>,
    pub(super) ca_pin: String,
    pub(super) api_token: String,
    pub(super) token: String,
    pub(super) heartbeat: Duration,
    /// `--controller-lease-ttl` given to every replica, when set.
    pub(super) lease_ttl: Option<Duration>,
    /// The store, read-only beside `bcctl serve` (SQLite), or a second client of its database.
    pub(super) db: Store,
    /// `--store` given to `bcctl serve`, when the store is PostgreSQL.
    pub(super) store_url: Option<String>,
}

pub(super) fn port_of(url: &str) -> String {
    url.rsplit(':')
        .next()
        .unwrap_or("0")
        .trim_end_matches('/')
        .to_owned()
}

pub(super) fn pid_of(c: &Child) -> Option<Pid> {
    c.id()
        .and_then(|p| i32::try_from(p).ok())
        .map(Pid::from_raw)
}

/// (utime + stime in USER_HZ ticks, VmRSS in bytes) of `pid`, from /proc (proc(5)).
pub fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some((ticks, rss_kib * 1024))
}

impl Harness {
    /// Starts `args.replicas` replicas on the bench's store; [`Harness::start_sim`] starts the
    /// `sim_count` simulators later.
    pub(super) async fn start(args: &BenchArgs, sim_count: usize) -> anyhow::Result<Self> {
        let bcd = crate::cli::dev::find_bcd(args.bcd.clone())?;
        let (dir, temp) = match &args.state_dir {
            Some(d) => (std::path::absolute(d)?, None),
            None => {
                let t = tempfile::Builder::new().prefix("bcctl-bench-").tempdir()?;
                (t.path().to_owned(), Some(t))
            }
        };
        std::fs::create_dir_all(&dir)?;
        let db_path = dir.join("state.db");
        let postgres = args
            .store
            .as_deref()
            .map(|url| {
                if cpl_store::is_postgres_url(url) {
                    Ok(cpl_store::PostgresOptions::new(url))
                } else {
                    Err(anyhow::anyhow!("--store {url}: expected postgres://…"))
                }
            })
            .transpose()?;
        let token = {
            // Locked and initialised (or checked) as `bcctl serve` does; the lock is released
            // before `bcctl serve` starts on the dir.
            let state = controlplane_lite::server::open_state_with(
                &dir,
                "bc.local",
                controlplane_lite::state_dir::Init::IfEmpty,
                postgres.as_ref(),
            )?;
            let store = state.store.clone();
            crate::cli::dev::ensure_dev_pool(&store)?;
            // Headroom: a join whose reply was lost retries and re-joins in place, which spends
            // a use too.
            crate::cli::dev::dev_token(
                &store,
                24 * 3_600_000,
                (args.nodes as u64).saturating_mul(2),
                "bcctl bench",
            )?
        };
        let db = match &postgres {
            Some(opts) => Store::open_postgres(opts)?,
            None => Store::open_read_only(&db_path)?,
        };
        let replicas = args.replicas.max(1);
        let mut serves = Vec::with_capacity(replicas);
        for i in 0..replicas {
            let rdir = if i == 0 {
                dir.clone()
            } else {
                let d = dir.join(format!("replica-{i}"));
                std::fs::create_dir_all(&d)?;
                for f in controlplane_lite::state_dir::REPLICA_FILES {
                    std::fs::copy(dir.join(f), d.join(f))
                        .with_context(|| format!("copying {f} to {}", d.display()))?;
                }
                d
            };
            serves.push(ServeProc {
                dir: rdir,
                child: None,
                gateway_url: String::new(),
                api_url: String::new(),
                metrics_url: String::new(),
                replica_id: String::new(),
            });
        }
        let mut h = Self {
            exe: std::env::current_exe().context("locating bcctl")?,
            dir,
            _temp: temp,
            bcd,
            nodes: args.nodes,
            serves,
            sims: Vec::new(),
            sim_count: sim_count.max(1),
            sim_extra: Vec::new(),
            ca_pin: String::new(),
            api_token: String::new(),
            token,
            heartbeat: args.heartbeat_interval,
            lease_ttl: args.controller_lease_ttl,
            db,
            store_url: args.store.clone(),
        };
        for i in 0..replicas {
            h.start_serve(i, "127.0.0.1:0", "127.0.0.1:0").await?;
        }
        Ok(h)
    }

    /// Starts replica `i` on `listen` and `api` (port 0: any) and waits for its endpoints.json.
    pub(super) async fn start_serve(
        &mut self,
        i: usize,
        listen: &str,
        api: &str,
    ) -> anyhow::Result<()> {
        let dir = self.serves[i].dir.clone();
        let ep_path = dir.join("endpoints.json");
        let _ = std::fs::remove_file(&ep_path);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))?;
        let lease = self
            .lease_ttl
            .map(|t| humantime::format_duration(t).to_string());
        let mut child = Command::new(&self.exe)
            .arg("serve")
            .arg("--state-dir")
            .arg(&dir)
            .args(["--listen", listen, "--api-listen", api])
            .args(["--join-attempts-per-minute", "0"])
            // Every simulated agent connects from 127.0.0.1: no per-address cap, and no total
            // cap beyond the file-descriptor check the bench makes itself.
            .args(["--gateway-max-connections-per-address", "0"])
            .args(["--gateway-max-connections", "0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(self.store_url.iter().flat_map(|u| ["--store", u.as_str()]))
            .args(
                lease
                    .iter()
                    .flat_map(|t| ["--controller-lease-ttl", t.as_str()]),
            )
            .arg("--heartbeat-interval")
            .arg(humantime::format_duration(self.heartbeat).to_string())
            .arg("--unreachable-after")
            .arg(humantime::format_duration(self.heartbeat * 4).to_string())
            .env("BCCTL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting bcctl serve")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let ep: Value = loop {
            if let Some(st) = child.try_wait()? {
                bail!(
                    "bcctl serve exited: {st}; see {}",
                    dir.join("serve.log").display()
                );
            }
            if let Some(v) = std::fs::read_to_string(&ep_path)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            {
                break v;
            }
            if Instant::now() > deadline {
                bail!("bcctl serve wrote no endpoints.json in 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let s = |k: &str| ep.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let sp = &mut self.serves[i];
        sp.gateway_url = s("gatewayUrl");
        sp.api_url = s("apiUrl");
        sp.metrics_url = s("metricsUrl");
        sp.replica_id = s("replicaId");
        sp.child = Some(child);
        self.ca_pin = s("caPin");
        self.api_token = std::fs::read_to_string(dir.join("api-token"))?
            .trim()
            .to_owned();
        Ok(())
    }

    /// Starts the simulators: the nodes split evenly over [`Harness::sim_count`] `bcd sim`
    /// processes, each node knowing every replica's gateway (each tries them in its own
    /// shuffled order).
    pub(super) fn start_sim(&mut self) -> anyhow::Result<()> {
        let urls: Vec<&str> = self.serves.iter().map(|s| s.gateway_url.as_str()).collect();
        let urls = urls.join(",");
        let k = self.sim_count;
        for i in 0..k {
            let nodes = self.nodes / k + usize::from(i < self.nodes % k);
            let log = std::fs::File::create(self.dir.join(format!("sim-{i}.log")))?;
            let child = Command::new(&self.bcd)
                .arg("sim")
                .args(["--control-plane", &urls])
                .args(["--ca-pin", &self.ca_pin])
                .args(["--join-token", &self.token])
                .args(["--nodes", &nodes.to_string()])
                .args(&self.sim_extra)
                .arg("--stats")
                .arg(self.dir.join(format!("sim-stats-{i}.json")))
                .env("BCD_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("starting {} sim", self.bcd.display()))?;
            self.sims.push(child);
        }
        Ok(())
    }

    /// The first replica's gateway URL.
    pub(super) fn gateway_url(&self) -> &str {
        self.serves.first().map_or("", |s| s.gateway_url.as_str())
    }

    /// Pids of the running replicas.
    pub(super) fn serve_pids(&self) -> Vec<u32> {
        self.serves
            .iter()
            .filter_map(|s| s.child.as_ref().and_then(Child::id))
            .collect()
    }

    /// (CPU ticks, RSS bytes) summed over the running replicas.
    pub(super) fn serve_usage(&self) -> Option<(u64, u64)> {
        let all: Vec<(u64, u64)> = self
            .serve_pids()
            .into_iter()
            .filter_map(proc_usage)
            .collect();
        (!all.is_empty()).then(|| all.iter().fold((0, 0), |(t, r), (t1, r1)| (t + t1, r + r1)))
    }

    /// Sends `sig` to every simulator.
    pub(super) fn signal_sims(&self, sig: Signal) {
        for pid in self.sims.iter().filter_map(pid_of) {
            let _ = kill(pid, sig);
        }
    }

    /// The simulators' stats files, merged ([`merge_stats`]).
    pub(super) fn sim_stats(&self) -> Value {
        let all: Vec<Value> = (0..self.sim_count)
            .filter_map(|i| {
                std::fs::read_to_string(self.dir.join(format!("sim-stats-{i}.json")))
                    .ok()
                    .and_then(|t| serde_json::from_str(&t).ok())
            })
            .collect();
        merge_stats(&all)
    }

    /// Nodes of the simulators' faulted share (their stats' `faultedNodes`, summed).
    pub(super) fn sim_faulted(&self) -> usize {
        let n = self.sim_stats()["faultedNodes"].as_u64().unwrap_or(0);
        usize::try_from(n).unwrap_or(usize::MAX)
    }

    pub(super) fn counts(&self, since_ms: i64) -> anyhow::Result<Counts> {
        Ok(self.db.read_blocking(|r| r.bench_counts(since_ms))?)
    }

    /// Polls until `done(counts)`; returns the seconds it took from `t0`.
    pub(super) async fn wait_for(
        &mut self,
        what: &str,
        t0: Instant,
        timeout: Duration,
        since_ms: i64,
        mut each: impl FnMut(f64, &Counts),
        done: impl Fn(&Counts) -> bool,
    ) -> anyhow::Result<f64> {
        loop {
            let c = self.counts(since_ms)?;
            let t = t0.elapsed().as_secs_f64();
            each(t, &c);
            if done(&c) {
                return Ok(t);
            }
            for sim in &mut self.sims {
                if let Some(st) = sim.try_wait()? {
                    bail!("bcd sim exited ({st}) while waiting for {what}");
                }
            }
            if t0.elapsed() > timeout {
                bail!("{what}: not reached in {timeout:?} (last counts {c:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(super) async fn stop(&mut self) {
        let sims = std::mem::take(&mut self.sims);
        let serves = self.serves.iter_mut().filter_map(|s| s.child.take());
        for mut c in sims.into_iter().chain(serves.collect::<Vec<_>>()) {
            if let Some(pid) = pid_of(&c) {
                let _ = kill(pid, Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(10), c.wait())
                .await
                .is_err()
            {
                let _ = c.kill().await;
            }
        }
    }

    /// An operator client of the first replica.
    pub(super) fn client(&self) -> controlplane_lite::client::Client {
        let api = self.serves.first().map_or("", |s| s.api_url.as_str());
        controlplane_lite::client::Client::new(api, self.api_token.clone())
    }

    pub(super) fn node_ids(&self) -> anyhow::Result<Vec<(String, u64)>> {
        Ok(self.db.read_blocking(|r| r.node_versions())?)
    }
}

/// Several simulators' stats (`bcd sim --stats`) as one: counters summed; the heartbeat ack
/// p50 averaged over the sims weighted by their samples, p99 and max the highest of theirs (so
/// p99 is an upper bound of the fleet's, exact with one simulator).
pub(super) fn merge_stats(all: &[Value]) -> Value {
    match all {
        [] => Value::Null,
        [one] => one.clone(),
        _ => {
            let mut out = serde_json::Map::new();
            let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            for k in [
                "nodes",
                "joined",
                "joinErrors",
                "connected",
                "sessionErrors",
                "sessionsOpened",
                "heartbeatsAcked",
                "specsConverged",
                "commandsAnswered",
                "commandsToFaulted",
                "commandsToHealthy",
                "faultsInjected",
                "faultedNodes",
                "latencySamples",
            ] {
                let sum: u64 = all
                    .iter()
                    .map(|v| v.get(k).and_then(Value::as_u64).unwrap_or(0))
                    .sum();
                out.insert(k.into(), sum.into());
            }
            let samples: f64 = all.iter().map(|v| f(v, "latencySamples")).sum();
            let p50 = if samples > 0.0 {
                all.iter()
                    .map(|v| f(v, "heartbeatAckP50Ms") * f(v, "latencySamples"))
                    .sum::<f64>()
                    / samples
            } else {
                0.0
            };
            out.insert("heartbeatAckP50Ms".into(), super::round2(p50).into());
            for k in ["heartbeatAckP99Ms", "heartbeatAckMaxMs"] {
                let max = all.iter().map(|v| f(v, k)).fold(0.0, f64::max);
                out.insert(k.into(), max.into());
            }
            out.insert("simulators".into(), all.len().into());
            Value::Object(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_of_several_simulators_add_up() {
        assert_eq!(merge_stats(&[]), Value::Null);
        let one = json!({"nodes": 3, "joined": 3, "heartbeatAckP99Ms": 4.0});
        assert_eq!(merge_stats(std::slice::from_ref(&one)), one);
        let m = merge_stats(&[
            json!({"nodes": 10, "joined": 10, "joinErrors": 1, "latencySamples": 30,
                   "heartbeatAckP50Ms": 1.0, "heartbeatAckP99Ms": 5.0, "heartbeatAckMaxMs": 9.0}),
            json!({"nodes": 20, "joined": 19, "joinErrors": 0, "latencySamples": 10,
                   "heartbeatAckP50Ms": 3.0, "heartbeatAckP99Ms": 7.0, "heartbeatAckMaxMs": 8.0}),
        ]);
        assert_eq!(
            (
                m["nodes"].as_u64(),
                m["joined"].as_u64(),
                m["joinErrors"].as_u64()
            ),
            (Some(30), Some(29), Some(1))
        );
        assert_eq!(m["heartbeatAckP50Ms"].as_f64(), Some(1.5));
        assert_eq!(m["heartbeatAckP99Ms"].as_f64(), Some(7.0));
        assert_eq!(m["heartbeatAckMaxMs"].as_f64(), Some(9.0));
        assert_eq!(m["simulators"].as_u64(), Some(2));
    }
}
