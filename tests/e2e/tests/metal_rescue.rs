//! Rescue booted for real (issue 16 item 3), on the rig of `metal_workflows.rs`: sushy-emulator's
//! Redfish BMC, a real `bcd site` with its boot service, a QEMU machine PXE-booting the ramdisk
//! built by `packaging/ramdisk/build.sh` (with dropbear), and a real `bcctl serve`.
//! - Machine r, enrolled with `--deployed`, is `deployed` without a boot. `bcctl nodes rescue
//!   --ssh-key K` → `rescue`: it boots the ramdisk, which starts dropbear with K; the node's
//!   `Rescued` condition turns true with the host keys. Through QEMU's port forward
//!   (127.0.0.1:P → the guest's 22), `ssh -i K root@127.0.0.1 cat /proc/cmdline` prints the
//!   ramdisk's command line with `bcd.node=<id>`; another key is refused; the fingerprints the
//!   control plane shows are those `ssh-keyscan | ssh-keygen -l` sees.
//! - `bcctl nodes unrescue` → `deployed`: the BMC reboots the machine from its disk, which the
//!   harness does not boot: the VM stops.
//!
//! One ramdisk boot. Skipped loudly without QEMU, a kernel, sushy-emulator, dropbear-bin or
//! OpenSSH's client; a failure under `CI=true`. Times are printed, never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/metal.rs"]
mod metal;
#[path = "support/bare_metal.rs"]
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bc_e2e::{eventually, ramdisk};
use bc_metal_sim::machines::Happened;
use bcd_site::test_utils::free_tcp_port;
use metal::{BOOT_BUDGET, enroll_with, machine, moves, system, until_state};
use serde_json::Value;
use support::{Seen, WAIT, condition};

const TEST: &str = "metal_rescue";

/// `ssh`, `ssh-keygen`, `ssh-keyscan` (openssh-client) and the dropbear the image takes
/// (dropbear-bin), else a loud skip (a failure under `CI=true`).
fn ssh_tools_or_skip() -> bool {
    let have = |t: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {t}"))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let missing = ["ssh", "ssh-keygen", "ssh-keyscan"]
        .into_iter()
        .find(|t| !have(t))
        .map(|t| format!("{t} (openssh-client)"))
        .or_else(|| {
            (!Path::new("/usr/sbin/dropbear").exists())
                .then(|| "/usr/sbin/dropbear (dropbear-bin)".to_owned())
        });
    let Some(m) = missing else {
        return true;
    };
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{TEST}: {m} is not installed (.ci/run installs it)"
    );
    eprintln!("!!! {TEST}: SKIPPED, {m} is not installed (.ci/run installs it)");
    false
}

/// An ed25519 key pair at `path` (and `path.pub`), without a passphrase; the public line.
fn key_pair(path: &Path) -> String {
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "rescue-test", "-f"])
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success(), "ssh-keygen: {o:?}");
    std::fs::read_to_string(path.with_extension("pub"))
        .unwrap()
        .trim()
        .to_owned()
}

