//! `bcctl bench <scenario> --nodes N`: a real `bcctl serve` process and one `bcd sim` process of
//! N simulated agents (real join, certificates, TLS sessions, protocol; synthetic hardware), and
//! the figures an operator sizes a control plane by. Figures come from the store (`state.db`,
//! read-only), the sim's stats file (`bcd sim --stats`: join errors, heartbeat ack latency) and
//! `/proc/<serve pid>/{stat,status}` (CPU ticks in USER_HZ = 100, VmRSS).

mod chart;
mod harness;
mod remediation;
mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use serde_json::{Value, json};

use super::Output;
use harness::Harness;
use remediation::remediation;
use scenarios::{fanout, join_storm, restart, rollout, steady};

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
    /// `--fault-fraction` of the nodes report `--fault-xid` at once in a pool whose remediation
    /// is `auto`: time until the circuit breaker trips, remediations started against its limit,
    /// false remediations and commands to healthy nodes.
    Remediation,
    /// Runs nothing: draws `--chart` from earlier `restart -o json` results given with `--input`.
    Chart,
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
    /// Run `bcctl serve --store URL` (a PostgreSQL database, `postgres://…`) instead of the state
    /// dir's state.db. Use an empty database: the bench's nodes stay in it.
    #[arg(long)]
    pub store: Option<String>,
    /// Control-plane replicas on the `--store` database (more than 1 needs `--store`): every
    /// simulated node knows every replica's gateway and tries them in its own shuffled order.
    /// `restart` then kills the replica leading the controllers and starts it again.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// `bcctl serve --controller-lease-ttl` of every replica (default: serve's, 10 s): how long
    /// a dead leader's lease lasts.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub controller_lease_ttl: Option<Duration>,
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
    /// Draw the restart storm (connected and unreachable nodes over time) into this PNG
    /// (`restart` and `chart` only).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// A TrueType font for the chart's text (default: DejaVu Sans from the usual paths).
    #[arg(long)]
    pub font: Option<PathBuf>,
    /// `chart` only: results of `bcctl bench restart -o json` to draw, one pair of curves each.
    #[arg(long)]
    pub input: Vec<PathBuf>,
    /// `remediation` only: the XID the faulted nodes report (`bcd sim --fault-xid`; 79, fallen
    /// off the bus, calls for a reboot a simulated node cannot do, so its remediations stay open).
    #[arg(long, default_value_t = 79)]
    pub fault_xid: u64,
    /// `remediation` only: the share of the nodes that fault (`bcd sim --fault-fraction`).
    #[arg(long, default_value_t = 0.3)]
    pub fault_fraction: f64,
    /// `remediation` only: the pool's `maxConcurrent` (N).
    #[arg(long, default_value_t = 4)]
    pub remediation_max_concurrent: u32,
    /// `remediation` only: the pool's `maxConcurrentPercent` (P).
    #[arg(long, default_value_t = 10)]
    pub remediation_max_percent: u32,
}

/// `bcctl bench chart --input A.json [--input B.json] --chart out.png`.
fn chart_from_files(args: &BenchArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let Some(png) = &args.chart else {
        bail!("`bcctl bench chart` needs --chart FILE.png");
    };
    if args.input.is_empty() {
        bail!(
            "`bcctl bench chart` needs at least one --input FILE.json (from `bcctl bench restart -o json`)"
        );
    }
    let mut runs = Vec::new();
    for path in &args.input {
        // A result file is a few KiB; cap the read so `--input /dev/zero` is an error.
        let bytes = chart::read_capped(path, 64 << 20, "bench result")?;
        let v: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        runs.push(chart::RestartSeries::from_result(run_label(&v), &v)?);
    }
    chart::draw(&runs, CHART_TITLE, png, args.font.as_deref())?;
    println!("wrote {}", png.display());
    Ok(())
}

const CHART_TITLE: &str = "Restart storm: nodes reconnected after kill -9 of bcctl serve";

fn run_label(v: &Value) -> String {
    let n = v.get("nodes").and_then(Value::as_u64).unwrap_or(0);
    format!("{n} nodes")
}

/// Raises the open-file limit towards `want` descriptors (one socket per agent session): the
/// soft limit to the hard one, and both to `want` where the process may (root, up to
/// `fs.nr_open`). Children (`bcctl serve`, `bcd sim`) inherit it. Returns the soft limit now.
pub fn raise_nofile_limit(want: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if want > hard && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
        return want;
    }
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(s, _)| s)
}

/// Open files `nodes` sessions need in one process: a socket each, plus margin for the store,
/// logs, the API and the runtime.
fn files_needed(nodes: usize) -> u64 {
    (nodes as u64).saturating_add(512)
}

/// Ephemeral ports the kernel hands out for loopback connections
/// (`/proc/sys/net/ipv4/ip_local_port_range`): every simulated session holds one.
fn ephemeral_ports() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    let (lo, hi) = (it.next()?.ok()?, it.next()?.ok()?);
    Some(hi.saturating_sub(lo) + 1)
}

/// Sessions one replica of `replicas` must be able to hold: all of them with one replica; with
/// several, a survivor's share once one replica died (the restart scenario moves the dead one's
/// nodes to the others), plus 10 % for the shuffles' unevenness.
fn sessions_per_replica(nodes: usize, replicas: usize) -> usize {
    if replicas <= 1 {
        nodes
    } else {
        let share = nodes.div_ceil(replicas - 1);
        share.saturating_add(share / 10).min(nodes)
    }
}

