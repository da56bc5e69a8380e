//! The inventory's PCIe/NUMA topology and disk identity fields, read by `bcd inventory -o json`
//! from a real kernel's `/sys` (Debian's kernel in QEMU, see `bc_e2e::vm`), against what QEMU's
//! command line put there and against `lsblk -O -J` from the same boot.
//!
//! The machine (q35, 4 CPUs, two NUMA nodes of 512 MiB, CPUs 0-1 on node 0 and 2-3 on node 1):
//!
//! | where | device | stands for |
//! |---|---|---|
//! | `pcie.0` root port `00:10.0` | NVMe `BCNVME0` | a local NVMe disk |
//! | `pcie.0` root port `00:11.0` | e1000e `…:01` | a NIC |
//! | `pcie.0` root port `00:12.0`, `x-speed=5,x-width=2` | NVMe `BCNVME1` | a narrow, slow slot |
//! | `pcie.0` root port `00:13.0` → switch (x3130-upstream) → 3 downstream ports | NVMe `BCNVME2` (4 KiB sectors), e1000e `…:02`, a second switch | a PCIe switch with a disk and a NIC |
//! | the first switch's third downstream port → switch → downstream port | e1000e `…:04` | a NIC two switches down |
//! | `pcie.0` root port `00:14.0` | virtio-blk `BCVIRTIO0` (4 KiB physical sectors) | a virtio disk |
//! | `pcie.0` root port `00:15.0` | virtio-scsi, scsi-hd `BCSCSI0` (WWN, target 0 LUN 3) | a SCSI disk |
//! | q35's AHCI controller `00:1f.2`, port 0 | ide-hd `BCSATA0` | a SATA disk (SMART through ATA PASS-THROUGH) |
//! | `pxb-pcie` host bridge on NUMA node 1 (bus 0x80), root ports `80:00.0`, `80:01.0`, `80:02.0` | NVMe `BCNVME3`, virtio-net `…:03`, bochs-display | a second socket's root complex; the display stands in for a GPU |
//! | ISA, KCS at I/O `0xca2` | `ipmi-bmc-sim` (firmware 2.34, manufacturer 674) | a BMC, reached in band through `/dev/ipmi0` |
//!
//! There is no NVIDIA GPU in QEMU, so `topology.affinity` (rows are NVIDIA GPUs) is empty here;
//! the pairwise classification (`bcd_probes::inventory::topology::affinity`) is applied to the
//! kernel's PCI placements as the inventory reports them, and checked against the command line.
//!
//! QEMU's emulated endpoints advertise a x1 2.5 GT/s link and train at the lower of that and
//! their port's: no endpoint runs below what both ends support, so `degradedLinks` stays empty;
//! the limited port's own values are checked as QEMU set them.
//!
//! Disk health and NIC driver facts come from real ioctls on the guest's devices: each NVMe
//! controller's SMART / Health Information log page (`NVME_IOCTL_ADMIN_CMD` on `/dev/nvme<N>`),
//! ETHTOOL_GDRVINFO on each NIC. The guest brings up the virtio NIC only, so link, speed and
//! duplex are checked both ways: set on it, absent on the e1000e NICs left down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bc_e2e::vm;
use bc_protocol::inventory::topology::Affinity;
use bc_protocol::inventory::{Disk, Inventory, PciDevice};
use bcd_probes::inventory::topology::affinity;
use serde_json::Value;

const SCSI_WWN: &str = "0x5000c500a1b2c3d4";
/// The virtio NIC, the only interface the guest brings up (with `speed=10000,duplex=full`).
const VIRTIO_NIC: &str = "52:54:00:00:00:03";

