//! The helpers of `metal_vm.rs`: machines and their BMC systems, enrollment through `bcctl`,
//! waiting for a provision state (failing with the consoles), and the kept-in-the-ramdisk case.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use bc_e2e::ramdisk::Image;
use bc_e2e::vm::VmTools;
use bc_e2e::{ControlPlane, eventually};
use bc_metal_sim::firmware::Firmware;
use bc_metal_sim::machines::{Machine, Machines};
use bcd_site::test_utils::free_tcp_port;
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use bcd_site::test_utils::{PASSWORD, USER};
use serde_json::{Value, json};

use super::support::{Seen, SiteAgent, WAIT, condition};

/// What the VM tests boot machines on: QEMU machines behind sushy-emulator's BMCs (powered by its
/// notifier), a real `bcctl serve` whose gateway the guests reach at 10.0.2.2, a site `dc1` and a
/// real `bcd site` holding its lease, with its boot service serving `image`. Fields drop in
/// order: the site agent, the control plane, the emulator, then the VMs.
pub struct Rig {
    pub agent: SiteAgent,
    pub cp: ControlPlane,
    pub sushy: Sushy,
    pub rt: tokio::runtime::Runtime,
    pub machines: Machines,
    pub site: String,
    /// The site agent's boot service port (on 127.0.0.1; the guests reach it at 10.0.2.2).
    pub boot_port: u16,
}

impl Rig {
    /// Starts the rig for `machines` (their BMCs reporting `systems`) in `dir`; `None` when
    /// sushy-emulator is missing (skipped loudly; a failure under `CI=true`).
    pub fn start(
        test: &str,
        dir: &Path,
        tools: &VmTools,
        image: &Image,
        machines: Vec<Machine>,
        systems: &[FakeSystem],
        seen: &mut Seen,
    ) -> Option<Self> {
        Sushy::program(test)?;
        let (boot_port, gw_port) = (free_tcp_port(), free_tcp_port());
        let machines = Machines::start(
            &tools.qemu,
            machines,
            &format!("http://10.0.2.2:{boot_port}/boot.ipxe?mac=${{netX/mac}}"),
            dir,
        )
        .expect("the machines' notifier");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let sushy = rt
            .block_on(Sushy::start_notifying(test, systems, &machines.notify_url))
            .expect("sushy-emulator");
        // The guest reaches the gateway at 10.0.2.2 (QEMU's user network maps it to the host's
        // loopback): the gateway's certificate names it, and it is the URL the ramdisk is given.
        let mut cp = ControlPlane::start_with_args(
            &dir.join("cp"),
            &[
                "--listen",
                &format!("127.0.0.1:{gw_port}"),
                "--api-listen",
                "127.0.0.1:0",
                "--san",
                "10.0.2.2",
                "--advertise-url",
                &format!("https://10.0.2.2:{gw_port}"),
                "--site-lease-ttl",
                "4s",
                "--power-sync-interval",
                "1s",
            ],
        );
        // The site agent runs on the host: it joins at the loopback address.
        cp.gateway_url = format!("https://127.0.0.1:{gw_port}");
        let site = seen.ok(
            &cp,
            "sites.create",
            json!({"name": "dc1", "kind": "platform"}),
        );
        let site = site["id"].as_str().unwrap().to_owned();
        let token = cp.create_token(&["--site", &site]);
        let agent = SiteAgent::start_with(
            &cp,
            dir,
            "site-a",
            &token,
            &[
                "--boot-listen",
                &format!("127.0.0.1:{boot_port}"),
                "--boot-kernel",
                image.kernel.to_str().unwrap(),
                "--boot-initrd",
                image.initrd.to_str().unwrap(),
                // QEMU's user network carries no LLDP: a short wait, not the 30 s default.
                "--ramdisk-lldp-wait",
                "2",
            ],
        );
        eventually(WAIT, "the site agent holding the lease", || {
            let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
            s["lease"]["holderNodeId"].as_str().map(str::to_owned)
        });
        Some(Self {
            agent,
            cp,
            sushy,
            rt,
            machines,
            site,
            boot_port,
        })
    }

