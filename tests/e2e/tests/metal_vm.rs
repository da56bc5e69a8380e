//! Bare metal booted for real (issue 15): `nodes.enroll` through sushy-emulator's Redfish BMC, a
//! real `bcd site` that powers the machine on with PXE and serves its iPXE script, kernel and
//! initramfs, and a QEMU machine (started by the emulator's external notifier) whose own iPXE ROM
//! boots the ramdisk built by `packaging/ramdisk/build.sh`; the ramdisk joins with its one-time
//! boot token and reports; the control plane inspects and commissions it.
//! - Scenario 1: the right machine → `ready`, its inventory showing the VM's SMBIOS serial, UUID
//!   and MAC, `hardwareKeyTrusted`, and the machine powered off by the site agent. It boots
//!   under UEFI (OVMF and iPXE's EFI driver; `bootMode: uefi` in its inventory) — with SeaBIOS,
//!   loudly, where OVMF is missing (a failure under `CI=true`).
//! - A replay of the first boot's token (read from the kernel command line on the console) is
//!   refused and changes nothing.
//! - Scenario 2: the VM's SMBIOS serial differs from the BMC's → its ramdisk is refused,
//!   `HardwareMismatch` names the serial, no second node; the node stays `inspecting` (a mismatch
//!   is evidence, not a verdict: issue 30.2) and its machine powers off. The machine has four
//!   NICs and boots from its third: the script is asked for with that NIC's MAC, the kernel line
//!   names it (`BOOTIF`), the ramdisk takes its DHCP lease there first.
//! - Scenario 3: the machine never boots (the harness ignores the power-on) → the pool's
//!   inspection deadline fails it, saying so.
//! - A pool with `powerOffWhenReady: false` keeps its machine in the ramdisk once `ready`: the
//!   ramdisk answers a Spec as the ramdisk (`SpecConverged` false, `RamdiskAgent`), bundles its
//!   own and the kernel's log for `logs.collect`, fails `diag.nvml` with `NVML_UNAVAILABLE`;
//!   `nodes inspect` reboots it (the running ramdisk's identity ends) into a second inspection
//!   with a new token, back to `ready`; `nodes power off` stops it.
//!
//! Skipped loudly without QEMU, a kernel or sushy-emulator; a failure under `CI=true`. Times are
//! printed (docs/benchmarks.md), never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/metal.rs"]
mod metal;
#[path = "support/bare_metal.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use bc_e2e::{eventually, ramdisk};
use bc_metal_sim::firmware::Firmware;
use bc_metal_sim::machines::{Happened, Machine};
use metal::{
    enroll, kept_in_the_ramdisk, machine, moves, system, until_state, until_state_marking,
};
use serde_json::{Value, json};
use support::{Seen, WAIT, condition};