/// QEMU's arguments for the machine described in the module docs; `dir` holds the disk images.
fn machine(dir: &std::path::Path) -> Vec<String> {
    let img = |n: &str| {
        let p = dir.join(format!("{n}.img"));
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(64 << 20).unwrap();
        format!("if=none,id={n},format=raw,file={}", p.display())
    };
    let mut a: Vec<String> = Vec::new();
    let mut add = |v: &[&str]| a.extend(v.iter().map(|s| (*s).to_owned()));
    add(&["-vga", "none"]);
    add(&["-object", "memory-backend-ram,id=m0,size=512M"]);
    add(&["-object", "memory-backend-ram,id=m1,size=512M"]);
    add(&["-numa", "node,nodeid=0,cpus=0-1,memdev=m0"]);
    add(&["-numa", "node,nodeid=1,cpus=2-3,memdev=m1"]);
    let rp = |id: &str, bus: &str, chassis: u32, addr: &str, extra: &str| {
        format!(
            "pcie-root-port,id={id},bus={bus},chassis={chassis},slot={chassis},addr={addr}{extra}"
        )
    };
    add(&["-device", &rp("rp1", "pcie.0", 1, "0x10", "")]);
    add(&["-drive", &img("nv0")]);
    add(&["-device", "nvme,bus=rp1,serial=BCNVME0,drive=nv0"]);
    add(&["-device", &rp("rp2", "pcie.0", 2, "0x11", "")]);
    add(&["-device", "e1000e,bus=rp2,mac=52:54:00:00:00:01,romfile="]);
    add(&[
        "-device",
        &rp("rp3", "pcie.0", 3, "0x12", ",x-speed=5,x-width=2"),
    ]);
    add(&["-drive", &img("nv1")]);
    add(&["-device", "nvme,bus=rp3,serial=BCNVME1,drive=nv1"]);
    add(&["-device", &rp("rp4", "pcie.0", 4, "0x13", "")]);
    add(&["-device", "x3130-upstream,id=up1,bus=rp4"]);
    add(&[
        "-device",
        "xio3130-downstream,id=dp1,bus=up1,chassis=5,slot=5,addr=0x0",
    ]);
    add(&[
        "-device",
        "xio3130-downstream,id=dp2,bus=up1,chassis=6,slot=6,addr=0x1",
    ]);
    add(&["-drive", &img("nv2")]);
    add(&[
        "-device",
        "nvme,bus=dp1,serial=BCNVME2,drive=nv2,logical_block_size=4096,physical_block_size=4096",
    ]);
    add(&["-device", "e1000e,bus=dp2,mac=52:54:00:00:00:02,romfile="]);
    // A second switch below the first one's third downstream port, with a NIC.
    add(&[
        "-device",
        "xio3130-downstream,id=dp3,bus=up1,chassis=13,slot=13,addr=0x2",
    ]);
    add(&["-device", "x3130-upstream,id=up2,bus=dp3"]);
    add(&[
        "-device",
        "xio3130-downstream,id=dp4,bus=up2,chassis=14,slot=14,addr=0x0",
    ]);
    add(&["-device", "e1000e,bus=dp4,mac=52:54:00:00:00:04,romfile="]);
    add(&["-device", &rp("rp5", "pcie.0", 7, "0x14", "")]);
    add(&["-drive", &img("vb0")]);
    add(&[
        "-device",
        "virtio-blk-pci,bus=rp5,drive=vb0,serial=BCVIRTIO0,physical_block_size=4096",
    ]);
    add(&["-device", &rp("rp6", "pcie.0", 8, "0x15", "")]);
    add(&["-device", "virtio-scsi-pci,id=scsi0,bus=rp6"]);
    add(&["-drive", &img("sd0")]);
    add(&[
        "-device",
        &format!(
            "scsi-hd,bus=scsi0.0,drive=sd0,serial=BCSCSI0,wwn={SCSI_WWN},scsi-id=0,lun=3,\
             logical_block_size=512,physical_block_size=4096"
        ),
    ]);
    add(&[
        "-device",
        "pxb-pcie,id=pxb1,bus_nr=0x80,numa_node=1,bus=pcie.0",
    ]);
    add(&["-device", &rp("rp10", "pxb1", 10, "0x0", "")]);
    add(&["-device", &rp("rp11", "pxb1", 11, "0x1", "")]);
    add(&["-device", &rp("rp12", "pxb1", 12, "0x2", "")]);
    add(&["-drive", &img("nv3")]);
    add(&["-device", "nvme,bus=rp10,serial=BCNVME3,drive=nv3"]);
    add(&[
        "-device",
        "virtio-net-pci,bus=rp11,mac=52:54:00:00:00:03,romfile=,speed=10000,duplex=full",
    ]);
    add(&["-device", "bochs-display,bus=rp12"]);
    // A SATA disk on q35's own AHCI controller (ICH9 at 00:1f.2): QEMU's IDE core implements
    // SMART (RETURN STATUS, READ DATA with its attribute table).
    add(&["-drive", &img("sata0")]);
    add(&[
        "-device",
        "ide-hd,bus=ide.0,drive=sata0,serial=BCSATA0,model=BC SATA DISK",
    ]);
    // A BMC on the system interface (KCS at I/O 0xca2, announced in ACPI and SMBIOS type 38):
    // QEMU's simulator answers Get Device ID with these values and has no LAN channel.
    add(&[
        "-device",
        &format!(
            "ipmi-bmc-sim,id=bmc0,fwrev1={BMC_FWREV1},fwrev2={BMC_FWREV2:#x},mfg_id={BMC_MFG_ID},product_id={BMC_PRODUCT_ID}"
        ),
    ]);
    add(&["-device", "isa-ipmi-kcs,bmc=bmc0"]);
    a
}