/// Refuses a fleet the open-file limit or the loopback ports cannot hold, before anything
/// starts. Returns how many `bcd sim` processes to run: enough that each holds at most the
/// sessions one process may open.
fn check_nofile(nodes: usize, replicas: usize) -> anyhow::Result<usize> {
    if nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    if replicas == 0 {
        bail!("--replicas must be at least 1");
    }
    // Loopback connections to one gateway port each need their own ephemeral port (the 4-tuple
    // differs only there); connections to different replicas' ports may share them.
    let per_replica = sessions_per_replica(nodes, replicas);
    if let Some(ports) = ephemeral_ports()
        && per_replica as u64 > ports
    {
        bail!(
            "{per_replica} simulated sessions to one gateway over loopback need as many ephemeral \
             ports; net.ipv4.ip_local_port_range gives {ports}: widen it or add --replicas"
        );
    }
    let need = files_needed(per_replica);
    let limit = raise_nofile_limit(need);
    if limit < need {
        bail!(
            "{per_replica} sessions on one `bcctl serve` need about {need} open files (one socket \
             per session); RLIMIT_NOFILE allows {limit}: raise it (`ulimit -n`, LimitNOFILE=, or \
             run as root), add --replicas, or simulate fewer nodes"
        );
    }
    // A simulator holds a socket per node: split the nodes so each fits.
    let per_sim = usize::try_from(limit.saturating_sub(512))
        .unwrap_or(usize::MAX)
        .max(1);
    Ok(nodes.div_ceil(per_sim))
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

/// Runs `bcctl bench`.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.scenario == Scenario::Chart {
        return chart_from_files(&args);
    }
    if let Some(png) = &args.chart {
        if args.scenario != Scenario::Restart {
            bail!(
                "--chart draws the restart storm: use it with `bcctl bench restart` (or `chart`)"
            );
        }
        // Before a run that may take minutes, not after it.
        chart::prepare(png, args.font.as_deref())?;
    }
    if args.replicas > 1 && args.store.is_none() {
        bail!(
            "--replicas {} needs --store postgres://… (replicas share one database)",
            args.replicas
        );
    }
    let sims = check_nofile(args.nodes, args.replicas)?;
    let mut h = Harness::start(&args, sims).await?;
    if args.scenario == Scenario::Remediation {
        h.sim_extra = vec![
            "--fault-xid".into(),
            args.fault_xid.to_string(),
            "--fault-fraction".into(),
            args.fault_fraction.to_string(),
        ];
    }
    let rss_base = h.serve_usage().map_or(0, |(_, r)| r);
    let mut out = serde_json::Map::new();
    let scenario = clap::ValueEnum::to_possible_value(&args.scenario)
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    out.insert("scenario".into(), json!(scenario));
    out.insert("nodes".into(), json!(args.nodes));
    out.insert("replicas".into(), json!(args.replicas));
    out.insert("store".into(), json!(h.db.backend_name()));
    out.insert("simulators".into(), json!(sims));
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
            Scenario::Remediation => remediation(&mut h, &args, &mut out).await?,
            Scenario::Chart => {}
        }
        anyhow::Ok(())
    }
    .await;
    let stats = h.sim_stats();
    h.stop().await;
    if let Err(e) = result {
        // A temporary state dir would vanish with the logs that explain the failure.
        if let Some(t) = h._temp.take() {
            let _ = t.keep();
        }
        bail!(
            "{e:#}\n(state dir {} kept; see serve.log, replica-*/serve.log and sim-*.log there)",
            h.dir.display()
        );
    }
    out.insert("sim".into(), stats);
    let out = Value::Object(out);
    // The figures first: a chart that fails to draw must not lose a finished run.
    if args.output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&out);
    }
    if let Some(png) = &args.chart {
        let run = chart::RestartSeries::from_result(run_label(&out), &out)?;
        chart::draw(&[run], CHART_TITLE, png, args.font.as_deref())?;
        eprintln!("chart: {}", png.display());
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
    let sims = check_nofile(nodes, 1)?;
    let args = BenchArgs {
        scenario: Scenario::JoinStorm,
        nodes,
        bcd: dev.bcd.clone(),
        state_dir: dev.state_dir.clone(),
        store: None,
        replicas: 1,
        controller_lease_ttl: None,
        heartbeat_interval: dev.heartbeat_interval,
        window: Duration::from_secs(0),
        timeout: dev.timeout,
        output: Output::Table,
        chart: None,
        font: None,
        input: Vec::new(),
        fault_xid: 79,
        fault_fraction: 0.0,
        remediation_max_concurrent: 4,
        remediation_max_percent: 10,
    };
    let mut h = Harness::start(&args, sims).await?;
    println!(
        "control plane: gateway {}  api {}",
        h.gateway_url(),
        h.serves.first().map_or("", |s| s.api_url.as_str())
    );
    println!("state:         {}", h.dir.display());
    println!(
        "operator API:  bcctl nodes list --state-dir {}",
        h.dir.display()
    );
    let mut out = serde_json::Map::new();
    if let Err(e) = join_storm(&mut h, &args, &mut out).await {
        h.stop().await;
        bail!(
            "{e:#}\n(see serve.log and sim-*.log in {})",
            h.dir.display()
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_must_hold_a_survivors_share() {
        assert_eq!(sessions_per_replica(30_000, 1), 30_000);
        // One of three died: 15,000 each on the other two, plus 10 %.
        assert_eq!(sessions_per_replica(30_000, 3), 16_500);
        // One of two died: the other holds everyone.
        assert_eq!(sessions_per_replica(30_000, 2), 30_000);
        assert_eq!(sessions_per_replica(10, 3), 5);
    }
}
