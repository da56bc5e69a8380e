//! Benchmark: `logs::collect` over a large fake journal — wall time, bundle size, and the peak RSS
//! of this process before and after (`VmHWM` in `/proc/self/status`), to show that memory does not
//! grow with the size of the logs.
//!
//! Run: `cargo bench -p bcd --bench logs` (or the dev-profile binary that `cargo build -p bcd
//! --bench logs` leaves in `target/debug/deps/logs-*`). Prints figures; asserts nothing.

use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

use bcd_core::ops::OpsConfig;
use bcd_core::ops::logs::{CollectArgs, collect};

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let Ok(tmp) = tempfile::tempdir() else {
        eprintln!("no temp dir");
        return;
    };
    // A journal of `n` MiB: a 1 MiB block of log lines (some with secrets) printed n times.
    let block = tmp.path().join("block.txt");
    let mut text = String::new();
    let mut i = 0u64;
    while text.len() < 1024 * 1024 {
        if i.is_multiple_of(50) {
            text.push_str("kubelet: Authorization: Bearer abcdefabcdef.0123456789\n");
        } else {
            text.push_str(&format!(
                "2026-01-01T00:00:00+0000 host systemd[1]: line {i} of the journal, nothing secret\n"
            ));
        }
        i += 1;
    }
    if std::fs::write(&block, &text).is_err() {
        return;
    }
    let script = tmp.path().join("journalctl");
    let body = format!(
        "#!/bin/sh\nn=${{BENCH_MIB:-64}}\ni=0; while [ $i -lt $n ]; do cat {}; i=$((i+1)); done\n",
        block.display()
    );
    if std::fs::write(&script, body).is_err()
        || std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).is_err()
    {
        return;
    }
    let cfg = OpsConfig {
        journalctl: script,
        kmsg: tmp.path().join("root/dev/kmsg"),
        ..OpsConfig::default()
    };
    println!("journal MiB | wall ms | bundle bytes | redactions | VmHWM before KiB | after KiB");
    for mib in [16u64, 64] {
        let args = CollectArgs {
            max_bytes: Some(1024 * 1024 * 1024),
            ..CollectArgs::default()
        };
        let cfg = OpsConfig {
            journalctl: {
                let p = tmp.path().join(format!("journalctl-{mib}"));
                let _ = std::fs::write(
                    &p,
                    format!(
                        "#!/bin/sh\nBENCH_MIB={mib} exec {}\n",
                        cfg.journalctl.display()
                    ),
                );
                let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
                p
            },
            ..cfg.clone()
        };
        let before = vm_hwm_kib();
        let start = Instant::now();
        match collect(&cfg, &args, None) {
            Ok(b) => println!(
                "{mib} | {} | {} | {} | {before} | {}",
                start.elapsed().as_millis(),
                b.bytes,
                b.manifest
                    .sources
                    .first()
                    .map(|s| s.redactions)
                    .unwrap_or(0),
                vm_hwm_kib()
            ),
            Err(e) => println!("{mib} | failed: {e}"),
        }
    }
}