/// The simulated BMC's firmware revision: major, and minor in BCD (shown `2.34`).
const BMC_FWREV1: u8 = 2;
const BMC_FWREV2: u8 = 0x34;
/// IANA enterprise number 674 (Dell) and a product id, as a real BMC would report them.
const BMC_MFG_ID: u32 = 674;
const BMC_PRODUCT_ID: u16 = 0x0100;

/// Block devices the guest waits for before running the probes (the kernel names them in probe
/// order: one namespace per NVMe controller, the virtio-blk disk, the SCSI disk).
const DISKS: &[&str] = &[
    "nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1", "vda", "sda", "sdb",
];

struct Seen {
    inv: Inventory,
    lsblk: Value,
}

impl Seen {
    fn pci(&self, root_port: &str, class: &str) -> &PciDevice {
        self.inv
            .pci_devices
            .iter()
            .find(|d| {
                d.bridges.first().map(String::as_str) == Some(root_port)
                    && d.class.starts_with(class)
            })
            .unwrap_or_else(|| {
                panic!(
                    "no {class} function below {root_port}: {:#?}",
                    self.inv.pci_devices
                )
            })
    }
    fn function(&self, addr: &str) -> &PciDevice {
        self.inv
            .pci_devices
            .iter()
            .find(|d| d.address == addr)
            .unwrap_or_else(|| panic!("no PCI function {addr}"))
    }
    fn nic(&self, mac: &str) -> &PciDevice {
        let n = self
            .inv
            .nics
            .iter()
            .find(|n| n.mac.as_deref() == Some(mac))
            .unwrap_or_else(|| panic!("no NIC {mac}: {:#?}", self.inv.nics));
        self.function(n.pci_address.as_deref().expect("NIC's pciAddress"))
    }
    fn disk(&self, serial: &str) -> &Disk {
        self.inv
            .disks
            .iter()
            .find(|d| d.serial.as_deref() == Some(serial))
            .unwrap_or_else(|| panic!("no disk with serial {serial}: {:#?}", self.inv.disks))
    }
    fn lsblk(&self, name: &str) -> &Value {
        self.lsblk["blockdevices"]
            .as_array()
            .expect("lsblk blockdevices")
            .iter()
            .find(|d| d["name"] == name)
            .unwrap_or_else(|| panic!("lsblk has no {name}"))
    }
}

