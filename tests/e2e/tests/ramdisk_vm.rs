//! The real ramdisk image (`packaging/ramdisk/build.sh`) boots Debian's kernel in QEMU, loads its
//! drivers, gets a DHCP lease from QEMU's user network, and `bcd ramdisk` joins a real
//! `bcctl serve` on the host with the settings of the kernel command line (`bcd.url`, `bcd.pin`,
//! `bcd.token`, `bcd.node`), as the site agent's iPXE script will pass them. The guest reaches
//! the host's loopback at 10.0.2.2, so the control plane's certificate names that address
//! (`--san 10.0.2.2`).
//!
//! Checked through the control plane: a node whose inventory holds the VM's SMBIOS serial and
//! UUID and its NIC's MAC, whose hardware key is trusted (three identifiers), whose hostname is
//! `bcd.node`, and whose `SpecConverged` condition carries the ramdisk agent's reason (only a
//! ramdisk answers a Spec so); `logs.collect` bundles the ramdisk's own log and the kernel's, and
//! `diag.nvml` fails with `NVML_UNAVAILABLE` (no NVIDIA driver in the image).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bc_e2e::{ControlPlane, ramdisk};
use serde_json::{Value, json};

/// A boot, up to the node's first report, may take this long (TCG on 2 busy cores).
const BOOT_BUDGET: Duration = Duration::from_secs(120);
const SERIAL: &str = "SER-RD-1";
const UUID: &str = "6b1f0b8e-3a52-4d0e-9c1e-5f2d8a7c4e01";
/// A globally administered MAC (Intel's OUI): the hardware key refuses locally administered
/// ones such as QEMU's default 52:54:00:….
const MAC: &str = "00:1b:21:aa:bb:01";
const NODE_HINT: &str = "vm-rd-1";

/// The token the ramdisk joins with. Today an ordinary pool join token (the control plane takes
/// mode ramdisk with it); the boot token of a bare-metal enrollment replaces it here.
fn boot_token(cp: &ControlPlane) -> String {
    let pool = cp.metal_host_pool();
    cp.create_token(&["--pool", &pool, "--uses", "1", "--ttl", "10m"])
}

/// The gateway URL as the guest sees it.
fn guest_url(cp: &ControlPlane) -> String {
    let port = cp
        .gateway_url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/');
    format!("https://10.0.2.2:{port}")
}

