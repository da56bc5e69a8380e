//! `image.write` end to end on a fake root: `<root>/sys/block/<disk>` with its size, `ro` and
//! serial, `<root>/dev/<disk>` a regular file, the image served by [`super::test_server`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::deploy::{
    Compression, ConfigDrive, ImageFormat, ImageSource, ImageWriteArgs, RootDeviceHints,
};
use bcd_probes::hostroot::HostRoot;
use sha2::{Digest, Sha256};

use super::test_server::{self, Serve};
use super::{DeployError, image_write};

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
pub(super) fn have_sfdisk() -> bool {
    have("sfdisk", "fdisk")
}

/// `blkid`, which probes the config drive as cloud-init does.
pub(super) fn have_blkid() -> bool {
    have("blkid", "util-linux")
}

/// A 6 MiB GPT disk image made by sfdisk: partition 1 at 1 MiB (1 MiB), partition 2 at 2 MiB
/// (2 MiB) whose first bytes are `marker`.
pub(super) fn gpt_image(marker: &[u8]) -> Vec<u8> {
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

pub(super) fn gzip(b: &[u8]) -> Vec<u8> {
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
    }
}

pub(crate) async fn serve(path: &str, what: Serve) -> String {
    let base = test_server::start(HashMap::from([(path.to_owned(), what)])).await;
    format!("{base}{path}")
}

