//! `image.write` failing: before the first byte (the disk untouched) and after it (both ends
//! of the disk zeroed), with the code and message each failure reports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use bc_protocol::commands::CommandErrorCode;
use bc_protocol::commands::deploy::{Compression, ConfigDrive, ImageFormat, RootDeviceHints};

use super::test_server::{self, Serve};
use super::test_utils::{
    MIB, SERIAL, all_zero, args, dev, eventually, fake_root, read_at, serve, sha, write,
};

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

    let mut a = args("http://127.0.0.1:1/img".into(), sha, Compression::Zstd);
    a.image.format = ImageFormat::Qcow2;
    let e = write(root.path(), a).await.unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(
        e.to_string().contains("cannot also be zstd-compressed"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_gzip_is_image_write_failed_unless_its_hash_is_wrong_too() {
    let _one = SERIAL.lock().await;
    let mut img = vec![0u8; usize::try_from(9 * MIB).unwrap()];
    test_server::pattern_chunk(5, &mut img);
    let mut served = super::test_utils::gzip(&img);
    // A flipped byte in the middle of the deflate data: the stream breaks after the decoder
    // has written several MiB.
    let mid = served.len() / 2;
    served[mid] ^= 0xff;
    let served = Arc::new(served);
    let root = fake_root(&[("vda", 32 * MIB, "S1")]);
    let url = serve("/img.gz", Serve::Bytes(served.clone())).await;

    let e = write(
        root.path(),
        args(url.clone(), sha(&served), Compression::Gzip),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ImageWriteFailed, "{e}");
    assert!(e.to_string().contains("does not decompress as gzip"), "{e}");
    assert!(e.to_string().contains("zeroed"), "{e}");
    assert!(all_zero(&read_at(&dev(root.path(), "vda"), 0, MIB)));

    // The same bytes with the sha256 of the good file: the file is wrong, and that is said.
    let good = sha(&super::test_utils::gzip(&img));
    let e = write(root.path(), args(url, good, Compression::Gzip))
        .await
        .unwrap_err();
    assert_eq!(e.code(), CommandErrorCode::ChecksumMismatch, "{e}");
    assert!(e.to_string().contains(&sha(&served)), "{e}");
}