fn nodes(s: &Seen) -> usize {
    s.inv.topology.as_ref().map_or(0, |t| t.numa_nodes.len())
}

#[test]
fn a_real_kernel_reports_the_qemu_machines_topology_and_disks() {
    let Some(tools) = vm::tools_or_skip("topology_vm") else {
        return;
    };
    let bcd = vm::build_bcd();
    let dir = tempfile::tempdir().unwrap();
    // BC_VM_CAPTURE=<dir>: also write the guest's /sys subset there (the fixture tree of
    // bcd-probes' qemu_topology test is made this way).
    let capture = std::env::var_os("BC_VM_CAPTURE").filter(|v| !v.is_empty());
    let initrd = vm::build_initramfs(
        &tools,
        &bcd,
        dir.path(),
        DISKS,
        &[VIRTIO_NIC],
        capture.is_some(),
    );
    let boot = vm::boot(&tools, &initrd, &machine(dir.path()));
    eprintln!(
        "topology_vm: kernel {} booted, probed and powered off in {:.1} s",
        tools.kernel_version, boot.seconds
    );
    if let Some(dest) = &capture {
        let text = boot.sys.as_deref().expect("the guest's /sys capture");
        let dest = std::path::Path::new(dest);
        if dest.exists() {
            std::fs::remove_dir_all(dest).unwrap();
        }
        vm::write_sys_tree(text, dest);
        eprintln!("topology_vm: /sys subset written to {}", dest.display());
    }
    let inv: Inventory = serde_json::from_value(boot.inventory.clone())
        .unwrap_or_else(|e| panic!("inventory document: {e}\n{:#}", boot.inventory));
    let s = Seen {
        inv,
        lsblk: boot.lsblk.clone(),
    };

    // NUMA nodes as -numa set them.
    let topo = s.inv.topology.as_ref().expect("topology section");
    let ids: Vec<(u32, &str, u32)> = topo
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.cpulist.as_str(), n.cpus))
        .collect();
    assert_eq!(ids, [(0, "0-1", 2), (1, "2-3", 2)]);
    for n in &topo.numa_nodes {
        let mem = n.memory_bytes.expect("node MemTotal");
        assert!(
            mem > 256 << 20 && mem <= 512 << 20,
            "node {} memory {mem}",
            n.id
        );
    }

    // Placements: the root ports' addresses are fixed on the command line.
    let nvme0 = s.pci("0000:00:10.0", "0108");
    let nic1 = s.nic("52:54:00:00:00:01");
    let nvme1 = s.pci("0000:00:12.0", "0108");
    let nvme2 = s.pci("0000:00:13.0", "0108");
    let nic2 = s.nic("52:54:00:00:00:02");
    let nic4 = s.nic("52:54:00:00:00:04");
    let nvme3 = s.pci("0000:80:00.0", "0108");
    let nic3 = s.nic("52:54:00:00:00:03");
    let display = s.pci("0000:80:02.0", "0380");
    assert_eq!(nic1.bridges, ["0000:00:11.0"]);
    assert_eq!(nic3.bridges, ["0000:80:01.0"]);
    for d in [nvme0, nic1, nvme1, nvme2, nic2, nic4] {
        assert_eq!(
            d.host_bridge.as_deref(),
            Some("pci0000:00"),
            "{}",
            d.address
        );
        // The main host bridge has no proximity domain in QEMU's ACPI tables: the kernel says -1.
        assert_eq!(d.numa_node, None, "{}", d.address);
    }
    for d in [nvme3, nic3, display] {
        assert_eq!(
            d.host_bridge.as_deref(),
            Some("pci0000:80"),
            "{}",
            d.address
        );
        assert_eq!(
            d.numa_node,
            Some(1),
            "{} is below the pxb on node 1",
            d.address
        );
    }
    // The switch: root port, upstream port, then one downstream port each.
    assert_eq!(nvme2.bridges.len(), 3, "{:?}", nvme2.bridges);
    assert_eq!(nic2.bridges.len(), 3, "{:?}", nic2.bridges);
    assert_eq!(nvme2.bridges[..2], nic2.bridges[..2]);
    assert_ne!(nvme2.bridges[2], nic2.bridges[2]);
    let upstream = s.function(&nvme2.bridges[1]);
    assert!(upstream.class.starts_with("0604"), "{upstream:?}");
    // Two switches: root port, upstream, downstream, upstream, downstream.
    assert_eq!(nic4.bridges.len(), 5, "{:?}", nic4.bridges);
    assert_eq!(nic4.bridges[..2], nvme2.bridges[..2]);

    // The nvidia-smi-style classification of the kernel's placements.
    let n = nodes(&s);
    assert_eq!(n, 2);
    assert_eq!(
        affinity(nvme2, nic2, n),
        Affinity::Pix,
        "one switch between them"
    );
    assert_eq!(
        affinity(nvme0, nvme2, n),
        Affinity::Phb,
        "different root ports"
    );
    assert_eq!(affinity(nvme0, nic1, n), Affinity::Phb);
    assert_eq!(
        affinity(display, nvme3, n),
        Affinity::Phb,
        "same pxb, two root ports"
    );
    for local in [nvme0, nic1, nvme1, nvme2, nic2, nic4] {
        for remote in [nvme3, nic3, display] {
            assert_eq!(
                affinity(local, remote, n),
                Affinity::Sys,
                "{} and {}",
                local.address,
                remote.address
            );
        }
    }
    // Links. QEMU's root ports advertise 16 GT/s x32 unless limited; its endpoints x1 2.5 GT/s.
    let limited = s.function("0000:00:12.0");
    assert_eq!(limited.max_link_speed_gts, Some(5.0));
    assert_eq!(limited.max_link_width, Some(2));
    let free = s.function("0000:00:10.0");
    assert_eq!(free.max_link_speed_gts, Some(16.0));
    assert_eq!(free.max_link_width, Some(32));
    for d in [nvme0, nvme1, nvme2, nvme3, nic1, nic2, nic3, nic4] {
        assert_eq!(d.max_link_speed_gts, Some(2.5), "{}", d.address);
        assert_eq!(d.max_link_width, Some(1), "{}", d.address);
        assert_eq!(d.current_link_speed_gts, Some(2.5), "{}", d.address);
        assert_eq!(d.current_link_width, Some(1), "{}", d.address);
    }
    // Every endpoint runs at the lower of both ends' maximum: nothing is degraded.
    assert_eq!(topo.degraded_links, []);
    assert!(topo.affinity.is_empty(), "no NVIDIA GPU in QEMU");

    // Disks: serial, WWN, HCTL, sector sizes from the command line, and as lsblk read them.
    for (serial, name_prefix, logical, physical) in [
        ("BCNVME0", "nvme", 512, 512),
        ("BCNVME1", "nvme", 512, 512),
        ("BCNVME2", "nvme", 4096, 4096),
        ("BCNVME3", "nvme", 512, 512),
        ("BCVIRTIO0", "vd", 512, 4096),
        ("BCSCSI0", "sd", 512, 4096),
    ] {
        let d = s.disk(serial);
        assert!(d.name.starts_with(name_prefix), "{serial}: {}", d.name);
        assert_eq!(d.logical_sector_bytes, Some(logical), "{serial}");
        assert_eq!(d.physical_sector_bytes, Some(physical), "{serial}");
        assert_eq!(d.size_bytes, 64 << 20, "{serial}");
        let l = s.lsblk(&d.name);
        assert_eq!(l["log-sec"], logical, "{serial}: lsblk {l}");
        assert_eq!(l["phy-sec"], physical, "{serial}: lsblk {l}");
        assert_eq!(l["size"], d.size_bytes, "{serial}: lsblk {l}");
        assert_eq!(l["hctl"].as_str(), d.hctl.as_deref(), "{serial}: lsblk {l}");
        // Without udev, lsblk reads the serial from sysfs for NVMe only, the WWN never.
        if let Some(ls) = l["serial"].as_str() {
            assert_eq!(ls.trim(), serial, "lsblk {l}");
        }
        if let Some(lm) = l["model"].as_str() {
            assert_eq!(Some(lm.trim()), d.model.as_deref(), "{serial}: lsblk {l}");
        }
        // No udev in the ramdisk: no /dev/disk links.
        assert!(d.by_path.is_empty() && d.by_id.is_empty(), "{d:?}");
    }
    assert!(boot.console.contains("@@VM no /dev/disk/by-path"));
    let sd = s.disk("BCSCSI0");
    assert_eq!(sd.wwn.as_deref(), Some("naa.5000c500a1b2c3d4"));
    let hctl = sd.hctl.as_deref().expect("SCSI disk's HCTL");
    assert!(hctl.ends_with(":0:0:3"), "scsi-id=0,lun=3: {hctl}");
    assert_eq!(sd.vendor.as_deref(), Some("QEMU"));
    for serial in ["BCNVME0", "BCNVME1", "BCNVME2", "BCNVME3"] {
        let d = s.disk(serial);
        assert!(d.nvme && d.hctl.is_none(), "{d:?}");
        assert_eq!(d.model.as_deref(), Some("QEMU NVMe Ctrl"));
    }

    health_and_nic_drivers(&s);
    sata_and_scsi_health(&s);
    bmc_in_band(&s);
}

