//! `bcd sim`: N simulated node agents in one process, for sizing a control plane. Each one is a
//! real client of the control plane and runs the session core every mode runs
//! ([`bcd_core::lifecycle::run`]): its own ECDSA P-256 key, CSR and certificate from the Join RPC
//! (verified through the CA pin), its own mutual-TLS session, and the same Hello, Welcome,
//! Inventory, heartbeats, Spec handling and command executor as `bcd agent`. Only the machine is
//! synthetic (`node::SimMachine`: a distinct hardware key per node, fake GPUs, specs converged
//! at once, commands answered at once) and the identity and journal live in memory: no state
//! dir, no converge task, one task per node (plus one per command while it runs).
//!
//! Figures the control plane cannot see (join errors, heartbeat ack latency) are written as JSON
//! to `--stats` every second ([`stats::Snapshot`]); SIGUSR1 clears the latency samples so a
//! benchmark can measure one window.
//!
//! `--fault-xid N --fault-fraction F` makes the first `round(F × nodes)` nodes fail: once faults
//! start (`--fault-after`, or SIGUSR2), each reports XID N on its first GPU through the same
//! `xid` Event the agent's XID watch sends, and answers `diag.nvml` and `gpu.reset` as a machine
//! with that fault would ([`fault`]). The stats count the commands each share received.

pub mod fault;
mod node;
pub mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

/// `bcd sim` flags.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Gateway URL, e.g. `https://127.0.0.1:7443`; several (one per control-plane replica)
    /// comma-separated or as repeated flags: each node tries them in its own shuffled order.
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_control_plane)]
    pub control_plane: Vec<String>,
    /// `sha256:<hex>` of the control plane CA's SubjectPublicKeyInfo.
    #[arg(long)]
    pub ca_pin: String,
    /// Join token (must allow `--nodes` uses).
    #[arg(long)]
    pub join_token: String,
    /// How many simulated nodes.
    #[arg(long, default_value_t = 10)]
    pub nodes: usize,
    /// GPUs per simulated node.
    #[arg(long, default_value_t = 8)]
    pub gpus: usize,
    /// Where to write the stats JSON (every second, and at exit).
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// Base of the reconnect backoff (full jitter, doubling to `--backoff-cap`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub backoff_base: Duration,
    /// Ceiling of the reconnect backoff.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub backoff_cap: Duration,
    /// XID the faulted nodes report on their first GPU once faults start (48: a reset heals it;
    /// 79: fallen off the bus, a reboot's). Without it no node faults.
    #[arg(long)]
    pub fault_xid: Option<u64>,
    /// Share of the nodes that fault, 0 to 1: the first `round(F × nodes)` (hostnames
    /// `sim-<run>-00000` on).
    #[arg(long, default_value_t = 0.3, value_parser = fault::parse_fraction)]
    pub fault_fraction: f64,
    /// When faults start, from the simulator's start. SIGUSR2 starts them at once; without
    /// this flag only SIGUSR2 does.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub fault_after: Option<Duration>,
}

impl SimArgs {
    /// How many nodes fault (none without `--fault-xid`).
    pub fn faulted_nodes(&self) -> usize {
        if self.fault_xid.is_some() {
            fault::faulted_count(self.fault_fraction, self.nodes)
        } else {
            0
        }
    }
}

/// `--control-plane`'s value parser: one URL of the list, trimmed and checked.
fn parse_control_plane(url: &str) -> Result<String, bcd_core::endpoints::EndpointError> {
    let url = url.trim();
    bcd_core::endpoints::check_url(url)?;
    Ok(url.to_owned())
}

/// Why the simulator could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("bad CA pin {pin}: {source}")]
    Pin {
        pin: String,
        source: bcd_core::tls::TlsError,
    },
    #[error("writing stats to {path}: {source}")]
    Stats {
        path: PathBuf,
        source: bc_sys::atomic::AtomicWriteError,
    },
    #[error("installing the signal handler: {0}")]
    Signal(std::io::Error),
    /// RLIMIT_NOFILE cannot hold a socket per simulated node.
    #[error(
        "{nodes} simulated nodes need about {need} open files (a socket each); RLIMIT_NOFILE allows {limit}: raise it (ulimit -n, LimitNOFILE=, or run as root) or simulate fewer nodes"
    )]
    TooFewFiles { nodes: usize, need: u64, limit: u64 },
}

