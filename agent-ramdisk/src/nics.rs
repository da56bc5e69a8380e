//! Which NIC the ramdisk asks DHCP on first, and whether a lease it got is the right one.
//!
//! # Background
//! A GPU server has a dozen Ethernet ports (LOM, RoCE and storage ConnectX ports, an OCP card);
//! one reaches the provisioning network. Asking on each in name order costs seconds per dead
//! port and gave up after 60 s with the right port 13th (ipxe/ipxe#1274, siderolabs/sidero#1240,
//! dracutdevs/dracut#850); a port on another network that answers DHCP gave a lease from which
//! the control plane could never be reached, and the join retried forever.
//!
//! # Design
//! - [`boot_mac`]: the firmware's or iPXE's boot NIC, `BOOTIF=01-aa-bb-cc-dd-ee-ff` on the
//!   kernel command line (pxelinux's form, which the site's iPXE script passes as
//!   `BOOTIF=01-${netX/mac:hexhyp}`): ARP hardware type 1 (Ethernet), then the MAC.
//! - [`order`]: the NIC with that MAC first, then those with carrier (`/sys/class/net/<if>/
//!   carrier` is 1), then the rest, each group by name.
//! - `setup::dhcp` takes them in that order and, for each lease, asks whether the control plane
//!   answers from it ([`ReachCheck`], a TCP connect to the gateway URLs within a bounded time);
//!   a lease that cannot reach it is given back and the next NIC is asked.
//! - The order, every attempt and why each was left are logged and go into the first inventory
//!   as a note (`setup::Lease::summary`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bcd_probes::hostroot::HostRoot;

/// The boot NIC's MAC from a `BOOTIF` value (`01-00-0a-f7-d2-30-00`), lowercase with colons;
/// `Err` says what is wrong with it.
pub fn boot_mac(value: &str) -> Result<String, String> {
    let parts: Vec<&str> = value.trim().split(['-', ':']).collect();
    let [hw, mac @ ..] = parts.as_slice() else {
        return Err("empty".into());
    };
    if *hw != "01" {
        return Err(format!(
            "hardware type {hw}, not 01 (Ethernet): expected 01-aa-bb-cc-dd-ee-ff"
        ));
    }
    let ok = mac.len() == 6
        && mac
            .iter()
            .all(|b| b.len() == 2 && b.bytes().all(|c| c.is_ascii_hexdigit()));
    if !ok {
        return Err("expected 01-aa-bb-cc-dd-ee-ff".into());
    }
    Ok(mac.join(":").to_ascii_lowercase())
}

/// Why a NIC is where it is in the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rank {
    /// The NIC the machine booted from (`BOOTIF`).
    BootIf,
    /// It has a link (`carrier` is 1).
    Carrier,
    /// Neither: asked last.
    Other,
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BootIf => "BOOTIF",
            Self::Carrier => "carrier",
            Self::Other => "no carrier",
        })
    }
}

/// One NIC in the order DHCP asks them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The interface name.
    pub iface: String,
    /// Why it is where it is.
    pub rank: Rank,
}

/// `ifaces` in the order DHCP asks them: the one whose `address` is `boot_mac`, then those
/// with carrier, then the rest, each group by name.
pub fn order(root: &HostRoot, ifaces: &[String], boot_mac: Option<&str>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = ifaces
        .iter()
        .map(|i| {
            let dir = format!("/sys/class/net/{i}");
            let mac = root
                .read_trimmed(format!("{dir}/address"))
                .map(|m| m.to_ascii_lowercase());
            let rank = if boot_mac.is_some() && mac.as_deref() == boot_mac {
                Rank::BootIf
            } else if root.read_trimmed(format!("{dir}/carrier")).as_deref() == Some("1") {
                Rank::Carrier
            } else {
                Rank::Other
            };
            Candidate {
                iface: i.clone(),
                rank,
            }
        })
        .collect();
    out.sort_by(|a, b| (a.rank, &a.iface).cmp(&(b.rank, &b.iface)));
    out
}

/// `eno1 (BOOTIF), eth2 (carrier), eth0 (no carrier)`.
pub fn describe_order(order: &[Candidate]) -> String {
    order
        .iter()
        .map(|c| format!("{} ({})", c.iface, c.rank))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The answer of a reachability check: `Err` says what failed.
pub type ReachResult = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Whether the control plane answers from a lease (the interface's name is given; the check
/// itself goes wherever the routes the lease set point).
#[derive(Clone)]
pub struct ReachCheck(Arc<dyn Fn(String) -> ReachResult + Send + Sync>);

impl fmt::Debug for ReachCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReachCheck")
    }
}

