//! The collectors on the real node_exporter sysfs/procfs tree and on small made-up trees.

use std::path::PathBuf;

use bc_protocol::inventory::{BootMode, PciDevice};

use super::*;

const NODE_EXPORTER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/hosts/node-exporter"
);

fn node_exporter() -> Option<Inventory> {
    let p = PathBuf::from(NODE_EXPORTER);
    if !p.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "fixture {} is missing",
            p.display()
        );
        eprintln!("!!! FIXTURE MISSING: {} — test skipped", p.display());
        return None;
    }
    Some(collect(&HostRoot::new(p)))
}

#[test]
fn node_exporter_system_cpu_memory() {
    let Some(inv) = node_exporter() else { return };
    let sys = inv.system.unwrap_or_default();
    assert_eq!(sys.vendor.as_deref(), Some("Dell Inc."));
    assert_eq!(sys.product.as_deref(), Some("PowerEdge R6515"));
    assert_eq!(
        sys.uuid.as_deref(),
        Some("83340ca8-cb49-4474-8c29-d2088ca84dd9")
    );
    assert_eq!(sys.bios_version.as_deref(), Some("2.2.4"));
    assert_eq!(sys.board_product.as_deref(), Some("07PXPY"));
    assert_eq!(sys.chassis_type, Some(23));
    assert_eq!(sys.smbios_version, None);
    let cpu = inv.cpu.unwrap_or_default();
    assert_eq!(
        cpu.model.as_deref(),
        Some("Intel(R) Core(TM) i7-8650U CPU @ 1.90GHz")
    );
    assert_eq!((cpu.sockets, cpu.cores, cpu.threads), (Some(1), Some(4), 8));
    assert!(cpu.flags.iter().any(|f| f == "avx2"));
    assert_eq!(inv.memory.map(|m| m.total_bytes), Some(3_742_148 * 1024));
    // What the tree lacks is a note, not a failure.
    for source in ["hostname", "os", "bootMode", "smbios"] {
        assert!(inv.notes.iter().any(|n| n.source == source), "{source}");
    }
    assert_eq!(inv.boot_mode, None);
}

#[test]
fn node_exporter_disks() {
    let Some(inv) = node_exporter() else { return };
    let names: Vec<&str> = inv.disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        ["nvme0n1", "sda", "sdi", "sdj", "sdk", "sdl", "sdm", "sdn"]
    );
    let nvme = &inv.disks[0];
    assert_eq!(nvme.size_bytes, 3_906_250_000 * 512);
    assert_eq!(nvme.model.as_deref(), Some("Samsung SSD 970 PRO 512GB"));
    assert_eq!(nvme.serial.as_deref(), Some("S680HF8N190894I"));
    assert!(nvme.nvme);
    assert_eq!(nvme.transport.as_deref(), Some("nvme"));
    assert_eq!(inv.disks[1].rotational, Some(true));
    assert!(!inv.disks[1].nvme);
}

#[test]
fn node_exporter_nics() {
    let Some(inv) = node_exporter() else { return };
    let names: Vec<&str> = inv.nics.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["bond0", "dmz", "eth0", "int"]);
    let eth0 = &inv.nics[2];
    assert!(eth0.physical);
    assert_eq!(eth0.mac.as_deref(), Some("01:01:01:01:01:01"));
    // addr_assign_type is 3 (set by userspace): no permanent MAC.
    assert_eq!(eth0.permanent_mac, None);
    assert_eq!(eth0.pci_address.as_deref(), Some("0000:03:00.0"));
    assert_eq!(
        (eth0.speed_mbps, eth0.mtu, eth0.link),
        (Some(1000), Some(1500), Some(true))
    );
    let bond0 = &inv.nics[0];
    assert!(!bond0.physical);
    assert_eq!(bond0.speed_mbps, None, "speed -1 means unknown");
}

