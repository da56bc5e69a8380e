//! `bcctl bench <scenario> --nodes N`: a real `bcctl serve` process and one `bcd sim` process of
//! N simulated agents (real join, certificates, TLS sessions, protocol; synthetic hardware), and
//! the figures an operator sizes a control plane by. Figures come from the store (`state.db`,
//! read-only), the sim's stats file (`bcd sim --stats`: join errors, heartbeat ack latency) and
//! `/proc/<serve pid>/{stat,status}` (CPU ticks in USER_HZ = 100, VmRSS).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

use controlplane_lite::store::{Store, now_ms, tokens};

use super::Output;

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// N agents join at once: time until all are adopted and connected; errors.
    JoinStorm,
    /// N sessions heartbeating: ack latency p50/p99, control-plane CPU and RSS (per session).
    Steady,
    /// `inventory.refresh` to every node: time until all results, p99 per command.
    Fanout,
    /// `nodes.updateSpec` on every node: time until every observedGeneration matches.
    Rollout,
    /// `kill -9` of the control plane and a restart: time until all reconnected; nodes wrongly
    /// marked unreachable.
    Restart,
}

/// `bcctl bench` flags.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// The `bcd` binary (default: next to `bcctl`, then PATH).
    #[arg(long, env = "BCD_BIN")]
    pub bcd: Option<PathBuf>,
    /// Keep the control plane's state here (default: a temporary dir, removed on exit).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Heartbeat interval told to agents.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub heartbeat_interval: Duration,
    /// Measuring window of the steady-state scenario.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub window: Duration,
    /// Give up on a phase after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300s")]
    pub timeout: Duration,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Output,
}

/// Raises the open-file soft limit to the hard limit (one socket per agent session).
pub fn raise_nofile_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Counts over the nodes table.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    total: u64,
    adopted: u64,
    connected: u64,
    converged: u64,
    unreachable: u64,
    /// Connected with a session opened at or after the `since` passed in (ms since the epoch).
    reconnected: u64,
}

/// A running `bcctl serve` plus `bcd sim`.
struct Harness {
    dir: PathBuf,
    /// This `bcctl`, resolved once: a rebuild during a run replaces the file and
    /// `/proc/self/exe` then names a deleted one.
    exe: PathBuf,
    _temp: Option<tempfile::TempDir>,
    bcd: PathBuf,
    nodes: usize,
    serve: Option<Child>,
    sim: Option<Child>,
    gateway_url: String,
    api_url: String,
    ca_pin: String,
    api_token: String,
    token: String,
    heartbeat: Duration,
    db: rusqlite::Connection,
}

fn port_of(url: &str) -> String {
    url.rsplit(':')
        .next()
        .unwrap_or("0")
        .trim_end_matches('/')
        .to_owned()
}

