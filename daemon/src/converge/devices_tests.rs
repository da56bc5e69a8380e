use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use super::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/hosts/node-exporter/sys"
);
/// The fixture's Intel i350 port (bound to `igb`), our stand-in GPU after its ids are rewritten.
const ADDR: &str = "0000:45:00.0";
const DEV_REL: &str = "devices/pci0000:40/0000:40:01.3/0000:45:00.0";

/// `None` (and a loud message) when the fixture is missing outside CI.
fn fixture() -> Option<&'static Path> {
    let p = Path::new(FIXTURE);
    if p.join(DEV_REL).is_dir() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "fixture {FIXTURE} missing"
    );
    eprintln!("!!! fixture {FIXTURE} missing: skipping device binding test");
    None
}

/// Files in the fixture that stand for sysfs symlinks (the tree was stored without links).
const LINK_FILES: &[&str] = &["driver", "iommu_group", "subsystem"];

fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let (s, d) = (e.path(), dst.join(e.file_name()));
        if e.file_type()?.is_dir() {
            copy_tree(&s, &d)?;
        } else if LINK_FILES.contains(&e.file_name().to_string_lossy().as_ref()) {
            std::os::unix::fs::symlink(std::fs::read_to_string(&s)?.trim(), &d)?;
        } else {
            std::fs::write(&d, std::fs::read(&s)?)?;
        }
    }
    Ok(())
}

/// Copies the fixture's PCI device into `tmp/sys`, adds the bus files the fixture lacks
/// (drivers, `drivers_probe`), and, when `as_gpu`, rewrites its ids to an NVIDIA 3D controller
/// bound to `nvidia`.
fn sysfs_copy(fixture: &Path, tmp: &Path, as_gpu: bool) -> std::io::Result<HostRoot> {
    let sys = tmp.join("sys");
    let dev = sys.join(DEV_REL);
    copy_tree(&fixture.join(DEV_REL), &dev)?;
    let bus = sys.join("bus/pci");
    std::fs::create_dir_all(bus.join("devices"))?;
    let link = std::fs::read_to_string(fixture.join("bus/pci/devices").join(ADDR))?;
    std::os::unix::fs::symlink(link.trim(), bus.join("devices").join(ADDR))?;
    for d in ["igb", "nvidia", "vfio-pci"] {
        std::fs::create_dir_all(bus.join("drivers").join(d))?;
        std::fs::write(bus.join("drivers").join(d).join("unbind"), "")?;
    }
    std::fs::write(bus.join("drivers_probe"), "")?;
    if as_gpu {
        std::fs::write(dev.join("vendor"), "0x10de\n")?;
        std::fs::write(dev.join("class"), "0x030200\n")?;
        std::fs::remove_file(dev.join("driver"))?;
        std::os::unix::fs::symlink("../../../../bus/pci/drivers/nvidia", dev.join("driver"))?;
    }
    Ok(HostRoot::new(tmp))
}

/// The real [`SysfsPci`] writes plus what the kernel does in answer: `unbind` drops the
/// device's `driver` link, `drivers_probe` links it to the loaded driver named in
/// `driver_override`. Every write is logged.
#[derive(Debug)]
struct FakeKernel {
    real: SysfsPci,
    root: HostRoot,
    writes: Mutex<Vec<String>>,
}

impl FakeKernel {
    fn new(root: HostRoot) -> Self {
        Self {
            real: SysfsPci::new(root.clone()),
            root,
            writes: Mutex::new(Vec::new()),
        }
    }
    fn dev(&self, addr: &str) -> PathBuf {
        self.root.path("/sys/bus/pci/devices").join(addr)
    }
    fn take_writes(&self) -> Vec<String> {
        std::mem::take(&mut *self.writes.lock())
    }
    fn read(&self, abs: &str) -> String {
        self.root.read_trimmed(abs).unwrap_or_default()
    }
}