async fn write(root: &Path, a: ImageWriteArgs) -> Result<super::ImageWriteResult, DeployError> {
    image_write(&HostRoot::new(root), a).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_image_lands_at_offset_zero_on_the_smallest_disk_or_the_hinted_one() {
    if !have_sfdisk() {
        return;
    }
    let _one = SERIAL.lock().await;
    let img = Arc::new(gpt_image(b"BCD-MARKER-raw"));
    let url = serve("/img.raw", Serve::Bytes(img.clone())).await;
    let root = fake_root(&[("vda", 64 * MIB, "QM00001"), ("vdb", 16 * MIB, "QM00002")]);

    let r = write(root.path(), args(url.clone(), sha(&img), Compression::None))
        .await
        .unwrap();
    assert_eq!(r.device, "vdb");
    assert_eq!(r.chosen_because, "smallest disk that fits (vdb, of 2)");
    assert_eq!(r.device_size_bytes, 16 * MIB);
    assert_eq!((r.image_bytes, r.written_bytes), (6 * MIB, 6 * MIB));
    assert_eq!(r.sha256, sha(&img));
    assert_eq!(r.config_drive_partition, None);
    assert_eq!(read_at(&dev(root.path(), "vdb"), 0, 6 * MIB), *img);
    assert!(
        read_at(&dev(root.path(), "vda"), 0, MIB)
            .iter()
            .all(|b| *b == 0)
    );

    let mut a = args(url, sha(&img), Compression::None);
    a.root_device = Some(RootDeviceHints {
        serial: Some("QM00001".into()),
        ..Default::default()
    });
    let r = write(root.path(), a).await.unwrap();
    assert_eq!(
        (r.device.as_str(), r.chosen_because.as_str()),
        ("vda", "serial QM00001 (hint)")
    );
    let back = read_at(&dev(root.path(), "vda"), 0, 6 * MIB);
    assert_eq!(back, *img);
    let marker = &back[usize::try_from(2 * MIB).unwrap()..][..14];
    assert_eq!(marker, b"BCD-MARKER-raw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_and_zstd_images_are_hashed_as_served_and_written_decompressed() {
    if !have_sfdisk() {
        return;
    }
    let _one = SERIAL.lock().await;
    let img = gpt_image(b"BCD-MARKER-zip");
    for (c, served) in [
        (Compression::Gzip, gzip(&img)),
        (Compression::Zstd, zstd::encode_all(&img[..], 3).unwrap()),
    ] {
        let root = fake_root(&[("vda", 32 * MIB, "S1")]);
        let url = serve("/img", Serve::Bytes(Arc::new(served.clone()))).await;
        let r = write(root.path(), args(url, sha(&served), c))
            .await
            .unwrap();
        assert_eq!(r.image_bytes, served.len() as u64, "{c:?}");
        assert_eq!(r.written_bytes, img.len() as u64, "{c:?}");
        assert_eq!(r.sha256, sha(&served), "{c:?}");
        assert_eq!(read_at(&dev(root.path(), "vda"), 0, 6 * MIB), img, "{c:?}");
    }
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sha256_is_a_checksum_mismatch_and_the_disk_ends_are_zeroed() {
    let _one = SERIAL.lock().await;
    let len = 10 * MIB;
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    let url = serve("/img", Serve::Pattern(len)).await;
    let wrong = "ab".repeat(32);
    let e = write(root.path(), args(url, wrong.clone(), Compression::None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");
    let msg = e.to_failure().message;
    assert!(
        msg.contains(&wrong) && msg.contains(&test_server::pattern_sha256(len)),
        "{msg}"
    );
    assert!(msg.contains("zeroed"), "{msg}");
    let disk = dev(root.path(), "vda");
    assert!(all_zero(&read_at(&disk, 0, MIB)));
    assert!(all_zero(&read_at(&disk, 31 * MIB, MIB)));
    // The rest of the image was written, so the zeroing (not a lack of writing) is what left
    // the first MiB empty.
    assert!(!all_zero(&read_at(&disk, MIB, MIB)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_short_is_unreachable_and_the_disk_ends_are_zeroed() {
    let _one = SERIAL.lock().await;
    let mut img = vec![0u8; usize::try_from(12 * MIB).unwrap()];
    test_server::pattern_chunk(7, &mut img);
    let img = Arc::new(img);
    let after = usize::try_from(9 * MIB).unwrap();
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    let url = serve(
        "/img",
        Serve::Cut {
            bytes: img.clone(),
            after,
        },
    )
    .await;
    let e = write(root.path(), args(url, sha(&img), Compression::None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageUnreachable, "{e}");
    assert!(e.to_string().contains("zeroed"), "{e}");
    let disk = dev(root.path(), "vda");
    assert!(all_zero(&read_at(&disk, 0, MIB)));
    assert_eq!(
        read_at(&disk, MIB, 3 * MIB),
        img[usize::try_from(MIB).unwrap()..][..usize::try_from(3 * MIB).unwrap()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_before_the_first_byte_leave_the_disk_alone() {
    let _one = SERIAL.lock().await;
    let root = fake_root(&[("vda", 16 * MIB, "S1"), ("vdb", 8 * MIB, "S2")]);
    let disk = dev(root.path(), "vda");
    let mut f = std::fs::OpenOptions::new().write(true).open(&disk).unwrap();
    f.write_all(b"OLD").unwrap();
    drop(f);
    let sha = test_server::pattern_sha256(20 * MIB);

    let url = serve("/big", Serve::Pattern(20 * MIB)).await;
    let e = write(
        root.path(),
        args(url.clone(), sha.clone(), Compression::None),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::NoRootDevice, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("vda: too small (16777216 bytes, 20971520 needed)"),
        "{msg}"
    );
    assert!(msg.contains("vdb: too small"), "{msg}");

    let mut a = args(url, sha.clone(), Compression::Gzip);
    a.root_device = Some(RootDeviceHints {
        serial: Some("NOPE".into()),
        ..Default::default()
    });
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::NoRootDevice, "{e}");
    assert!(e.to_string().contains("vda: serial S1 is not NOPE"), "{e}");

    let url = serve("/gone", Serve::Status(404)).await;
    let e = write(root.path(), args(url, sha.clone(), Compression::None))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageUnreachable, "{e}");
    assert!(e.to_string().contains("404"), "{e}");

    let e = write(
        root.path(),
        args(
            "http://127.0.0.1:1/img".into(),
            sha.clone(),
            Compression::None,
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageUnreachable, "{e}");

    let mut a = args("http://127.0.0.1:1/img".into(), sha, Compression::None);
    a.image.format = ImageFormat::Qcow2;
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(
        e.to_string()
            .contains("qcow2 is not supported by this ramdisk yet"),
        "{e}"
    );
    assert_eq!(read_at(&disk, 0, 3), b"OLD");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_drive_needs_a_gpt_image_and_a_failed_one_erases() {
    let _one = SERIAL.lock().await;
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    let url = serve("/img", Serve::Pattern(5 * MIB)).await;
    let mut a = args(url, test_server::pattern_sha256(5 * MIB), Compression::None);
    a.config_drive = Some(ConfigDrive {
        hostname: "h".into(),
        ..Default::default()
    });
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(
        e.to_string().contains("a config drive needs a GPT image"),
        "{e}"
    );
    assert!(all_zero(&read_at(&dev(root.path(), "vda"), 0, MIB)));
}

/// Peak resident memory since the last reset, and now, KiB (`/proc/self/status`).
fn vm_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_eight_times_the_buffer_streams_in_bounded_memory() {
    let _one = SERIAL.lock().await;
    let len = 96 * MIB;
    let root = fake_root(&[("vda", 128 * MIB, "S1")]);
    let url = serve("/big", Serve::Pattern(len)).await;
    let sha = test_server::pattern_sha256(len);
    // "5" resets VmHWM to the current RSS (proc(5), clear_refs); where that is refused the
    // peak since start is compared, which only makes the check stricter.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before = vm_kib("VmRSS:");
    let r = write(root.path(), args(url, sha.clone(), Compression::None))
        .await
        .unwrap();
    let peak_growth_mib = vm_kib("VmHWM:").saturating_sub(rss_before) / 1024;
    assert_eq!((r.written_bytes, r.sha256.as_str()), (len, sha.as_str()));
    eprintln!(
        "streaming {} MiB raised the peak RSS by {peak_growth_mib} MiB",
        len / MIB
    );
    assert!(
        peak_growth_mib < 40,
        "streaming {} MiB raised the peak RSS by {peak_growth_mib} MiB",
        len / MIB
    );
    let mut want = vec![0u8; test_server::PATTERN_CHUNK];
    for i in [0u64, 50, 95] {
        test_server::pattern_chunk(i, &mut want);
        assert_eq!(
            read_at(&dev(root.path(), "vda"), i * MIB, MIB),
            want,
            "MiB {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_refuses_writes_is_image_write_failed_and_says_it_may_boot() {
    let _one = SERIAL.lock().await;
    if !Path::new("/dev/full").exists() {
        eprintln!("!!! SKIPPED: no /dev/full to stand for a failing disk");
        return;
    }
    let root = fake_root(&[("vda", 16 * MIB, "S1")]);
    // /dev/full fails every write with ENOSPC: the image's first write and the zeroing after.
    let disk = dev(root.path(), "vda");
    std::fs::remove_file(&disk).unwrap();
    std::os::unix::fs::symlink("/dev/full", &disk).unwrap();
    let url = serve("/img", Serve::Pattern(5 * MIB)).await;
    let e = write(
        root.path(),
        args(url, test_server::pattern_sha256(5 * MIB), Compression::None),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with("/dev/vda: write: "), "{msg}");
    assert!(
        msg.contains("zeroing the ends of /dev/vda failed too"),
        "{msg}"
    );
}

/// Polls `f` every 20 ms until it is true, or panics after 20 s naming `what`.
async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_dropped_mid_stream_stops_the_copy_and_erases() {
    let _one = SERIAL.lock().await;
    let mut img = vec![0u8; usize::try_from(12 * MIB).unwrap()];
    test_server::pattern_chunk(3, &mut img);
    let img = Arc::new(img);
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    let disk = dev(root.path(), "vda");
    // The server sends 5 MiB and then nothing: the copy writes its first 4 MiB and waits.
    let after = usize::try_from(5 * MIB).unwrap();
    let url = serve(
        "/img",
        Serve::Stall {
            bytes: img.clone(),
            after,
        },
    )
    .await;
    let a = args(url, sha(&img), Compression::None);
    let r = root.path().to_owned();
    let task = tokio::spawn(async move { write(&r, a).await });
    eventually("the first buffer on the disk", || {
        read_at(&disk, 0, 16) == img[..16]
    })
    .await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    eventually("the first MiB zeroed", || all_zero(&read_at(&disk, 0, MIB))).await;
    assert!(all_zero(&read_at(&disk, 31 * MIB, MIB)));
    assert_eq!(
        read_at(&disk, MIB, 16),
        img[usize::try_from(MIB).unwrap()..][..16]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_image_larger_than_the_disk_fails_and_erases() {
    let _one = SERIAL.lock().await;
    let img = vec![1u8; usize::try_from(20 * MIB).unwrap()];
    let served = Arc::new(zstd::encode_all(&img[..], 1).unwrap());
    let root = fake_root(&[("vda", 16 * MIB, "S1")]);
    let url = serve("/img.zst", Serve::Bytes(served.clone())).await;
    let e = write(root.path(), args(url, sha(&served), Compression::Zstd))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("larger than /dev/vda (16777216 bytes"),
        "{msg}"
    );
    assert!(msg.contains("zeroed"), "{msg}");
    let disk = dev(root.path(), "vda");
    assert!(all_zero(&read_at(&disk, 0, MIB)));
    assert!(all_zero(&read_at(&disk, 15 * MIB, MIB)));
    assert_eq!(
        std::fs::metadata(&disk).unwrap().len(),
        16 * MIB,
        "nothing past the disk's end"
    );
}
