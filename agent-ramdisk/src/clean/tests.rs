//! `disk.clean` on a fake `/sys/block` with regular files standing for the devices.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use bc_protocol::commands::clean::{CleanMode, DiskOutcome};
use bcd_probes::hostroot::HostRoot;

use super::{Tools, clean, clean_disks, discover};

const MIB: u64 = 1 << 20;
const FILL: u8 = 0xAB;

/// A fake machine: `sys/block/<name>` entries and `dev/<name>` files full of [`FILL`].
struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/block")).unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        Self { dir }
    }

    fn root(&self) -> HostRoot {
        HostRoot::new(self.dir.path())
    }

    fn sys(&self, rel: &str, value: &str) {
        let p = self.dir.path().join("sys/block").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{value}\n")).unwrap();
    }

    /// A disk of `mib` MiB with partitions (start, size) in MiB.
    fn disk(&self, name: &str, mib: u64, parts: &[(u64, u64)]) {
        self.sys(&format!("{name}/size"), &(mib * MIB / 512).to_string());
        self.sys(&format!("{name}/ro"), "0");
        self.sys(&format!("{name}/serial"), &format!("SER-{name}"));
        for (i, (start, size)) in parts.iter().enumerate() {
            let p = format!("{name}/{name}{}", i + 1);
            self.sys(&format!("{p}/partition"), &(i + 1).to_string());
            self.sys(&format!("{p}/start"), &(start * MIB / 512).to_string());
            self.sys(&format!("{p}/size"), &(size * MIB / 512).to_string());
        }
        let bytes = vec![FILL; usize::try_from(mib * MIB).unwrap()];
        std::fs::write(self.dev(name), bytes).unwrap();
    }

    /// A virtual block device: its directory under `/sys/devices/virtual/block`, linked from
    /// `/sys/block/<name>` as the kernel links it, no `device` link.
    fn virtual_dev(&self, name: &str, sectors: &str) {
        let dir = self.dir.path().join("sys/devices/virtual/block").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("size"), format!("{sectors}\n")).unwrap();
        std::os::unix::fs::symlink(
            format!("../devices/virtual/block/{name}"),
            self.dir.path().join("sys/block").join(name),
        )
        .unwrap();
    }

    fn dev(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join("dev").join(name)
    }

    fn bytes(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dev(name)).unwrap()
    }
}

/// True when `bytes[range]` (MiB) are all `b`.
fn all(bytes: &[u8], from_mib: u64, to_mib: u64, b: u8) -> bool {
    let (a, z) = ((from_mib * MIB) as usize, (to_mib * MIB) as usize);
    bytes[a..z].iter().all(|&x| x == b)
}

#[test]
fn metadata_zeroes_both_ends_of_the_disk_and_of_each_partition_and_nothing_else() {
    let h = Host::new();
    // 16 MiB: partitions 2..6 and 8..14 MiB.
    h.disk("vda", 16, &[(2, 4), (8, 6)]);
    let r = clean(&h.root(), CleanMode::Metadata).unwrap();
    assert_eq!(r.mode, CleanMode::Metadata);
    assert_eq!(r.disks.len(), 1);
    let d = &r.disks[0];
    assert_eq!(d.outcome, DiskOutcome::Cleaned, "{d:?}");
    assert_eq!(
        (d.name.as_str(), d.serial.as_deref()),
        ("vda", Some("SER-vda"))
    );
    assert_eq!(d.size_bytes, 16 * MIB);
    // Disk 0..1, 15..16; vda1 2..3, 5..6; vda2 8..9, 13..14: six separate MiB.
    assert_eq!(d.bytes_erased, 6 * MIB);
    assert!(
        d.steps[0].starts_with("metadata (6291456 bytes"),
        "{:?}",
        d.steps
    );
    assert!(d.steps[0].contains("2 partition(s)"), "{:?}", d.steps);
    assert!(
        d.steps[1].starts_with("rereadPartitions: not a block device"),
        "{:?}",
        d.steps
    );
    assert_eq!(d.error, None);
    let b = h.bytes("vda");
    assert_eq!(b.len() as u64, 16 * MIB, "the file is not grown or cut");
    for (zero_from, zero_to) in [(0, 1), (2, 3), (5, 6), (8, 9), (13, 14), (15, 16)] {
        assert!(
            all(&b, zero_from, zero_to, 0),
            "{zero_from}..{zero_to} MiB not zeroed"
        );
    }
    for (kept_from, kept_to) in [(1, 2), (3, 5), (6, 8), (9, 13), (14, 15)] {
        assert!(
            all(&b, kept_from, kept_to, FILL),
            "{kept_from}..{kept_to} MiB touched"
        );
    }
}