/// SATA health through SG_IO's ATA PASS-THROUGH on libata (QEMU's IDE SMART); the virtio-scsi
/// disk is asked for its Informational Exceptions page.
fn sata_and_scsi_health(s: &Seen) {
    let sata = s.disk("BCSATA0");
    eprintln!(
        "topology_vm: {} (BCSATA0) health {:?}",
        sata.name, sata.health
    );
    let h = sata
        .health
        .as_ref()
        .unwrap_or_else(|| panic!("BCSATA0 has no health; notes {:#?}", s.inv.notes));
    assert_eq!(h.source, "ata-smart");
    assert_eq!(h.smart_passed, Some(true), "{h:?}");
    assert_eq!(h.reallocated_sectors, Some(0), "{h:?}");
    assert!(
        h.temperature_celsius
            .is_some_and(|t| (1..=100).contains(&t)),
        "{h:?}"
    );
    let scsi = s.disk("BCSCSI0");
    let note = s
        .inv
        .notes
        .iter()
        .find(|n| n.message.contains(&format!("{}:", scsi.name)) && n.source == "disks");
    eprintln!(
        "topology_vm: {} (BCSCSI0) health {:?}, note {note:?}",
        scsi.name, scsi.health
    );
    assert!(
        scsi.health
            .as_ref()
            .is_some_and(|h| h.source == "scsi-informational-exceptions")
            || note.is_some_and(|n| n.message.contains("Informational Exceptions")),
        "BCSCSI0: neither health nor a note saying why: {:#?}",
        s.inv.notes
    );
}