    /// The consoles of machine `uuid` and the site agent's log, for a failing assertion.
    pub fn dump<'a>(&'a self, uuid: &str) -> impl Fn() -> String + use<'a> {
        let uuid = uuid.to_owned();
        move || {
            format!(
                "consoles:\n{}\nsite agent:\n{}",
                self.machines.consoles(&uuid).join("\n----\n"),
                self.agent.log_text()
            )
        }
    }

    /// Waits until machine `uuid`'s VM is stopped and the emulator says Off.
    pub fn until_off(&self, uuid: &str) {
        eventually(WAIT, "the machine powered off", || {
            (!self.machines.running(uuid) && self.rt.block_on(self.sushy.power(uuid)) == "Off")
                .then_some(())
        });
    }
}

/// How long one machine may take from enrollment to its verdict (a TCG boot takes 15–30 s on
/// two idle cores; CI's are busy).
pub const BOOT_BUDGET: Duration = Duration::from_secs(400);

pub fn machine(name: &str, i: u32, serial: &str, ignore: bool) -> Machine {
    Machine {
        name: name.into(),
        uuid: format!("5f2e0c4e-1c9a-4a51-9a43-0000000000{i:02}"),
        serial: serial.into(),
        mac: format!("00:1b:21:aa:bb:{i:02x}"),
        other_nics: Vec::new(),
        boot_nic: 0,
        firmware: Firmware::Bios,
        ignore,
        ssh_port: None,
    }
}

/// `m`'s NICs' MACs in PCI order (the booting one where [`Machine::boot_nic`] puts it).
pub fn nics(m: &Machine) -> Vec<String> {
    let mut all = m.other_nics.clone();
    all.insert(m.boot_nic.min(all.len()), m.mac.clone());
    all
}

pub fn system(m: &Machine, bmc_serial: &str) -> FakeSystem {
    FakeSystem {
        uuid: m.uuid.clone(),
        name: m.name.clone(),
        on: false,
        // Every NIC, in PCI order, as a BMC lists them.
        macs: nics(m).iter().map(|m| m.to_ascii_uppercase()).collect(),
        serial: Some(bmc_serial.into()),
    }
}

pub fn enroll(
    seen: &mut Seen,
    cp: &ControlPlane,
    site: &str,
    pool: &str,
    name: &str,
    address: &str,
) -> String {
    enroll_with(seen, cp, site, pool, name, address, &[])
}

/// [`enroll`] with more `bcctl nodes enroll` flags (`--deployed`, `--no-inspect`).
pub fn enroll_with(
    seen: &mut Seen,
    cp: &ControlPlane,
    site: &str,
    pool: &str,
    name: &str,
    address: &str,
    extra: &[&str],
) -> String {
    let pw = cp.dir.join("bmc.password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let mut args = vec![
        "nodes",
        "enroll",
        "--site",
        site,
        "--pool",
        pool,
        "--name",
        name,
        "--bmc-address",
        address,
        "--username",
        USER,
        "--password-file",
        pw.to_str().unwrap(),
    ];
    args.extend(extra);
    let v = seen.bcctl(cp, &args, None);
    v["id"].as_str().unwrap().to_owned()
}

/// Waits until node `id` is in `state` and returns it; a terminal state that is not it fails
/// the test with the machine's consoles and the site agent's log.
pub fn until_state(
    seen: &mut Seen,
    cp: &ControlPlane,
    id: &str,
    state: &str,
    dump: &dyn Fn() -> String,
) -> Value {
    until_state_marking(seen, cp, id, state, dump, &mut |_| {})
}