fn pid_of(c: &Child) -> Option<Pid> {
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
    async fn start(args: &BenchArgs) -> anyhow::Result<Self> {
        let bcd = super::dev::find_bcd(args.bcd.clone())?;
        let (dir, temp) = match &args.state_dir {
            Some(d) => (std::path::absolute(d)?, None),
            None => {
                let t = tempfile::Builder::new().prefix("bcctl-bench-").tempdir()?;
                (t.path().to_owned(), Some(t))
            }
        };
        std::fs::create_dir_all(&dir)?;
        let db_path = dir.join("state.db");
        let token = {
            let store = Store::open(&db_path)?;
            super::dev::ensure_dev_pool(&store)?;
            let (_, token) = store.with(|c| {
                tokens::create(
                    c,
                    &tokens::NewToken {
                        pool_id: Some(super::dev::DEV_POOL.to_owned()),
                        ttl_ms: 24 * 3_600_000,
                        // Headroom: a join whose reply was lost retries and re-joins in
                        // place, which spends a use too.
                        max_uses: Some(2 * args.nodes as u64),
                        description: Some("bcctl bench".to_owned()),
                        ..Default::default()
                    },
                    now_ms(),
                )
            })?;
            token
        };
        let db = rusqlite::Connection::open_with_flags(
            &db_path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        db.busy_timeout(Duration::from_secs(10))?;
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
            ca_pin: String::new(),
            api_token: String::new(),
            token,
            heartbeat: args.heartbeat_interval,
            db,
        };
        h.start_serve("127.0.0.1:0", "127.0.0.1:0").await?;
        Ok(h)
    }

    async fn start_serve(&mut self, listen: &str, api: &str) -> anyhow::Result<()> {
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
        self.ca_pin = s("caPin");
        self.api_token = std::fs::read_to_string(self.dir.join("api-token"))?
            .trim()
            .to_owned();
        self.serve = Some(child);
        Ok(())
    }

    fn start_sim(&mut self) -> anyhow::Result<()> {
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

    fn serve_pid(&self) -> Option<u32> {
        self.serve.as_ref().and_then(Child::id)
    }

    fn sim_stats(&self) -> Value {
        std::fs::read_to_string(self.dir.join("sim-stats.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(Value::Null)
    }

    fn counts(&self, since_ms: i64) -> anyhow::Result<Counts> {
        let c = self.db.query_row(
            "SELECT count(*), \
                coalesce(sum(provision_state = 'adopted'), 0), \
                coalesce(sum(connectivity = 'connected'), 0), \
                coalesce(sum(observed_generation >= generation), 0), \
                coalesce(sum(connectivity IN ('unreachable', 'lost')), 0), \
                coalesce(sum(connectivity = 'connected' AND connected_at >= ?1), 0) \
             FROM nodes",
            [since_ms],
            |r| {
                Ok(Counts {
                    total: r.get(0)?,
                    adopted: r.get(1)?,
                    connected: r.get(2)?,
                    converged: r.get(3)?,
                    unreachable: r.get(4)?,
                    reconnected: r.get(5)?,
                })
            },
        )?;
        Ok(c)
    }

    /// Polls until `done(counts)`; returns the seconds it took from `t0`.
    async fn wait_for(
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

    async fn stop(&mut self) {
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

    fn client(&self) -> controlplane_lite::client::Client {
        controlplane_lite::client::Client::new(self.api_url.clone(), self.api_token.clone())
    }

    fn node_ids(&self) -> anyhow::Result<Vec<(String, u64)>> {
        let mut st = self
            .db
            .prepare("SELECT id, version FROM nodes ORDER BY id")?;
        let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    json!({"cpus": cpus, "cpuModel": model, "memTotal": mem, "kernel": kernel})
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The join storm every scenario starts with; fills `out`.
async fn join_storm(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let n = args.nodes as u64;
    let base = h.serve_pid().and_then(proc_usage);
    let t0 = Instant::now();
    h.start_sim()?;
    let mut peak_rss = 0u64;
    let pid = h.serve_pid();
    let adopted = h
        .wait_for(
            "all nodes adopted",
            t0,
            args.timeout,
            0,
            |_, _| {
                if let Some((_, rss)) = pid.and_then(proc_usage) {
                    peak_rss = peak_rss.max(rss);
                }
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
    let after = h.serve_pid().and_then(proc_usage);
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
    if let (Some((t0c, rss0)), Some((t1c, _))) = (base, after) {
        #[allow(clippy::cast_precision_loss)]
        let cpu_s = (t1c.saturating_sub(t0c)) as f64 / 100.0;
        out.insert("joinServeCpuS".into(), json!(round2(cpu_s)));
        out.insert("serveRssBeforeMiB".into(), json!(rss0 / (1 << 20)));
        out.insert("joinServePeakRssMiB".into(), json!(peak_rss / (1 << 20)));
    }
    Ok(())
}

async fn steady(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
    rss_base: u64,
) -> anyhow::Result<()> {
    // Let the join storm's inventory writes drain, then measure one clean window.
    tokio::time::sleep(args.heartbeat_interval.min(Duration::from_secs(5))).await;
    if let Some(pid) = h.sim.as_ref().and_then(pid_of) {
        let _ = kill(pid, Signal::SIGUSR1);
    }
    let pid = h.serve_pid().context("serve is not running")?;
    let (c0, _) = proc_usage(pid).context("reading /proc of serve")?;
    let t0 = Instant::now();
    let mut max_rss = 0u64;
    while t0.elapsed() < args.window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some((_, r)) = proc_usage(pid) {
            max_rss = max_rss.max(r);
        }
    }
    let (c1, rss) = proc_usage(pid).context("reading /proc of serve")?;
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
    Ok(())
}

async fn restart(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let n = args.nodes as u64;
    let listen = format!("127.0.0.1:{}", port_of(&h.gateway_url));
    let api = format!("127.0.0.1:{}", port_of(&h.api_url));
    let t_kill = now_ms();
    let t0 = Instant::now();
    if let Some(mut s) = h.serve.take() {
        let _ = s.start_kill();
        let _ = s.wait().await;
    }
    h.start_serve(&listen, &api).await?;
    let up = t0.elapsed().as_secs_f64();
    let mut series: Vec<(f64, u64)> = Vec::new();
    let mut wrongly_unreachable = 0u64;
    let settled = h
        .wait_for(
            "all nodes reconnected",
            t0,
            args.timeout,
            t_kill,
            |t, c| {
                wrongly_unreachable = wrongly_unreachable.max(c.unreachable);
                series.push((round2(t), c.reconnected));
            },
            |c| c.reconnected >= n,
        )
        .await?;
    // Watch a little longer: a node marked unreachable late still counts.
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_secs(3) {
        wrongly_unreachable = wrongly_unreachable.max(h.counts(t_kill)?.unreachable);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Keep the series small: at most ~100 points.
    let step = (series.len() / 100).max(1);
    let series: Vec<Value> = series
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i + 1 == series.len())
        .map(|(_, (t, c))| json!([t, c]))
        .collect();
    out.insert("restartServeUpS".into(), json!(round2(up)));
    out.insert("restartAllReconnectedS".into(), json!(round2(settled)));
    out.insert("wronglyUnreachable".into(), json!(wrongly_unreachable));
    out.insert("reconnectSeries".into(), Value::Array(series));
    Ok(())
}

async fn fanout(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let ids = h.node_ids()?;
    let client = h.client();
    let since = now_ms();
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    for (id, _) in ids {
        let c = client.clone();
        let sem = std::sync::Arc::clone(&sem);
        set.spawn(async move {
            let _permit = sem.acquire().await;
            c.call::<_, Value>("commands.create", &json!({"nodeId": id, "name": "inventory.refresh", "args": {}, "timeoutSeconds": 600}))
                .await
                .map(|_| ())
        });
    }
    let mut create_errors = 0u64;
    while let Some(r) = set.join_next().await {
        if !matches!(r, Ok(Ok(()))) {
            create_errors += 1;
        }
    }
    let created = t0.elapsed().as_secs_f64();
    let n = args.nodes as u64;
    loop {
        let done: u64 = h.db.query_row(
            "SELECT count(*) FROM commands WHERE name = 'inventory.refresh' AND created_at >= ?1 AND state = 'succeeded'",
            [since],
            |r| r.get(0),
        )?;
        if done + create_errors >= n {
            break;
        }
        if t0.elapsed() > args.timeout {
            bail!("fan-out: {done} of {n} results in {:?}", args.timeout);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all = t0.elapsed().as_secs_f64();
    let mut st = h.db.prepare(
        "SELECT finished_at - created_at FROM commands WHERE name = 'inventory.refresh' AND created_at >= ?1 AND finished_at IS NOT NULL ORDER BY 1",
    )?;
    let lat: Vec<i64> = st
        .query_map([since], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
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

async fn rollout(
    h: &mut Harness,
    args: &BenchArgs,
    out: &mut serde_json::Map<String, Value>,
) -> anyhow::Result<()> {
    let ids = h.node_ids()?;
    let client = h.client();
    let t0 = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    for (id, version) in ids {
        let c = client.clone();
        let sem = std::sync::Arc::clone(&sem);
        set.spawn(async move {
            let _permit = sem.acquire().await;
            c.call::<_, Value>(
                "nodes.updateSpec",
                &json!({"nodeId": id, "version": version, "spec": {"devices": {"gpus": []}}}),
            )
            .await
            .map(|_| ())
        });
    }
    let mut update_errors = 0u64;
    let mut first_error = None;
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                update_errors += 1;
                first_error.get_or_insert(e.to_string());
            }
            Err(e) => {
                update_errors += 1;
                first_error.get_or_insert(e.to_string());
            }
        }
    }
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
    let gens: u64 =
        h.db.query_row("SELECT coalesce(min(generation), 0) FROM nodes", [], |r| {
            r.get(0)
        })?;
    out.insert("rolloutUpdatedS".into(), json!(round2(updated)));
    out.insert("rolloutAllObservedS".into(), json!(round2(all)));
    out.insert("rolloutMinGeneration".into(), json!(gens));
    out.insert("rolloutUpdateErrors".into(), json!(update_errors));
    if let Some(e) = first_error {
        out.insert("rolloutFirstError".into(), json!(e));
    }
    Ok(())
}

/// Runs `bcctl bench`.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    raise_nofile_limit();
    let mut h = Harness::start(&args).await?;
    let rss_base = h.serve_pid().and_then(proc_usage).map_or(0, |(_, r)| r);
    let mut out = serde_json::Map::new();
    let scenario = clap::ValueEnum::to_possible_value(&args.scenario)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    out.insert("scenario".into(), json!(scenario));
    out.insert("nodes".into(), json!(args.nodes));
    out.insert(
        "heartbeatIntervalS".into(),
        json!(args.heartbeat_interval.as_secs_f64()),
    );
    out.insert("machine".into(), machine());
    let result = async {
        join_storm(&mut h, &args, &mut out).await?;
        match args.scenario {
            Scenario::JoinStorm => {}
            Scenario::Steady => steady(&mut h, &args, &mut out, rss_base).await?,
            Scenario::Fanout => fanout(&mut h, &args, &mut out).await?,
            Scenario::Rollout => rollout(&mut h, &args, &mut out).await?,
            Scenario::Restart => restart(&mut h, &args, &mut out).await?,
        }
        anyhow::Ok(())
    }
    .await;
    let stats = h.sim_stats();
    h.stop().await;
    if let Err(e) = result {
        bail!(
            "{e:#}\n(state dir {}; see serve.log and sim.log there)",
            h.dir.display()
        );
    }
    out.insert("sim".into(), stats);
    let out = Value::Object(out);
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    Ok(())
}

fn print_table(v: &Value) {
    let Some(o) = v.as_object() else { return };
    for (k, val) in o {
        match (k.as_str(), val) {
            ("reconnectSeries" | "sim", _) => {}
            ("machine", Value::Object(m)) => {
                for (mk, mv) in m {
                    println!("{:<28} {}", format!("machine.{mk}"), mv);
                }
            }
            _ => println!("{k:<28} {val}"),
        }
    }
}

/// `bcctl dev --sim N`: a `bcctl serve` process and N simulated agents; waits until all are
/// adopted, connected and converged, prints the join figures, then runs until Ctrl-C (or exits
/// with `--once`).
pub async fn dev_sim(dev: &super::dev::DevArgs, nodes: usize) -> anyhow::Result<()> {
    raise_nofile_limit();
    let args = BenchArgs {
        scenario: Scenario::JoinStorm,
        nodes,
        bcd: dev.bcd.clone(),
        state_dir: dev.state_dir.clone(),
        heartbeat_interval: dev.heartbeat_interval,
        window: Duration::from_secs(0),
        timeout: dev.timeout,
        output: Output::Table,
    };
    let mut h = Harness::start(&args).await?;
    println!(
        "control plane: gateway {}  api {}",
        h.gateway_url, h.api_url
    );
    println!("state:         {}", h.dir.display());
    println!(
        "operator API:  bcctl --state-dir {} nodes list",
        h.dir.display()
    );
    let mut out = serde_json::Map::new();
    if let Err(e) = join_storm(&mut h, &args, &mut out).await {
        h.stop().await;
        bail!("{e:#}\n(see serve.log and sim.log in {})", h.dir.display());
    }
    println!("\n{nodes} simulated nodes adopted, connected and converged:\n");
    print_table(&Value::Object(out));
    if !dev.once {
        println!("\nrunning; Ctrl-C stops the simulator and the control plane");
        let _ = tokio::signal::ctrl_c().await;
    }
    h.stop().await;
    println!("stopped");
    Ok(())
}