/// The BMC through the guest kernel's /dev/ipmi0 (ipmi_si over KCS, ipmi_devintf): Get Device ID
/// as QEMU's command line set it; QEMU's simulator has no LAN channel, so none is listed.
fn bmc_in_band(s: &Seen) {
    let bmc = s
        .inv
        .bmc
        .as_ref()
        .unwrap_or_else(|| panic!("no bmc section; notes {:#?}", s.inv.notes));
    eprintln!("topology_vm: bmc {bmc:?}");
    assert_eq!(bmc.firmware.as_deref(), Some("2.34"));
    assert_eq!(bmc.ipmi_version.as_deref(), Some("2.0"));
    assert_eq!(bmc.manufacturer_id, Some(BMC_MFG_ID));
    assert_eq!(bmc.product_id, Some(BMC_PRODUCT_ID));
    assert!(bmc.lan.is_empty(), "{:?}", bmc.lan);
    assert!(
        !s.inv.notes.iter().any(|n| n.source == "bmc"),
        "{:#?}",
        s.inv.notes
    );
}

/// The NVMe SMART log of each controller as QEMU's emulated one reports it, the NICs' driver
/// facts from ETHTOOL_GDRVINFO, and link state from sysfs.
fn health_and_nic_drivers(s: &Seen) {
    for serial in ["BCNVME0", "BCNVME1", "BCNVME2", "BCNVME3"] {
        let d = s.disk(serial);
        let h = d
            .health
            .as_ref()
            .unwrap_or_else(|| panic!("{serial} has no health; notes {:#?}", s.inv.notes));
        eprintln!("topology_vm: {} ({serial}) health {h:?}", d.name);
        assert_eq!(h.source, "nvme-smart-log", "{serial}");
        assert_eq!(h.critical_warning, 0, "{serial}: {h:?}");
        assert!(h.critical_warnings.is_empty(), "{serial}: {h:?}");
        let t = h
            .temperature_celsius
            .expect("QEMU reports a composite temperature");
        assert!((0..=100).contains(&t), "{serial}: {t} °C");
        assert!(h.percentage_used.is_some(), "{serial}");
        // QEMU leaves Available Spare and its threshold 0; present, not judged.
        assert!(h.available_spare_percent.is_some(), "{serial}");
        assert_eq!(h.media_errors, Some(0), "{serial}: a fresh emulated drive");
    }
    for d in s.inv.disks.iter().filter(|d| !d.nvme) {
        assert!(
            d.health
                .as_ref()
                .is_none_or(|h| h.source != "nvme-smart-log"),
            "{}: no NVMe SMART log",
            d.name
        );
    }
    assert_eq!(
        s.disk("BCVIRTIO0").health,
        None,
        "virtio-blk has no health protocol"
    );
    assert!(
        !s.inv.notes.iter().any(|n| n.source == "disk-health"),
        "{:#?}",
        s.inv.notes
    );

    let nic = |mac: &str| {
        s.inv
            .nics
            .iter()
            .find(|n| n.mac.as_deref() == Some(mac))
            .unwrap_or_else(|| panic!("no NIC {mac}"))
    };
    for n in &s.inv.nics {
        eprintln!(
            "topology_vm: {} {:?} driver {:?} version {:?} firmware {:?} link {:?} speed {:?} \
             duplex {:?}",
            n.name,
            n.mac,
            n.driver,
            n.driver_version,
            n.firmware_version,
            n.link,
            n.speed_mbps,
            n.duplex
        );
    }
    let virtio = nic(VIRTIO_NIC);
    assert_eq!(virtio.driver.as_deref(), Some("virtio_net"));
    assert!(virtio.driver_version.is_some(), "{virtio:?}");
    assert_eq!(virtio.firmware_version, None, "virtio_net has no firmware");
    assert_eq!(virtio.link, Some(true), "{virtio:?}");
    assert_eq!(virtio.speed_mbps, Some(10000), "speed=10000");
    assert_eq!(virtio.duplex.as_deref(), Some("full"));
    let kernel = s.inv.os.as_ref().and_then(|o| o.kernel.as_deref());
    for mac in [
        "52:54:00:00:00:01",
        "52:54:00:00:00:02",
        "52:54:00:00:00:04",
    ] {
        let e = nic(mac);
        assert_eq!(e.driver.as_deref(), Some("e1000e"), "{mac}");
        // e1000e has no version of its own: ethtool reports the kernel's release. Its firmware
        // version is read from the (emulated) NVM: `2.1-0` in QEMU 10.
        assert_eq!(e.driver_version.as_deref(), kernel, "{mac}");
        assert!(e.firmware_version.is_some(), "{mac}");
        // Down: the kernel answers EINVAL for carrier, speed and duplex.
        assert_eq!(
            (e.link, e.speed_mbps, e.duplex.as_deref()),
            (None, None, None),
            "{mac}"
        );
    }
}
