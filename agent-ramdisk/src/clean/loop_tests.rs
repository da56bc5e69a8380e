//! `disk.clean` on real loop devices (root only): a GPT disk with an ext4 partition loses its
//! table at both ends and the filesystem's superblock; a full erase zeroes every byte, by
//! `BLKZEROOUT` or by discard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::process::Command;

use bc_protocol::commands::clean::{CleanMode, DiskOutcome};
use bcd_probes::hostroot::HostRoot;

use super::{Tools, clean_disks};

const MIB: u64 = 1 << 20;
const DISK_MIB: u64 = 64;
const FILL: u8 = 0xAB;
/// Partition 1: 1..33 MiB; partition 2: 33 MiB to the backup GPT.
const TABLE: &str = "label: gpt\nstart=2048, size=65536, type=L\nstart=67584, type=L\n";

/// Not root: skipped anywhere. A tool missing or a loop device refused: skipped on a
/// workstation, a failure in CI (`CI=true`), where `.ci/run` installs the tools.
fn skip(why: &str, only_outside_ci: bool) -> bool {
    if only_outside_ci {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    }
    eprintln!("!!! SKIPPED: {why}");
    true
}

fn run(cmd: &str, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write;
    let mut c = Command::new(cmd);
    c.args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn().map_err(|e| format!("{cmd}: {e}"))?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin.unwrap_or("").as_bytes())
            .map_err(|e| format!("{cmd} stdin: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A loop device over a temporary image, detached on drop.
struct LoopDisk {
    name: String,
    image: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if let Err(e) = run("losetup", &["-d", &format!("/dev/{}", self.name)], None) {
            eprintln!("detaching {}: {e}", self.name);
        }
    }
}

impl LoopDisk {
    /// A `DISK_MIB` image full of [`FILL`] with a GPT (partition 1: 1..33 MiB, ext4;
    /// partition 2: the rest, left as it is), attached with its partitions scanned; `None`
    /// when the test cannot run here.
    fn gpt_ext4() -> Option<Self> {
        Self::attach(false)
    }

    /// [`LoopDisk::gpt_ext4`], attached read-only when `read_only`.
    fn attach(read_only: bool) -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            skip("loop devices need root", false);
            return None;
        }
        for tool in ["losetup", "sfdisk", "mkfs.ext4", "blkid"] {
            if run(tool, &["--version"], None).is_err() && run(tool, &["-V"], None).is_err() {
                skip(&format!("{tool} not installed"), true);
                return None;
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, vec![FILL; (DISK_MIB * MIB) as usize]).unwrap();
        let img = image.to_string_lossy().into_owned();
        run("sfdisk", &["-q", &img], Some(TABLE)).unwrap();
        // Made on the image at partition 1's offset, not on `/dev/loopNp1`: a kernel built
        // without partition parsers (this one may be) never makes that node.
        run(
            "mkfs.ext4",
            &["-q", "-F", "-E", &format!("offset={MIB}"), &img, "32M"],
            None,
        )
        .unwrap();
        let mut args = vec!["-f", "--show", "-P"];
        if read_only {
            args.push("-r");
        }
        args.push(&img);
        let dev = match run("losetup", &args, None) {
            Ok(d) => d.trim().to_owned(),
            Err(e) => {
                skip(&format!("no loop device: {e}"), true);
                return None;
            }
        };
        let name = dev.trim_start_matches("/dev/").to_owned();
        Some(Self {
            name,
            image,
            _dir: dir,
        })
    }

    fn dev(&self) -> String {
        format!("/dev/{}", self.name)
    }

    /// What `blkid -p` finds on `dev` at byte `offset` (empty when nothing).
    fn probe(dev: &str, offset: u64) -> String {
        let offset = offset.to_string();
        run("blkid", &["-p", "-o", "export", "-O", &offset, dev], None).unwrap_or_default()
    }

    /// The partitions the kernel lists for it.
    fn kernel_partitions(&self) -> usize {
        std::fs::read_dir(format!("/sys/block/{}", self.name))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().join("partition").exists())
                    .count()
            })
            .unwrap_or(0)
    }

    fn read(&self, at: u64, len: usize) -> Vec<u8> {
        let f = std::fs::File::open(&self.image).unwrap();
        let mut b = vec![0u8; len];
        f.read_exact_at(&mut b, at).unwrap();
        b
    }
}

fn zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

