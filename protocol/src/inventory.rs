//! The inventory document a node agent reports (`Inventory.document_json`), camelCase JSON.
//!
//! Every section is optional: a collector that cannot read its source leaves the section or field
//! absent and adds a [`Note`]; it never fails the whole inventory. Fields the control plane reads
//! today (keep their names and meaning): `hostname`, `cpu.model`, `cpu.threads`,
//! `memory.totalBytes`, `disks[].name`, `disks[].sizeBytes`, `nics[].name`, `nics[].mac`,
//! `nics[].physical`, `os.kernel`, `os.bootId`, `notes`.

use serde::{Deserialize, Serialize};

pub mod bmc;
pub mod health;
pub mod lldp;
pub mod topology;

pub use bmc::{Bmc, BmcLanChannel, RedfishHostInterface};
pub use health::DiskHealth;
pub use lldp::LldpNeighbor;
pub use topology::{Affinity, DegradedLink, DeviceKind, GpuAffinity, NumaNode, Topology};

/// Version of this document's shape. Bump on an incompatible change; additions keep it.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole inventory of one machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    pub schema_version: u32,
    /// `/proc/sys/kernel/hostname`, else `/etc/hostname`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<System>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default)]
    pub pci_devices: Vec<PciDevice>,
    #[serde(default)]
    pub infiniband: Vec<InfinibandPort>,
    /// GPUs: from NVML when it is loaded, else from the PCI list (vendor `10de`, class `0x03xx`).
    #[serde(default)]
    pub gpus: Vec<Gpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<Os>,
    /// `uefi` (`/sys/firmware/efi` exists) or `bios`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mode: Option<BootMode>,
    /// PCIe and NUMA topology: NUMA nodes, GPU affinity, degraded links (sysfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    /// The BMC as the host sees it: in-band IPMI and SMBIOS type 42 ([`Bmc`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<Bmc>,
    /// Why a section or field is missing.
    #[serde(default)]
    pub notes: Vec<Note>,
}

/// System identity from SMBIOS (types 0, 1, 2, 3) or `/sys/class/dmi/id`. Values are as the
/// firmware wrote them (trimmed), placeholders included: the hardware key, not the inventory,
/// judges them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct System {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Rendered by the SMBIOS rule (2.6+: first three fields little-endian), lowercase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios_version: Option<String>,
    /// As the firmware wrote it, usually `MM/DD/YYYY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bios_date: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_vendor: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board_serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis_vendor: Option<String>,
    /// SMBIOS type 3 chassis type byte (e.g. 23 = rack mount chassis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis_type: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chassis_serial: Option<String>,
    /// `major.minor` from the entry point; absent when only `/sys/class/dmi/id` was readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smbios_version: Option<String>,
}

/// CPU facts from `/proc/cpuinfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Distinct `physical id` values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    /// Distinct (`physical id`, `core id`) pairs: physical cores over all sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    /// Logical CPUs (hardware threads).
    pub threads: u32,
    /// Kernel machine name (`x86_64`, `aarch64`), from `/proc/sys/kernel/arch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// `flags` (x86) or `Features` (arm64) of the first CPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// Highest maximum frequency over all CPUs, MHz: `cpufreq/cpuinfo_max_freq` (kHz) of
    /// `/sys/devices/system/cpu/cpu<N>`, else `cpufreq/scaling_max_freq` (kHz).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_frequency_mhz: Option<u32>,
    /// `cpu MHz` of the first CPU in `/proc/cpuinfo` (x86), rounded, MHz: the clock at the time
    /// of reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_frequency_mhz: Option<u32>,
    /// `microcode` of the first CPU in `/proc/cpuinfo` (x86), as written (`0xb4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microcode: Option<String>,
}

/// Memory: total from `/proc/meminfo`, modules from SMBIOS type 17.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// `MemTotal`, bytes.
    pub total_bytes: u64,
    /// Populated slots only (SMBIOS type 17 with a non-zero size).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dimms: Vec<Dimm>,
    /// Installed memory, bytes: the sum of the DIMMs' sizes (SMBIOS type 17 size or extended
    /// size), what ironic calls `physical_mb`; absent without SMBIOS DIMMs. Above `totalBytes`
    /// by what the firmware and kernel reserve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimm_total_bytes: Option<u64>,
}

