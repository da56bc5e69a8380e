//! Issue 18, items 2, 3 and 5: the field trees (`../shared/fixtures/field/`, read in place) and
//! trees of the same kinds built here: NVMe multipath path devices, padded identifier strings,
//! InfiniBand ports.

use std::path::Path;

use bc_protocol::inventory::Disk;

use super::*;

const FIELD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/field");

/// The field tree as a root, or `None` (loudly; a failure under `CI=true`) when it is missing.
pub(super) fn field_root(rel: &str) -> Option<HostRoot> {
    let p = Path::new(FIELD).join(rel);
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

/// A made-up host tree (the other test modules of the inventory build theirs with it too).
pub(super) struct Tree {
    _dir: tempfile::TempDir,
    pub(super) root: HostRoot,
}

impl Tree {
    pub(super) fn new() -> std::io::Result<Self> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        Ok(Self { _dir: dir, root })
    }

    pub(super) fn file(&self, path: &str, bytes: &[u8]) -> std::io::Result<()> {
        let p = self.root.path(path);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::fs::write(p, bytes)
    }

    pub(super) fn link(&self, path: &str, target: &str) -> std::io::Result<()> {
        let p = self.root.path(path);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d)?;
        }
        std::os::unix::fs::symlink(target, p)
    }

    /// A block device under `dir` (a `/sys/devices/...` path), linked from `/sys/block/<name>`.
    pub(super) fn block(
        &self,
        name: &str,
        dir: &str,
        sectors: u64,
        hidden: Option<&str>,
    ) -> std::io::Result<()> {
        self.file(&format!("{dir}/size"), format!("{sectors}\n").as_bytes())?;
        if let Some(h) = hidden {
            self.file(&format!("{dir}/hidden"), h.as_bytes())?;
        }
        self.link(
            &format!("/sys/block/{name}"),
            &self.root.path(dir).to_string_lossy(),
        )
    }
}

fn disks(root: &HostRoot) -> Vec<Disk> {
    disks::collect(root, &mut Vec::new())
}

fn names(d: &[Disk]) -> Vec<&str> {
    d.iter().map(|d| d.name.as_str()).collect()
}

#[test]
fn nvme_multipath_path_devices_are_not_disks() {
    let Some(root) = field_root("nvme-multipath/root") else {
        return;
    };
    let d = disks(&root);
    assert_eq!(names(&d), ["nvme0n1"]);
    assert_eq!(d[0].size_bytes, 7_501_476_528 * 512);
    assert_eq!(d[0].serial.as_deref(), Some("S6XXNA0T900001"));
    assert_eq!(
        d[0].wwn.as_deref(),
        Some("eui.36344830529001230025384500000001")
    );
    let total: u64 = collect(&root).disks.iter().map(|d| d.size_bytes).sum();
    assert_eq!(total, 7_501_476_528 * 512, "capacity counted once");
}

#[test]
fn hidden_and_path_devices_are_skipped_on_every_path() -> std::io::Result<()> {
    let t = Tree::new()?;
    let subsys = "/sys/devices/virtual/nvme-subsystem/nvme-subsys1";
    let ctrl1 = "/sys/devices/pci0000:00/0000:00:01.1/0000:02:00.0/nvme/nvme1";
    let ctrl2 = "/sys/devices/pci0000:00/0000:00:01.2/0000:03:00.0/nvme/nvme2";
    // The head, two path devices (one says hidden, one only has the path name), and a hidden
    // device of another kind.
    t.block("nvme1n1", &format!("{subsys}/nvme1n1"), 1000, Some("0\n"))?;
    // The head's parent is its subsystem (`device_add_disk(&subsys->dev, …)`).
    t.link(&format!("{subsys}/nvme1n1/device"), "../../nvme-subsys1")?;
    t.block(
        "nvme1c1n1",
        &format!("{ctrl1}/nvme1c1n1"),
        1000,
        Some("1\n"),
    )?;
    t.block("nvme1c2n1", &format!("{ctrl2}/nvme1c2n1"), 1000, None)?;
    t.block("sdz", "/sys/devices/virtual/block/sdz", 2000, Some("1\n"))?;
    t.block(
        "sda",
        "/sys/devices/pci0000:00/0000:00:17.0/ata1/host0/sda",
        3000,
        Some("0\n"),
    )?;
    // /sys/class/nvme lists the path devices under their controllers, and a namespace head of
    // a third controller that /sys/block does not list (a copied tree) with its own path device.
    t.link(
        "/sys/class/nvme/nvme1",
        &t.root.path(ctrl1).to_string_lossy(),
    )?;
    t.link(
        "/sys/class/nvme/nvme2",
        &t.root.path(ctrl2).to_string_lossy(),
    )?;
    let ctrl3 = "/sys/devices/pci0000:00/0000:00:01.3/0000:04:00.0/nvme/nvme3";
    t.file(&format!("{ctrl3}/nvme3n1/size"), b"500\n")?;
    t.file(&format!("{ctrl3}/nvme3c3n1/size"), b"500\n")?;
    t.file(&format!("{ctrl3}/nvme3c3n1/hidden"), b"1\n")?;
    t.file(&format!("{ctrl3}/nvme3x1/size"), b"500\n")?;
    t.file(&format!("{ctrl3}/nvme3x1/hidden"), b"1\n")?;
    t.link(
        "/sys/class/nvme/nvme3",
        &t.root.path(ctrl3).to_string_lossy(),
    )?;
    let d = disks(&t.root);
    assert_eq!(names(&d), ["nvme1n1", "nvme3n1", "sda"]);
    Ok(())
}