#[test]
fn metadata_erases_both_gpt_headers_and_the_ext4_superblock_of_a_loop_disk() {
    let Some(disk) = LoopDisk::gpt_ext4() else {
        return;
    };
    assert!(LoopDisk::probe(&disk.dev(), 0).contains("PTTYPE=gpt"));
    assert!(LoopDisk::probe(&disk.dev(), MIB).contains("TYPE=ext4"));
    let listed = disk.kernel_partitions();
    let ext4_magic_at = MIB + 1024 + 0x38;
    assert_eq!(disk.read(ext4_magic_at, 2), [0x53, 0xEF], "ext4 magic");
    assert_eq!(&disk.read(512, 8), b"EFI PART");
    assert_eq!(&disk.read(DISK_MIB * MIB - 512, 8), b"EFI PART");

    let r = clean_disks(
        &HostRoot::default(),
        CleanMode::Metadata,
        std::slice::from_ref(&disk.name),
        Tools::default(),
    );
    let d = &r.disks[0];
    assert_eq!(d.outcome, DiskOutcome::Cleaned, "{d:?}");
    assert_eq!(d.size_bytes, DISK_MIB * MIB);
    // Disk 0..1 and 63..64 MiB; p1 1..2 and 32..33; p2 (sfdisk ends it on the MiB before the
    // backup GPT) 33..34 and 62..63: 0..2, 32..34, 62..64.
    assert_eq!(d.bytes_erased, 6 * MIB, "{d:?}");
    assert!(d.steps[0].contains("2 partition(s)"), "{:?}", d.steps);
    assert_eq!(d.steps[1], "rereadPartitions", "{:?}", d.steps);

    assert!(
        zero(&disk.read(0, MIB as usize * 2)),
        "protective MBR, primary GPT, ext4 superblock"
    );
    assert!(
        zero(&disk.read((DISK_MIB - 2) * MIB, 2 * MIB as usize)),
        "p2's end, backup GPT"
    );
    assert!(zero(&disk.read(32 * MIB, 2 * MIB as usize)));
    assert!(
        disk.read(40 * MIB, MIB as usize).iter().all(|&x| x == FILL),
        "p2's middle kept"
    );
    assert_eq!(
        LoopDisk::probe(&disk.dev(), 0),
        "",
        "blkid still finds a table"
    );
    assert_eq!(
        LoopDisk::probe(&disk.dev(), MIB),
        "",
        "blkid still finds ext4"
    );
    // Where the kernel parsed the table, BLKRRPART made it forget the partitions.
    eprintln!("the kernel listed {listed} partition(s) before");
    assert_eq!(
        disk.kernel_partitions(),
        0,
        "the kernel still has the partitions"
    );
}

#[test]
fn full_erase_zeroes_every_byte_by_zeroout_or_by_discard() {
    for tools in [
        Tools {
            discard: false,
            ..Tools::default()
        },
        Tools::default(),
    ] {
        let Some(disk) = LoopDisk::gpt_ext4() else {
            return;
        };
        let r = clean_disks(
            &HostRoot::default(),
            CleanMode::Full,
            std::slice::from_ref(&disk.name),
            tools,
        );
        let d = &r.disks[0];
        eprintln!("{tools:?}: {:?}", d.steps);
        assert_eq!(d.outcome, DiskOutcome::Cleaned, "{d:?}");
        assert_eq!(d.bytes_erased, DISK_MIB * MIB);
        if !tools.discard {
            assert_eq!(d.steps[1], "zero", "{:?}", d.steps);
        } else {
            // A file-backed loop device discards by punching holes: they read as zeroes.
            assert!(
                d.steps
                    .iter()
                    .any(|s| s.starts_with("discard (reads back zeroes")),
                "{:?}",
                d.steps
            );
        }
        assert_eq!(d.steps.last().map(String::as_str), Some("rereadPartitions"));
        for mib in 0..DISK_MIB {
            assert!(
                zero(&disk.read(mib * MIB, MIB as usize)),
                "MiB {mib} not zero ({tools:?})"
            );
        }
    }
}

#[test]
fn a_read_only_loop_disk_is_named_and_left_as_it_is() {
    let Some(disk) = LoopDisk::attach(true) else {
        return;
    };
    let before = disk.read(0, 2 * MIB as usize);
    for mode in [CleanMode::Metadata, CleanMode::Full] {
        let r = clean_disks(
            &HostRoot::default(),
            mode,
            std::slice::from_ref(&disk.name),
            Tools::default(),
        );
        let d = &r.disks[0];
        assert_eq!(d.outcome, DiskOutcome::ReadOnly, "{d:?}");
        assert_eq!(d.bytes_erased, 0);
        assert!(d.steps.is_empty(), "{d:?}");
    }
    assert_eq!(disk.read(0, 2 * MIB as usize), before);
    assert!(LoopDisk::probe(&disk.dev(), 0).contains("PTTYPE=gpt"));
}