#[test]
fn node_exporter_pci_and_infiniband() {
    let Some(inv) = node_exporter() else { return };
    let addrs: Vec<&str> = inv.pci_devices.iter().map(|p| p.address.as_str()).collect();
    assert_eq!(addrs, ["0000:00:02.1", "0000:01:00.0", "0000:45:00.0"]);
    let igb = &inv.pci_devices[2];
    assert_eq!(
        (igb.vendor_id.as_str(), igb.device_id.as_str()),
        ("8086", "1521")
    );
    assert_eq!(igb.class, "020000");
    assert_eq!(igb.driver.as_deref(), Some("igb"));
    assert_eq!(igb.numa_node, Some(0));
    assert_eq!(
        inv.pci_devices[0].numa_node, None,
        "numa_node -1 means none"
    );
    assert!(inv.pci_devices.iter().all(|p| !p.nvidia_gpu && !p.mellanox));
    assert!(inv.gpus.is_empty());
    assert_eq!(inv.infiniband.len(), 3);
    let p = &inv.infiniband[1];
    assert_eq!((p.device.as_str(), p.port), ("mlx4_0", 1));
    assert_eq!(p.state.as_deref(), Some("ACTIVE"));
    assert_eq!(p.phys_state.as_deref(), Some("LinkUp"));
    assert_eq!(p.rate.as_deref(), Some("40 Gb/sec (4X QDR)"));
    assert_eq!(p.link_layer.as_deref(), Some("InfiniBand"));
    assert_eq!(p.firmware.as_deref(), Some("2.31.5050"));
}

#[test]
fn gpus_come_from_pci_unless_nvml_hands_them_in() {
    let pci = [
        PciDevice {
            address: "0000:17:00.0".into(),
            vendor_id: "10de".into(),
            device_id: "2330".into(),
            class: "030200".into(),
            nvidia_gpu: true,
            ..PciDevice::default()
        },
        PciDevice {
            address: "0000:18:00.0".into(),
            vendor_id: "10de".into(),
            device_id: "22a3".into(),
            class: "068000".into(),
            ..PciDevice::default()
        },
    ];
    let g = gpu::from_pci(&pci);
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].pci_bus_id, "0000:17:00.0");
    assert_eq!(g[0].source, "pci");
    let nvml = vec![Gpu {
        uuid: Some("GPU-1".into()),
        pci_bus_id: "0000:17:00.0".into(),
        source: "nvml".into(),
        ..Gpu::default()
    }];
    let dir = tempfile::tempdir().ok();
    let root = HostRoot::new(
        dir.as_ref()
            .map_or_else(|| PathBuf::from("/nonexistent"), |d| d.path().to_owned()),
    );
    assert_eq!(collect_with_gpus(&root, Some(nvml.clone())).gpus, nvml);
}

