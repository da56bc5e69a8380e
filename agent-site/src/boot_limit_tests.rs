//! Issue 30.2: script fetches are limited per source address. 256 MAC guesses from one address
//! in a burst get 429 past the burst (counted), while a machine at another address still gets
//! its script; the guessing address is served again once its bucket refills. Waits are upper
//! bounds only; nothing is timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

use super::slow_client_tests::{MAC, site};
use super::*;

const GUESSES: usize = 256;

/// `GET path` from the loopback address `from`; the answer's status code.
async fn status_from(from: [u8; 4], to: SocketAddr, path: &str) -> u16 {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    let mut c = s.connect(to).await.unwrap();
    c.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: boot\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = Vec::new();
    c.read_to_end(&mut text).await.unwrap();
    let text = String::from_utf8_lossy(&text);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mac_guesses_from_one_address_are_slowed_and_others_still_boot() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, initrd) = (dir.path().join("vmlinuz"), dir.path().join("initrd.img"));
    std::fs::write(&kernel, b"k").unwrap();
    std::fs::write(&initrd, b"i").unwrap();
    let metrics = BootMetrics::default();
    let service = BootService {
        site: site(),
        files: Arc::new(BootFiles {
            kernel,
            initrd,
            kernel_args: DEFAULT_KERNEL_ARGS.into(),
            lldp_wait_s: 2,
        }),
        metrics: metrics.clone(),
    };
    let bound = serve(([127, 0, 0, 1], 0).into(), service).await.unwrap();

    let mut answered = 0usize;
    let mut limited = 0usize;
    for i in 0..GUESSES {
        let path = format!("/boot.ipxe?mac=3c:ec:ef:00:01:{:02x}", i % 256);
        match status_from([127, 0, 0, 2], bound, &path).await {
            429 => limited += 1,
            404 => answered += 1,
            other => panic!("guess {i}: status {other}"),
        }
    }
    assert!(
        limited > 0,
        "{GUESSES} guesses from one address, none limited"
    );
    assert!(
        answered <= crate::boot_limit::FETCH_BURST as usize + 8,
        "{answered} guesses answered"
    );
    assert_eq!(metrics.requests(Outcome::RateLimited), limited as u64);
    assert_eq!(metrics.requests(Outcome::Unknown), answered as u64);

    // The machine, at another address, gets its script.
    let path = format!("/boot.ipxe?mac={MAC}");
    assert_eq!(status_from([127, 0, 0, 1], bound, &path).await, 200);
    // The guessing address is served again once its bucket refills (2 a second).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if status_from([127, 0, 0, 2], bound, &path).await == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
