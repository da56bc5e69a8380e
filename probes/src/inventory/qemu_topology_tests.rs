//! The inventory on `/sys` as Debian's 6.1 kernel showed it in QEMU (`tests/fixtures/
//! qemu-q35-topology`, captured by `BC_VM_CAPTURE=… cargo test -p bc-e2e --test topology_vm`
//! with `tests/e2e/vm/capture-sys.sh`; the machine is described in `tests/e2e/tests/topology_vm.rs`).
//! A real kernel's PCI placements, link files, NUMA nodes and block devices, without QEMU.

use std::path::Path;

use bc_protocol::inventory::topology::{Affinity, DeviceKind};

use super::*;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/qemu-q35-topology"
);

/// The bochs-display below the pxb's third root port, the GPU's stand-in.
const DISPLAY: &str = "0000:80:02.0/0000:83:00.0";

fn pci<'a>(inv: &'a Inventory, addr: &str) -> &'a bc_protocol::inventory::PciDevice {
    inv.pci_devices
        .iter()
        .find(|d| d.address == addr)
        .unwrap_or_else(|| panic!("no {addr}"))
}

#[test]
fn the_qemu_machine_as_its_kernel_showed_it() {
    let inv = collect(&HostRoot::new(FIXTURE));
    let Some(topo) = inv.topology.as_ref() else {
        panic!("no topology section: {:#?}", inv.notes)
    };
    let nodes: Vec<(u32, &str)> = topo
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.cpulist.as_str()))
        .collect();
    assert_eq!(nodes, [(0, "0-1"), (1, "2-3")]);
    // The switch: root port 00:13.0, upstream port 04:00.0, a downstream port each.
    assert_eq!(
        pci(&inv, "0000:06:00.0").bridges,
        ["0000:00:13.0", "0000:04:00.0", "0000:05:00.0"]
    );
    assert_eq!(
        pci(&inv, "0000:07:00.0").bridges,
        ["0000:00:13.0", "0000:04:00.0", "0000:05:01.0"]
    );
    // A second switch below the first one's third downstream port.
    let deep = pci(&inv, "0000:0a:00.0");
    assert_eq!(
        deep.bridges,
        [
            "0000:00:13.0",
            "0000:04:00.0",
            "0000:05:02.0",
            "0000:08:00.0",
            "0000:09:00.0"
        ]
    );
    let nvme2 = pci(&inv, "0000:06:00.0");
    let n = topo.numa_nodes.len();
    assert_eq!(
        topology::affinity(nvme2, pci(&inv, "0000:07:00.0"), n),
        Affinity::Pix
    );
    assert_eq!(topology::affinity(nvme2, deep, n), Affinity::Pxb);
    assert_eq!(
        topology::affinity(nvme2, pci(&inv, "0000:81:00.0"), n),
        Affinity::Sys
    );
    // xio3130's downstream ports have no link capability: max_link_speed is "Unknown".
    let dp = pci(&inv, "0000:05:00.0");
    assert_eq!((dp.max_link_speed_gts, dp.max_link_width), (None, None));
    assert_eq!(dp.current_link_speed_gts, Some(2.5));
    let limited = pci(&inv, "0000:00:12.0");
    assert_eq!(
        (limited.max_link_speed_gts, limited.max_link_width),
        (Some(5.0), Some(2))
    );
    for (addr, node, bridge) in [
        ("0000:01:00.0", None, "pci0000:00"),
        ("0000:81:00.0", Some(1), "pci0000:80"),
        ("0000:82:00.0", Some(1), "pci0000:80"),
    ] {
        let d = pci(&inv, addr);
        assert_eq!(d.numa_node, node, "{addr}");
        assert_eq!(d.host_bridge.as_deref(), Some(bridge), "{addr}");
    }
    assert!(topo.affinity.is_empty() && topo.degraded_links.is_empty());
    let nic = |mac: &str| {
        inv.nics
            .iter()
            .find(|n| n.mac.as_deref() == Some(mac))
            .and_then(|n| n.pci_address.clone())
    };
    assert_eq!(nic("52:54:00:00:00:02").as_deref(), Some("0000:07:00.0"));
    assert_eq!(nic("52:54:00:00:00:03").as_deref(), Some("0000:82:00.0"));
    let disk = |serial: &str| {
        inv.disks
            .iter()
            .find(|d| d.serial.as_deref() == Some(serial))
            .unwrap_or_else(|| panic!("no disk {serial}: {:#?}", inv.disks))
    };
    let sda = disk("BCSCSI0");
    assert_eq!(sda.wwn.as_deref(), Some("naa.5000c500a1b2c3d4"));
    assert_eq!(sda.hctl.as_deref(), Some("0:0:0:3"));
    assert_eq!(
        (sda.logical_sector_bytes, sda.physical_sector_bytes),
        (Some(512), Some(4096))
    );
    assert_eq!(disk("BCVIRTIO0").name, "vda");
    let nv2 = disk("BCNVME2");
    assert_eq!(
        (nv2.logical_sector_bytes, nv2.physical_sector_bytes),
        (Some(4096), Some(4096))
    );
    assert_eq!(inv.disks.len(), 6, "namespaces once, not per path");
    // Health is not in sysfs: the SMART log needs the controller's /dev node, which a fixture
    // tree lacks. Each namespace (a multipath head whose `device` is its subsystem) is mapped
    // to its controller through the hidden path device beside it; each controller is named once
    // in one note.
    let root = HostRoot::new(FIXTURE);
    for n in 0..4 {
        let d = inv.disks.iter().find(|d| d.name == format!("nvme{n}n1"));
        assert_eq!(d.map(|d| d.health.is_none()), Some(true), "nvme{n}n1");
        let ctrl = nvme::controller_of(&root, &format!("nvme{n}n1"));
        assert_eq!(ctrl, Some(format!("nvme{n}")));
    }
    assert!(inv.disks.iter().all(|d| d.health.is_none()));
    let health: Vec<&Note> = inv
        .notes
        .iter()
        .filter(|n| n.source == "disk-health")
        .collect();
    assert_eq!(health.len(), 1, "{:#?}", inv.notes);
    for n in 0..4 {
        assert!(
            health[0]
                .message
                .contains(&format!("dev/nvme{n}: no device node")),
            "{}",
            health[0].message
        );
    }
    // ETHTOOL_GDRVINFO is asked on the running machine only.
    assert!(
        inv.nics
            .iter()
            .all(|n| n.driver_version.is_none() && n.firmware_version.is_none())
    );
}

