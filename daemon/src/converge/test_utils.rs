//! In-memory fakes for the converge task: a PCI bus that behaves like the kernel and a probe.

use std::collections::BTreeMap;

use bc_protocol::spec::GpuDriver;
use parking_lot::Mutex;

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
