//! Benchmark: wall time and peak RSS of `bcd inventory -o json` beside `lshw -json`, measured in
//! the same run on this machine, plus the in-process cost of `inventory::collect` and
//! `hwkey::compute` (what the agent pays at start and on every `inventory.refresh`).
//!
//! Run: `cargo bench -p bcd --bench inventory`. Prints figures; asserts nothing.
//!
//! With `BC_IPA_PYTHON` set to the `python` of a virtualenv holding ironic-python-agent (and
//! `lshw` and `udevadm` on the machine, which it runs), it also measures IPA's
//! `GenericHardwareManager.list_hardware_info()` in the same run, LLDP off on both sides (IPA's
//! default, and `bcd inventory` without `--lldp-wait`): docs/benchmarks.md.
//!
//! Each external command is measured by a fresh copy of this program (`BCD_BENCH_MEASURE=1`) that
//! spawns it, waits, and reads `getrusage(RUSAGE_CHILDREN)`: the peak RSS of that one child.

use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bcd_probes::hostroot::HostRoot;
use nix::sys::resource::{UsageWho, getrusage};

const RUNS: usize = 15;
const IN_PROCESS_RUNS: usize = 200;
const MEASURE_ENV: &str = "BCD_BENCH_MEASURE";
/// The Python program that asks ironic-python-agent for what its inspection reports: its
/// configuration loaded as the agent loads it, then the generic hardware manager's inventory.
const IPA_PROGRAM: &str = "from oslo_config import cfg\n\
from ironic_python_agent import config, hardware\n\
config.populate_config()\n\
cfg.CONF([], project='ironic-python-agent')\n\
hardware.GenericHardwareManager().list_hardware_info()\n";

/// Child mode: run argv[1..], print `<wall_us> <maxrss_kib>`.
fn measure_child(cmd: &[String]) -> ExitCode {
    let Some((prog, args)) = cmd.split_first() else {
        return ExitCode::FAILURE;
    };
    let start = Instant::now();
    let status = Command::new(prog)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let wall = start.elapsed();
    match (status, getrusage(UsageWho::RUSAGE_CHILDREN)) {
        (Ok(s), Ok(u)) if s.success() => {
            println!("{} {}", wall.as_micros(), u.max_rss());
            ExitCode::SUCCESS
        }
        _ => ExitCode::FAILURE,
    }
}

struct Figures {
    median: Duration,
    min: Duration,
    peak_rss_kib: i64,
}

fn measure(cmd: &[&str]) -> Option<Figures> {
    let me = std::env::current_exe().ok()?;
    let mut walls = Vec::new();
    let mut rss = 0i64;
    for _ in 0..RUNS {
        let out = Command::new(&me)
            .env(MEASURE_ENV, "1")
            .args(cmd)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace();
        let us: u64 = it.next()?.parse().ok()?;
        let kib: i64 = it.next()?.parse().ok()?;
        walls.push(Duration::from_micros(us));
        rss = rss.max(kib);
    }
    walls.sort();
    Some(Figures {
        median: walls[walls.len() / 2],
        min: walls[0],
        peak_rss_kib: rss,
    })
}

fn in_process<T>(f: impl Fn() -> T) -> (Duration, Duration) {
    let mut v: Vec<Duration> = (0..IN_PROCESS_RUNS)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(f());
            s.elapsed()
        })
        .collect();
    v.sort();
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() -> ExitCode {
    if std::env::var_os(MEASURE_ENV).is_some() {
        let cmd: Vec<String> = std::env::args().skip(1).collect();
        return measure_child(&cmd);
    }
    let bcd = env!("CARGO_BIN_EXE_bcd");
    println!("inventory benchmark: {RUNS} runs each, median (min) wall time, peak RSS");
    let ours = measure(&[bcd, "inventory", "-o", "json"]);
    let lshw = measure(&["lshw", "-json"]);
    let ipa_python = std::env::var("BC_IPA_PYTHON")
        .ok()
        .filter(|p| !p.is_empty());
    let ipa = ipa_python
        .as_deref()
        .and_then(|py| measure(&[py, "-c", IPA_PROGRAM]));
    let row = |name: &str, f: &Option<Figures>| match f {
        Some(f) => println!(
            "  {name:<24} {:>10} ({:>10})  {:>8.1} MiB",
            ms(f.median),
            ms(f.min),
            f.peak_rss_kib as f64 / 1024.0
        ),
        None => println!("  {name:<24} not measured (command missing or failed)"),
    };
    row("bcd inventory -o json", &ours);
    row("lshw -json", &lshw);
    if ipa_python.is_some() {
        row("IPA list_hardware_info", &ipa);
    } else {
        println!(
            "  IPA list_hardware_info     not measured: set BC_IPA_PYTHON (docs/benchmarks.md)"
        );
    }
    for (name, other) in [("lshw", &lshw), ("IPA", &ipa)] {
        if let (Some(o), Some(l)) = (&ours, other) {
            println!(
                "  against {name}: bcd is {:.0}x faster (median) and uses {:.1}x less peak memory",
                l.median.as_secs_f64() / o.median.as_secs_f64(),
                l.peak_rss_kib as f64 / o.peak_rss_kib.max(1) as f64
            );
        }
    }
    let root = HostRoot::default();
    let (m, p99) = in_process(|| bcd_probes::inventory::collect(&root));
    println!(
        "in process ({IN_PROCESS_RUNS} runs): inventory::collect median {} p99 {}",
        ms(m),
        ms(p99)
    );
    let (m, p99) = in_process(|| bcd_probes::hwkey::compute(&root));
    println!(
        "in process ({IN_PROCESS_RUNS} runs): hwkey::compute    median {} p99 {}",
        ms(m),
        ms(p99)
    );
    ExitCode::SUCCESS
}