/// One memory module (SMBIOS type 17, Memory Device).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dimm {
    /// Device locator string, e.g. `DIMM_A1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locator: Option<String>,
    /// Bytes (from the size field, or the extended size when the size field says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Memory type, e.g. `DDR4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_type: Option<String>,
    /// MT/s (the SMBIOS "speed" field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
}

/// A block device from `/sys/block` (and NVMe namespaces from `/sys/class/nvme`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    pub name: String,
    /// Bytes (`size` is in 512-byte sectors in sysfs).
    pub size_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// `wwid` (e.g. `naa.5000c500a1b2c3d4`, `eui.0025385...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotational: Option<bool>,
    /// `nvme`, `sata`, `sas`, `usb`, `virtio`, `scsi` (from the device path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    pub nvme: bool,
    /// The vendor extension of an NAA type 6 `wwn` (`naa.6…`, 32 hex digits): its last 16 hex
    /// digits, `0x…` as udev's `ID_WWN_VENDOR_EXTENSION`; the first 16 are the WWN proper.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn_vendor_extension: Option<String>,
    /// `device/vendor`: SCSI INQUIRY vendor identification (`ATA` for SATA behind libata), the
    /// virtio vendor id (`0x1af4`) for virtio disks, as lsblk shows it; absent for NVMe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Firmware revision: `device/rev` (SCSI INQUIRY product revision level) or the NVMe
    /// controller's `firmware_rev` (Identify Controller FR).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// SCSI address `host:channel:target:lun` (`0:0:0:0`): the name of the SCSI device the
    /// disk's `device` link points to. Absent for NVMe and virtio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hctl: Option<String>,
    /// Names in `/dev/disk/by-path` whose link points to this disk (not its partitions), sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_path: Vec<String>,
    /// Names in `/dev/disk/by-id` whose link points to this disk, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_id: Vec<String>,
    /// `queue/logical_block_size`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_sector_bytes: Option<u32>,
    /// `queue/physical_block_size`, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physical_sector_bytes: Option<u32>,
    /// `removable` is 1 (the medium can be removed: USB sticks, card readers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removable: Option<bool>,
    /// Partitions: the subdirectories of `/sys/block/<disk>` that hold a `partition` file,
    /// sorted (`sda1`, `nvme0n1p1`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<String>,
    /// Devices stacked on the disk or on one of its partitions (md RAID, device-mapper): the
    /// entries of their `holders/` directories, sorted, each once (`dm-0`, `md127`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
    /// Health summary, where the machine gives one (NVMe SMART / Health Information log page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<DiskHealth>,
}