/// Raises the open-file limit towards `want` (every session is a socket): the soft limit to the
/// hard one, and both to `want` where the process may (root, up to `fs.nr_open`). Returns the
/// soft limit now.
pub fn raise_nofile_limit(want: u64) -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if want > hard && setrlimit(Resource::RLIMIT_NOFILE, want, want).is_ok() {
        return Some(want);
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).ok()?;
    Some(hard)
}

/// Runs the simulator until SIGTERM or Ctrl-C.
pub async fn run(args: SimArgs) -> Result<(), SimError> {
    bcd_core::tls::parse_pin(&args.ca_pin).map_err(|source| SimError::Pin {
        pin: args.ca_pin.clone(),
        source,
    })?;
    // A socket per node, plus margin for the runtime, logs and the stats file.
    let need = args.nodes as u64 + 256;
    let limit = raise_nofile_limit(need);
    if let Some(limit) = limit.filter(|l| *l < need) {
        return Err(SimError::TooFewFiles {
            nodes: args.nodes,
            need,
            limit,
        });
    }
    tracing::info!(nodes = args.nodes, nofile = ?limit, "simulating nodes");
    let stats = Arc::new(stats::Stats::default());
    let run_id = format!("{:08x}", rand::random::<u32>());
    let args = Arc::new(args);
    // Nodes stop when the process does (their tasks are aborted, as a crash would): no
    // Goodbye, so a benchmark sees the control plane's view of vanished agents. The sender stays
    // alive until then.
    let (_never_stop, stop) = tokio::sync::watch::channel(false);
    let (start_faults, faults) = tokio::sync::watch::channel(false);
    let faulted = args.faulted_nodes();
    if faulted > 0 {
        tracing::info!(faulted, xid = ?args.fault_xid, after = ?args.fault_after, "fault injection armed (SIGUSR2 starts it)");
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.nodes {
        let fault = args.fault_xid.filter(|_| i < faulted);
        let machine = node::SimMachine::new(&run_id, i, args.gpus, fault, Arc::clone(&stats));
        tasks.spawn(node::run(
            machine,
            Arc::clone(&args),
            Arc::clone(&stats),
            faults.clone(),
            stop.clone(),
        ));
    }
    let begin_faults = || {
        if !*start_faults.borrow() {
            stats.faults_started_at_ms.store(
                chrono::Utc::now().timestamp_millis(),
                std::sync::atomic::Ordering::Relaxed,
            );
            tracing::info!(faulted, "faults start");
            start_faults.send_replace(true);
        }
    };
    let fault_timer = tokio::time::sleep(args.fault_after.unwrap_or(Duration::ZERO));
    tokio::pin!(fault_timer);
    let mut timer_armed = args.fault_after.is_some();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(SimError::Signal)?;
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
        .map_err(SimError::Signal)?;
    let mut usr2 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined2())
        .map_err(SimError::Signal)?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = usr1.recv() => stats.clear_latencies(),
            _ = usr2.recv() => begin_faults(),
            _ = &mut fault_timer, if timer_armed => {
                timer_armed = false;
                begin_faults();
            }
            _ = tick.tick() => {
                // A stats file that cannot be written this second (a full disk) is not a reason
                // to drop thousands of sessions; the next tick tries again.
                if let Err(e) = write_stats(&args, &stats) {
                    tracing::warn!(error = %e, "stats not written");
                }
            }
        }
    }
    tasks.abort_all();
    write_stats(&args, &stats)?;
    Ok(())
}

fn write_stats(args: &SimArgs, stats: &stats::Stats) -> Result<(), SimError> {
    let Some(path) = &args.stats else {
        return Ok(());
    };
    let snap = stats.snapshot(args.nodes, args.faulted_nodes());
    let text = serde_json::to_vec(&snap).unwrap_or_default();
    bc_sys::atomic::write(path, &text, 0o644).map_err(|source| SimError::Stats {
        path: path.clone(),
        source,
    })
}