#[test]
fn a_read_only_disk_is_left_untouched_and_a_failing_one_does_not_stop_the_others() {
    let h = Host::new();
    h.disk("sda", 4, &[]);
    h.disk("sdb", 4, &[]);
    h.sys("sdb/ro", "1");
    // sdc: its device node is a directory; sdd: no node at all; sde: no size in sysfs.
    h.sys("sdc/size", "8192");
    std::fs::create_dir(h.dev("sdc")).unwrap();
    h.sys("sdd/size", "8192");
    h.sys("sde/ro", "0");
    h.disk("vdz", 4, &[]);
    let r = clean(&h.root(), CleanMode::Metadata).unwrap();
    let by: Vec<(&str, DiskOutcome)> = r
        .disks
        .iter()
        .map(|d| (d.name.as_str(), d.outcome))
        .collect();
    assert_eq!(
        by,
        vec![
            ("sda", DiskOutcome::Cleaned),
            ("sdb", DiskOutcome::ReadOnly),
            ("sdc", DiskOutcome::Failed),
            ("sdd", DiskOutcome::Failed),
            ("sde", DiskOutcome::Failed),
            ("vdz", DiskOutcome::Cleaned),
        ]
    );
    let err = |n: usize| r.disks[n].error.clone().unwrap_or_default();
    assert_eq!(err(1), "read-only: /sys/block/sdb/ro is 1");
    assert!(r.disks[1].steps.is_empty() && r.disks[1].bytes_erased == 0);
    assert!(
        all(&h.bytes("sdb"), 0, 4, FILL),
        "a read-only disk was written"
    );
    assert!(
        err(2).ends_with("dev/sdc: not a block device"),
        "{}",
        err(2)
    );
    assert!(err(3).contains("dev/sdd: ENOENT"), "{}", err(3));
    assert_eq!(err(4), "size unknown: /sys/block/sde/size unreadable");
    for n in ["sda", "vdz"] {
        let b = h.bytes(n);
        assert!(
            all(&b, 0, 1, 0) && all(&b, 3, 4, 0) && all(&b, 1, 3, FILL),
            "{n}"
        );
    }
    assert!(r.summary().starts_with(
        "2 disk(s) cleaned (metadata), read-only and left as they are: sdb (read-only"
    ));
    assert_eq!(r.failed().count(), 3);
}

#[test]
fn discovery_leaves_out_what_is_not_a_disk_whatever_its_name() {
    let h = Host::new();
    // Disks: devices with hardware behind them, one named like a virtual device.
    for n in ["vdb", "nvme0n1", "sda", "loop7"] {
        h.sys(&format!("{n}/size"), "2048");
    }
    // Virtual devices, whatever they are called: a loop device, a new kind of virtual disk with
    // a disk-like name, device-mapper, an md array made of two disks.
    h.virtual_dev("loop0", "2048");
    h.virtual_dev("sdq", "2048");
    h.virtual_dev("frob0", "2048");
    h.sys("dm-0/size", "2048");
    h.sys("dm-0/dm/name", "vg-root");
    h.sys("md127/size", "4096");
    h.sys("md127/md/level", "raid1");
    h.sys("md127/slaves/sda", "");
    h.sys("md127/slaves/vdb", "");
    // A CD drive (SCSI type 5), a hidden multipath path, a removed disk still listed.
    h.sys("sr0/size", "2048");
    h.sys("sr0/device/type", "5");
    h.sys("nvme0c0n1/size", "2048");
    h.sys("nvme0c0n1/hidden", "1");
    h.sys("sdz/size", "0");
    let scan = discover::list_disks(&h.root()).unwrap();
    assert_eq!(scan.disks, ["loop7", "nvme0n1", "sda", "vdb"]);
    let left: Vec<(&str, String)> = scan
        .left_out
        .iter()
        .map(|(n, why)| (n.as_str(), why.to_string()))
        .collect();
    assert_eq!(
        left,
        [
            (
                "dm-0",
                "virtual, no hardware behind it (device-mapper)".to_owned()
            ),
            (
                "frob0",
                "virtual, no hardware behind it (under /sys/devices/virtual, no device link)"
                    .to_owned()
            ),
            (
                "loop0",
                "virtual, no hardware behind it (under /sys/devices/virtual, no device link)"
                    .to_owned()
            ),
            (
                "md127",
                "virtual, no hardware behind it (md array made of sda, vdb)".to_owned()
            ),
            (
                "nvme0c0n1",
                "hidden (a multipath path of a disk listed on its own)".to_owned()
            ),
            (
                "sdq",
                "virtual, no hardware behind it (under /sys/devices/virtual, no device link)"
                    .to_owned()
            ),
            (
                "sdz",
                "size 0 (removed but still listed, or no capacity)".to_owned()
            ),
            (
                "sr0",
                "not a disk drive (SCSI peripheral type 5, CD/DVD)".to_owned()
            ),
        ]
    );
    let info = discover::read_disk(&h.root(), "nvme0n1");
    assert!(info.is_nvme_namespace());
    assert!(!discover::read_disk(&h.root(), "nvme0c0n1").is_nvme_namespace());
    assert!(!discover::read_disk(&h.root(), "sda").is_nvme_namespace());
    // A missing /sys/block: the command fails as a whole.
    let empty = tempfile::tempdir().unwrap();
    let e = clean(&HostRoot::new(empty.path()), CleanMode::Metadata).unwrap_err();
    assert!(e.to_string().starts_with("listing "), "{e}");
}

