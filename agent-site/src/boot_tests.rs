//! Issue 30.3: the boot service under slow clients. 600 connections from one address that send
//! half a request head and stop, and a few that trickle a head one byte at a time, while a
//! machine behind another address fetches its script, kernel and initramfs. Waits are upper
//! bounds only; nothing is timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bc_protocol::pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use super::*;
use crate::bmc::fake::FakeConnector;
use crate::config::SiteConfig;

pub(super) const MAC: &str = "3c:ec:ef:00:00:30";
const HALF_OPEN: usize = 600;
const TRICKLERS: usize = 4;

/// A site whose assignment sends machine `MAC` to the ramdisk, with a lease valid for minutes.
pub(super) fn site() -> Arc<Site> {
    let site = Arc::new(Site::new(
        SiteConfig::default(),
        Arc::new(FakeConnector::default()),
    ));
    site.apply(pb::SiteAssignment {
        site_id: "site_a".into(),
        lease_held: true,
        lease_epoch: 1,
        lease_ttl_ms: 600_000,
        bmcs: vec![pb::ManagedBmc {
            node_id: "node_m".into(),
            endpoint: Some(pb::BmcEndpoint {
                address: "redfish+http://bmc.test/redfish/v1/Systems/1".into(),
                username: "admin".into(),
                password: "pw".into(),
                tls: 0,
                cert_sha256: String::new(),
            }),
            candidate: None,
            sync_power: false,
            boot: Some(pb::BootPlan {
                macs: vec![MAC.into()],
                ramdisk: Some(pb::RamdiskBoot {
                    kernel_args: "bcd.url=https://cp:7443 bcd.token=boot_x.s bcd.node=node_m"
                        .into(),
                    purpose: "inspecting".into(),
                    expires_at_ms: 0,
                }),
                reason: "inspecting".into(),
            }),
        }],
        power_sync_interval_ms: 60_000,
        max_requests_per_bmc: 0,
        max_requests_per_site: 0,
    });
    site
}

/// A connection to `to` from the loopback address `from`, so the attacker and the machine are
/// counted apart.
async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((from, 0)))?;
    s.connect(to).await
}

/// Whether the server closed `conn` (a read gives end of file or an error) within `wait`.
async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout(wait, conn.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_do_not_keep_a_machine_from_booting() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, initrd) = (dir.path().join("vmlinuz"), dir.path().join("initrd.img"));
    std::fs::write(&kernel, vec![7u8; 300_000]).unwrap();
    std::fs::write(&initrd, vec![9u8; 900_000]).unwrap();
    let service = BootService {
        site: site(),
        files: Arc::new(BootFiles {
            kernel: kernel.clone(),
            initrd: initrd.clone(),
            kernel_args: DEFAULT_KERNEL_ARGS.into(),
            lldp_wait_s: 2,
        }),
        metrics: BootMetrics::default(),
    };
    let bound = serve(([127, 0, 0, 1], 0).into(), service).await.unwrap();

    // 600 requests from 127.0.0.2 that send half a head and stop.
    let mut held = Vec::new();
    for _ in 0..HALF_OPEN {
        let Ok(mut c) = connect_from([127, 0, 0, 2], bound).await else {
            continue;
        };
        if c.write_all(b"GET /boot.ipxe?mac=3c:ec:ef").await.is_ok() {
            held.push(c);
        }
    }
    // A few that trickle a head, one byte every 200 ms, until the server closes them.
    let closed = Arc::new(AtomicUsize::new(0));
    let mut tricklers = Vec::new();
    for _ in 0..TRICKLERS {
        let closed = Arc::clone(&closed);
        let Ok(mut c) = connect_from([127, 0, 0, 3], bound).await else {
            continue;
        };
        tricklers.push(tokio::spawn(async move {
            let head = b"GET /boot.ipxe?mac=3c:ec:ef:00:00:30 HTTP/1.1\r\nHost: x\r\nX-Pad: ";
            for b in head.iter().chain(std::iter::repeat(&b'a')) {
                let wrote = c.write_all(&[*b]).await;
                let mut buf = [0u8; 64];
                let gone = matches!(
                    tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await,
                    Ok(Ok(0) | Err(_))
                );
                if wrote.is_err() || gone {
                    closed.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        }));
    }

    // The machine, from 127.0.0.1, gets its script, kernel and initramfs.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .local_address(std::net::IpAddr::from([127, 0, 0, 1]))
        .build()
        .unwrap();
    let base = format!("http://{bound}");
    let script = client
        .get(format!("{base}/boot.ipxe?mac={MAC}"))
        .send()
        .await
        .expect("the boot script while 600 requests hang");
    assert_eq!(script.status(), 200);
    let script = script.text().await.unwrap();
    assert!(script.contains("kernel /ramdisk/vmlinuz"), "{script}");
    for (path, file) in [("/ramdisk/vmlinuz", &kernel), ("/ramdisk/initrd", &initrd)] {
        let bytes = client
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect(path)
            .bytes()
            .await
            .expect(path);
        assert_eq!(
            bytes.as_ref(),
            std::fs::read(file).unwrap().as_slice(),
            "{path}"
        );
    }

    // Every trickler is cut although it never stops sending (an idle timer alone restarts on
    // each byte), and so is every half-open request: refused at accept or cut at the deadline.
    for t in tricklers {
        tokio::time::timeout(Duration::from_secs(45), t)
            .await
            .expect("a trickling head kept its connection")
            .unwrap();
    }
    assert_eq!(closed.load(Ordering::SeqCst), TRICKLERS);
    for c in &mut held {
        assert!(
            closed_within(c, Duration::from_secs(45)).await,
            "a half-open request kept its connection"
        );
    }
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |series: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    assert!(
        count(r#"bcd_site_boot_connections_refused_total{reason="per_address"}"#) > 0,
        "{metrics}"
    );
    assert!(
        count(r#"bcd_site_boot_connections_closed_total{reason="header_timeout"}"#)
            >= TRICKLERS as u64,
        "{metrics}"
    );
}