impl PciBus for FakeKernel {
    fn exists(&self, addr: &str) -> bool {
        self.real.exists(addr)
    }
    fn ids(&self, addr: &str) -> Result<(String, String), DeviceError> {
        self.real.ids(addr)
    }
    fn current_driver(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        self.real.current_driver(addr)
    }
    fn driver_override(&self, addr: &str) -> Result<Option<String>, DeviceError> {
        self.real.driver_override(addr)
    }
    fn driver_loaded(&self, driver: GpuDriver) -> bool {
        self.real.driver_loaded(driver)
    }
    fn set_override(&self, addr: &str, driver: GpuDriver) -> Result<(), DeviceError> {
        self.writes.lock().push(format!("driver_override={driver}"));
        self.real.set_override(addr, driver)
    }
    fn unbind(&self, addr: &str) -> Result<(), DeviceError> {
        let from = self.real.current_driver(addr)?.unwrap_or_default();
        self.writes.lock().push(format!("unbind from {from}"));
        self.real.unbind(addr)?;
        let _ = std::fs::remove_file(self.dev(addr).join("driver"));
        Ok(())
    }
    fn probe(&self, addr: &str) -> Result<(), DeviceError> {
        self.writes.lock().push("drivers_probe".to_owned());
        self.real.probe(addr)?;
        if let Some(d) = self.real.driver_override(addr)?
            && self.root.path("/sys/bus/pci/drivers").join(&d).is_dir()
        {
            let _ = std::os::unix::fs::symlink(
                format!("../../../../bus/pci/drivers/{d}"),
                self.dev(addr).join("driver"),
            );
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FakeProbe {
    pids: Mutex<Result<Vec<u32>, String>>,
    uuids: Mutex<BTreeMap<String, String>>,
}

impl FakeProbe {
    fn idle() -> Arc<Self> {
        Arc::new(Self {
            pids: Mutex::new(Ok(vec![])),
            uuids: Mutex::default(),
        })
    }
}

impl GpuProcessProbe for FakeProbe {
    fn running_pids(&self, _pci_address: &str) -> Result<Vec<u32>, String> {
        self.pids.lock().clone()
    }
    fn pci_address_for_uuid(&self, uuid: &str) -> Result<Option<String>, String> {
        Ok(self.uuids.lock().get(uuid).cloned())
    }
}

fn binding(m: GpuMatch, driver: GpuDriver) -> GpuBinding {
    GpuBinding { match_: m, driver }
}

#[test]
fn rebinds_through_override_unbind_probe_and_twice_changes_nothing()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let kernel = FakeKernel::new(sysfs_copy(fx, tmp.path(), true)?);
    let probe = FakeProbe::idle();
    let mut b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let to_vfio = binding(
        GpuMatch::PciAddress("45:00.0".to_owned()),
        GpuDriver::VfioPci,
    );

    let out = b.apply(&to_vfio)?;
    assert_eq!(
        out,
        BindOutcome::Rebound {
            from: Some("nvidia".to_owned())
        }
    );
    assert_eq!(
        kernel.take_writes(),
        [
            "driver_override=vfio-pci",
            "unbind from nvidia",
            "drivers_probe"
        ]
    );
    // The real files got the kernel ABI's values.
    let dev = format!("/sys/bus/pci/devices/{ADDR}");
    assert_eq!(kernel.read(&format!("{dev}/driver_override")), "vfio-pci");
    assert_eq!(kernel.read("/sys/bus/pci/drivers/nvidia/unbind"), ADDR);
    assert_eq!(kernel.read("/sys/bus/pci/drivers_probe"), ADDR);
    assert_eq!(kernel.current_driver(ADDR)?.as_deref(), Some("vfio-pci"));

    assert_eq!(b.apply(&to_vfio)?, BindOutcome::Unchanged);
    assert!(kernel.take_writes().is_empty(), "second apply wrote");

    let back = binding(GpuMatch::PciAddress(ADDR.to_owned()), GpuDriver::Nvidia);
    assert!(matches!(b.apply(&back)?, BindOutcome::Rebound { .. }));
    assert_eq!(kernel.current_driver(ADDR)?.as_deref(), Some("nvidia"));
    assert_eq!(kernel.read("/sys/bus/pci/drivers/vfio-pci/unbind"), ADDR);
    Ok(())
}

#[test]
fn busy_gpu_is_not_rebound_and_says_why() -> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let kernel = FakeKernel::new(sysfs_copy(fx, tmp.path(), true)?);
    let probe = FakeProbe::idle();
    *probe.pids.lock() = Ok(vec![4242, 4243]);
    let b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let err = b.bind(ADDR, GpuDriver::VfioPci).err();
    let Some(err) = err else {
        panic!("busy GPU was rebound")
    };
    assert_eq!(err.reason(), "GpuBusy");
    assert!(err.to_string().contains("4242"), "{err}");
    assert!(kernel.take_writes().is_empty());
    assert_eq!(kernel.current_driver(ADDR)?.as_deref(), Some("nvidia"));

    // A probe that cannot answer counts as busy.
    *probe.pids.lock() = Err("NVML: driver not loaded".to_owned());
    let err = b.bind(ADDR, GpuDriver::VfioPci).err();
    assert_eq!(err.map(|e| e.reason()), Some("GpuProbeFailed"));
    assert!(kernel.take_writes().is_empty());
    Ok(())
}

#[test]
fn fixture_nic_is_refused_as_not_a_gpu() -> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let kernel = FakeKernel::new(sysfs_copy(fx, tmp.path(), false)?);
    let probe = FakeProbe::idle();
    let b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let err = b.bind(ADDR, GpuDriver::VfioPci).err();
    assert!(
        matches!(&err, Some(DeviceError::NotAGpu { vendor, .. }) if vendor == "0x8086"),
        "{err:?}"
    );
    assert!(kernel.take_writes().is_empty());
    assert_eq!(kernel.current_driver(ADDR)?.as_deref(), Some("igb"));
    Ok(())
}

