//! A machine boots while slow clients besiege the boot service (issue 30.3): from 127.0.0.2, 600
//! connections that send half a request head and stop, and a few that trickle one byte every
//! 200 ms, each re-opened as soon as the site agent closes it, for as long as the machine takes;
//! the QEMU machine (whose iPXE reaches the service from 127.0.0.1 through QEMU's user network)
//! boots the ramdisk, is inspected and commissioned to `ready`. The boot service's counters show
//! the caps and the header deadline at work. Skipped loudly without QEMU, a kernel or
//! sushy-emulator; a failure under `CI=true`. Nothing is timed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/metal.rs"]
mod metal;
#[path = "support/bare_metal.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bc_e2e::ramdisk;
use metal::{enroll, machine, system, until_state};
use support::Seen;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HALF_OPEN: usize = 600;
const TRICKLERS: usize = 8;

async fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    s.bind(SocketAddr::from((from, 0)))?;
    s.connect(to).await
}

/// One besieging connection, re-opened whenever it is closed, until `stop`: half a head and
/// silence, or (`trickle`) a head one byte every 200 ms. Counts the connections opened.
async fn besiege(to: SocketAddr, trickle: bool, stop: Arc<AtomicBool>, opened: Arc<AtomicUsize>) {
    let from = if trickle {
        [127, 0, 0, 3]
    } else {
        [127, 0, 0, 2]
    };
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut c) = connect_from(from, to).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        opened.fetch_add(1, Ordering::SeqCst);
        let head: &[u8] = b"GET /boot.ipxe?mac=00:1b:21:aa:bb:01 HTTP/1.1\r\nHost: x\r\nX-Pad: ";
        let mut sent = 0usize;
        let mut buf = [0u8; 64];
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let wrote = if trickle || sent == 0 {
                let chunk = if trickle {
                    &head[sent % head.len()..=sent % head.len()]
                } else {
                    &head[..20]
                };
                sent += chunk.len();
                c.write_all(chunk).await.is_ok()
            } else {
                true
            };
            let gone = matches!(
                tokio::time::timeout(Duration::from_millis(200), c.read(&mut buf)).await,
                Ok(Ok(0) | Err(_))
            );
            if !wrote || gone {
                break;
            }
        }
        // Re-opened after a pause: a tight reconnect loop would only burn the CPU the emulated
        // machine needs, and the siege is the connections held, not the rate.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[test]
fn a_machine_boots_while_slow_clients_besiege_the_boot_service() {
    let Some(tools) = ramdisk::tools_or_skip("metal_slowloris") else {
        return;
    };
    let a = machine("a", 1, "SER-A-0001", false);
    let systems = [system(&a, "SER-A-0001")];
    let (_, bcd) = ramdisk::bins();
    let tmp = tempfile::tempdir().unwrap();
    let image = ramdisk::build_image(&tools, bcd, &tmp.path().join("image"));
    let mut seen = Seen::default();
    let Some(rig) = metal::Rig::start(
        "metal_slowloris",
        tmp.path(),
        &tools,
        &image,
        vec![a.clone()],
        &systems,
        &mut seen,
    ) else {
        return;
    };
    let boot: SocketAddr = ([127, 0, 0, 1], rig.boot_port).into();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..HALF_OPEN + TRICKLERS)
        .map(|i| {
            rig.rt.spawn(besiege(
                boot,
                i >= HALF_OPEN,
                Arc::clone(&stop),
                Arc::clone(&opened),
            ))
        })
        .collect();
    let pool = seen.bcctl(
        &rig.cp,
        &[
            "pools",
            "create",
            "--name",
            "metal",
            "--kind",
            "metal-host",
            "--site",
            &rig.site,
            "--inspection-deadline",
            "15m",
        ],
        None,
    );
    let pool = pool["id"].as_str().unwrap().to_owned();
    let id = enroll(
        &mut seen,
        &rig.cp,
        &rig.site,
        &pool,
        "a",
        &rig.sushy.address(&a.uuid),
    );
    let dump = rig.dump(&a.uuid);
    let n = until_state(&mut seen, &rig.cp, &id, "ready", &dump);
    assert_eq!(n["hardwareKeyTrusted"], true, "{n:#}");
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        rig.rt.block_on(t).unwrap();
    }
    assert!(
        opened.load(Ordering::SeqCst) > HALF_OPEN + TRICKLERS,
        "the siege re-opened what was closed"
    );
    let metrics = reqwest::blocking::get(format!("http://{boot}/metrics"))
        .unwrap()
        .text()
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
        count(r#"bcd_site_boot_connections_closed_total{reason="header_timeout"}"#) > 0,
        "{metrics}"
    );
    eprintln!(
        "metal_slowloris: the machine reached ready while {} besieging connections were opened",
        opened.load(Ordering::SeqCst)
    );
}
