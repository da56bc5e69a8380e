//! `image.write` streaming an image much larger than a ramdisk machine's memory: the throughput
//! and the peak resident memory of the process that writes it (docs/benchmarks.md).
//!
//! `cargo bench -p bcd-ramdisk --bench image_write [-- GIB]` (default 2 GiB, more than the
//! 1 GiB the QEMU machines of the VM tests have). The image is a sparse file served by Python's
//! `http.server` on loopback; the "disk" is a sparse file under a fake root (`/sys/block/vda`,
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
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let image = served.join("big.raw");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(size)
        .unwrap();
    // SHA-256 of `size` zero bytes, as the server will send them.
    let sha = {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        let zeros = vec![0u8; MIB as usize];
        for _ in 0..size / MIB {
            h.update(&zeros);
        }
        hex::encode(h.finalize())
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
    let mut server = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(&served)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
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
            url: format!("http://127.0.0.1:{port}/big.raw"),
            sha256: sha,
            format: ImageFormat::Raw,
            compression: Compression::None,
        },
        root_device: None,
        config_drive: None,
        instance_id: None,
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
