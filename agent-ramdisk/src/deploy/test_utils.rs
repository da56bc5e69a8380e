//! Helpers of the deploy tests: fake roots with disk files, test images (sfdisk's GPT, gzip,
//! zstd), the args of a write, waits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use bc_protocol::commands::deploy::{Compression, ImageFormat, ImageSource, ImageWriteArgs};
use bcd_probes::hostroot::HostRoot;
use sha2::{Digest, Sha256};

use super::test_server::{self, Serve};
use super::{DeployError, ImageWriteResult, image_write};

pub(crate) const MIB: u64 = 1 << 20;

/// One image write at a time: the memory test measures the process's peak, and the others
/// would add theirs.
pub(crate) static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A fake root with these disks (name, bytes, serial), each `/dev/<name>` a file of that size.
pub(crate) fn fake_root(disks: &[(&str, u64, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, size, serial) in disks {
        let sys = dir.path().join(format!("sys/block/{name}"));
        std::fs::create_dir_all(sys.join("device")).unwrap();
        std::fs::write(sys.join("size"), format!("{}\n", size / 512)).unwrap();
        std::fs::write(sys.join("ro"), "0\n").unwrap();
        std::fs::write(sys.join("device/serial"), format!("{serial}\n")).unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        let f = std::fs::File::create(dev(dir.path(), name)).unwrap();
        f.set_len(*size).unwrap();
    }
    dir
}

pub(crate) fn dev(root: &Path, name: &str) -> PathBuf {
    root.join("dev").join(name)
}

/// `len` bytes of the disk file from `at`.
pub(crate) fn read_at(path: &Path, at: u64, len: u64) -> Vec<u8> {
    let mut f = std::fs::File::open(path).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    let mut b = vec![0u8; usize::try_from(len).unwrap()];
    f.read_exact(&mut b).unwrap();
    b
}

pub(crate) fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// True when `tool --version` runs; else the test is skipped (outside CI) or fails (in CI).
fn have(tool: &str, package: &str) -> bool {
    let ok = std::process::Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} (Debian package {package}) is missing"
        );
        eprintln!("!!! SKIPPED: {tool} is missing (apt-get install {package})");
    }
    ok
}

/// `sfdisk`, which makes the test images and reads their GPT back.
pub(crate) fn have_sfdisk() -> bool {
    have("sfdisk", "fdisk")
}

/// `blkid`, which probes the config drive as cloud-init does.
pub(crate) fn have_blkid() -> bool {
    have("blkid", "util-linux")
}

/// `qemu-img` (and `qemu-io`, of the same package), which make the qcow2 test images and which
/// image.write runs for them.
pub(crate) fn have_qemu_img() -> bool {
    have("qemu-img", "qemu-utils") && have("qemu-io", "qemu-utils")
}

/// Runs `qemu-img` (or `qemu-io`) with `args`, panicking with its stderr when it fails.
pub(crate) fn qemu(tool: &str, args: &[&str]) {
    let out = std::process::Command::new(tool)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `raw` converted to qcow2 by `qemu-img convert` with `extra` options (`-c`: compressed
/// clusters); the file's bytes.
pub(crate) fn qcow2_of(raw: &[u8], extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("img.raw"), dir.path().join("img.qcow2"));
    std::fs::write(&src, raw).unwrap();
    let (src, dst) = (src.to_string_lossy(), dst.to_string_lossy());
    let mut args = vec!["convert", "-f", "raw", "-O", "qcow2"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[&*src, &*dst]);
    qemu("qemu-img", &args);
    std::fs::read(&*dst).unwrap()
}

/// A 6 MiB GPT disk image made by sfdisk: partition 1 at 1 MiB (1 MiB), partition 2 at 2 MiB
/// (2 MiB) whose first bytes are `marker`.
pub(crate) fn gpt_image(marker: &[u8]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(6 * MIB)
        .unwrap();
    let mut child = std::process::Command::new("sfdisk")
        .args(["--quiet", "--no-reread", "--no-tell-kernel"])
        .arg(&path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\nstart=2048, size=2048, type=U\nstart=4096, size=4096, type=L\n")
        .unwrap();
    assert!(child.wait().unwrap().success(), "sfdisk failed");
    let mut img = std::fs::read(&path).unwrap();
    let at = usize::try_from(2 * MIB).unwrap();
    img[at..at + marker.len()].copy_from_slice(marker);
    img
}

pub(crate) fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

pub(crate) fn args(url: String, sha256: String, compression: Compression) -> ImageWriteArgs {
    ImageWriteArgs {
        image: ImageSource {
            url,
            sha256,
            format: ImageFormat::Raw,
            compression,
        },
        root_device: None,
        config_drive: None,
        instance_id: None,
        deploy_token: None,
    }
}

pub(crate) async fn serve(path: &str, what: Serve) -> String {
    let base = test_server::start(HashMap::from([(path.to_owned(), what)])).await;
    format!("{base}{path}")
}

/// `image.write` on the fake root.
pub(crate) async fn write(root: &Path, a: ImageWriteArgs) -> Result<ImageWriteResult, DeployError> {
    image_write(&HostRoot::new(root), a).await
}

pub(crate) fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

/// Polls `f` every 20 ms until it is true, or panics after 20 s naming `what`.
pub(crate) async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
