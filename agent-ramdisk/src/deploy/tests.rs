//! `image.write` end to end on a fake root (`<root>/sys/block/<disk>` with its size, `ro` and
//! serial, `<root>/dev/<disk>` a regular file, the image served by [`super::test_server`]):
//! what lands on the disk, the hash, the disk chosen, the memory it takes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bc_protocol::commands::deploy::{Compression, RootDeviceHints};

use super::test_server::{self, Serve};
use super::test_utils::{
    MIB, SERIAL, args, dev, fake_root, gpt_image, gzip, have_sfdisk, read_at, serve, sha, write,
};

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