/// [`until_state`], calling `tick` with the node at every poll.
pub fn until_state_marking(
    seen: &mut Seen,
    cp: &ControlPlane,
    id: &str,
    state: &str,
    dump: &dyn Fn() -> String,
    tick: &mut dyn FnMut(&Value),
) -> Value {
    let started = Instant::now();
    loop {
        let n = seen.node(cp, id);
        tick(&n);
        let now = n["provisionState"].as_str().unwrap_or_default().to_owned();
        if now == state {
            return n;
        }
        assert!(
            !matches!(now.as_str(), "ready" | "failed"),
            "node {id} reached {now}, expected {state}: {n:#}\n{}",
            dump()
        );
        assert!(
            started.elapsed() < BOOT_BUDGET,
            "node {id} not {state} within {BOOT_BUDGET:?} (now {now}): {n:#}\n{}",
            dump()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub fn moves(seen: &mut Seen, cp: &ControlPlane, id: &str) -> Vec<String> {
    seen.events(cp, id)
        .iter()
        .filter(|e| e["kind"] == "provisionState")
        .map(|e| e["to"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Machine `m` in a pool that keeps it running once `ready`: the ramdisk's answers, then a
/// second inspection (a reboot into a new boot token), then a power-off.
#[allow(clippy::too_many_arguments)]
pub fn kept_in_the_ramdisk(
    seen: &mut Seen,
    cp: &ControlPlane,
    machines: &Machines,
    site: &str,
    pool: &str,
    m: &Machine,
    sushy: &Sushy,
    dump: &dyn Fn() -> String,
) {
    let id = enroll(seen, cp, site, pool, &m.name, &sushy.address(&m.uuid));
    let n = until_state(seen, cp, &id, "ready", dump);
    let first_generation = n["identityGeneration"].as_u64().unwrap();
    // Still in the ramdisk, connected: its answers are the ramdisk's.
    let n = eventually(WAIT, "the ramdisk's SpecConverged", || {
        let n = seen.node(cp, &id);
        (n["connectivity"] == "connected" && condition(&n, "SpecConverged").is_some()).then_some(n)
    });
    assert!(
        machines.running(&m.uuid),
        "powerOffWhenReady false keeps it on"
    );
    let spec = condition(&n, "SpecConverged").unwrap();
    assert_eq!(
        (spec["status"].as_str(), spec["reason"].as_str()),
        (Some("false"), Some("RamdiskAgent")),
        "{n:#}"
    );
    let (ok, out, err) = cp.bcctl(&["nodes", "run", &id, "logs.collect", "--wait", "-o", "json"]);
    assert!(ok, "logs.collect: {err}\n{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded", "{v:#}");
    for src in ["agent", "kernel"] {
        let status = v["result"]["manifest"]["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["source"] == src)
            .map(|r| r["status"].clone());
        assert_eq!(status, Some(json!("collected")), "{src}: {v:#}");
    }
    let (_, out, _) = cp.bcctl(&["nodes", "run", &id, "diag.nvml", "--wait", "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
    assert_eq!(v["state"], "failed", "{out}");
    assert_eq!(v["error"]["code"], "NVML_UNAVAILABLE", "{out}");

    // Inspect again: the machine (on) is rebooted into a new boot with a new token.
    let v = seen.bcctl(cp, &["nodes", "inspect", &id], None);
    assert_eq!(v["provisionState"], "inspecting", "{v:#}");
    let n = until_state(seen, cp, &id, "ready", dump);
    assert!(
        n["identityGeneration"].as_u64().unwrap() >= first_generation + 2,
        "the first ramdisk's identity ended and the second joined anew: {n:#}"
    );
    let consoles = machines.consoles(&m.uuid);
    assert_eq!(consoles.len(), 2, "two boots");
    let tokens: Vec<&str> = consoles
        .iter()
        .filter_map(|c| {
            c.split_whitespace()
                .find_map(|w| w.strip_prefix("bcd.token="))
        })
        .collect();
    assert_eq!(tokens.len(), 2, "a token on each boot's command line");
    assert_ne!(tokens[0], tokens[1], "every boot has its own token");
    assert_eq!(
        moves(seen, cp, &id),
        [
            "enrolling",
            "inspecting",
            "commissioning",
            "ready",
            "inspecting",
            "commissioning",
            "ready"
        ]
    );

    // Off through the operator: the harness stops the VM when the BMC says so.
    seen.bcctl(cp, &["nodes", "power", &id, "off"], None);
    eventually(WAIT, "machine d powered off", || {
        (!machines.running(&m.uuid)).then_some(())
    });
}