#[test]
fn override_alone_is_written_when_already_on_the_driver() -> Result<(), Box<dyn std::error::Error>>
{
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let kernel = FakeKernel::new(sysfs_copy(fx, tmp.path(), true)?);
    let probe = FakeProbe::idle();
    // Busy does not matter when nothing is unbound.
    *probe.pids.lock() = Ok(vec![1]);
    let b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    assert_eq!(b.bind(ADDR, GpuDriver::Nvidia)?, BindOutcome::OverrideSet);
    assert_eq!(kernel.take_writes(), ["driver_override=nvidia"]);
    assert_eq!(b.bind(ADDR, GpuDriver::Nvidia)?, BindOutcome::Unchanged);
    assert!(kernel.take_writes().is_empty());
    Ok(())
}

#[test]
fn missing_device_and_unloaded_driver_are_reported() -> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let root = sysfs_copy(fx, tmp.path(), true)?;
    let kernel = FakeKernel::new(root.clone());
    let probe = FakeProbe::idle();
    let b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let err = b.bind("0000:af:00.0", GpuDriver::VfioPci).err();
    assert_eq!(err.map(|e| e.reason()), Some("DeviceNotFound"));
    std::fs::remove_dir_all(root.path("/sys/bus/pci/drivers/vfio-pci"))?;
    let err = b.bind(ADDR, GpuDriver::VfioPci).err();
    assert_eq!(err.map(|e| e.reason()), Some("DriverNotLoaded"));
    assert!(kernel.take_writes().is_empty());
    Ok(())
}

#[test]
fn uuid_is_remembered_after_the_gpu_leaves_nvml() -> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let kernel = FakeKernel::new(sysfs_copy(fx, tmp.path(), true)?);
    let probe = FakeProbe::idle();
    probe
        .uuids
        .lock()
        .insert("GPU-abc".to_owned(), "00000000:45:00.0".to_owned());
    let mut b = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let by_uuid = binding(GpuMatch::Uuid("GPU-abc".to_owned()), GpuDriver::VfioPci);
    assert!(matches!(b.apply(&by_uuid)?, BindOutcome::Rebound { .. }));
    // On vfio-pci NVML no longer lists it.
    probe.uuids.lock().clear();
    assert_eq!(b.apply(&by_uuid)?, BindOutcome::Unchanged);
    assert_eq!(b.uuid_memo.get("gpu-abc").map(String::as_str), Some(ADDR));
    let mut fresh = DeviceBinder::new(&kernel, probe.as_ref(), BTreeMap::new());
    let err = fresh.apply(&by_uuid).err();
    assert_eq!(err.map(|e| e.reason()), Some("DeviceNotFound"));
    Ok(())
}

#[test]
fn procfs_probe_finds_users_of_the_nvidia_node_and_the_vfio_group()
-> Result<(), Box<dyn std::error::Error>> {
    let Some(fx) = fixture() else { return Ok(()) };
    let tmp = tempfile::tempdir()?;
    let root = sysfs_copy(fx, tmp.path(), true)?;
    let info = root.path(format!("/proc/driver/nvidia/gpus/{ADDR}"));
    std::fs::create_dir_all(&info)?;
    std::fs::write(
        info.join("information"),
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 312\nGPU UUID: \t\t GPU-5c3a0f1e-0000-1111-2222-333344445555\nDevice Minor: \t\t 3\n",
    )?;
    let fd = |pid: u32, n: u32, target: &str| -> std::io::Result<()> {
        let dir = root.path(format!("/proc/{pid}/fd"));
        std::fs::create_dir_all(&dir)?;
        std::os::unix::fs::symlink(target, dir.join(n.to_string()))
    };
    fd(1234, 5, "/dev/nvidia3")?;
    fd(1234, 6, "/dev/nvidiactl")?;
    fd(99, 1, "/dev/null")?;
    fd(77, 4, "/dev/nvidia30")?;
    fd(555, 9, "/dev/vfio/25")?;
    let p = ProcfsProbe::new(root);
    assert_eq!(p.running_pids(ADDR)?, [555, 1234]);
    assert_eq!(
        p.pci_address_for_uuid("gpu-5c3a0f1e-0000-1111-2222-333344445555")?
            .as_deref(),
        Some(ADDR)
    );
    assert_eq!(p.pci_address_for_uuid("GPU-other")?, None);
    assert!(p.running_pids("0000:af:00.0")?.is_empty());
    Ok(())
}
