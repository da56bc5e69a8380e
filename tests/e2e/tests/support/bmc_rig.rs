//! The rig of the BMC behaviour tests (issue 31): a real `bcctl serve`, a real `bcd site` with
//! its boot service, one sushy-emulator holding the systems, and a BMC behaviour simulator
//! (`bc_bmc_sim`) in front of it per machine. A simulated firmware that network-boots fetches its
//! script from the site's boot service as iPXE would; [`ramdisk`] then joins with the script's
//! boot token as `bcd ramdisk` does (mode `RAMDISK`, the machine's identifier digests, an
//! inventory), so a workflow runs to its end without QEMU. Included with `#[path]`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bc_bmc_sim::{Behaviour, BmcSim, SimConfig};
use bc_e2e::fake_agent::FakeAgent;
use bc_e2e::{ControlPlane, eventually};
use bc_protocol::hwid::{self, Kind};
use bc_protocol::pb::{self, AgentMode};
use bcd_site::test_utils::sushy::{FakeSystem, Sushy};
use bcd_site::test_utils::{PASSWORD, USER, free_tcp_port};
use serde_json::{Value, json};

use super::support::{Seen, SiteAgent, WAIT};

/// The rig. Fields drop in order: the site agent first (its sessions at the BMCs end while they
/// still answer), then the control plane and the emulator.
pub struct Rig {
    pub agent: SiteAgent,
    pub cp: ControlPlane,
    pub sushy: Sushy,
    pub rt: tokio::runtime::Runtime,
    pub site: String,
    pub seen: Seen,
    /// The site agent's boot service script URL (`http://127.0.0.1:<port>/boot.ipxe`).
    pub boot_url: String,
    pub dir: tempfile::TempDir,
}