impl ReachCheck {
    /// A check made of `f` (tests: by interface).
    pub fn new(f: impl Fn(String) -> ReachResult + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Every lease is taken (nothing to check against).
    pub fn always() -> Self {
        Self::new(|_| Box::pin(async { Ok(()) }))
    }

    /// A TCP connection to any of the gateway URLs (`https://host:port`, port 443 when absent)
    /// opens within `limit`: the network reaches the control plane.
    pub fn control_plane(urls: Vec<String>, limit: Duration) -> Self {
        Self::new(move |_| {
            let urls = urls.clone();
            Box::pin(async move { connect_any(&urls, limit).await })
        })
    }

    /// Runs the check for the lease on `iface`.
    pub async fn check(&self, iface: &str) -> Result<(), String> {
        (self.0)(iface.to_owned()).await
    }
}

/// `host:port` of a gateway URL.
fn authority(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let host = rest.split('/').next()?;
    if host.is_empty() {
        return None;
    }
    // `[::1]:7443`, `host:7443`, `host`.
    let has_port = match host.rfind(']') {
        Some(close) => host[close..].contains(':'),
        None => host.contains(':'),
    };
    Some(if has_port {
        host.to_owned()
    } else {
        format!("{host}:443")
    })
}

/// Tries every URL at once; `Ok` at the first connection, else every failure, within `limit`.
async fn connect_any(urls: &[String], limit: Duration) -> Result<(), String> {
    let mut tries = tokio::task::JoinSet::new();
    for url in urls {
        let Some(addr) = authority(url) else {
            continue;
        };
        tries.spawn(async move {
            match tokio::time::timeout(limit, tokio::net::TcpStream::connect(&addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("{addr}: {e}")),
                Err(_) => Err(format!("{addr}: no answer within {limit:?}")),
            }
        });
    }
    let mut failures = Vec::new();
    while let Some(r) = tries.join_next().await {
        match r {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => failures.push(e),
            Err(e) => failures.push(e.to_string()),
        }
    }
    if failures.is_empty() {
        return Err("no gateway URL to try".into());
    }
    failures.sort();
    Err(failures.join("; "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FIELD: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/fixtures/field/many-nics-bootif"
    );

    #[test]
    fn bootif_names_the_boot_nic_and_a_bad_one_says_why() {
        assert_eq!(
            boot_mac("01-00-0A-F7-D2-30-00").as_deref(),
            Ok("00:0a:f7:d2:30:00")
        );
        assert_eq!(
            boot_mac("01:52:54:00:12:34:56").as_deref(),
            Ok("52:54:00:12:34:56")
        );
        assert!(
            boot_mac("06-00-0a-f7-d2-30-00")
                .unwrap_err()
                .contains("hardware type 06")
        );
        assert!(boot_mac("01-00-0a-f7").is_err());
        assert!(boot_mac("01-zz-0a-f7-d2-30-00").is_err());
        assert!(boot_mac("").is_err());
    }

    /// The field tree: 14 Ethernet ports; the command line's BOOTIF names the 13th by name.
    #[test]
    fn the_boot_nic_of_the_field_server_comes_first() {
        let root = std::path::Path::new(FIELD);
        if !root.exists() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{FIELD} missing"
            );
            eprintln!("!!! FIXTURE MISSING: {FIELD} — test skipped");
            return;
        }
        let cmdline = std::fs::read_to_string(root.join("cmdline")).unwrap();
        let p = crate::cmdline::parse(&cmdline).unwrap();
        assert_eq!(p.boot_mac.as_deref(), Some("00:0a:f7:d2:30:00"));
        let host = HostRoot::new(root.join("root"));
        let ifaces = crate::setup::ethernet_interfaces(&host);
        assert_eq!(ifaces.len(), 14);
        assert_eq!(
            ifaces.iter().position(|i| i == "ens3f0np0"),
            Some(12),
            "13th by name"
        );
        let o = order(&host, &ifaces, p.boot_mac.as_deref());
        assert_eq!(
            o[0],
            Candidate {
                iface: "ens3f0np0".into(),
                rank: Rank::BootIf
            }
        );
        assert!(o[1..].iter().all(|c| c.rank == Rank::Other));
        assert_eq!(o.len(), 14);
        // Without BOOTIF: name order.
        let plain = order(&host, &ifaces, None);
        assert_eq!(plain[0].iface, "eno8303");
    }

    #[test]
    fn carrier_comes_before_the_rest_and_authorities_default_to_443() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        for (name, mac, carrier) in [
            ("eth0", "52:54:00:00:00:01", "0"),
            ("eth1", "52:54:00:00:00:02", "1"),
            ("eth2", "52:54:00:00:00:03", "1"),
        ] {
            let d = root.path(format!("/sys/class/net/{name}"));
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("address"), format!("{mac}\n"))?;
            std::fs::write(d.join("carrier"), format!("{carrier}\n"))?;
        }
        let names = ["eth0", "eth1", "eth2"].map(str::to_owned);
        let o = order(&root, &names, Some("52:54:00:00:00:03"));
        assert_eq!(
            describe_order(&o),
            "eth2 (BOOTIF), eth1 (carrier), eth0 (no carrier)"
        );
        assert_eq!(
            authority("https://cp.example:7443").as_deref(),
            Some("cp.example:7443")
        );
        assert_eq!(
            authority("https://cp.example/").as_deref(),
            Some("cp.example:443")
        );
        assert_eq!(
            authority("https://[::1]:7443").as_deref(),
            Some("[::1]:7443")
        );
        assert_eq!(authority("https://[::1]").as_deref(), Some("[::1]:443"));
        assert_eq!(authority("http://x:1"), None);
        Ok(())
    }

    #[tokio::test]
    async fn the_control_plane_check_connects_within_its_limit() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = format!("https://{}", listener.local_addr().unwrap());
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("https://{}", l.local_addr().unwrap())
        };
        let limit = Duration::from_secs(2);
        let ok = ReachCheck::control_plane(vec![closed.clone(), up], limit);
        assert_eq!(ok.check("eth0").await, Ok(()));
        let down = ReachCheck::control_plane(vec![closed.clone()], limit);
        let e = down.check("eth0").await.unwrap_err();
        assert!(e.contains("refused"), "{e}");
        // A silent address (TEST-NET-1, nothing routes there) runs into the limit.
        let silent = ReachCheck::control_plane(
            vec!["https://192.0.2.1:7443".into()],
            Duration::from_millis(300),
        );
        let started = std::time::Instant::now();
        let e = silent.check("eth0").await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(e.contains("192.0.2.1:7443"), "{e}");
    }
}