#[test]
fn the_ramdisk_boots_joins_and_reports_the_vms_identity() {
    let Some(t) = ramdisk::tools_or_skip("ramdisk_vm") else {
        return;
    };
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&t, bcd, &tmp.path().join("image"));
    let cp = ControlPlane::start_with(&tmp.path().join("cp"), &["--san", "10.0.2.2"]);
    let token = boot_token(&cp);
    let append = format!(
        "bcd.url={} bcd.pin={} bcd.token={token} bcd.node={NODE_HINT} bcd.log=info",
        guest_url(&cp),
        cp.ca_pin
    );
    let args: Vec<String> = [
        "-netdev",
        "user,id=n0",
        "-device",
        &format!("virtio-net-pci,netdev=n0,mac={MAC},romfile="),
        "-smbios",
        &format!("type=1,serial={SERIAL},uuid={UUID}"),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let mut guest = ramdisk::Guest::start(&t, &image, &append, &args, tmp.path());

    // The node appears with its first inventory; the console's milestones are timed as they
    // show up (seconds since QEMU started).
    let mut marks = Marks::new(&[
        "Run /init",
        "bcd ramdisk starting",
        "DHCP lease obtained",
        "joined",
        "session open",
    ]);
    let node = loop {
        guest.assert_running();
        marks.look(&guest);
        let found = cp
            .nodes()
            .into_iter()
            .find(|n| n["inventory"].is_object() && n["connectivity"] == "connected");
        if let Some(n) = found {
            break n;
        }
        assert!(
            guest.started.elapsed() < BOOT_BUDGET,
            "no node reported within {BOOT_BUDGET:?}; console:\n{}\nserve.log:\n{}",
            guest.console_text(),
            std::fs::read_to_string(cp.dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let first_report = guest.started.elapsed();
    marks.look(&guest);
    let console = guest.console_text();
    let id = node["id"].as_str().unwrap().to_owned();
    eprintln!(
        "timings (s since QEMU start, seen by polling every 0.25 s): {}; first report {:.1}",
        marks.summary(),
        first_report.as_secs_f64()
    );

    // Through the operator API: the MAC, a trusted key, the ramdisk's answer to the Spec.
    let n = wait_for(&cp, &id, |n| {
        n["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "SpecConverged"))
    });
    assert_eq!(n["hardwareKeyTrusted"], true, "{n:#}");
    let macs: Vec<&str> = n["inventory"]["nics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["mac"].as_str())
        .collect();
    assert_eq!(macs, [MAC], "{n:#}");
    let spec = n["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "SpecConverged")
        .unwrap();
    assert_eq!(spec["status"], "false", "{spec}");
    assert_eq!(spec["reason"], "RamdiskAgent", "{spec}");

    // What the control plane stored: the whole inventory document and the join's facts.
    let store = cpl_store::Store::open_read_only(&cp.dir.join("state.db")).unwrap();
    let rec = store
        .read_blocking(|r| r.node(&id))
        .unwrap()
        .expect("node record");
    let doc: Value = serde_json::from_str(rec.inventory_json.as_deref().unwrap()).unwrap();
    assert_eq!(doc["system"]["serial"], SERIAL, "{doc:#}");
    assert_eq!(
        doc["system"]["uuid"].as_str().map(str::to_ascii_lowercase),
        Some(UUID.to_owned()),
        "{doc:#}"
    );
    assert_eq!(rec.hostname.as_deref(), Some(NODE_HINT));
    assert!(
        rec.identifier_digests.len() >= 3,
        "uuid, serial and MAC expected: {:?}",
        rec.identifier_digests
    );
    assert!(
        console.contains("DHCP lease obtained") && console.contains("eth0"),
        "{console}"
    );

    // Commands: logs.collect bundles the ramdisk's own log file and the kernel log (no journal
    // in a ramdisk); diag.nvml fails plainly without an NVIDIA driver.
    let (ok, out, err) = cp.bcctl(&["nodes", "run", &id, "logs.collect", "--wait", "-o", "json"]);
    assert!(ok, "logs.collect: {err}\n{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded", "{v:#}");
    let status = |src: &str| {
        v["result"]["manifest"]["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["source"] == src)
            .map(|r| r["status"].clone())
    };
    assert_eq!(status("agent"), Some(json!("collected")), "{v:#}");
    assert_eq!(status("kernel"), Some(json!("collected")), "{v:#}");
    let (_, out, _) = cp.bcctl(&["nodes", "run", &id, "diag.nvml", "--wait", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert_eq!(v["state"], "failed", "{out}");
    assert_eq!(v["error"]["code"], "NVML_UNAVAILABLE", "{out}");

    guest.kill();
    drop(store);
    eprintln!(
        "ramdisk VM: first report after {:.1} s; node {id}",
        first_report.as_secs_f64()
    );
}

/// When each console milestone was first seen.
struct Marks {
    seen: Vec<(&'static str, Option<f64>)>,
}

impl Marks {
    fn new(needles: &[&'static str]) -> Self {
        Self {
            seen: needles.iter().map(|n| (*n, None)).collect(),
        }
    }

    fn look(&mut self, guest: &ramdisk::Guest) {
        let console = guest.console_text();
        let now = guest.started.elapsed().as_secs_f64();
        for (needle, at) in &mut self.seen {
            if at.is_none() && console.contains(*needle) {
                *at = Some(now);
            }
        }
    }

    fn summary(&self) -> String {
        self.seen
            .iter()
            .map(|(n, at)| match at {
                Some(s) => format!("{n:?} {s:.1}"),
                None => format!("{n:?} never"),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Polls the node until `pred` holds (30 s).
fn wait_for(cp: &ControlPlane, id: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = cp.ok("nodes.get", json!({"nodeId": id}));
        if pred(&n) {
            return n;
        }
        assert!(Instant::now() < deadline, "node never matched: {n:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