#[test]
fn enrolled_machines_boot_the_ramdisk_and_are_inspected_commissioned_or_failed() {
    let Some(tools) = ramdisk::tools_or_skip("metal_vm") else {
        return;
    };
    // Machine a boots under UEFI (OVMF, iPXE's EFI driver); without OVMF it boots with SeaBIOS
    // after saying so loudly (a failure under CI=true).
    let uefi = bc_e2e::vm::uefi_or_skip("metal_vm (machine a under UEFI)");
    let a = Machine {
        firmware: uefi.clone().unwrap_or(Firmware::Bios),
        ..machine("a", 1, "SER-A-0001", false)
    };
    // Machine b has four NICs and boots from its third (issue 31, rule 12): its script is asked
    // for with that NIC's MAC, its kernel line names it (BOOTIF), the ramdisk asks DHCP there.
    let b = Machine {
        other_nics: vec![
            "00:1b:21:aa:b2:01".into(),
            "00:1b:21:aa:b2:02".into(),
            "00:1b:21:aa:b2:04".into(),
        ],
        boot_nic: 2,
        ..machine("b", 2, "SER-B-OTHER", false)
    };
    let c = machine("c", 3, "SER-C-0003", true);
    let d = machine("d", 4, "SER-D-0004", false);
    let systems = [
        system(&a, "SER-A-0001"),
        system(&b, "SER-B-0002"),
        system(&c, "SER-C-0003"),
        system(&d, "SER-D-0004"),
    ];
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    let mut seen = Seen::default();
    let Some(rig) = metal::Rig::start(
        "metal_vm",
        tmp.path(),
        &tools,
        &image,
        vec![a.clone(), b.clone(), c.clone(), d.clone()],
        &systems,
        &mut seen,
    ) else {
        return;
    };
    let (cp, machines, sushy, rt, agent) =
        (&rig.cp, &rig.machines, &rig.sushy, &rig.rt, &rig.agent);
    let site = rig.site.clone();
    // Through bcctl, with the bare-metal flags of `pools create`.
    let pool = |seen: &mut Seen, name: &str, extra: &[&str]| -> String {
        let mut args = vec!["pools", "create", "--name", name, "--kind", "metal-host"];
        args.extend([
            "--site",
            &site,
            "--min-cpu-threads",
            "2",
            "--min-linked-nics",
            "1",
        ]);
        args.extend(extra);
        let p = seen.bcctl(cp, &args, None);
        assert_eq!(p["hardwareProfile"]["minLinkedNics"], 1, "{p:#}");
        p["id"].as_str().unwrap().to_owned()
    };
    let metal = pool(&mut seen, "metal", &["--inspection-deadline", "15m"]);
    let quick = pool(&mut seen, "quick", &["--inspection-deadline", "8s"]);
    let kept = pool(
        &mut seen,
        "kept",
        &[
            "--inspection-deadline",
            "15m",
            "--power-off-when-ready",
            "false",
        ],
    );
    let p = seen.ok(cp, "pools.get", json!({"poolId": kept}));
    assert_eq!(
        (
            &p["acceptance"]["inspectionDeadlineSeconds"],
            &p["acceptance"]["powerOffWhenReady"]
        ),
        (&json!(900), &json!(false)),
        "{p:#}"
    );
    let dump = |uuid: &str| rig.dump(uuid);

    // Scenario 3 first (it never boots, so it costs no CPU): the deadline fails it.
    let c_id = enroll(&mut seen, cp, &site, &quick, "c", &sushy.address(&c.uuid));

    // Scenario 1: the right machine, enroll to ready.
    let started = Instant::now();
    let a_id = enroll(&mut seen, cp, &site, &metal, "a", &sushy.address(&a.uuid));
    // Milestones of the boot, first seen at a poll (s since QEMU started; every 0.25 s).
    let mut marks: Vec<(&str, Option<f64>)> = [
        "iPXE",
        "Linux version",
        "Run /init",
        "DHCP lease obtained",
        "session open",
        "node commissioning",
    ]
    .iter()
    .map(|m| (*m, None))
    .collect();
    let mut tick = |n: &Value| {
        let Some(vm) = machines
            .happened()
            .iter()
            .find(|(_, h)| *h == Happened::Started(a.uuid.clone()))
            .map(|(t, _)| *t)
        else {
            return;
        };
        let console = machines.consoles(&a.uuid).concat();
        let s = vm.elapsed().as_secs_f64();
        for (needle, at) in &mut marks {
            let seen_now = if *needle == "node commissioning" {
                n["provisionState"] != "inspecting"
            } else {
                console.contains(*needle)
            };
            if at.is_none() && seen_now {
                *at = Some(s);
            }
        }
    };
    let n = until_state_marking(&mut seen, cp, &a_id, "ready", &dump(&a.uuid), &mut tick);
    let to_ready = started.elapsed();
    eprintln!(
        "metal_vm: boot milestones (s after QEMU started): {}",
        marks
            .iter()
            .map(|(m, at)| format!("{m} {}", at.map_or("-".into(), |s| format!("{s:.1}"))))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert_eq!(
        moves(&mut seen, cp, &a_id),
        ["enrolling", "inspecting", "commissioning", "ready"]
    );
    assert_eq!(n["hardwareKeyTrusted"], true, "{n:#}");
    // Every commissioning step is an event; the NVMe disk's SMART log was read in the ramdisk.
    let steps: Vec<String> = seen
        .events(cp, &a_id)
        .iter()
        .filter(|e| e["kind"] == "commissioningStep")
        .map(|e| {
            format!(
                "{} {}",
                e["to"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect();
    for want in [
        "passed diskHealth: 1 disk(s) healthy",
        "passed cpuThreads: 2 logical CPUs, at least 2",
        "passed hardwareKey: trusted",
    ] {
        assert!(
            steps.iter().any(|s| s.starts_with(want)),
            "{want}: {steps:#?}"
        );
    }
    assert!(
        steps
            .iter()
            .any(|s| s.starts_with("passed nicLinks: link up: eth0")),
        "{steps:#?}"
    );
    for (t, status) in [
        ("HardwareMismatch", "false"),
        ("Inspected", "true"),
        ("Commissioned", "true"),
    ] {
        assert_eq!(condition(&n, t).unwrap()["status"], status, "{t}: {n:#}");
    }
    let inv = &n["inventory"];
    let macs: Vec<&str> = inv["nics"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["mac"].as_str())
        .collect();
    assert_eq!(macs, [a.mac.as_str()], "{inv:#}");
    // Firmware in one place: the NVMe controller's revision as the ramdisk read it, and the
    // fleet-wide query finds the node by it.
    let nvme = n["inventory"]["firmware"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["component"] == "nvme")
        .unwrap_or_else(|| panic!("no NVMe firmware: {n:#}"))
        .clone();
    let found = seen.bcctl(
        cp,
        &[
            "nodes",
            "list",
            "--firmware",
            &format!("nvme={}", nvme["version"].as_str().unwrap()),
        ],
        None,
    );
    let ids: Vec<&str> = found["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["id"].as_str())
        .collect();
    assert!(ids.contains(&a_id.as_str()), "{nvme} -> {ids:?}");
    let store = cpl_store::Store::open_read_only(&cp.dir.join("state.db")).unwrap();
    let rec = store.read_blocking(|r| r.node(&a_id)).unwrap().unwrap();
    let doc: Value = serde_json::from_str(rec.inventory_json.as_deref().unwrap()).unwrap();
    assert_eq!(doc["system"]["serial"], a.serial, "{doc:#}");
    // The ramdisk saw the firmware it was booted by.
    let mode = if uefi.is_some() { "uefi" } else { "bios" };
    assert_eq!(doc["bootMode"], mode, "{doc:#}");
    assert_eq!(
        doc["system"]["uuid"].as_str().map(str::to_ascii_lowercase),
        Some(a.uuid.clone())
    );
    drop(store);
    // Ready and powered off: the site agent asked the BMC, the emulator told the harness.
    let off_since = Instant::now();
    loop {
        let (running, bmc) = (machines.running(&a.uuid), rt.block_on(sushy.power(&a.uuid)));
        let n = seen.node(cp, &a_id);
        if !running && bmc == "Off" && n["bmc"]["power"] == "off" {
            break;
        }
        assert!(
            off_since.elapsed() < WAIT,
            "machine a not powered off: VM running {running}, emulator {bmc}, node {n:#}\nevents {:#?}\nharness {:?}\n{}",
            seen.events(cp, &a_id),
            machines.happened(),
            dump(&a.uuid)()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let console = machines.consoles(&a.uuid).concat();
    let first_boot = machines
        .happened()
        .iter()
        .find(|(_, h)| *h == Happened::Started(a.uuid.clone()))
        .map(|(t, _)| *t)
        .unwrap();
    eprintln!(
        "metal_vm: enroll -> ready {:.1} s (power-on to ready {:.1} s); initramfs {}",
        to_ready.as_secs_f64(),
        first_boot.elapsed().as_secs_f64(),
        image
            .report
            .lines()
            .filter(|l| l.contains("initrd"))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // A replay of the first boot's token (the kernel printed its command line) is refused.
    let token = console
        .split_whitespace()
        .find_map(|w| w.strip_prefix("bcd.token="))
        .expect("bcd.token on the kernel command line")
        .to_owned();
    assert!(token.starts_with("boot_"), "{token}");
    let before = seen.node(cp, &a_id);
    let cmdline = tmp.path().join("replay.cmdline");
    std::fs::write(
        &cmdline,
        format!(
            "bcd.url={} bcd.pin={} bcd.token={token}\n",
            cp.gateway_url, cp.ca_pin
        ),
    )
    .unwrap();
    let out = Command::new(bcd)
        .args([
            "ramdisk",
            "--no-setup",
            "--reconnect-max",
            "1s",
            "--cmdline",
        ])
        .arg(&cmdline)
        .env("BCD_LOG", "info")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "a replayed token must not join: {text}"
    );
    assert!(
        text.contains("already used"),
        "a replay is refused as one: {text}"
    );
    let after = seen.node(cp, &a_id);
    assert_eq!(after["provisionState"], "ready");
    assert_eq!(after["identityGeneration"], before["identityGeneration"]);

    kept_in_the_ramdisk(
        &mut seen,
        cp,
        machines,
        &site,
        &kept,
        &d,
        sushy,
        &dump(&d.uuid),
    );

    // Scenario 2: a machine whose SMBIOS serial is not the BMC's.
    let nodes_before = seen.ok(cp, "nodes.list", json!({}))["nodes"]
        .as_array()
        .unwrap()
        .len();
    let b_id = enroll(&mut seen, cp, &site, &metal, "b", &sushy.address(&b.uuid));
    let n = eventually(Duration::from_secs(600), "b's ramdisk refused", || {
        let n = seen.node(cp, &b_id);
        condition(&n, "HardwareMismatch")
            .is_some_and(|m| m["status"] == "true")
            .then_some(n)
    });
    assert_eq!(n["provisionState"], "inspecting", "{n:#}");
    let m = condition(&n, "HardwareMismatch").expect("HardwareMismatch");
    let msg = m["message"].as_str().unwrap();
    assert!(
        msg.contains("system serial")
            && msg.contains("SER-B-0002")
            && msg.contains("mismatched join 1 of this boot"),
        "{msg}"
    );
    assert!(
        !msg.contains("system UUID") && !msg.contains("MAC:"),
        "{msg}"
    );
    let nodes_after = seen.ok(cp, "nodes.list", json!({}))["nodes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(nodes_after, nodes_before + 1, "only b's own node is new");
    booted_from_the_third_nic(&b, &rig);
    eventually(WAIT, "machine b powered off", || {
        (!machines.running(&b.uuid)).then_some(())
    });

    // Scenario 3's verdict: never booted, failed by the deadline.
    let n = until_state(&mut seen, cp, &c_id, "failed", &dump(&c.uuid));
    assert_eq!(n["failedFrom"], "inspecting", "{n:#}");
    let i = condition(&n, "Inspected").expect("Inspected");
    assert_eq!(i["reason"], "InspectionDeadline", "{n:#}");
    assert!(
        i["message"]
            .as_str()
            .unwrap()
            .contains("never booted the ramdisk"),
        "{n:#}"
    );
    assert!(
        machines
            .happened()
            .iter()
            .any(|(_, h)| matches!(h, Happened::Ignored(u, _) if *u == c.uuid)),
        "{:?}",
        machines.happened()
    );
    assert!(machines.consoles(&c.uuid).is_empty());

    // No boot token in the site agent's or the control plane's log.
    let serve = std::fs::read_to_string(cp.dir.join("serve.log")).unwrap_or_default();
    let secret = token.split_once('.').unwrap().1;
    assert!(
        !agent.log_text().contains(secret),
        "the site agent logged a boot token"
    );
    assert!(!serve.contains(secret), "bcctl serve logged a boot token");
}

/// Machine `b` booted from its third NIC (issue 31, rule 12): the site's boot service was asked
/// for the script with that NIC's MAC, never the first's (iPXE's `${net0/mac}`); the kernel line
/// named it (`BOOTIF=01-<mac>`); and the ramdisk asked DHCP on the NIC `BOOTIF` names first and
/// took its lease there (its `network` log line on the console).
fn booted_from_the_third_nic(b: &Machine, rig: &metal::Rig) {
    let log = rig.agent.log_text();
    let first = &b.other_nics[0];
    let requests: Vec<&str> = log.lines().filter(|l| l.contains("boot request")).collect();
    assert!(
        requests.iter().any(|l| l.contains(&b.mac)),
        "no boot request with the booting NIC's MAC {}:\n{}",
        b.mac,
        requests.join("\n")
    );
    assert!(
        !requests.iter().any(|l| l.contains(first.as_str())),
        "a boot request named the first NIC {first}:\n{}",
        requests.join("\n")
    );
    let console = rig.machines.consoles(&b.uuid).concat();
    let bootif = format!("BOOTIF=01-{}", b.mac.replace(':', "-"));
    assert!(
        console.contains(&bootif),
        "the kernel line lacks {bootif}:\n{console}"
    );
    let story = console
        .lines()
        .find_map(|l| l.split_once("DHCP order: ").map(|(_, s)| s))
        .unwrap_or_else(|| panic!("no DHCP order on the console:\n{console}"));
    let (boot_nic, _) = story
        .split_once(" (BOOTIF)")
        .unwrap_or_else(|| panic!("the BOOTIF NIC is not asked first: {story}"));
    assert!(
        !boot_nic.contains(',') && story.contains(&format!("lease on {boot_nic}")),
        "{story}"
    );
}