/// Copies `from` to `to`, symbolic links as links.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if t.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// The same tree with the display function turned into an NVIDIA GPU (vendor 10de, class 0300):
/// the affinity matrix over a real kernel's placements.
#[test]
fn a_gpu_in_the_display_slot_gets_its_matrix() -> std::io::Result<()> {
    let tmp = tempfile::tempdir()?;
    copy_tree(Path::new(FIXTURE), tmp.path())?;
    let dir = tmp.path().join("sys/devices/pci0000:80").join(DISPLAY);
    std::fs::write(dir.join("vendor"), "0x10de\n")?;
    std::fs::write(dir.join("class"), "0x030000\n")?;
    let inv = collect(&HostRoot::new(tmp.path()));
    let Some(topo) = inv.topology else {
        panic!("no topology section: {:#?}", inv.notes)
    };
    let row: Vec<(&str, DeviceKind, Affinity)> = topo
        .affinity
        .iter()
        .map(|a| {
            assert_eq!(a.gpu, "0000:83:00.0");
            (a.device.as_str(), a.kind, a.affinity)
        })
        .collect();
    use {Affinity::*, DeviceKind::*};
    assert_eq!(
        row,
        [
            ("0000:01:00.0", Nvme, Sys),
            ("0000:02:00.0", Nic, Sys),
            ("0000:03:00.0", Nvme, Sys),
            ("0000:06:00.0", Nvme, Sys),
            ("0000:07:00.0", Nic, Sys),
            ("0000:0a:00.0", Nic, Sys),
            ("0000:81:00.0", Nvme, Phb),
            ("0000:82:00.0", Nic, Phb),
        ]
    );
    Ok(())
}