impl Rig {
    /// Starts the rig for `systems`: `bcctl serve` with a 1 s power sync and `cp_extra`, and
    /// `bcd site` with `site_env` (`BCD_SITE_*`). `None` when sushy-emulator is missing (skipped
    /// loudly; a failure under `CI=true`).
    pub fn start(
        test: &str,
        systems: &[FakeSystem],
        cp_extra: &[&str],
        site_env: &[(&str, &str)],
    ) -> Option<Self> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let sushy = rt.block_on(Sushy::start(test, systems, None))?;
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["--power-sync-interval", "1s", "--site-lease-ttl", "4s"];
        args.extend_from_slice(cp_extra);
        let cp = ControlPlane::start_with(&dir.path().join("cp"), &args);
        let mut seen = Seen::default();
        let site = seen.ok(
            &cp,
            "sites.create",
            json!({"name": "dc-sim", "kind": "platform"}),
        );
        let site = site["id"].as_str().unwrap().to_owned();
        let token = cp.create_token(&["--site", &site]);
        let (kernel, initrd) = (dir.path().join("vmlinuz"), dir.path().join("initrd"));
        std::fs::write(&kernel, b"not a kernel").unwrap();
        std::fs::write(&initrd, b"not an initramfs").unwrap();
        let port = free_tcp_port();
        let listen = format!("127.0.0.1:{port}");
        let agent = SiteAgent::start_env(
            &cp,
            dir.path(),
            "site",
            &token,
            &[
                "--boot-listen",
                &listen,
                "--boot-kernel",
                kernel.to_str().unwrap(),
                "--boot-initrd",
                initrd.to_str().unwrap(),
                "--ramdisk-lldp-wait",
                "0",
            ],
            site_env,
        );
        eventually(WAIT, "the site agent holding the lease", || {
            let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
            s["lease"]["holderNodeId"].is_string().then_some(())
        });
        Some(Self {
            agent,
            cp,
            sushy,
            rt,
            site,
            seen,
            boot_url: format!("http://{listen}/boot.ipxe"),
            dir,
        })
    }

    /// A simulated BMC of `system` behaving as `b` (the site agent's credentials:
    /// `bcd_site::test_utils::{USER, PASSWORD}`).
    pub fn sim(&self, system: &FakeSystem, b: Behaviour) -> BmcSim {
        self.rt
            .block_on(BmcSim::start(SimConfig {
                upstream: self.sushy.socket(),
                upstream_credentials: (USER.to_owned(), PASSWORD.to_owned()),
                system_uuid: system.uuid.clone(),
                credentials: (USER.to_owned(), PASSWORD.to_owned()),
                behaviour: b,
            }))
            .expect("the BMC simulator")
    }

    /// The simulated firmware of `system` network-boots from this rig's boot service with its
    /// first MAC, and a ramdisk joins with the script's token.
    pub fn machine(&self, sim: &BmcSim, system: &FakeSystem) -> Arc<FakeRamdisk> {
        let r = Arc::new(FakeRamdisk::new(&self.cp, system));
        let hook = Arc::clone(&r);
        sim.network_boot(
            &self.boot_url,
            &system.macs[0].to_ascii_lowercase(),
            Some(Arc::new(move |script: String| hook.boot(&script))),
        );
        r
    }

    /// `nodes.enroll` of `name` at `address` (`inspect`: go on to the inspection).
    pub fn enroll(&mut self, name: &str, address: &str, inspect: bool) -> String {
        let n = self.seen.ok(
            &self.cp,
            "nodes.enroll",
            json!({"inspect": inspect, "siteId": self.site, "name": name, "bmc": {
                "address": address, "username": USER, "password": PASSWORD}}),
        );
        n["id"].as_str().unwrap().to_owned()
    }

    /// Waits until node `id`'s BMC is verified.
    pub fn verified(&mut self, id: &str) -> Value {
        let (cp, seen) = (&self.cp, &mut self.seen);
        eventually(WAIT, &format!("{id} verified"), || {
            let n = seen.node(cp, id);
            if n["provisionState"] == "failed" {
                panic!("{id} failed instead of being verified: {n}");
            }
            n["bmc"]["verifiedAt"].is_string().then_some(n)
        })
    }

    /// Node `id` as `nodes.get` shows it.
    pub fn node(&mut self, id: &str) -> Value {
        self.seen.node(&self.cp, id)
    }

    /// Node `id`'s events.
    pub fn events(&mut self, id: &str) -> Vec<Value> {
        self.seen.events(&self.cp, id)
    }

    /// Waits (at most `WAIT`) until one of node `id`'s events has a message containing `text`;
    /// returns that event. Events of a command's result may land after the state they led to.
    pub fn until_event(&mut self, id: &str, text: &str) -> Value {
        let (cp, seen) = (&self.cp, &mut self.seen);
        eventually(WAIT, &format!("an event of {id} saying {text:?}"), || {
            seen.events(cp, id)
                .into_iter()
                .find(|e| e["message"].as_str().is_some_and(|m| m.contains(text)))
        })
    }

    /// Waits (at most `WAIT`) until `f` of node `id` gives `Some`.
    pub fn until<T>(&mut self, id: &str, what: &str, mut f: impl FnMut(&Value) -> Option<T>) -> T {
        let (cp, seen) = (&self.cp, &mut self.seen);
        eventually(WAIT, what, || f(&seen.node(cp, id)))
    }

    /// Waits until node `id` is in `state`; panics with the node if it fails on the way.
    pub fn state(&mut self, id: &str, state: &str) -> Value {
        self.until(id, &format!("{id} {state}"), |n| {
            if n["provisionState"] == "failed" && state != "failed" {
                panic!("{id} failed on the way to {state}: {n}");
            }
            (n["provisionState"] == state).then(|| n.clone())
        })
    }

    /// `nodes.power` `action`, waited for; returns the finished command.
    pub fn power(&mut self, id: &str, action: &str) -> Value {
        let c = self.seen.ok(
            &self.cp,
            "nodes.power",
            json!({"nodeId": id, "action": action}),
        );
        self.seen.finished(&self.cp, c["id"].as_str().unwrap())
    }

    /// `nodes.setBootDevice` `device`, waited for; returns the finished command.
    pub fn boot_device(&mut self, id: &str, device: &str, persistent: bool) -> Value {
        let c = self.seen.ok(
            &self.cp,
            "nodes.setBootDevice",
            json!({"nodeId": id, "device": device, "persistent": persistent}),
        );
        self.seen.finished(&self.cp, c["id"].as_str().unwrap())
    }

    /// The emulator's `PowerState` of `system`.
    pub fn real_power(&self, system: &FakeSystem) -> String {
        self.rt.block_on(self.sushy.power(&system.uuid))
    }
}