#[test]
fn a_sas_disks_padded_vpd_serial_is_clean() {
    let Some(root) = field_root("sas-vpd80-padding/root") else {
        return;
    };
    let d = disks(&root);
    assert_eq!(names(&d), ["sdb"]);
    assert_eq!(d[0].serial.as_deref(), Some("ZC1AB2CD"));
    assert_eq!(d[0].model.as_deref(), Some("ST4000NM0025"));
    assert_eq!(d[0].transport.as_deref(), Some("sas"));
    assert_eq!(d[0].wwn.as_deref(), Some("naa.5000c500a1b2c3d7"));
}

#[test]
fn identifier_strings_are_clean_on_every_path() -> std::io::Result<()> {
    let t = Tree::new()?;
    // A SCSI disk: page 0x80 announces 12 bytes (serial, tab, NULs); the kernel's buffer holds
    // more. No wwid file: page 0x83's NAA designator is the name.
    let sdc = "/sys/devices/pci0000:00/0000:00:03.0/0000:18:00.0/host0/target0:0:1/0:0:1:0";
    t.block("sdc", &format!("{sdc}/block/sdc"), 4000, None)?;
    t.link(
        &format!("{sdc}/block/sdc/device"),
        &t.root.path(sdc).to_string_lossy(),
    )?;
    let mut pg80 = vec![0x00, 0x80, 0x00, 0x0c];
    pg80.extend_from_slice(b"  WX41\tA9\0\0\0\0 trailing junk past the page");
    t.file(&format!("{sdc}/vpd_pg80"), &pg80)?;
    let mut pg83 = vec![0x00, 0x83, 0x00, 0x0c, 0x01, 0x03, 0x00, 0x08];
    pg83.extend_from_slice(&[0x50, 0x00, 0xc5, 0x00, 0x11, 0x22, 0x33, 0x44]);
    t.file(&format!("{sdc}/vpd_pg83"), &pg83)?;
    t.file(&format!("{sdc}/model"), b"ST8000NM\0\0\0\0\n")?;
    // An NVMe disk whose controller serial holds a tab and NULs.
    let nv = "/sys/devices/pci0000:00/0000:00:01.1/0000:05:00.0/nvme/nvme4";
    t.block("nvme4n1", &format!("{nv}/nvme4n1"), 5000, None)?;
    t.link(
        &format!("{nv}/nvme4n1/device"),
        &t.root.path(nv).to_string_lossy(),
    )?;
    t.file(&format!("{nv}/serial"), b"\tS7ABNX0W100042\0\0   \n")?;
    // The kernel's DMI copy with NUL padding.
    t.file("/sys/class/dmi/id/product_serial", b"7N62AI2\0\0\0\n")?;
    t.file(
        "/sys/class/dmi/id/board_serial",
        b"\t.7N62AI2.GRTCL6944100GP.\0\n",
    )?;
    let inv = collect(&t.root);
    let by = |n: &str| {
        inv.disks
            .iter()
            .find(|d| d.name == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by("sdc").serial.as_deref(), Some("WX41 A9"));
    assert_eq!(by("sdc").wwn.as_deref(), Some("naa.5000c50011223344"));
    assert_eq!(by("sdc").model.as_deref(), Some("ST8000NM"));
    assert_eq!(by("nvme4n1").serial.as_deref(), Some("S7ABNX0W100042"));
    let sys = inv.system.unwrap_or_default();
    assert_eq!(sys.serial.as_deref(), Some("7N62AI2"));
    assert_eq!(
        sys.board_serial.as_deref(),
        Some(".7N62AI2.GRTCL6944100GP.")
    );
    // The hardware key reads the same values.
    let r = crate::hwkey::report(&t.root);
    assert!(
        r.lines.contains(&"system-serial:7n62ai2".to_owned())
            && r.lines
                .contains(&"baseboard-serial:7n62ai2.grtcl6944100gp".to_owned()),
        "{:?}",
        r.lines
    );
    Ok(())
}

/// An IPoIB interface `name` of HCA port `guid` (8 bytes, `:`-separated), with the given
/// `addr_assign_type`.
fn ipoib(t: &Tree, name: &str, pci: &str, guid: &str) -> std::io::Result<String> {
    let dir = format!("/sys/devices/pci0000:00/0000:00:02.0/{pci}/net/{name}");
    let addr = format!("80:00:02:08:fe:80:00:00:00:00:00:00:{guid}");
    t.file(&format!("{dir}/address"), format!("{addr}\n").as_bytes())?;
    t.file(&format!("{dir}/addr_assign_type"), b"0\n")?;
    t.file(&format!("{dir}/type"), b"32\n")?;
    t.link(
        &format!("/sys/class/net/{name}"),
        &t.root.path(&dir).to_string_lossy(),
    )?;
    t.link(
        &format!("{dir}/device"),
        &t.root
            .path(format!("/sys/devices/pci0000:00/0000:00:02.0/{pci}"))
            .to_string_lossy(),
    )?;
    Ok(dir)
}

#[test]
fn an_infiniband_address_is_not_a_permanent_mac() -> std::io::Result<()> {
    let t = Tree::new()?;
    ipoib(&t, "ib0", "0000:41:00.0", "00:02:c9:03:00:0f:ab:cd")?;
    // A bonded IPoIB port (active-backup): its perm_hwaddr is its own 20-byte address.
    let ib1 = ipoib(&t, "ib1", "0000:42:00.0", "00:02:c9:03:00:0f:ab:ce")?;
    t.file(
        &format!("{ib1}/bonding_slave/perm_hwaddr"),
        b"80:00:02:09:fe:80:00:00:00:00:00:00:00:02:c9:03:00:0f:ab:ce\n",
    )?;
    // An Ethernet port keeps its permanent MAC.
    let eth = "/sys/devices/pci0000:00/0000:00:02.0/0000:43:00.0/net/eno1";
    t.file(&format!("{eth}/address"), b"0c:c4:7a:11:22:33\n")?;
    t.file(&format!("{eth}/addr_assign_type"), b"0\n")?;
    t.file(&format!("{eth}/type"), b"1\n")?;
    t.link("/sys/class/net/eno1", &t.root.path(eth).to_string_lossy())?;
    let nics = collect(&t.root).nics;
    let by = |n: &str| {
        nics.iter()
            .find(|x| x.name == n)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(by("ib0").permanent_mac, None);
    assert_eq!(by("ib1").permanent_mac, None);
    assert_eq!(
        by("eno1").permanent_mac.as_deref(),
        Some("0c:c4:7a:11:22:33")
    );
    // Not a MAC for the hardware key either.
    let r = crate::hwkey::report(&t.root);
    assert_eq!(r.lines, ["mac:0c:c4:7a:11:22:33"]);
    Ok(())
}

#[test]
fn an_infiniband_port_reports_its_port_guid() -> std::io::Result<()> {
    let t = Tree::new()?;
    ipoib(&t, "ib0", "0000:41:00.0", "00:02:c9:03:00:0f:ab:cd")?;
    let port = "/sys/class/infiniband/mlx5_0/ports/1";
    t.file(&format!("{port}/state"), b"4: ACTIVE\n")?;
    t.file(
        &format!("{port}/gids/0"),
        b"fe80:0000:0000:0000:0002:c903:000f:abcd\n",
    )?;
    t.file(
        "/sys/class/infiniband/mlx5_0/ports/2/gids/0",
        b"0000:0000:0000:0000:0000:0000:0000:0000\n",
    )?;
    let inv = collect(&t.root);
    let ib0 = inv
        .nics
        .iter()
        .find(|n| n.name == "ib0")
        .cloned()
        .unwrap_or_default();
    assert_eq!(ib0.port_guid.as_deref(), Some("0002:c903:000f:abcd"));
    assert_eq!(ib0.permanent_mac, None);
    assert_eq!(inv.infiniband.len(), 2);
    assert_eq!(
        inv.infiniband[0].port_guid.as_deref(),
        Some("0002:c903:000f:abcd")
    );
    assert_eq!(
        inv.infiniband[1].port_guid, None,
        "no GUID on a port without a GID"
    );
    assert!(render_table(&inv).contains("guid=0002:c903:000f:abcd"));
    Ok(())
}