/// `ssh -i key -p port root@127.0.0.1 command`, never asking anything, no known_hosts.
fn ssh(key: &Path, port: u16, command: &str) -> Output {
    Command::new("ssh")
        .args(["-F", "/dev/null", "-i"])
        .arg(key)
        .args(["-p", &port.to_string()])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=60",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
            command,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The SHA-256 fingerprints of the host keys the server on `port` presents, as OpenSSH prints
/// them (`ssh-keyscan -t T | ssh-keygen -lf -`), one key type at a time: dropbear drops
/// connections past a few unauthenticated ones from one address, and ssh-keyscan opens one per
/// type at once. A type that gives nothing is tried again (a TCG guest is slow).
fn scanned_fingerprints(port: u16) -> BTreeSet<String> {
    const SCAN: &str =
        "ssh-keyscan -T 60 -t \"$1\" -p \"$2\" 127.0.0.1 2>/dev/null | ssh-keygen -lf -";
    let mut out = BTreeSet::new();
    for t in ["ed25519", "ecdsa"] {
        for _ in 0..3 {
            let o = Command::new("sh")
                .arg("-c")
                .arg(SCAN)
                .arg("sh")
                .arg(t)
                .arg(port.to_string())
                .output()
                .unwrap();
            let found: Vec<String> = String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter(|w| w.starts_with("SHA256:"))
                .map(str::to_owned)
                .collect();
            if !found.is_empty() {
                out.extend(found);
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}: stdout {:?}, stderr {:?}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_deployed_machine_is_rescued_over_ssh_and_unrescued() {
    let Some(tools) = ramdisk::tools_or_skip(TEST) else {
        return;
    };
    if !ssh_tools_or_skip() {
        return;
    }
    let ssh_port = free_tcp_port();
    let r = bc_metal_sim::machines::Machine {
        ssh_port: Some(ssh_port),
        ..machine("r", 13, "SER-R-0013", false)
    };
    let systems = [system(&r, "SER-R-0013")];
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    let mut seen = Seen::default();
    let Some(rig) = metal::Rig::start(
        TEST,
        tmp.path(),
        &tools,
        &image,
        vec![r.clone()],
        &systems,
        &mut seen,
    ) else {
        return;
    };
    let (cp, machines, sushy, site) = (&rig.cp, &rig.machines, &rig.sushy, rig.site.clone());
    let p = seen.bcctl(
        cp,
        &[
            "pools",
            "create",
            "--name",
            "metal",
            "--kind",
            "metal-host",
            "--site",
            &site,
        ],
        None,
    );
    let pool = p["id"].as_str().unwrap().to_owned();
    let dump = rig.dump(&r.uuid);

    let id = enroll_with(
        &mut seen,
        cp,
        &site,
        &pool,
        "r",
        &sushy.address(&r.uuid),
        &["--deployed"],
    );
    until_state(&mut seen, cp, &id, "deployed", &dump);
    assert!(!machines.running(&r.uuid), "adopted without a boot");

    let (key, other) = (tmp.path().join("k"), tmp.path().join("other"));
    let public = key_pair(&key);
    key_pair(&other);
    let started = Instant::now();
    let v = seen.bcctl(cp, &["nodes", "rescue", &id, "--ssh-key", &public], None);
    assert_eq!(v["provisionState"], "rescue", "{v:#}");

    // The state is `rescue` at once; the Rescued condition turns true once dropbear listens.
    let n: Value = {
        let budget = Instant::now();
        loop {
            let n = seen.node(cp, &id);
            if condition(&n, "Rescued").is_some_and(|c| c["status"] == "true") {
                break n;
            }
            assert_ne!(n["provisionState"], "failed", "{n:#}\n{}", dump());
            assert!(
                budget.elapsed() < BOOT_BUDGET,
                "not Rescued within {BOOT_BUDGET:?}: {n:#}\n{}",
                dump()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let rescued_in = started.elapsed();
    let rescued = condition(&n, "Rescued").unwrap();
    let message = rescued["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("port 22"), "{rescued:#}");

    let o = ssh(&key, ssh_port, "cat /proc/cmdline");
    let ssh_in = started.elapsed();
    assert!(
        o.status.success(),
        "ssh with the given key: {}\n{}",
        text(&o),
        dump()
    );
    let cmdline = String::from_utf8_lossy(&o.stdout);
    assert!(
        cmdline
            .split_whitespace()
            .any(|w| w == format!("bcd.node={id}")),
        "the ramdisk's command line names the node: {cmdline}"
    );

    let o = ssh(&other, ssh_port, "true");
    assert_eq!(o.status.code(), Some(255), "another key: {}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "another key: {}",
        text(&o)
    );

    let shown: BTreeSet<String> = message
        .split([' ', ','])
        .filter(|w| w.starts_with("SHA256:"))
        .map(str::to_owned)
        .collect();
    let scanned = scanned_fingerprints(ssh_port);
    assert!(!scanned.is_empty(), "ssh-keyscan saw no host key");
    assert_eq!(
        shown, scanned,
        "the host keys shown are those served: {message}"
    );

    let v = seen.bcctl(cp, &["nodes", "unrescue", &id], None);
    assert_eq!(v["provisionState"], "deployed", "{v:#}");
    eventually(
        WAIT,
        "the rescued machine rebooted from its disk (not booted)",
        || (!machines.running(&r.uuid)).then_some(()),
    );
    let n = until_state(&mut seen, cp, &id, "deployed", &dump);
    let rescued = condition(&n, "Rescued").unwrap();
    assert_eq!(rescued["status"], "false", "{n:#}");
    assert_eq!(
        moves(&mut seen, cp, &id),
        ["enrolling", "deployed", "rescue", "deployed"]
    );
    let boots = machines
        .happened()
        .iter()
        .filter(|(_, h)| *h == Happened::Started(r.uuid.clone()))
        .count();
    assert_eq!(boots, 1, "one ramdisk boot: {:?}", machines.happened());
    eprintln!(
        "{TEST}: nodes rescue -> Rescued {:.1} s, -> ssh works {:.1} s (one TCG boot); host keys {shown:?}",
        rescued_in.as_secs_f64(),
        ssh_in.as_secs_f64()
    );
}
