//! Issue 20 (inspection depth), items 1, 2 and 6: disk names and ids, NIC link and SR-IOV facts,
//! CPU clock and microcode, installed memory, on the real node_exporter tree and the field trees
//! (read in place) and on trees made here for what those lack.

use std::path::Path;

use super::field_tests::Tree;
use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures");

/// `../shared/fixtures/<rel>` as a root, or `None` (loudly; a failure under `CI=true`).
fn fixture_root(rel: &str) -> Option<HostRoot> {
    let p = Path::new(FIXTURES).join(rel);
    if !p.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "fixture {} is missing",
            p.display()
        );
        eprintln!("!!! FIXTURE MISSING: {} — test skipped", p.display());
        return None;
    }
    Some(HostRoot::new(p))
}

#[test]
fn node_exporter_disks_have_firmware_and_sector_sizes() {
    let Some(root) = fixture_root("hosts/node-exporter") else {
        return;
    };
    let d = disks::collect(&root, &mut Vec::new());
    let nvme = &d[0];
    assert_eq!(nvme.name, "nvme0n1");
    assert_eq!(nvme.firmware.as_deref(), Some("1B2QEXP7"));
    assert_eq!(nvme.logical_sector_bytes, Some(4096));
    assert_eq!((nvme.vendor.as_deref(), nvme.hctl.as_deref()), (None, None));
    let sda = &d[1];
    assert_eq!(sda.name, "sda");
    assert_eq!(
        (sda.logical_sector_bytes, sda.physical_sector_bytes),
        (Some(512), Some(512))
    );
    // The tree has no /dev: no udev names, and that is no error.
    assert!(d.iter().all(|d| d.by_path.is_empty() && d.by_id.is_empty()));
}

#[test]
fn sas_field_disk_gets_its_hctl_vendor_and_no_extension() {
    let Some(root) = fixture_root("field/sas-vpd80-padding/root") else {
        return;
    };
    let d = disks::collect(&root, &mut Vec::new());
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].hctl.as_deref(), Some("0:0:0:0"));
    assert_eq!(d[0].vendor.as_deref(), Some("SEAGATE"));
    assert_eq!(d[0].wwn.as_deref(), Some("naa.5000c500a1b2c3d7"));
    assert_eq!(d[0].wwn_vendor_extension, None, "NAA 5 has no extension");
}

/// A SATA disk as a live machine shows it: SCSI device `2:0:0:0`, two partitions (one in an md
/// array), an LVM volume on the whole disk, udev links to the disk and to a partition.
fn sata_tree() -> std::io::Result<Tree> {
    let t = Tree::new()?;
    let scsi = "/sys/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0";
    let dev = format!("{scsi}/block/sdb");
    t.block("sdb", &dev, 3_907_029_168, None)?;
    t.link(&format!("{dev}/device"), "../../../2:0:0:0")?;
    for (f, v) in [
        ("vendor", "ATA     \n"),
        ("model", "ST2000NM0055-1V4\n"),
        ("rev", "SN05\n"),
        ("wwid", "naa.600508b1001c4d4bd2b1e0f5a3c7e921\n"),
    ] {
        t.file(&format!("{scsi}/{f}"), v.as_bytes())?;
    }
    t.file(&format!("{dev}/queue/logical_block_size"), b"512\n")?;
    t.file(&format!("{dev}/queue/physical_block_size"), b"4096\n")?;
    t.file(&format!("{dev}/queue/rotational"), b"1\n")?;
    t.file(&format!("{dev}/removable"), b"0\n")?;
    t.file(&format!("{dev}/sdb1/partition"), b"1\n")?;
    t.file(&format!("{dev}/sdb2/partition"), b"2\n")?;
    std::fs::create_dir_all(t.root.path(format!("{dev}/sdb2/holders/md127")))?;
    std::fs::create_dir_all(t.root.path(format!("{dev}/holders/dm-0")))?;
    std::fs::create_dir_all(t.root.path(format!("{dev}/sdb1/holders/dm-0")))?;
    std::fs::create_dir_all(t.root.path(format!("{dev}/queue/iosched")))?;
    let by_path = "/dev/disk/by-path/pci-0000:00:17.0-ata-3";
    t.link(by_path, "../../sdb")?;
    t.link(&format!("{by_path}-part1"), "../../sdb1")?;
    t.link("/dev/disk/by-id/wwn-0x600508b1001c4d4b", "../../sdb")?;
    t.link("/dev/disk/by-id/ata-ST2000NM0055-1V4_ZC1AB2CD", "../../sdb")?;
    t.link(
        "/dev/disk/by-id/ata-ST2000NM0055-1V4_ZC1AB2CD-part2",
        "../../sdb2",
    )?;
    // A USB stick beside it: removable.
    let usb = "/sys/devices/pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/host6/target6:0:0/6:0:0:0";
    t.block("sdc", &format!("{usb}/block/sdc"), 60_063_744, None)?;
    t.file(&format!("{usb}/block/sdc/removable"), b"1\n")?;
    t.link("/dev/disk/by-id/usb-SanDisk_Ultra-0:0", "../../sdc")?;
    Ok(t)
}

