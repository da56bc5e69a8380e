//! Machines behind an emulated BMC: sushy-emulator's external notifier turned into QEMU boots
//! (`-accel tcg`: no KVM needed).
//!
//! The emulator PUTs a system's stored JSON to [`Machines::notify_url`] on every change, inside
//! the Redfish request that made it. The first PUT of a power request carries it in
//! `pending_power.power_state` while `power_state` still shows the old state; later PUTs without
//! a pending change are echoes (a read applying it, a boot device change) and start nothing. So:
//! - a pending `On`/`ForceOn` with boot device `Pxe` starts the machine's QEMU, which PXE-boots
//!   with its own iPXE ROM from `bootfile` (the site agent's boot service, reached at 10.0.2.2,
//!   the host's loopback as the guest sees it), with the machine's SMBIOS UUID and serial and its
//!   MAC on a virtio NIC, under SeaBIOS or UEFI ([`crate::firmware`]); a machine with more NICs
//!   boots from the one [`Machine::boot_nic`] places among them (each NIC on its own QEMU user
//!   network; only the booting one's DHCP names the bootfile); a pending `On` with any other
//!   boot device starts nothing (there is no disk to boot);
//! - a pending `Off` (the fake driver stores `ForceOff` and `GracefulShutdown` as `Off`) stops
//!   it; a restart (`power_state` already `Off`, `On` pending, the VM still running) stops it
//!   and starts it again (PXE only);
//! - a machine with an `ssh_port` has that loopback port forwarded to its port 22;
//! - a machine marked `ignore` never boots (the "machine that never boots" case); a test can
//!   change that while it runs ([`Machines::set_ignore`]).
//!
//! Each boot's console goes to `<dir>/<name>-<n>.log`. The answer to the PUT comes first (204),
//! the work after it: a slow answer would slow the emulator's Redfish answers.
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde_json::Value;

use crate::firmware::Firmware;

/// Why the machines cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum MachinesError {
    /// The notifier's loopback listener.
    #[error("the machines' notifier cannot listen on 127.0.0.1: {0}")]
    Listen(std::io::Error),
    /// The runtime that serves it.
    #[error("the machines' notifier runtime: {0}")]
    Runtime(std::io::Error),
}

/// One machine: what its BMC reports is the emulator's business; this is what QEMU gives the
/// guest.
#[derive(Debug, Clone)]
pub struct Machine {
    /// Its name (console file names).
    pub name: String,
    /// SMBIOS system UUID (also the emulator's system id).
    pub uuid: String,
    /// SMBIOS system serial as the guest reads it (may differ from what the BMC reports).
    pub serial: String,
    /// The MAC of the virtio NIC it network-boots from.
    pub mac: String,
    /// Its other NICs' MACs, in PCI order (none: one NIC). iPXE's `${net0/mac}` is the first
    /// NIC's whichever booted; `${netX/mac}` the booting one's.
    pub other_nics: Vec<String>,
    /// Where the booting NIC sits among all of them (0: first; past the end: last).
    pub boot_nic: usize,
    /// SeaBIOS or OVMF.
    pub firmware: Firmware,
    /// Never boot, whatever the BMC is asked.
    pub ignore: bool,
    /// A host port forwarded to the guest's SSH port (QEMU user network's
    /// `hostfwd=tcp:127.0.0.1:<port>-:22`): the rescue's dropbear, reached from the host.
    pub ssh_port: Option<u16>,
}

/// What happened, in order, for the test's assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Happened {
    /// A VM was started for the machine (its UUID).
    Started(String),
    /// A VM was stopped by a power-off.
    Stopped(String),
    /// A power-on was ignored (the machine is marked `ignore`, or it was not asked to PXE-boot).
    Ignored(String, String),
}

#[derive(Debug)]
struct Vm {
    child: Child,
    console: PathBuf,
}

#[derive(Debug, Default)]
struct State {
    running: HashMap<String, Vm>,
    boots: HashMap<String, u32>,
    log: Vec<(Instant, Happened)>,
    consoles: HashMap<String, Vec<PathBuf>>,
    /// UUIDs of the machines that ignore a power-on now.
    ignored: HashSet<String>,
}