/// A network interface from `/sys/class/net`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    pub name: String,
    /// Current MAC (`address`), lowercase `aa:bb:...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// The burned-in MAC when known (bond member's `perm_hwaddr`, ETHTOOL_GPERMADDR, or `address`
    /// when `addr_assign_type` is 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permanent_mac: Option<String>,
    /// True when the interface has a `device` link (a real device, not a virtual interface).
    pub physical: bool,
    /// Kernel driver (`device/driver` link name; else `driver` of the ETHTOOL_GDRVINFO ioctl).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The driver's version: `version` of `struct ethtool_drvinfo` (ETHTOOL_GDRVINFO,
    /// `linux/ethtool.h`); in-tree drivers report the kernel release there. Running machine only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The NIC's firmware version: `fw_version` of `struct ethtool_drvinfo`; absent when the
    /// driver leaves it empty or writes `N/A` (virtio_net, veth). Running machine only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware_version: Option<String>,
    /// Mb/s (`speed`); absent when the kernel reports -1 (unknown) or refuses the read (EINVAL:
    /// the interface is down or has no link settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbps: Option<u32>,
    /// `carrier` is 1; absent when the interface is administratively down (the kernel answers
    /// EINVAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// PCI address of the device (`0000:03:00.0`) when it is a PCI function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// An InfiniBand (IPoIB) interface's port GUID, `0002:c903:000f:abcd`: the last 8 bytes of
    /// its 20-byte link-layer address, which is not a MAC (`mac` keeps the address as written,
    /// `permanentMac` stays absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_guid: Option<String>,
    /// `duplex`: `full` or `half`; absent when the kernel says `unknown` or there is no link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplex: Option<String>,
    /// PCI vendor id of the function at `pciAddress` (`/sys/bus/pci/devices/<addr>/vendor`; not
    /// `device/vendor`, which is a virtio id for a virtio NIC), lowercase hex without `0x`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_vendor_id: Option<String>,
    /// PCI device id of that function (`…/device`), lowercase hex without `0x`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<String>,
    /// SR-IOV virtual functions the function supports (`…/sriov_totalvfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov_total_vfs: Option<u32>,
    /// SR-IOV virtual functions enabled now (`…/sriov_numvfs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov_num_vfs: Option<u32>,
    /// IPv4 addresses with their prefix length (`192.0.2.2/24`), from `getifaddrs(3)` on the
    /// running machine only (no procfs file lists them per interface).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv4: Vec<String>,
    /// IPv6 addresses with their prefix length (`fe80::1/64`), from `/proc/net/if_inet6`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ipv6: Vec<String>,
    /// LLDP neighbours heard on the interface (IEEE 802.1AB LLDPDUs on a raw socket): what
    /// `bcd inventory --lldp-wait` heard in its wait, what the node agent's listener holds
    /// (entries past their TTL dropped), what the ramdisk heard before its first inventory.
    /// Empty (absent) when nothing was heard or LLDP was not listened to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lldp: Vec<LldpNeighbor>,
}

/// A PCI function from `/sys/bus/pci/devices`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PciDevice {
    /// `domain:bus:device.function`, e.g. `0000:45:00.0`.
    pub address: String,
    /// Lowercase hex without `0x`, e.g. `10de`.
    pub vendor_id: String,
    pub device_id: String,
    /// 24-bit class code, lowercase hex without `0x`, e.g. `030200`.
    pub class: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// `numa_node`; absent when the kernel reports -1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// NVIDIA (`10de`) display/3D controller (class `03xxxx`).
    pub nvidia_gpu: bool,
    /// Mellanox/NVIDIA Networking (`15b3`) network controller (class `02xxxx`): a ConnectX or
    /// BlueField port, InfiniBand or Ethernet.
    pub mellanox: bool,
    /// An InfiniBand controller (class `0207xx`), any vendor.
    pub infiniband: bool,
    /// `current_link_speed` (`16.0 GT/s PCIe`), GT/s; absent when `Unknown` or not PCIe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_link_speed_gts: Option<f64>,
    /// `max_link_speed`, GT/s: what the device itself supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_link_speed_gts: Option<f64>,
    /// `current_link_width`, lanes; absent when 0 (no link trained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_link_width: Option<u32>,
    /// `max_link_width`, lanes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_link_width: Option<u32>,
    /// The PCI host bridge the function hangs under (`pci0000:00`), from its canonical sysfs
    /// path `/sys/devices/pci0000:00/…`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bridge: Option<String>,
    /// The bridges between the host bridge and the function, root port first (root port, then
    /// each switch's upstream and downstream port), from the same path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bridges: Vec<String>,
}

/// One InfiniBand (or RoCE) port from `/sys/class/infiniband/<dev>/ports/<n>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InfinibandPort {
    /// HCA name, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    /// `state` without its number, e.g. `ACTIVE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `phys_state` without its number, e.g. `LinkUp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phys_state: Option<String>,
    /// `rate` as written, e.g. `200 Gb/sec (4X HDR)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// `InfiniBand` or `Ethernet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// The port GUID, `0002:c903:000f:abcd`: the low 8 bytes of GID index 0 (`gids/0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_guid: Option<String>,
}

