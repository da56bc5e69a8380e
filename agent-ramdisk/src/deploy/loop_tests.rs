//! `image.write` onto a real block device (root only): a loop device stands for the disk (the
//! fake root's `/dev/vda` links to it), so the kernel's side is real — the partitions it lists
//! after `BLKRRPART` (where the kernel parses a loop device's table), the image and config
//! drive read back through the device, and `O_EXCL` refusing a disk another holder claimed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::OpenOptionsExt;
use std::process::Command;
use std::sync::Arc;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::deploy::{Compression, ConfigDrive};

use super::test_server::Serve;
use super::test_utils::{MIB, SERIAL, args, fake_root, gpt_image, have_sfdisk, serve, sha, write};

const DISK: u64 = 64 * MIB;

fn run(cmd: &str, args: &[&str], stdin: &str) -> Result<String, String> {
    use std::io::Write;
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd}: {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .map_err(|e| format!("{cmd} stdin: {e}"))?;
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

/// A loop device over a sparse `DISK`-byte file, detached on drop.
struct LoopDisk {
    name: String,
    _dir: tempfile::TempDir,
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if let Err(e) = run("losetup", &["-d", &format!("/dev/{}", self.name)], "") {
            eprintln!("detaching {}: {e}", self.name);
        }
    }
}

impl LoopDisk {
    /// `None` (the test skipped) when not root, or, outside CI, without losetup or a free
    /// loop device.
    fn attach() -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("!!! SKIPPED: loop devices need root");
            return None;
        }
        let in_ci = std::env::var("CI").as_deref() == Ok("true");
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img).unwrap().set_len(DISK).unwrap();
        match run(
            "losetup",
            &["-f", "--show", "-P", &img.to_string_lossy()],
            "",
        ) {
            Ok(dev) => Some(Self {
                name: dev.trim().trim_start_matches("/dev/").to_owned(),
                _dir: dir,
            }),
            Err(e) => {
                assert!(!in_ci, "no loop device: {e}");
                eprintln!("!!! SKIPPED: no loop device: {e}");
                None
            }
        }
    }

    fn dev(&self) -> String {
        format!("/dev/{}", self.name)
    }

    /// The kernel's partitions of the disk, name and size in 512-byte sectors, sorted.
    fn kernel_partitions(&self) -> Vec<(String, u64)> {
        let base = format!("/sys/block/{}", self.name);
        let mut out: Vec<(String, u64)> = std::fs::read_dir(&base)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.path().join("partition").exists())
            .map(|e| {
                let size = std::fs::read_to_string(e.path().join("size")).unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, size.trim().parse().unwrap())
            })
            .collect();
        out.sort();
        out
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_real_disk_the_kernel_sees_the_new_partitions_and_a_claimed_disk_is_refused() {
    if !have_sfdisk() {
        return;
    }
    let _one = SERIAL.lock().await;
    let Some(disk) = LoopDisk::attach() else {
        return;
    };
    // A table from before, which the kernel takes in: the image's must replace it there.
    if let Err(e) = run(
        "sfdisk",
        &["-q", &disk.dev()],
        "label: gpt\nstart=2048, size=40960\n",
    ) {
        panic!("sfdisk on {}: {e}", disk.dev());
    }
    // A kernel without the GPT parser (or one that does not scan loop devices) lists none:
    // then only the kernel's view is not checked.
    let kernel_parses = disk.kernel_partitions().len() == 1;
    let root = fake_root(&[("vda", DISK, "LOOP1")]);
    let vda = root.path().join("dev/vda");
    std::fs::remove_file(&vda).unwrap();
    std::os::unix::fs::symlink(disk.dev(), &vda).unwrap();

    let img = Arc::new(gpt_image(b"BCD-MARKER-loop"));
    let url = serve("/img.raw", Serve::Bytes(img.clone())).await;
    let mut a = args(url, sha(&img), Compression::None);
    a.config_drive = Some(ConfigDrive {
        hostname: "loop-host".into(),
        ..Default::default()
    });
    let r = write(root.path(), a.clone()).await.unwrap();
    assert_eq!(r.config_drive_partition.as_deref(), Some("vda3"));
    let n = &disk.name;
    let sectors = DISK / 512;
    if kernel_parses {
        assert_eq!(
            disk.kernel_partitions(),
            [
                (format!("{n}p1"), 2048),
                (format!("{n}p2"), 4096),
                (format!("{n}p3"), sectors - 33 - 8192),
            ],
            "the kernel's view after BLKRRPART"
        );
    } else {
        eprintln!("!!! SKIPPED (in part): this kernel lists no partitions of a loop device");
    }
    let mut marker = [0u8; 15];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(disk.dev()).unwrap(),
        &mut marker,
        2 * MIB,
    )
    .unwrap();
    assert_eq!(&marker, b"BCD-MARKER-loop");
    let probe = run(
        "blkid",
        &[
            "-p",
            "-o",
            "export",
            "-O",
            &(4 * MIB).to_string(),
            &disk.dev(),
        ],
        "",
    )
    .unwrap();
    assert!(
        probe.contains("LABEL=cidata") && probe.contains("TYPE=vfat"),
        "{probe}"
    );

    // Another holder's exclusive claim (a mounted filesystem, md, dm all hold one).
    let claim = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_EXCL.bits())
        .open(disk.dev())
        .unwrap();
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(e.to_string().contains("in use"), "{e}");
    drop(claim);
}
