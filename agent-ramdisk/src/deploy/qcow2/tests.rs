//! `image.write` of qcow2 images made in the test by `qemu-img` from a GPT image with a marker,
//! served by the test server, written onto a fake root's disk file: the disk's bytes equal the
//! raw image's; a wrong hash, a file that changes between reads, garbage and what cannot be
//! deployed (a backing file, compression around qcow2) fail with their codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::deploy::{Compression, ConfigDrive, ImageFormat, ImageWriteArgs};

use super::super::test_server::Serve;
use super::super::test_utils::{
    MIB, SERIAL, all_zero, args, dev, fake_root, gpt_image, have_qemu_img, have_sfdisk, qcow2_of,
    qemu, read_at, serve, sha, write,
};

fn qcow2_args(url: String, sha256: String) -> ImageWriteArgs {
    let mut a = args(url, sha256, Compression::None);
    a.image.format = ImageFormat::Qcow2;
    a
}

/// A fake root with one 32 MiB disk whose every byte is 0xAA, so zeros the image holds are
/// seen to be written.
fn dirty_root() -> tempfile::TempDir {
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    std::fs::write(
        dev(root.path(), "vda"),
        vec![0xAAu8; usize::try_from(32 * MIB).unwrap()],
    )
    .unwrap();
    root
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_image_lands_on_the_disk_as_its_raw_bytes_plain_or_compressed() {
    if !have_sfdisk() || !have_qemu_img() {
        return;
    }
    let _one = SERIAL.lock().await;
    let raw = gpt_image(b"BCD-MARKER-qcow2");
    for extra in [&[][..], &["-c"][..]] {
        let img = Arc::new(qcow2_of(&raw, extra));
        let root = dirty_root();
        let url = serve("/img.qcow2", Serve::Bytes(img.clone())).await;
        let r = write(root.path(), qcow2_args(url, sha(&img)))
            .await
            .unwrap();
        assert_eq!(r.device, "vda", "{extra:?}");
        assert_eq!(r.image_bytes, img.len() as u64, "{extra:?}");
        assert_eq!(r.written_bytes, raw.len() as u64, "{extra:?}");
        assert_eq!(r.sha256, sha(&img), "{extra:?}");
        let back = read_at(&dev(root.path(), "vda"), 0, raw.len() as u64);
        assert!(
            back == raw,
            "the disk's bytes are not the raw image's ({extra:?})"
        );
        assert_eq!(
            &back[usize::try_from(2 * MIB).unwrap()..][..16],
            b"BCD-MARKER-qcow2"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_image_gets_a_config_drive_after_its_partitions() {
    if !have_sfdisk() || !have_qemu_img() {
        return;
    }
    let _one = SERIAL.lock().await;
    let raw = gpt_image(b"BCD-MARKER-qcow2");
    let img = Arc::new(qcow2_of(&raw, &[]));
    let root = dirty_root();
    let url = serve("/img.qcow2", Serve::Bytes(img.clone())).await;
    let mut a = qcow2_args(url, sha(&img));
    a.config_drive = Some(ConfigDrive {
        hostname: "q-host".into(),
        ..Default::default()
    });
    let r = write(root.path(), a).await.unwrap();
    assert_eq!(r.config_drive_partition.as_deref(), Some("vda3"));
    let disk = dev(root.path(), "vda");
    let out = std::process::Command::new("sfdisk")
        .args(["--json"])
        .arg(&disk)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    // The GPT grown to the disk: its last usable LBA is the 32 MiB disk's, not the image's.
    assert!(table.contains("\"lastlba\": 65502"), "{table}");
    assert!(table.contains("vda3"), "{table}");
    assert_eq!(&read_at(&disk, 2 * MIB, 16), b"BCD-MARKER-qcow2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_sha256_on_a_qcow2_is_a_checksum_mismatch_and_the_disk_ends_are_zeroed() {
    if !have_sfdisk() || !have_qemu_img() {
        return;
    }
    let _one = SERIAL.lock().await;
    let raw = gpt_image(b"BCD-MARKER-qcow2");
    let img = Arc::new(qcow2_of(&raw, &[]));
    let root = dirty_root();
    let url = serve("/img.qcow2", Serve::Bytes(img.clone())).await;
    let wrong = "cd".repeat(32);
    let e = write(root.path(), qcow2_args(url, wrong.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&wrong) && msg.contains(&sha(&img)), "{msg}");
    assert!(msg.contains("zeroed"), "{msg}");
    let disk = dev(root.path(), "vda");
    assert!(all_zero(&read_at(&disk, 0, MIB)));
    assert!(all_zero(&read_at(&disk, 31 * MIB, MIB)));
    // The conversion did run: the marker past the first MiB is there.
    assert_eq!(&read_at(&disk, 2 * MIB, 16), b"BCD-MARKER-qcow2");
}

/// A qcow2 whose clusters are out of guest order (guest 4 MiB written first, then guest 0),
/// so `qemu-img convert` reads behind the stream; and the raw image it holds.
fn out_of_order_qcow2() -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ooo.qcow2");
    let p = path.to_string_lossy().into_owned();
    qemu("qemu-img", &["create", "-q", "-f", "qcow2", &p, "8M"]);
    qemu(
        "qemu-io",
        &[
            "-f",
            "qcow2",
            "-c",
            "write -P 0x44 4M 3M",
            "-c",
            "write -P 0x11 0 3M",
            &p,
        ],
    );
    let m = usize::try_from(MIB).unwrap();
    let mut raw = vec![0u8; 8 * m];
    raw[..3 * m].fill(0x11);
    raw[4 * m..7 * m].fill(0x44);
    (std::fs::read(&path).unwrap(), raw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_behind_the_stream_come_by_range_and_are_checked_by_a_second_read() {
    if !have_qemu_img() {
        return;
    }
    let _one = SERIAL.lock().await;
    let (img, raw) = out_of_order_qcow2();
    let img = Arc::new(img);
    let (requests, ranges) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let url = serve(
        "/ooo.qcow2",
        Serve::Versions {
            versions: Arc::new(vec![img.clone()]),
            requests: requests.clone(),
            ranges: ranges.clone(),
        },
    )
    .await;
    let root = dirty_root();
    let r = write(root.path(), qcow2_args(url.clone(), sha(&img)))
        .await
        .unwrap();
    assert_eq!(r.written_bytes, 8 * MIB);
    assert!(read_at(&dev(root.path(), "vda"), 0, 8 * MIB) == raw);
    let n = ranges.load(Ordering::SeqCst);
    assert!(
        n > 0,
        "qemu-img read nothing behind the stream: the test image does not test it"
    );
    // The stream, the Range requests, the second full read.
    assert_eq!(requests.load(Ordering::SeqCst), n + 2);

    // The same image, then (for every later request) one whose guest-4-MiB data differs: the
    // ranges read behind the stream are not the checked file's.
    let mut changed = (*img).clone();
    let at = changed.windows(4).position(|w| w == [0x44; 4]).unwrap();
    changed[at] = 0x45;
    let url = serve(
        "/changing.qcow2",
        Serve::Versions {
            versions: Arc::new(vec![img.clone(), Arc::new(changed)]),
            requests: Arc::new(AtomicUsize::new(0)),
            ranges: Arc::new(AtomicUsize::new(0)),
        },
    )
    .await;
    let root = dirty_root();
    let e = write(root.path(), qcow2_args(url, sha(&img)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("changed on the server"), "{msg}");
    assert!(msg.contains("zeroed"), "{msg}");
    assert!(all_zero(&read_at(&dev(root.path(), "vda"), 0, MIB)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_a_truncated_qcow2_and_what_cannot_be_deployed_fail_clearly() {
    if !have_sfdisk() || !have_qemu_img() {
        return;
    }
    let _one = SERIAL.lock().await;
    let disk_untouched = |root: &tempfile::TempDir| {
        let b = read_at(&dev(root.path(), "vda"), 0, MIB);
        b.iter().all(|x| *x == 0xAA)
    };

    // Not a qcow2 at all, with its right hash: qemu-img's refusal, the disk untouched.
    let garbage = Arc::new(vec![0x5Au8; 3 * 1024 * 1024]);
    let root = dirty_root();
    let url = serve("/garbage", Serve::Bytes(garbage.clone())).await;
    let e = write(root.path(), qcow2_args(url.clone(), sha(&garbage)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(e.to_string().contains("qemu-img info failed"), "{e}");
    assert!(disk_untouched(&root));
    // The same with the hash of another file: the file is wrong, and that is said.
    let e = write(root.path(), qcow2_args(url, "00".repeat(32)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");

    // A qcow2 cut short: in its header (with the cut file's hash) qemu-img refuses it; after
    // its tables, with the whole file's hash, it is the wrong file (qemu-img reads clusters past
    // a file's end as zeros, so the hash is what catches it); a body that ends before its
    // Content-Length is unreachable. The last two after writing began: the ends zeroed.
    let raw = gpt_image(b"BCD-MARKER-qcow2");
    let img = Arc::new(qcow2_of(&raw, &[]));
    let head = Arc::new(img[..100].to_vec());
    let root = dirty_root();
    let url = serve("/head.qcow2", Serve::Bytes(head.clone())).await;
    let e = write(root.path(), qcow2_args(url, sha(&head)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(
        e.to_string().starts_with("qcow2: qemu-img info failed"),
        "{e}"
    );
    assert!(disk_untouched(&root));
    let cut = Arc::new(img[..img.len() / 2].to_vec());
    let url = serve("/cut.qcow2", Serve::Bytes(cut)).await;
    let e = write(root.path(), qcow2_args(url, sha(&img)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");
    assert!(e.to_string().contains("zeroed"), "{e}");
    assert!(all_zero(&read_at(&dev(root.path(), "vda"), 0, MIB)));
    let root = dirty_root();
    let after = img.len() / 2;
    let url = serve(
        "/short.qcow2",
        Serve::Cut {
            bytes: img.clone(),
            after,
        },
    )
    .await;
    let e = write(root.path(), qcow2_args(url, sha(&img)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageUnreachable, "{e}");
    assert!(e.to_string().contains("zeroed"), "{e}");

    // A backing file: refused before anything is written.
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.qcow2");
    let top = dir.path().join("top.qcow2");
    let (b, t) = (base.to_string_lossy(), top.to_string_lossy());
    qemu("qemu-img", &["create", "-q", "-f", "qcow2", &b, "4M"]);
    qemu(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", &b, &t],
    );
    let top = Arc::new(std::fs::read(&top).unwrap());
    let root = dirty_root();
    let url = serve("/top.qcow2", Serve::Bytes(top.clone())).await;
    let e = write(root.path(), qcow2_args(url, sha(&top)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(e.to_string().contains("has a backing file"), "{e}");
    assert!(disk_untouched(&root));

    // A virtual disk larger than every disk: no root device, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.qcow2");
    qemu(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", &big.to_string_lossy(), "1G"],
    );
    let big = Arc::new(std::fs::read(&big).unwrap());
    let url = serve("/big.qcow2", Serve::Bytes(big.clone())).await;
    let e = write(root.path(), qcow2_args(url, sha(&big)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::NoRootDevice, "{e}");
    assert!(e.to_string().contains("1073741824 needed"), "{e}");
    assert!(disk_untouched(&root));

    // gzip around a qcow2: refused before the request.
    let mut a = qcow2_args("http://127.0.0.1:1/img".into(), sha(&top));
    a.image.compression = Compression::Gzip;
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(
        e.to_string().contains("cannot also be gzip-compressed"),
        "{e}"
    );
}