/// A GPU. From NVML when present (every field), else from PCI (`pciBusId`, `name` from ids).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// `GPU-xxxxxxxx-...` (nvmlDeviceGetUUID); absent from the PCI fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `0000:45:00.0`.
    pub pci_bus_id: String,
    /// Framebuffer bytes (nvmlDeviceGetMemoryInfo total).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// nvmlSystemGetDriverVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The VBIOS version (`nvmlDeviceGetVbiosVersion`), e.g. `96.00.89.00.01`; NVML only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios_version: Option<String>,
    /// `nvml` or `pci`: which source filled this entry.
    pub source: String,
    /// MIG mode is on (`nvmlDeviceGetMigMode` current mode); absent where MIG is not supported
    /// or the source is `pci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// The MIG devices (GPU instances' compute instances) carved out of this GPU, in NVML's
    /// index order (`nvmlDeviceGetMigDeviceHandleByIndex`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    /// Its registration with the NVLink fabric (`nvmlDeviceGetGpuFabricInfoV`); absent where
    /// the GPU has none (no NVSwitch fabric, before Hopper) or the source is `pci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<GpuFabric>,
}

/// A GPU's registration with the NVLink fabric, as the fabric manager left it (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuFabric {
    /// `notStarted` (the fabric manager has not registered the GPU), `inProgress`, `completed`.
    pub state: String,
    /// The registration's failure, once completed (NVML's words for its status); absent when it
    /// succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The clique: the GPUs with one clique id reach each other over NVLink. Once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clique_id: Option<u32>,
    /// The fabric's cluster UUID. Once completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_uuid: Option<String>,
}

/// One MIG device of a GPU in MIG mode.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDevice {
    /// Index under its parent GPU (`nvmlDeviceGetMigDeviceHandleByIndex`).
    pub index: u32,
    /// `MIG-xxxxxxxx-...` (`nvmlDeviceGetUUID` on the MIG handle).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// e.g. `NVIDIA H100 80GB HBM3 MIG 1g.10gb` (`nvmlDeviceGetName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Memory of the instance, bytes (`nvmlDeviceGetMemoryInfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// Operating system facts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Os {
    /// `/proc/sys/kernel/osrelease`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// `PRETTY_NAME` of `/etc/os-release` (else `/usr/lib/os-release`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distro: Option<String>,
    /// `ID` and `VERSION_ID` of os-release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distro_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distro_version: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Seconds since boot (`/proc/uptime`, first field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uptime_s: Option<f64>,
}

/// How the machine booted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootMode {
    Uefi,
    Bios,
}

/// Why something could not be collected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Note {
    /// Which collector, e.g. `cpu`, `smbios`.
    pub source: String,
    pub message: String,
}