#[test]
fn devices_that_are_not_disks_are_reported_and_left_untouched() {
    let h = Host::new();
    h.disk("vda", 4, &[]);
    h.virtual_dev("loop3", "8192");
    std::fs::write(h.dev("loop3"), vec![FILL; 4 * MIB as usize]).unwrap();
    // An empty card reader (removable, size 0) and a removed disk (size 0).
    h.sys("sdy/size", "0");
    h.sys("sdy/removable", "1");
    h.sys("sdz/size", "0");
    let r = clean(&h.root(), CleanMode::Metadata).unwrap();
    let names: Vec<&str> = r.disks.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["vda"]);
    let left: Vec<(&str, &str)> = r
        .left_out
        .iter()
        .map(|l| (l.name.as_str(), l.reason.as_str()))
        .collect();
    assert_eq!(
        left,
        [
            (
                "loop3",
                "virtual, no hardware behind it (under /sys/devices/virtual, no device link)"
            ),
            ("sdy", "size 0 (removable, no medium)"),
            ("sdz", "size 0 (removed but still listed, or no capacity)"),
        ]
    );
    assert!(
        all(&h.bytes("loop3"), 0, 4, FILL),
        "a device left out was written"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["leftOut"][1]["name"], "sdy");
}

#[test]
fn a_zero_sized_disk_named_explicitly_has_nothing_to_write_and_tiny_ones_are_clamped() {
    let h = Host::new();
    h.disk("vda", 0, &[]);
    std::fs::write(h.dev("vdb"), vec![FILL; 3000]).unwrap();
    h.sys("vdb/size", "5"); // 2560 bytes: the last 440 bytes of the file are not the disk's
    // sdz: an empty card reader (size 0, no device node that opens).
    h.sys("sdz/size", "0");
    let names = ["sdz", "vda", "vdb"].map(str::to_owned);
    let r = clean_disks(&h.root(), CleanMode::Metadata, &names, Tools::default());
    assert_eq!(r.disks[0].name, "sdz");
    assert_eq!(r.disks[0].outcome, DiskOutcome::Cleaned, "{:?}", r.disks[0]);
    assert_eq!(r.disks[0].steps, ["nothing to erase (size 0: no medium)"]);
    assert_eq!(r.disks[1].outcome, DiskOutcome::Cleaned);
    assert_eq!(r.disks[1].bytes_erased, 0);
    assert_eq!(r.disks[2].bytes_erased, 2560);
    let b = h.bytes("vdb");
    assert!(b[..2560].iter().all(|&x| x == 0) && b[2560..].iter().all(|&x| x == FILL));
}

#[test]
fn full_mode_on_a_file_zeroes_every_byte() {
    let h = Host::new();
    h.disk("vda", 5, &[(1, 3)]);
    let r = clean_disks(
        &h.root(),
        CleanMode::Full,
        &["vda".to_owned()],
        Tools::default(),
    );
    let d = &r.disks[0];
    assert_eq!(d.outcome, DiskOutcome::Cleaned, "{d:?}");
    assert_eq!(d.bytes_erased, 5 * MIB);
    assert_eq!(
        d.steps[1..3],
        [
            "zero (written: not a block device)",
            "metadata (again, after the full erase)",
        ],
    );
    assert!(d.steps[3].starts_with("rereadPartitions: not a block device (ENOTTY"));
    assert!(all(&h.bytes("vda"), 0, 5, 0));
}

#[test]
fn a_device_path_is_under_the_root() {
    // The device of disk `x` is `<root>/dev/x`, never the machine's `/dev/x`.
    let h = Host::new();
    h.sys("null/size", "8");
    let r = clean_disks(
        &h.root(),
        CleanMode::Metadata,
        &["null".to_owned()],
        Tools::default(),
    );
    assert_eq!(r.disks[0].outcome, DiskOutcome::Failed);
    let e = r.disks[0].error.clone().unwrap_or_default();
    assert!(
        e.contains(&*h.dir.path().to_string_lossy()) && e.contains("ENOENT"),
        "{e}"
    );
    assert!(Path::new("/dev/null").exists());
}