/// The harness: the notifier endpoint and the machines' VMs (all killed on drop).
#[derive(Debug)]
pub struct Machines {
    /// `http://127.0.0.1:<port>/notify`.
    pub notify_url: String,
    state: Arc<Mutex<State>>,
    /// Taken on drop: shut down in the background, which works from async code too.
    runtime: Option<tokio::runtime::Runtime>,
}

struct Ctx {
    qemu: PathBuf,
    machines: Vec<Machine>,
    bootfile: String,
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

impl Ctx {
    fn start_vm(&self, m: &Machine, st: &mut State) {
        if st.running.contains_key(&m.uuid) {
            return;
        }
        let n = st.boots.entry(m.uuid.clone()).or_insert(0);
        *n += 1;
        let console = self.dir.join(format!("{}-{}.log", m.name, n));
        match self.spawn(m, &console) {
            Ok(child) => {
                st.consoles
                    .entry(m.uuid.clone())
                    .or_default()
                    .push(console.clone());
                st.running.insert(m.uuid.clone(), Vm { child, console });
                st.log
                    .push((Instant::now(), Happened::Started(m.uuid.clone())));
            }
            Err(e) => {
                tracing::error!(machine = %m.name, error = %e, "starting the machine's QEMU failed");
                st.log.push((
                    Instant::now(),
                    Happened::Ignored(m.uuid.clone(), format!("qemu did not start: {e}")),
                ));
            }
        }
    }

    /// QEMU for `m`, its console (serial, firmware and iPXE output) into `console`.
    fn spawn(&self, m: &Machine, console: &Path) -> std::io::Result<Child> {
        let disk = Machines::disk(&self.dir, &m.name);
        if !disk.exists() {
            std::fs::File::create(&disk)?.set_len(64 << 20)?;
        }
        let log = std::fs::File::create(console)?;
        let mut cmd = Command::new(&self.qemu);
        cmd.args([
            "-machine",
            "q35",
            "-accel",
            "tcg,thread=single",
            "-m",
            "1G",
            "-smp",
            "2",
            "-nographic",
            "-no-reboot",
            "-boot",
            "n",
            "-smbios",
        ])
        .arg(format!("type=1,serial={},uuid={}", m.serial, m.uuid));
        if let Firmware::Uefi(ovmf) = &m.firmware {
            let vars = Machines::uefi_vars(&self.dir, &m.name);
            ovmf.machine_vars(&vars).map_err(std::io::Error::other)?;
            cmd.arg("-drive")
                .arg(format!(
                    "if=pflash,format=raw,unit=0,readonly=on,file={}",
                    ovmf.code.display()
                ))
                .arg("-drive")
                .arg(format!(
                    "if=pflash,format=raw,unit=1,file={}",
                    vars.display()
                ));
        }
        cmd.args(nic_args(m, &self.bootfile))
            .arg("-drive")
            .arg(format!("file={},if=none,id=d0,format=raw", disk.display()))
            // NVMe: the ramdisk reads its SMART / Health Information log (commissioning's
            // diskHealth step); its serial names the machine.
            .arg("-device")
            .arg(format!("nvme,drive=d0,serial=NVME-{}", m.name))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        tracing::info!(machine = %m.name, uuid = %m.uuid, command = ?cmd, "machine powered on: starting QEMU");
        cmd.spawn()
    }

    fn stop_vm(&self, uuid: &str, st: &mut State) {
        if let Some(mut vm) = st.running.remove(uuid) {
            let _ = vm.child.kill();
            let _ = vm.child.wait();
            tracing::info!(uuid = %uuid, console = %vm.console.display(), "machine powered off: QEMU stopped");
            st.log
                .push((Instant::now(), Happened::Stopped(uuid.to_owned())));
        }
    }