#[test]
fn a_sata_disk_with_everything_root_device_hints_match_on() -> std::io::Result<()> {
    let t = sata_tree()?;
    let d = disks::collect(&t.root, &mut Vec::new());
    assert_eq!(
        d.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["sdb", "sdc"]
    );
    let sdb = &d[0];
    assert_eq!(sdb.hctl.as_deref(), Some("2:0:0:0"));
    assert_eq!(
        sdb.vendor.as_deref(),
        Some("ATA"),
        "INQUIRY padding trimmed"
    );
    assert_eq!(sdb.model.as_deref(), Some("ST2000NM0055-1V4"));
    assert_eq!(sdb.firmware.as_deref(), Some("SN05"));
    assert_eq!(
        sdb.wwn.as_deref(),
        Some("naa.600508b1001c4d4bd2b1e0f5a3c7e921")
    );
    assert_eq!(
        sdb.wwn_vendor_extension.as_deref(),
        Some("0xd2b1e0f5a3c7e921")
    );
    assert_eq!(
        (sdb.logical_sector_bytes, sdb.physical_sector_bytes),
        (Some(512), Some(4096))
    );
    assert_eq!(sdb.removable, Some(false));
    assert_eq!(
        sdb.by_path,
        ["pci-0000:00:17.0-ata-3"],
        "not the partition's"
    );
    assert_eq!(
        sdb.by_id,
        ["ata-ST2000NM0055-1V4_ZC1AB2CD", "wwn-0x600508b1001c4d4b"]
    );
    assert_eq!(sdb.partitions, ["sdb1", "sdb2"]);
    assert_eq!(
        sdb.holders,
        ["dm-0", "md127"],
        "each once, from disk and parts"
    );
    assert_eq!(sdb.transport.as_deref(), Some("sata"));
    let sdc = &d[1];
    assert_eq!(sdc.removable, Some(true));
    assert_eq!(
        sdc.hctl.as_deref(),
        Some("6:0:0:0"),
        "from the block link's path"
    );
    assert_eq!(sdc.by_id, ["usb-SanDisk_Ultra-0:0"]);
    assert!(sdc.partitions.is_empty() && sdc.holders.is_empty());
    Ok(())
}

/// A virtio-blk disk as Debian's 6.1 kernel shows it under QEMU (`-device
/// virtio-blk-pci,serial=…`): the serial is the disk's own `serial` attribute, there is no
/// `device/serial` and no VPD page.
#[test]
fn a_virtio_disk_has_its_serial() -> std::io::Result<()> {
    let t = Tree::new()?;
    let dev = "/sys/devices/pci0000:00/0000:00:14.0/0000:06:00.0/virtio3/block/vda";
    t.block("vda", dev, 131_072, None)?;
    t.file(&format!("{dev}/serial"), b"BCVIRTIO0\n")?;
    t.file(&format!("{dev}/device/vendor"), b"0x1af4\n")?;
    let d = disks::collect(&t.root, &mut Vec::new());
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].serial.as_deref(), Some("BCVIRTIO0"));
    assert_eq!(d[0].transport.as_deref(), Some("virtio"));
    assert_eq!(d[0].hctl, None);
    Ok(())
}

#[test]
fn node_exporter_nics_report_duplex() {
    let Some(root) = fixture_root("hosts/node-exporter") else {
        return;
    };
    let nics = collect(&root).nics;
    let eth0 = nics.iter().find(|n| n.name == "eth0");
    assert_eq!(eth0.and_then(|n| n.duplex.as_deref()), Some("full"));
    // The tree keeps no `device` link for eth0: no PCI ids, no SR-IOV, no guesses.
    assert_eq!(eth0.and_then(|n| n.pci_vendor_id.as_deref()), None);
    assert!(
        nics.iter().all(|n| n.ipv6.is_empty()),
        "no /proc/net/if_inet6"
    );
}