/// `sfdisk` writes `script` on `file`; false (and a skip) without it.
fn sfdisk(file: &Path, script: &str) -> bool {
    use std::io::Write;
    let child = std::process::Command::new("sfdisk")
        .arg("-q")
        .arg(file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "sfdisk not installed"
        );
        eprintln!("!!! SKIPPED: sfdisk not installed");
        return false;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk {script}");
    true
}

#[test]
fn partitions_the_kernel_does_not_list_are_read_from_the_gpt_or_the_mbr() {
    let h = Host::new();
    // No partitions in sysfs: only the disk's own table says where they are.
    h.disk("vda", 32, &[]);
    let gpt = "label: gpt\nstart=2048, size=8192, type=L\nstart=16384, size=20480, type=L\n";
    if !sfdisk(&h.dev("vda"), gpt) {
        return;
    }
    let f = std::fs::File::open(h.dev("vda")).unwrap();
    let sectors = |p: &super::discover::Partition| (p.start_bytes / 512, p.size_bytes / 512);
    let parts: Vec<_> = super::table::read(&f, 32 * MIB, 512)
        .iter()
        .map(sectors)
        .collect();
    assert_eq!(parts, vec![(2048, 8192), (16384, 20480)]);
    // The primary header gone, the backup one at the last LBA still tells.
    let rw = std::fs::OpenOptions::new()
        .write(true)
        .open(h.dev("vda"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&rw, &[0; 512], 512).unwrap();
    let parts: Vec<_> = super::table::read(&f, 32 * MIB, 512)
        .iter()
        .map(sectors)
        .collect();
    assert_eq!(parts, vec![(2048, 8192), (16384, 20480)]);

    h.disk("vdb", 32, &[]);
    let dos = "label: dos\nstart=2048, size=4096, type=83\nstart=8192, size=40960, type=5\n\
               start=10240, size=4096, type=83\nstart=16384, size=4096, type=83\n";
    assert!(sfdisk(&h.dev("vdb"), dos));
    let f = std::fs::File::open(h.dev("vdb")).unwrap();
    let parts: Vec<_> = super::table::read(&f, 32 * MIB, 512)
        .iter()
        .map(sectors)
        .collect();
    assert_eq!(
        parts,
        vec![(2048, 4096), (8192, 40960), (10240, 4096), (16384, 4096)]
    );

    let r = clean(&h.root(), CleanMode::Metadata).unwrap();
    assert!(
        r.disks[0].steps[0].contains("of 2 partition(s)"),
        "{:?}",
        r.disks[0].steps
    );
    assert!(
        r.disks[1].steps[0].contains("of 4 partition(s)"),
        "{:?}",
        r.disks[1].steps
    );
    let b = h.bytes("vda");
    // vda1 1..5 MiB, vda2 8..18 MiB: both ends of each zeroed, their middles kept.
    assert!(all(&b, 0, 2, 0) && all(&b, 4, 5, 0) && all(&b, 8, 9, 0) && all(&b, 17, 18, 0));
    assert!(all(&b, 2, 4, FILL) && all(&b, 9, 17, FILL) && all(&b, 18, 31, FILL));
}

/// The field tree `rel` (`../shared/fixtures/field/…`, read in place), or `None` (loudly; a
/// failure under `CI=true`) when it is missing.
fn field_root(rel: &str) -> Option<HostRoot> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/field")
        .join(rel);
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
fn the_cleaner_erases_what_the_inventory_lists_on_the_field_trees() {
    for (tree, disks, left_out) in [
        (
            "emmc-boot-partitions/root",
            vec!["mmcblk0", "nvme0n1"],
            vec![
                ("mmcblk0boot0", "read-only hardware partition of mmcblk0"),
                ("mmcblk0boot1", "read-only hardware partition of mmcblk0"),
            ],
        ),
        (
            "removed-disk-zero-size/root",
            vec!["sda"],
            vec![("sdb", "size 0 (removed but still listed, or no capacity)")],
        ),
    ] {
        let Some(root) = field_root(tree) else {
            continue;
        };
        let scan = discover::list_disks(&root).unwrap();
        assert_eq!(scan.disks, disks, "{tree}");
        let left: Vec<(&str, String)> = scan
            .left_out
            .iter()
            .map(|(n, w)| (n.as_str(), w.to_string()))
            .collect();
        let want: Vec<(&str, String)> = left_out
            .iter()
            .map(|(n, w)| (*n, (*w).to_owned()))
            .collect();
        assert_eq!(left, want, "{tree}");
        let inventoried: Vec<String> = bcd_probes::inventory::collect(&root)
            .disks
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(
            inventoried, scan.disks,
            "{tree}: the inventory and the cleaner disagree"
        );
    }
}