    fn on_notify(&self, doc: &Value) {
        let Some(uuid) = doc["uuid"].as_str() else {
            return;
        };
        let Some(pending) = doc["pending_power"]["power_state"].as_str() else {
            return;
        };
        let Some(m) = self.machines.iter().find(|m| m.uuid == uuid) else {
            return;
        };
        let pxe = doc["boot_device"].as_str() == Some("Pxe");
        let mut st = self.state.lock();
        let on = |st: &mut State| {
            if st.ignored.contains(uuid) {
                st.log.push((
                    Instant::now(),
                    Happened::Ignored(uuid.to_owned(), "marked ignore".into()),
                ));
            } else if !pxe {
                st.log.push((
                    Instant::now(),
                    Happened::Ignored(
                        uuid.to_owned(),
                        format!("boot device {}", doc["boot_device"]),
                    ),
                ));
            } else {
                self.start_vm(m, st);
            }
        };
        let was_off = doc["power_state"].as_str() == Some("Off");
        match pending {
            // A restart reads Off at once with On pending: a VM still running is restarted.
            "On" | "ForceOn" if was_off && st.running.contains_key(uuid) => {
                self.stop_vm(uuid, &mut st);
                on(&mut st);
            }
            "On" | "ForceOn" => on(&mut st),
            "Off" | "ForceOff" | "GracefulShutdown" => self.stop_vm(uuid, &mut st),
            "ForceRestart" | "GracefulRestart" => {
                self.stop_vm(uuid, &mut st);
                on(&mut st);
            }
            _ => {}
        }
    }
}

/// The `-netdev`/`-device` pairs of `m`'s NICs in PCI order: each on its own QEMU user network;
/// the booting one's DHCP names `bootfile`, it is the firmware's first boot entry
/// (`bootindex=1`) and carries the SSH forward if any.
fn nic_args(m: &Machine, bootfile: &str) -> Vec<String> {
    let mut macs: Vec<&str> = m.other_nics.iter().map(String::as_str).collect();
    let at = m.boot_nic.min(macs.len());
    macs.insert(at, &m.mac);
    let mut args = Vec::new();
    for (i, mac) in macs.iter().enumerate() {
        let mut netdev = format!("user,id=n{i}");
        let mut device = format!("virtio-net-pci,netdev=n{i},mac={mac}");
        if i == at {
            netdev.push_str(&format!(",bootfile={bootfile}"));
            if let Some(port) = m.ssh_port {
                netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{port}-:22"));
            }
            device.push_str(",bootindex=1");
        }
        args.extend(["-netdev".to_owned(), netdev, "-device".to_owned(), device]);
    }
    args
}

impl Machines {
    /// Listens for the emulator's notifications (on its own small runtime) and runs `qemu`
    /// (`qemu-system-x86_64`) for the machines; `bootfile` is QEMU's DHCP bootfile (e.g.
    /// `http://10.0.2.2:<port>/boot.ipxe?mac=${netX/mac}`, which iPXE expands: `netX` is the NIC
    /// that booted, `net0` the first whichever booted); consoles and
    /// disks go to `dir`.
    ///
    /// Errors: the runtime or the loopback listener cannot be made.
    pub fn start(
        qemu: &Path,
        machines: Vec<Machine>,
        bootfile: &str,
        dir: &Path,
    ) -> Result<Self, MachinesError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(MachinesError::Runtime)?;
        let state = Arc::new(Mutex::new(State {
            ignored: machines
                .iter()
                .filter(|m| m.ignore)
                .map(|m| m.uuid.clone())
                .collect(),
            ..State::default()
        }));
        let ctx = Arc::new(Ctx {
            qemu: qemu.to_owned(),
            machines,
            bootfile: bootfile.to_owned(),
            dir: dir.to_owned(),
            state: Arc::clone(&state),
        });
        // Bound without blocking on the runtime: a caller may itself be async.
        let std_listener =
            std::net::TcpListener::bind("127.0.0.1:0").map_err(MachinesError::Listen)?;
        std_listener
            .set_nonblocking(true)
            .map_err(MachinesError::Listen)?;
        let port = std_listener
            .local_addr()
            .map_err(MachinesError::Listen)?
            .port();
        let listener = {
            let _in_runtime = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener).map_err(MachinesError::Listen)?
        };
        let app = axum::Router::new().route(
            "/notify",
            axum::routing::put(move |body: axum::body::Bytes| {
                let ctx = Arc::clone(&ctx);
                async move {
                    if let Ok(doc) = serde_json::from_slice::<Value>(&body) {
                        // Answer first: the emulator waits for this inside its Redfish request.
                        tokio::task::spawn_blocking(move || ctx.on_notify(&doc));
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        );
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            notify_url: format!("http://127.0.0.1:{port}/notify"),
            state,
            runtime: Some(runtime),
        })
    }

    /// From now on the machine ignores power-ons (`true`: it "never boots") or boots again.
    pub fn set_ignore(&self, uuid: &str, ignore: bool) {
        let mut st = self.state.lock();
        if ignore {
            st.ignored.insert(uuid.to_owned());
        } else {
            st.ignored.remove(uuid);
        }
    }

    /// The machine's UEFI variable store (its NVRAM), copied from OVMF's template at its first
    /// UEFI boot in the directory given to [`Machines::start`].
    pub fn uefi_vars(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.vars.fd"))
    }

    /// The machine's disk: a 64 MiB raw file on its NVMe controller, made at its first boot
    /// in the directory given to [`Machines::start`].
    pub fn disk(dir: &Path, name: &str) -> PathBuf {
        dir.join(format!("{name}.disk"))
    }

    /// Everything that happened so far, with when.
    pub fn happened(&self) -> Vec<(Instant, Happened)> {
        self.state.lock().log.clone()
    }

    /// Whether the machine's VM runs now (one that exited by itself counts as not running).
    pub fn running(&self, uuid: &str) -> bool {
        let mut st = self.state.lock();
        match st.running.get_mut(uuid) {
            Some(vm) => match vm.child.try_wait() {
                Ok(Some(_)) => {
                    st.running.remove(uuid);
                    false
                }
                _ => true,
            },
            None => false,
        }
    }

    /// The consoles of the machine's boots so far, oldest first.
    pub fn consoles(&self, uuid: &str) -> Vec<String> {
        let st = self.state.lock();
        st.consoles
            .get(uuid)
            .map(|v| {
                v.iter()
                    .map(|p| {
                        std::fs::read_to_string(p)
                            .unwrap_or_default()
                            .replace('\r', "")
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Machines {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
        let mut st = self.state.lock();
        for (_, mut vm) in st.running.drain() {
            let _ = vm.child.kill();
            let _ = vm.child.wait();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn machine(other_nics: &[&str], boot_nic: usize) -> Machine {
        Machine {
            name: "m".into(),
            uuid: "u".into(),
            serial: "s".into(),
            mac: "00:1b:21:00:00:03".into(),
            other_nics: other_nics.iter().map(|s| (*s).to_owned()).collect(),
            boot_nic,
            firmware: Firmware::Bios,
            ignore: false,
            ssh_port: Some(2222),
        }
    }

    #[test]
    fn the_booting_nic_sits_where_asked_and_alone_names_the_bootfile() {
        let m = machine(
            &[
                "00:1b:21:00:00:01",
                "00:1b:21:00:00:02",
                "00:1b:21:00:00:04",
            ],
            2,
        );
        let args = nic_args(&m, "http://10.0.2.2:1/boot.ipxe?mac=${netX/mac}");
        let devices: Vec<&str> = args
            .chunks(2)
            .filter(|p| p[0] == "-device")
            .map(|p| p[1].as_str())
            .collect();
        assert_eq!(
            devices,
            [
                "virtio-net-pci,netdev=n0,mac=00:1b:21:00:00:01",
                "virtio-net-pci,netdev=n1,mac=00:1b:21:00:00:02",
                "virtio-net-pci,netdev=n2,mac=00:1b:21:00:00:03,bootindex=1",
                "virtio-net-pci,netdev=n3,mac=00:1b:21:00:00:04",
            ]
        );
        let netdevs: Vec<&str> = args
            .chunks(2)
            .filter(|p| p[0] == "-netdev")
            .map(|p| p[1].as_str())
            .collect();
        assert_eq!(netdevs[0], "user,id=n0");
        assert_eq!(
            netdevs[2],
            "user,id=n2,bootfile=http://10.0.2.2:1/boot.ipxe?mac=${netX/mac},hostfwd=tcp:127.0.0.1:2222-:22"
        );
        assert_eq!(netdevs[3], "user,id=n3");
        // Past the end: last; one NIC: it.
        let last = nic_args(&machine(&["00:1b:21:00:00:01"], 9), "f");
        assert!(last[3].ends_with("mac=00:1b:21:00:00:01") && last[7].ends_with("bootindex=1"));
        assert_eq!(nic_args(&machine(&[], 0), "f").len(), 4);
    }
}