#[test]
fn a_connectx_port_with_vfs_and_addresses() -> std::io::Result<()> {
    let t = Tree::new()?;
    let pci = "/sys/devices/pci0000:00/0000:00:01.0/0000:17:00.0";
    let net = format!("{pci}/net/ens1f0np0");
    t.link(
        "/sys/class/net/ens1f0np0",
        &t.root.path(&net).to_string_lossy(),
    )?;
    t.link(
        &format!("{net}/device"),
        &t.root.path(pci).to_string_lossy(),
    )?;
    t.link(
        &format!("{pci}/driver"),
        &t.root
            .path("/sys/bus/pci/drivers/mlx5_core")
            .to_string_lossy(),
    )?;
    std::fs::create_dir_all(t.root.path("/sys/bus/pci/drivers/mlx5_core"))?;
    t.link(
        "/sys/bus/pci/devices/0000:17:00.0",
        &t.root.path(pci).to_string_lossy(),
    )?;
    for (f, v) in [
        ("vendor", "0x15b3\n"),
        ("device", "0x101d\n"),
        ("sriov_totalvfs", "16\n"),
        ("sriov_numvfs", "4\n"),
    ] {
        t.file(&format!("{pci}/{f}"), v.as_bytes())?;
    }
    t.file(&format!("{net}/address"), b"b8:3f:d2:00:00:01\n")?;
    t.file(&format!("{net}/speed"), b"100000\n")?;
    t.file(&format!("{net}/duplex"), b"full\n")?;
    t.file(&format!("{net}/carrier"), b"1\n")?;
    // A second port without link: duplex unknown, speed -1.
    let net2 = format!("{pci}/net/ens1f1np1");
    t.link(
        "/sys/class/net/ens1f1np1",
        &t.root.path(&net2).to_string_lossy(),
    )?;
    t.file(&format!("{net2}/duplex"), b"unknown\n")?;
    t.file(&format!("{net2}/speed"), b"-1\n")?;
    t.file(&format!("{net2}/carrier"), b"0\n")?;
    t.file(
        "/proc/net/if_inet6",
        b"fe800000000000000000000000000001 02 40 20 80 ens1f0np0\n\
          20010db8000000000000000000000042 02 30 00 00 ens1f0np0\n\
          00000000000000000000000000000001 01 80 10 80       lo\n\
          garbage line\n",
    )?;
    // A virtio NIC: `device` is the virtio device (virtio ids), its parent the PCI function.
    let vpci = "/sys/devices/pci0000:00/0000:00:03.0";
    let vnet = format!("{vpci}/virtio0/net/eth0");
    t.link("/sys/class/net/eth0", &t.root.path(&vnet).to_string_lossy())?;
    t.link(
        &format!("{vnet}/device"),
        &t.root.path(format!("{vpci}/virtio0")).to_string_lossy(),
    )?;
    t.file(&format!("{vpci}/virtio0/vendor"), b"0x1af4\n")?;
    t.file(&format!("{vpci}/virtio0/device"), b"0x0001\n")?;
    t.file(&format!("{vpci}/vendor"), b"0x1af4\n")?;
    t.file(&format!("{vpci}/device"), b"0x1000\n")?;
    t.link(
        "/sys/bus/pci/devices/0000:00:03.0",
        &t.root.path(vpci).to_string_lossy(),
    )?;
    let nics = nics::probe(&t.root, &mut Vec::new());
    let virtio = &nics[2].nic;
    assert_eq!(virtio.name, "eth0");
    assert_eq!(virtio.pci_address.as_deref(), Some("0000:00:03.0"));
    assert_eq!(
        (
            virtio.pci_vendor_id.as_deref(),
            virtio.pci_device_id.as_deref()
        ),
        (Some("1af4"), Some("1000")),
        "the PCI function's ids, not the virtio device's"
    );
    assert_eq!(
        (virtio.sriov_total_vfs, virtio.duplex.as_deref()),
        (None, None)
    );
    let p0 = &nics[0].nic;
    assert_eq!(p0.name, "ens1f0np0");
    assert_eq!(
        (p0.pci_vendor_id.as_deref(), p0.pci_device_id.as_deref()),
        (Some("15b3"), Some("101d"))
    );
    assert_eq!(p0.driver.as_deref(), Some("mlx5_core"));
    assert_eq!((p0.sriov_total_vfs, p0.sriov_num_vfs), (Some(16), Some(4)));
    assert_eq!(
        (p0.speed_mbps, p0.duplex.as_deref(), p0.link),
        (Some(100_000), Some("full"), Some(true))
    );
    assert_eq!(p0.ipv6, ["fe80::1/64", "2001:db8::42/48"]);
    let p1 = &nics[1].nic;
    assert_eq!(
        (p1.speed_mbps, p1.duplex.as_deref(), p1.link),
        (None, None, Some(false))
    );
    assert!(p1.ipv6.is_empty());
    Ok(())
}