impl Inventory {
    /// The document as JSON, at most `max` bytes: when the full one is larger, the PCI list, then
    /// the disks, NICs and InfiniBand ports are left out (each with a note saying so) until it
    /// fits; `None` if even the smallest form does not. Sections are dropped in the order an
    /// operator needs them least for identity and placement (GPUs, CPU and memory stay).
    pub fn to_json_within(&self, max: usize) -> Option<Vec<u8>> {
        let mut doc = self.clone();
        let fits = |d: &Inventory| serde_json::to_vec(d).ok().filter(|b| b.len() <= max);
        if let Some(b) = fits(&doc) {
            return Some(b);
        }
        type Shed = fn(&mut Inventory) -> usize;
        let steps: [(&str, Shed); 4] = [
            ("pci", |d| std::mem::take(&mut d.pci_devices).len()),
            ("disks", |d| std::mem::take(&mut d.disks).len()),
            ("nics", |d| std::mem::take(&mut d.nics).len()),
            ("infiniband", |d| std::mem::take(&mut d.infiniband).len()),
        ];
        for (source, drop) in steps {
            let n = drop(&mut doc);
            doc.notes.push(Note {
                source: source.to_owned(),
                message: format!("{n} entries left out: the inventory was over {max} bytes"),
            });
            if let Some(b) = fits(&doc) {
                return Some(b);
            }
        }
        // Notes themselves (a collector repeating an error) are the last thing that can grow.
        doc.notes.truncate(16);
        fits(&doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_the_control_plane_reads_keep_their_names() {
        let inv = Inventory {
            schema_version: SCHEMA_VERSION,
            hostname: Some("h".into()),
            cpu: Some(Cpu {
                model: Some("m".into()),
                threads: 8,
                ..Cpu::default()
            }),
            memory: Some(Memory {
                total_bytes: 1024,
                ..Memory::default()
            }),
            disks: vec![Disk {
                name: "sda".into(),
                size_bytes: 512,
                ..Disk::default()
            }],
            nics: vec![Nic {
                name: "eth0".into(),
                mac: Some("aa:bb:cc:dd:ee:ff".into()),
                physical: true,
                lldp: vec![LldpNeighbor {
                    chassis_id: "00:11:22:33:44:55".into(),
                    chassis_id_subtype: "macAddress".into(),
                    port_id: "Ethernet12".into(),
                    port_id_subtype: "interfaceName".into(),
                    port_description: Some("rack 4 port 12".into()),
                    system_name: Some("leaf-4".into()),
                    system_description: Some("SONiC".into()),
                    management_addresses: vec!["192.0.2.4".into()],
                    vlan_id: Some(100),
                    ttl_seconds: 120,
                }],
                ..Nic::default()
            }],
            os: Some(Os {
                kernel: Some("6.1".into()),
                boot_id: Some("b".into()),
                ..Os::default()
            }),
            boot_mode: Some(BootMode::Uefi),
            ..Inventory::default()
        };
        let v = serde_json::to_value(&inv).unwrap_or_default();
        assert_eq!(v["hostname"], "h");
        assert_eq!(v["cpu"]["model"], "m");
        assert_eq!(v["cpu"]["threads"], 8);
        assert_eq!(v["memory"]["totalBytes"], 1024);
        assert_eq!(v["disks"][0]["name"], "sda");
        assert_eq!(v["disks"][0]["sizeBytes"], 512);
        assert_eq!(v["nics"][0]["name"], "eth0");
        assert_eq!(v["nics"][0]["mac"], "aa:bb:cc:dd:ee:ff");
        assert_eq!(v["nics"][0]["physical"], true);
        let n = &v["nics"][0]["lldp"][0];
        assert_eq!(n["chassisId"], "00:11:22:33:44:55");
        assert_eq!(n["chassisIdSubtype"], "macAddress");
        assert_eq!(n["portId"], "Ethernet12");
        assert_eq!(n["portIdSubtype"], "interfaceName");
        assert_eq!(n["portDescription"], "rack 4 port 12");
        assert_eq!(n["systemName"], "leaf-4");
        assert_eq!(n["systemDescription"], "SONiC");
        assert_eq!(n["managementAddresses"][0], "192.0.2.4");
        assert_eq!(n["vlanId"], 100);
        assert_eq!(n["ttlSeconds"], 120);
        let bare = serde_json::to_value(Nic::default()).unwrap_or_default();
        assert!(bare.get("lldp").is_none(), "no neighbours, no key: {bare}");
        assert_eq!(v["os"]["kernel"], "6.1");
        assert_eq!(v["os"]["bootId"], "b");
        assert_eq!(v["bootMode"], "uefi");
        assert!(v["notes"].is_array());
        let back: Inventory = serde_json::from_value(v).unwrap_or_default();
        assert_eq!(back, inv);
    }

    #[test]
    fn an_oversized_inventory_sheds_sections_until_it_fits() {
        let mut inv = Inventory {
            hostname: Some("h".into()),
            ..Default::default()
        };
        inv.pci_devices = (0..2000)
            .map(|i| PciDevice {
                address: format!("0000:{i:04x}:00.0"),
                ..Default::default()
            })
            .collect();
        let full = serde_json::to_vec(&inv).unwrap_or_default();
        assert_eq!(inv.to_json_within(full.len()), Some(full.clone()));
        let small = inv.to_json_within(full.len() / 4).unwrap_or_default();
        assert!(!small.is_empty() && small.len() <= full.len() / 4);
        let back: Inventory = serde_json::from_slice(&small).unwrap_or_default();
        assert!(back.pci_devices.is_empty());
        assert_eq!(back.hostname.as_deref(), Some("h"));
        assert!(
            back.notes
                .iter()
                .any(|n| n.source == "pci" && n.message.contains("2000 entries"))
        );
        assert_eq!(
            inv.to_json_within(10),
            None,
            "not even the skeleton fits in 10 bytes"
        );
    }
}