#[test]
fn a_made_up_tree_with_pci_gpu_uefi_and_os_release() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = HostRoot::new(dir.path());
    let w = |p: &str, s: &str| -> std::io::Result<()> {
        let p = root.path(p);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, s)
    };
    let dev = "/sys/devices/pci0000:00/0000:17:00.0";
    w(&format!("{dev}/vendor"), "0x10de\n")?;
    w(&format!("{dev}/device"), "0x2330\n")?;
    w(&format!("{dev}/class"), "0x030200\n")?;
    w(&format!("{dev}/numa_node"), "1\n")?;
    let ib = "/sys/devices/pci0000:00/0000:18:00.0";
    w(&format!("{ib}/vendor"), "0x15b3\n")?;
    w(&format!("{ib}/device"), "0x101b\n")?;
    w(&format!("{ib}/class"), "0x020700\n")?;
    std::fs::create_dir_all(root.path("/sys/bus/pci/devices"))?;
    std::fs::create_dir_all(root.path("/sys/bus/pci/drivers/nvidia"))?;
    std::os::unix::fs::symlink(
        root.path(dev),
        root.path("/sys/bus/pci/devices/0000:17:00.0"),
    )?;
    std::os::unix::fs::symlink(
        root.path(ib),
        root.path("/sys/bus/pci/devices/0000:18:00.0"),
    )?;
    std::os::unix::fs::symlink(
        root.path("/sys/bus/pci/drivers/nvidia"),
        root.path(format!("{dev}/driver")),
    )?;
    std::fs::create_dir_all(root.path("/sys/firmware/efi"))?;
    w(
        "/etc/os-release",
        "PRETTY_NAME=\"Ubuntu 24.04 LTS\"\nID=ubuntu\nVERSION_ID=\"24.04\"\n",
    )?;
    w("/proc/sys/kernel/osrelease", "6.8.0-45-generic\n")?;
    w(
        "/proc/sys/kernel/random/boot_id",
        "0f7d1e4c-1b2a-4c3d-9e8f-001122334455\n",
    )?;
    w("/proc/uptime", "12345.67 99999.00\n")?;
    w("/proc/sys/kernel/hostname", "gpu-node-7\n")?;
    let inv = collect(&root);
    assert_eq!(inv.hostname.as_deref(), Some("gpu-node-7"));
    assert_eq!(inv.boot_mode, Some(BootMode::Uefi));
    let os = inv.os.unwrap_or_default();
    assert_eq!(os.distro.as_deref(), Some("Ubuntu 24.04 LTS"));
    assert_eq!(
        (os.distro_id.as_deref(), os.distro_version.as_deref()),
        (Some("ubuntu"), Some("24.04"))
    );
    assert_eq!(os.kernel.as_deref(), Some("6.8.0-45-generic"));
    assert_eq!(
        os.boot_id.as_deref(),
        Some("0f7d1e4c-1b2a-4c3d-9e8f-001122334455")
    );
    assert_eq!(os.uptime_s, Some(12345.67));
    let gpu = &inv.pci_devices[0];
    assert!(gpu.nvidia_gpu && !gpu.infiniband);
    assert_eq!(gpu.driver.as_deref(), Some("nvidia"));
    assert_eq!(gpu.numa_node, Some(1));
    assert!(inv.pci_devices[1].mellanox && inv.pci_devices[1].infiniband);
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].pci_bus_id, "0000:17:00.0");
    // No /proc/cpuinfo, /proc/meminfo, /sys/class/net, /sys/block: notes, not failure.
    assert!(inv.cpu.is_none() && inv.memory.is_none());
    for source in ["cpu", "memory", "nics", "disks"] {
        assert!(inv.notes.iter().any(|n| n.source == source), "{source}");
    }
    Ok(())
}

#[test]
fn missing_root_gives_notes_not_failure() {
    let inv = collect(&HostRoot::new("/nonexistent-bcd-root"));
    assert!(inv.cpu.is_none());
    assert!(inv.notes.iter().any(|n| n.source == "cpu"));
    assert!(render_table(&inv).contains("notes:"));
}

#[test]
fn cpuinfo_topology() {
    let text = "processor: 0\nphysical id: 0\ncore id: 0\nmodel name: X\nflags: a b\n\n\
                processor: 1\nphysical id: 1\ncore id: 0\n\nprocessor: 2\nphysical id: 0\ncore id: 0\n";
    let c = cpu::parse_cpuinfo(text);
    assert_eq!((c.sockets, c.cores, c.threads), (Some(2), Some(2), 3));
    assert_eq!(c.flags, ["a", "b"]);
}

#[test]
fn the_command_prints_the_document_as_json() {
    let out = run(&InventoryArgs {
        root: PathBuf::from(NODE_EXPORTER),
        output: "json".into(),
        lldp_wait: 0,
        lldp_interfaces: Vec::new(),
    });
    let back: Option<Inventory> = out.ok().and_then(|s| serde_json::from_str(&s).ok());
    if PathBuf::from(NODE_EXPORTER).exists() {
        let back = back.unwrap_or_default();
        assert_eq!(back.cpu.map(|c| c.threads), Some(8));
        assert_eq!(back.nics.len(), 4);
        assert!(
            back.notes.iter().all(|n| n.source != "lldp"),
            "not asked to listen"
        );
    }
}

#[test]
fn lldp_wait_under_a_root_prefix_is_a_note_not_a_wait() {
    let started = std::time::Instant::now();
    let out = run(&InventoryArgs {
        root: PathBuf::from(NODE_EXPORTER),
        output: "json".into(),
        lldp_wait: 30,
        lldp_interfaces: Vec::new(),
    });
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let back: Inventory = out
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let note = back.notes.iter().find(|n| n.source == "lldp");
    assert!(
        note.is_some_and(|n| n.message.contains("--root")),
        "{:?}",
        back.notes
    );
}