#[test]
fn node_exporter_cpu_clock_and_microcode() {
    let Some(root) = fixture_root("hosts/node-exporter") else {
        return;
    };
    let cpu = cpu::collect(&root, &mut Vec::new()).unwrap_or_default();
    // cpu0-1 allow 3.7 GHz and cpu2-3 4.2 GHz (scaling_max_freq; no cpuinfo_max_freq there).
    assert_eq!(cpu.max_frequency_mhz, Some(4200));
    assert_eq!(cpu.current_frequency_mhz, Some(800), "cpu MHz 799.998");
    assert_eq!(cpu.microcode.as_deref(), Some("0xb4"));
}

#[test]
fn the_hardware_maximum_wins_over_the_policy() -> std::io::Result<()> {
    let t = Tree::new()?;
    let f = "/sys/devices/system/cpu/cpu0/cpufreq";
    t.file(&format!("{f}/cpuinfo_max_freq"), b"3500000\n")?;
    t.file(&format!("{f}/scaling_max_freq"), b"2000000\n")?;
    t.file("/sys/devices/system/cpu/cpufreq/boost", b"1\n")?;
    t.file(
        "/proc/cpuinfo",
        b"processor\t: 0\nmodel name\t: Neoverse-V2\n",
    )?;
    let cpu = cpu::collect(&t.root, &mut Vec::new()).unwrap_or_default();
    assert_eq!(cpu.max_frequency_mhz, Some(3500));
    assert_eq!((cpu.current_frequency_mhz, cpu.microcode), (None, None));
    Ok(())
}

#[test]
fn installed_memory_is_the_sum_of_the_dimms() {
    let p = Path::new(FIXTURES).join("smbios/SuperMicro-Dual-Xeon.dmi");
    let Ok(bytes) = std::fs::read(&p) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "fixture {} is missing",
            p.display()
        );
        return;
    };
    let dimms = crate::smbios::from_raw_table(bytes, None)
        .map(|t| t.facts().dimms)
        .unwrap_or_default();
    // 16 modules of 4096 MB (SMBIOS type 17 size field).
    assert_eq!(host::dimm_total(&dimms), Some(16 * 4096 * (1 << 20)));
    assert_eq!(host::dimm_total(&[]), None);
}

/// A JSON value of lsblk's as text: newer versions write numbers and booleans, older ones
/// strings (`"512"`, `"0"`).
fn lsblk_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null => None,
        serde_json::Value::Bool(b) => Some(if *b { "1" } else { "0" }.to_owned()),
        serde_json::Value::String(s) => crate::hostroot::clean_identifier(s),
        other => Some(other.to_string()),
    }
}

/// On the running machine, what this collector reads agrees with `lsblk -J` (util-linux, from
/// the same sysfs files) for every disk both list; skipped where lsblk is not installed.
#[test]
fn live_disks_agree_with_lsblk() {
    let Ok(out) = std::process::Command::new("lsblk")
        .args([
            "-J",
            "-d",
            "-b",
            "-o",
            "NAME,HCTL,LOG-SEC,PHY-SEC,RM,REV,VENDOR",
        ])
        .output()
    else {
        eprintln!("lsblk is not installed: test skipped");
        return;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        eprintln!("lsblk gave no JSON: test skipped");
        return;
    };
    let ours = disks::collect(&HostRoot::default(), &mut Vec::new());
    let mut compared = 0;
    for b in v["blockdevices"].as_array().into_iter().flatten() {
        let Some(d) = ours
            .iter()
            .find(|d| b["name"].as_str() == Some(d.name.as_str()))
        else {
            continue;
        };
        let num = |n: Option<u32>| n.map(|n| n.to_string());
        let flag = |f: Option<bool>| f.map(|f| if f { "1" } else { "0" }.to_owned());
        assert_eq!(lsblk_text(&b["hctl"]), d.hctl, "{} hctl", d.name);
        assert_eq!(
            lsblk_text(&b["log-sec"]),
            num(d.logical_sector_bytes),
            "{}",
            d.name
        );
        assert_eq!(
            lsblk_text(&b["phy-sec"]),
            num(d.physical_sector_bytes),
            "{}",
            d.name
        );
        assert_eq!(
            lsblk_text(&b["rm"]),
            flag(d.removable),
            "{} removable",
            d.name
        );
        // SCSI INQUIRY fields (lsblk reads `device/rev` and `device/vendor`; an NVMe disk has
        // neither, and its firmware revision comes from `firmware_rev` here).
        if !d.nvme {
            assert_eq!(lsblk_text(&b["rev"]), d.firmware, "{} firmware", d.name);
            assert_eq!(lsblk_text(&b["vendor"]), d.vendor, "{} vendor", d.name);
        }
        compared += 1;
    }
    eprintln!("{compared} disks compared with lsblk");
}