/// A condition of `node` by type.
pub fn condition<'a>(node: &'a Value, type_: &str) -> Option<&'a Value> {
    node["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// What `bcd ramdisk` does with its script, minus the kernel: the boot token from the kernel
/// line, a join in mode `RAMDISK` with the machine's identifier digests (its SMBIOS UUID and
/// serial and its MAC, as the emulator describes it), a session, one inventory, heartbeats.
#[derive(Debug)]
pub struct FakeRamdisk {
    url: String,
    ca_pem: String,
    /// The machine's identifier digests (SMBIOS UUID and serial, MACs), as it joins with them.
    pub digests: Vec<String>,
    /// Its hardware key.
    pub key: String,
    /// Boot tokens it joined with, in order.
    pub joined: parking_lot::Mutex<Vec<String>>,
    stop: Arc<AtomicBool>,
}

impl Drop for FakeRamdisk {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl FakeRamdisk {
    pub fn new(cp: &ControlPlane, system: &FakeSystem) -> Self {
        let mut lines = Vec::new();
        if let Ok(l) = hwid::uuid_line(&system.uuid) {
            lines.push(l);
        }
        if let Some(s) = &system.serial
            && let Ok(l) = hwid::serial_line(Kind::SystemSerial, s)
        {
            lines.push(l);
        }
        for m in &system.macs {
            if let Ok(l) = hwid::mac_line(m) {
                lines.push(l);
            }
        }
        lines.sort();
        let key = hwid::digest(&lines.join("\n"));
        Self {
            url: cp.gateway_url.clone(),
            ca_pem: std::fs::read_to_string(cp.dir.join("ca.crt")).unwrap(),
            digests: lines.iter().map(|l| hwid::digest(l)).collect(),
            key,
            joined: parking_lot::Mutex::new(Vec::new()),
            stop: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Boots `script` (the boot service's answer) in a thread of its own: nothing happens for an
    /// `exit` script.
    pub fn boot(&self, script: &str) {
        let Some(token) = script
            .split_whitespace()
            .find_map(|w| w.strip_prefix("bcd.token="))
            .map(str::to_owned)
        else {
            return;
        };
        let (url, ca, key, digests) = (
            self.url.clone(),
            self.ca_pem.clone(),
            self.key.clone(),
            self.digests.clone(),
        );
        self.joined.lock().push(token.clone());
        let stop = Arc::clone(&self.stop);
        std::thread::spawn(move || {
            let agent = FakeAgent::at(&url, &ca);
            let refs: Vec<&str> = digests.iter().map(String::as_str).collect();
            let Ok(j) = agent.join_as(AgentMode::Ramdisk, &token, &key, true, &refs) else {
                return;
            };
            let s = agent.session_as(&j, AgentMode::Ramdisk);
            let doc = serde_json::to_vec(&bc_protocol::inventory::Inventory::default()).unwrap();
            let inventory = pb::AgentMessage {
                epoch: 0,
                msg: Some(pb::agent_message::Msg::Inventory(pb::Inventory {
                    hardware: Some(pb::HardwareIdentity {
                        hardware_key: key,
                        trusted: true,
                        identifier_digests: digests,
                    }),
                    document_json: doc,
                    collected_at_ms: chrono::Utc::now().timestamp_millis(),
                })),
            };
            if agent.rt.block_on(s.tx.send(inventory)).is_err() {
                return;
            }
            let until = Instant::now() + Duration::from_secs(120);
            let mut seq = 0;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                seq += 1;
                let hb = pb::AgentMessage {
                    epoch: 0,
                    msg: Some(pb::agent_message::Msg::Heartbeat(pb::Heartbeat { seq })),
                };
                if agent.rt.block_on(s.tx.send(hb)).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(150));
            }
        });
    }
}
