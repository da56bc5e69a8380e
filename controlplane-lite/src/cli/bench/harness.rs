//! The bench's processes: a real `bcctl serve` and one `bcd sim`, and what is read off them (the
//! store, read-only; the sim's stats file; `/proc/<pid>`).

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

/// A running `bcctl serve` plus `bcd sim`.
pub(super) struct Harness {
    pub(super) dir: PathBuf,
    /// This `bcctl`, resolved once: a rebuild during a run replaces the file and
    /// `/proc/self/exe` then names a deleted one.
    pub(super) exe: PathBuf,
    pub(super) _temp: Option<tempfile::TempDir>,
    pub(super) bcd: PathBuf,
    pub(super) nodes: usize,
    pub(super) serve: Option<Child>,
    pub(super) sim: Option<Child>,
    pub(super) gateway_url: String,
    pub(super) api_url: String,
    /// `bcctl serve`'s Prometheus endpoint (`--metrics-listen 127.0.0.1:0`).
    pub(super) metrics_url: String,
    pub(super) ca_pin: String,
    pub(super) api_token: String,
    pub(super) token: String,
    pub(super) heartbeat: Duration,
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
    pub(super) async fn start(args: &BenchArgs) -> anyhow::Result<Self> {
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
        let mut h = Self {
            exe: std::env::current_exe().context("locating bcctl")?,
            dir,
            _temp: temp,
            bcd,
            nodes: args.nodes,
            serve: None,
            sim: None,
            gateway_url: String::new(),
            api_url: String::new(),
            metrics_url: String::new(),
            ca_pin: String::new(),
            api_token: String::new(),
            token,
            heartbeat: args.heartbeat_interval,
            db,
            store_url: args.store.clone(),
        };
        h.start_serve("127.0.0.1:0", "127.0.0.1:0").await?;
        Ok(h)
    }

    pub(super) async fn start_serve(&mut self, listen: &str, api: &str) -> anyhow::Result<()> {
        let ep_path = self.dir.join("endpoints.json");
        let _ = std::fs::remove_file(&ep_path);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("serve.log"))?;
        let mut child = Command::new(&self.exe)
            .arg("serve")
            .arg("--state-dir")
            .arg(&self.dir)
            .args(["--listen", listen, "--api-listen", api])
            .args(["--join-attempts-per-minute", "0"])
            // Every simulated agent connects from 127.0.0.1: no per-address cap, and no total
            // cap beyond the file-descriptor check the bench makes itself.
            .args(["--gateway-max-connections-per-address", "0"])
            .args(["--gateway-max-connections", "0"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(self.store_url.iter().flat_map(|u| ["--store", u.as_str()]))
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
                    self.dir.join("serve.log").display()
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
        self.gateway_url = s("gatewayUrl");
        self.api_url = s("apiUrl");
        self.metrics_url = s("metricsUrl");
        self.ca_pin = s("caPin");
        self.api_token = std::fs::read_to_string(self.dir.join("api-token"))?
            .trim()
            .to_owned();
        self.serve = Some(child);
        Ok(())
    }

    pub(super) fn start_sim(&mut self) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join("sim.log"))?;
        let child = Command::new(&self.bcd)
            .arg("sim")
            .args(["--control-plane", &self.gateway_url])
            .args(["--ca-pin", &self.ca_pin])
            .args(["--join-token", &self.token])
            .args(["--nodes", &self.nodes.to_string()])
            .arg("--stats")
            .arg(self.dir.join("sim-stats.json"))
            .env("BCD_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} sim", self.bcd.display()))?;
        self.sim = Some(child);
        Ok(())
    }

    pub(super) fn serve_pid(&self) -> Option<u32> {
        self.serve.as_ref().and_then(Child::id)
    }

    pub(super) fn sim_stats(&self) -> Value {
        std::fs::read_to_string(self.dir.join("sim-stats.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
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
            if let Some(sim) = self.sim.as_mut()
                && let Some(st) = sim.try_wait()?
            {
                bail!("bcd sim exited ({st}) while waiting for {what}");
            }
            if t0.elapsed() > timeout {
                bail!("{what}: not reached in {timeout:?} (last counts {c:?})");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(super) async fn stop(&mut self) {
        for c in [self.sim.take(), self.serve.take()].into_iter().flatten() {
            let mut c = c;
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

    pub(super) fn client(&self) -> controlplane_lite::client::Client {
        controlplane_lite::client::Client::new(self.api_url.clone(), self.api_token.clone())
    }

    pub(super) fn node_ids(&self) -> anyhow::Result<Vec<(String, u64)>> {
        Ok(self.db.read_blocking(|r| r.node_versions())?)
    }
}
