//! In-memory fakes for the converge task: a PCI bus that behaves like the kernel and a probe,
//! and the rig the task's tests share (a host root, a state dir, a clock).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bc_protocol::pb;
use bc_protocol::spec::{
    BreakGlassSsh, Devices, GpuBinding, GpuDriver, GpuMatch, NodeSpec, SshKey,
};
use bcd_probes::hostroot::HostRoot;
use chrono::{TimeZone, Utc};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use super::Applier;
use super::devices::{DeviceError, GpuProcessProbe, PciBus};

/// Called with the address at the start of every `drivers_probe`; lets a test hold an apply.
pub type ProbeHook = Box<dyn Fn(&str) + Send + Sync>;

/// `(bound driver, driver_override)` of one pretend device.
pub type DevState = (Option<String>, Option<String>);

/// NVIDIA GPUs on a pretend PCI bus: `(driver, driver_override)` per address, every write logged.
#[derive(Default)]
pub struct MemBus {
    pub devs: Mutex<BTreeMap<String, DevState>>,
    pub writes: Mutex<Vec<String>>,
    pub hook: Mutex<Option<ProbeHook>>,
}

impl std::fmt::Debug for MemBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemBus").field("devs", &self.devs).finish()
    }
}

impl MemBus {
    /// GPUs at `addrs`, all on `nvidia` with no override.
    pub fn with_gpus(addrs: &[&str]) -> Self {
        let bus = Self::default();
        for a in addrs {
            bus.devs
                .lock()
                .insert((*a).to_owned(), (Some("nvidia".to_owned()), None));
        }
        bus
    }

    pub fn driver(&self, addr: &str) -> Option<String> {
        self.devs.lock().get(addr).and_then(|d| d.0.clone())
    }

    /// Writes that touched `addr`.
    pub fn writes_for(&self, addr: &str) -> Vec<String> {
        self.writes
            .lock()
            .iter()
            .filter(|w| w.starts_with(addr))
            .cloned()
            .collect()
    }
}

impl PciBus for MemBus {
    fn exists(&self, addr: &str) -> bool {
        self.devs.lock().contains_key(addr)
    }
    fn ids(&self, _addr: &str) -> Result<(String, String), DeviceError> {
        Ok(("0x10de".to_owned(), "0x030200".to_owned()))
    }
    fn current_driver(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        Ok(self.driver(addr))
    }
    fn driver_override(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        Ok(self.devs.lock().get(addr).and_then(|d| d.1.clone()))
    }
    fn driver_loaded(&self, _driver: GpuDriver) -> bool {
        true
    }
    fn set_override(&self, addr: &str, driver: GpuDriver) -> Result<(), DeviceError> {
        self.writes.lock().push(format!("{addr} override={driver}"));
        if let Some(d) = self.devs.lock().get_mut(addr) {
            d.1 = Some(driver.as_str().to_owned());
        }
        Ok(())
    }
    fn unbind(&self, addr: &str) -> Result<(), DeviceError> {
        self.writes.lock().push(format!("{addr} unbind"));
        if let Some(d) = self.devs.lock().get_mut(addr) {
            d.0 = None;
        }
        Ok(())
    }
    fn probe(&self, addr: &str) -> Result<(), DeviceError> {
        if let Some(h) = self.hook.lock().as_ref() {
            h(addr);
        }
        self.writes.lock().push(format!("{addr} probe"));
        if let Some(d) = self.devs.lock().get_mut(addr) {
            d.0.clone_from(&d.1);
        }
        Ok(())
    }
}

/// Busy GPUs by address.
#[derive(Debug, Default)]
pub struct BusyProbe {
    pub busy: Mutex<BTreeMap<String, Vec<u32>>>,
}

impl GpuProcessProbe for BusyProbe {
    fn running_pids(&self, pci_address: &str) -> Result<Vec<u32>, String> {
        Ok(self
            .busy
            .lock()
            .get(pci_address)
            .cloned()
            .unwrap_or_default())
    }
}

// Generated with ssh-keygen for these tests; the private half was thrown away.
pub const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFoI/vRJxuXKIFpm08wZNESqDqg4OFGJz5u4IOqvbE7K";
pub const A: &str = "0000:3b:00.0";
pub const B: &str = "0000:86:00.0";
pub const WAIT: Duration = Duration::from_secs(10);

/// A host root with users `ops` and `alt` (the test's own uid), a state dir, a pretend PCI bus
/// with GPUs `A` and `B`, and a clock the test moves.
pub struct Rig {
    pub tmp: tempfile::TempDir,
    pub bus: Arc<MemBus>,
    pub probe: Arc<BusyProbe>,
    pub now: Arc<AtomicI64>,
}

impl Rig {
    pub fn new() -> Result<Self, std::io::Error> {
        let tmp = tempfile::tempdir()?;
        let uid = nix::unistd::Uid::effective().as_raw();
        let gid = nix::unistd::Gid::effective().as_raw();
        std::fs::create_dir_all(tmp.path().join("root/etc"))?;
        std::fs::write(
            tmp.path().join("root/etc/passwd"),
            format!("ops:x:{uid}:{gid}::/home/ops:/bin/sh\nalt:x:{uid}:{gid}::/home/alt:/bin/sh\n"),
        )?;
        std::fs::create_dir_all(tmp.path().join("root/home/ops"))?;
        std::fs::create_dir_all(tmp.path().join("root/home/alt"))?;
        std::fs::create_dir_all(tmp.path().join("state"))?;
        Ok(Self {
            tmp,
            bus: Arc::new(MemBus::with_gpus(&[A, B])),
            probe: Arc::new(BusyProbe::default()),
            now: Arc::new(AtomicI64::new(chrono::Utc::now().timestamp_millis())),
        })
    }
    pub fn state_dir(&self) -> PathBuf {
        self.tmp.path().join("state")
    }
    pub fn applier(&self) -> Applier {
        let now = self.now.clone();
        Applier::new(
            HostRoot::new(self.tmp.path().join("root")),
            self.state_dir(),
            self.probe.clone(),
        )
        .with_bus(self.bus.clone())
        .with_clock(Arc::new(move || now.load(Ordering::SeqCst)))
    }
    pub fn keys_of(&self, user: &str) -> String {
        std::fs::read_to_string(
            self.tmp
                .path()
                .join(format!("root/home/{user}/.ssh/authorized_keys")),
        )
        .unwrap_or_default()
    }
}

pub fn spec(gpus: &[(&str, GpuDriver)], user: &str, keys: Vec<SshKey>) -> pb::NodeSpec {
    pb::NodeSpec::from(&NodeSpec {
        devices: Devices {
            gpus: gpus
                .iter()
                .map(|(a, d)| GpuBinding {
                    match_: GpuMatch::PciAddress((*a).to_owned()),
                    driver: *d,
                })
                .collect(),
        },
        break_glass_ssh: (!user.is_empty()).then(|| BreakGlassSsh {
            user: user.to_owned(),
            keys,
        }),
    })
}

pub fn key(comment: &str, expires_at_ms: Option<i64>) -> SshKey {
    SshKey {
        public_key: KEY.to_owned(),
        comment: comment.to_owned(),
        expires_at: expires_at_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
    }
}

pub async fn next(rx: &mut mpsc::Receiver<pb::SpecStatus>) -> pb::SpecStatus {
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Some(s)) => s,
        other => panic!("no status: {other:?}"),
    }
}
