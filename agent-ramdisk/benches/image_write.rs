//! `image.write` streaming an image much larger than a ramdisk machine's memory: the throughput
//! and the peak resident memory of the process that writes it (docs/benchmarks.md).
//!
//! `cargo bench -p bcd-ramdisk --bench image_write [-- GIB [qcow2]]` (default 2 GiB, more than
//! the 1 GiB the QEMU machines of the VM tests have). With `qcow2` the raw image holds 1 MiB of
//! data in every 4 MiB (the rest zeros), is converted to qcow2 by `qemu-img`, and the qcow2 file
//! is served and written (`format: qcow2`); MiB/s is of the virtual disk written. The image is
//! a sparse file served by Python's `http.server` on loopback (busybox httpd for qcow2, which
//! needs byte ranges); the "disk" is a sparse file under a fake root (`/sys/block/vda`,
//! `/dev/vda`) a little larger than the image, so the same code path as in the ramdisk runs:
//! the HTTP stream, SHA-256 as served, the 4 MiB write buffer, fsync. Prints MiB/s and VmHWM
//! (the process's peak RSS, `/proc/self/status`) before and after.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bc_protocol::commands::deploy::{Compression, ImageFormat, ImageSource, ImageWriteArgs};
use bcd_probes::hostroot::HostRoot;

const MIB: u64 = 1 << 20;

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let gib: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(2);
    let size = gib << 30;
    let qcow2 = std::env::args().any(|a| a == "qcow2");
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let image = served.join("big.raw");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(size)
        .unwrap();
    let sha = if qcow2 {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .unwrap();
        let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 | 1).collect();
        for at in (0..size).step_by(4 * MIB as usize) {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(&data).unwrap();
        }
        drop(f);
        let q = served.join("big.qcow2");
        let ok = Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&image)
            .arg(&q)
            .status()
            .expect("qemu-img");
        assert!(ok.success());
        std::fs::remove_file(&image).unwrap();
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        std::io::copy(&mut std::fs::File::open(&q).unwrap(), &mut h).unwrap();
        println!(
            "qcow2 file: {} MiB for a {} MiB disk",
            std::fs::metadata(&q).unwrap().len() / MIB,
            size / MIB
        );
        hex::encode(h.finalize())
    } else {
        // SHA-256 of `size` zero bytes, as the server will send them.
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let zeros = vec![0u8; MIB as usize];
        for _ in 0..size / MIB {
            h.update(&zeros);
        }
        hex::encode(h.finalize())
    };
    let (file, format) = if qcow2 {
        ("big.qcow2", ImageFormat::Qcow2)
    } else {
        ("big.raw", ImageFormat::Raw)
    };
    let root = tmp.path().join("root");
    let block = root.join("sys/block/vda");
    std::fs::create_dir_all(block.join("queue")).unwrap();
    let disk_size = size + 64 * MIB;
    std::fs::write(block.join("size"), format!("{}\n", disk_size / 512)).unwrap();
    std::fs::write(block.join("ro"), "0\n").unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::File::create(root.join("dev/vda"))
        .unwrap()
        .set_len(disk_size)
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // qcow2 needs a server that serves byte ranges (qemu-img reads some tables out of order):
    // busybox httpd does, Python's http.server does not.
    let mut server = if qcow2 {
        Command::new("busybox")
            .args(["httpd", "-f", "-p", &format!("127.0.0.1:{port}"), "-h"])
            .arg(&served)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("busybox httpd")
    } else {
        Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1"])
            .arg(port.to_string())
            .arg("--directory")
            .arg(&served)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server")
    };
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no http.server"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let args = ImageWriteArgs {
        image: ImageSource {
            url: format!("http://127.0.0.1:{port}/{file}"),
            sha256: sha,
            format,
            compression: Compression::None,
        },
        root_device: None,
        config_drive: None,
        instance_id: None,
        deploy_token: None,
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (rss_before, hwm_before) = (status_kib("VmRSS:"), status_kib("VmHWM:"));
    let t = Instant::now();
    let r = rt
        .block_on(bcd_ramdisk::deploy::image_write(
            &HostRoot::new(&root),
            args,
        ))
        .expect("image.write");
    let secs = t.elapsed().as_secs_f64();
    let hwm = status_kib("VmHWM:");
    let _ = server.kill();
    let _ = server.wait();
    println!(
        "image.write: {} MiB image onto a {} MiB disk in {secs:.1} s = {:.0} MiB/s (written {} MiB, sha256 checked)",
        size / MIB,
        disk_size / MIB,
        (r.written_bytes / MIB) as f64 / secs,
        r.written_bytes / MIB
    );
    println!(
        "memory: RSS before {:.1} MiB, peak (VmHWM) before {:.1} MiB, after {:.1} MiB: +{:.1} MiB for a {} MiB image",
        rss_before as f64 / 1024.0,
        hwm_before as f64 / 1024.0,
        hwm as f64 / 1024.0,
        hwm.saturating_sub(hwm_before) as f64 / 1024.0,
        size / MIB
    );
}
