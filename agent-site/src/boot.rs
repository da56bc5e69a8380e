//! The site agent's boot service (issue 15): the HTTP endpoint a machine's iPXE asks how to boot,
//! and the ramdisk's kernel and initramfs.
//!
//! # Background
//! The site's DHCP points PXE clients here (a proxy-DHCP example is in
//! `packaging/dnsmasq-bcd-pxe.conf`; QEMU's own iPXE takes the URL as its bootfile). iPXE then
//! requests `GET /boot.ipxe?mac=${netX/mac}` (the NIC that booted; `${net0/mac}` would be the
//! first NIC whichever booted; iPXE URL-encodes the colons) and runs the script it gets. Every
//! request may come through NAT, so the MAC in the query, not the source address, names the
//! machine.
//!
//! # Design
//! The answer comes from the lease holder's assignment ([`crate::site::Site::boot_entry`]),
//! never from anything the request claims beyond its MAC:
//! - a machine the control plane wants in the ramdisk, with a boot pending (token unused and
//!   unexpired), gets a script that loads `/ramdisk/vmlinuz` and `/ramdisk/initrd` with the
//!   site's kernel arguments and the boot's (`bcd.url`, `bcd.pin`, `bcd.token`, `bcd.node`),
//!   and the NIC it booted from as `BOOTIF=01-<mac>` (iPXE's `${netX/mac:hexhyp}`);
//! - any other known machine gets `exit`, which makes the firmware boot the next device (its
//!   disk);
//! - an unknown MAC (or none) gets `404` and nothing else: a log line and
//!   `bcd_site_boot_requests_total{outcome="unknown"}`. Strangers are not discovered.
//! - past its source address's budget of script fetches ([`crate::boot_limit`], issue 30.2), a
//!   request gets `429` whatever its MAC, counted as `outcome="rate_limited"`: guessing MACs to
//!   find one with a boot pending runs at two a second.
//!
//! The kernel arguments hold the boot token: they are served to that MAC only and never logged.
//! Which known machine asked, from which MAC, is noted in the site's state
//! ([`crate::site::Site::note_script_request`]): it confirms a power-on with PXE booted the
//! network (issue 31, rule 5).
//!
//! Slow clients (issue 30.3) get the limits of every small endpoint ([`bc_net::http::serve`]):
//! at most [`MAX_CONNECTIONS`] open, [`MAX_CONNECTIONS_PER_ADDRESS`] from one address (more are
//! closed at accept), a request head whole within [`HEADER_TIMEOUT`] however it trickles, and
//! [`IDLE_TIMEOUT`] without a byte either way; refusals and closes are counted
//! (`bcd_site_boot_connections_refused_total{reason}`,
//! `bcd_site_boot_connections_closed_total{reason}`, `bcd_site_boot_connections`).
//!
//! # Limitations
//! Plain HTTP (what firmware iPXE speaks without an embedded certificate): the boot token on the
//! wire is one-use, short-lived and bound to the machine's identifiers, so a copy is worth
//! nothing once the ramdisk joined. TFTP (for firmware without iPXE) is not served.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bc_net::caps::Refused;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::boot_limit::FetchLimiter;
use crate::site::{BootEntry, Site};

/// Connections the boot service holds open at once; more wait in the accept queue. A rack
/// powering on at once fetches the initramfs hundreds of times.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections one source address may hold open; more are closed at accept. Machines behind
/// one NAT address count together (each holds one or two while it boots).
pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 128;
/// Time for a request head to arrive whole, however its bytes trickle in; a keep-alive
/// connection without a next request is closed after it too.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection with no byte in or out this long is closed (a client that stopped reading).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Kernel arguments the site adds before the boot's own when `[site] boot_kernel_args` is unset:
/// a serial and a screen console.
pub const DEFAULT_KERNEL_ARGS: &str = "console=tty0 console=ttyS0,115200n8";

/// Why the boot service cannot start.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel or the initramfs is missing or unreadable.
    #[error("boot service: {what} {path}: {source}")]
    File {
        /// `kernel` or `initramfs`.
        what: &'static str,
        /// The configured path.
        path: PathBuf,
        /// Why it cannot be opened.
        source: std::io::Error,
    },
    /// The listen address cannot be bound.
    #[error("boot service: binding {addr}: {source}")]
    Bind {
        /// The configured address.
        addr: SocketAddr,
        /// Why it cannot be bound.
        source: std::io::Error,
    },
}

/// What the boot service serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFiles {
    /// The ramdisk's kernel (`vmlinuz`, from `packaging/ramdisk/`).
    pub kernel: PathBuf,
    /// The ramdisk's initramfs (`initrd.img`).
    pub initrd: PathBuf,
    /// Kernel arguments of the site (consoles, …), before the boot's own.
    pub kernel_args: String,
    /// `bcd.lldp_wait` of every ramdisk boot (`[site] ramdisk_lldp_wait_s`), seconds.
    pub lldp_wait_s: u32,
}

/// How a request was answered, the label of `bcd_site_boot_requests_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The ramdisk script.
    Ramdisk,
    /// `exit`: boot from disk.
    Disk,
    /// A MAC no assignment names.
    Unknown,
    /// No MAC, or not a MAC.
    Invalid,
    /// Refused `429`: its source address fetched too many scripts
    /// ([`crate::boot_limit::FetchLimiter`]).
    RateLimited,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ramdisk => "ramdisk",
            Self::Disk => "disk",
            Self::Unknown => "unknown",
            Self::Invalid => "invalid",
            Self::RateLimited => "rate_limited",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FileLabel {
    file: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The boot service's counters, exposed at its `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct BootMetrics {
    requests: Family<OutcomeLabel, Counter>,
    files: Family<FileLabel, Counter>,
    /// The listener's refusals, closes and open connections ([`bc_net::http::serve`]).
    pub listener: bc_net::http::ListenerStats,
}

impl BootMetrics {
    /// Counts one script request answered with `o`.
    pub fn request(&self, o: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: o.as_str().to_owned(),
            })
            .inc();
    }

    /// Requests answered with `o` so far.
    pub fn requests(&self, o: Outcome) -> u64 {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: o.as_str().to_owned(),
            })
            .get()
    }

    fn file(&self, f: &str) {
        self.files
            .get_or_create(&FileLabel { file: f.to_owned() })
            .inc();
    }

    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut r = Registry::default();
        r.register(
            "bcd_site_boot_requests",
            "iPXE script requests by how they were answered",
            self.requests.clone(),
        );
        r.register(
            "bcd_site_boot_files",
            "Kernel and initramfs downloads started",
            self.files.clone(),
        );
        let refused = Family::<ReasonLabel, Counter>::default();
        for why in [Refused::Total, Refused::PerAddress] {
            refused
                .get_or_create(&ReasonLabel {
                    reason: why.as_str().to_owned(),
                })
                .inc_by(self.listener.refused(why));
        }
        r.register(
            "bcd_site_boot_connections_refused",
            "Connections closed at accept, by the cap that was full (per source address, total)",
            refused,
        );
        let closed = Family::<ReasonLabel, Counter>::default();
        closed
            .get_or_create(&ReasonLabel {
                reason: "header_timeout".to_owned(),
            })
            .inc_by(self.listener.header_timeouts());
        r.register(
            "bcd_site_boot_connections_closed",
            "Connections closed by the service: a request head not received whole in time",
            closed,
        );
        let open = Gauge::<i64>::default();
        open.set(i64::try_from(self.listener.open()).unwrap_or(i64::MAX));
        r.register("bcd_site_boot_connections", "Connections open now", open);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r)?;
        Ok(out)
    }
}

/// The boot service's state.
#[derive(Debug, Clone)]
pub struct BootService {
    /// Whose assignment decides.
    pub site: Arc<Site>,
    /// What is served.
    pub files: Arc<BootFiles>,
    /// The counters.
    pub metrics: BootMetrics,
}

/// A MAC as iPXE writes it (`52:54:00:12:34:56`, any case; the query is already URL-decoded),
/// lowercase; `None` when it is not six `:`-separated hex bytes.
pub fn normalize_mac(raw: &str) -> Option<String> {
    let parts: Vec<&str> = raw.trim().split([':', '-']).collect();
    let ok = parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.chars().all(|c| c.is_ascii_hexdigit()));
    ok.then(|| parts.join(":").to_ascii_lowercase())
}

/// The iPXE script for a known machine. Relative URLs: iPXE resolves them against the script's
/// own URL, so the service needs no idea of the address machines reach it at.
pub fn script(entry: &BootEntry, files: &BootFiles) -> (Outcome, String) {
    match &entry.plan.ramdisk {
        Some(r) => (
            Outcome::Ramdisk,
            format!(
                "#!ipxe\necho bcd: {node} boots the ramdisk ({purpose})\nkernel /ramdisk/vmlinuz initrd=initrd {site} bcd.lldp_wait={lldp} BOOTIF=01-${{netX/mac:hexhyp}} {args}\ninitrd --name initrd /ramdisk/initrd\nboot\n",
                node = entry.node_id,
                purpose = r.purpose,
                site = files.kernel_args,
                lldp = files.lldp_wait_s,
                args = r.kernel_args,
            ),
        ),
        None => (
            Outcome::Disk,
            format!(
                "#!ipxe\necho bcd: {node} boots from its disk ({reason})\nexit\n",
                node = entry.node_id,
                reason = entry.plan.reason.replace('\n', " "),
            ),
        ),
    }
}

#[derive(Debug, serde::Deserialize)]
struct BootQuery {
    mac: Option<String>,
}

async fn boot_ipxe(
    State(s): State<BootService>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(limiter): Extension<Arc<FetchLimiter>>,
    Query(q): Query<BootQuery>,
) -> Response {
    // Before anything about the MAC: a guesser learns nothing past its budget (issue 30.2).
    if !limiter.allow(peer.ip()) {
        s.metrics.request(Outcome::RateLimited);
        tracing::debug!(%peer, "boot script fetches from this address over their rate: 429");
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "",
        )
            .into_response();
    }
    let Some(mac) = q.mac.as_deref().and_then(normalize_mac) else {
        s.metrics.request(Outcome::Invalid);
        tracing::warn!(mac = ?q.mac, "boot request without a usable MAC (boot.ipxe?mac=${{netX/mac}})");
        return (
            StatusCode::BAD_REQUEST,
            "boot.ipxe?mac=<aa:bb:cc:dd:ee:ff>\n",
        )
            .into_response();
    };
    let entry = s
        .site
        .boot_entry(&mac)
        .filter(|e| e.plan.macs.iter().any(|m| m.eq_ignore_ascii_case(&mac)));
    let Some(mut entry) = entry else {
        s.metrics.request(Outcome::Unknown);
        tracing::info!(mac = %mac, "boot request from an unknown MAC: not answered");
        return (StatusCode::NOT_FOUND, "").into_response();
    };
    // An expired token is not served even if no newer assignment came yet.
    let expired = entry.plan.ramdisk.as_ref().is_some_and(|r| {
        r.expires_at_ms > 0 && r.expires_at_ms <= chrono::Utc::now().timestamp_millis()
    });
    if expired && let Some(r) = entry.plan.ramdisk.take() {
        entry.plan.reason = format!("{}: its boot token expired", r.purpose);
    }
    let (outcome, text) = script(&entry, &s.files);
    s.metrics.request(outcome);
    // The evidence that the machine network-booted (issue 31, rule 5): a power-on with PXE
    // waits for it.
    s.site.note_script_request(&entry.node_id, &mac);
    // Never the script itself: it holds the boot token.
    tracing::info!(mac = %mac, node_id = %entry.node_id, answer = outcome.as_str(), reason = %entry.plan.reason, "boot request");
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

async fn send_file(s: &BootService, path: &PathBuf, name: &str) -> Response {
    match tokio::fs::File::open(path).await {
        Ok(f) => {
            s.metrics.file(name);
            let len = f.metadata().await.ok().map(|m| m.len());
            let body = Body::from_stream(tokio_util::io::ReaderStream::new(f));
            let mut r = Response::new(body);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/octet-stream"),
            );
            if let Some(n) = len {
                r.headers_mut()
                    .insert(header::CONTENT_LENGTH, header::HeaderValue::from(n));
            }
            r
        }
        Err(e) => {
            tracing::error!(file = %path.display(), error = %e, "boot file unreadable");
            (StatusCode::INTERNAL_SERVER_ERROR, "").into_response()
        }
    }
}

async fn kernel(State(s): State<BootService>) -> Response {
    let p = s.files.kernel.clone();
    send_file(&s, &p, "vmlinuz").await
}

async fn initrd(State(s): State<BootService>) -> Response {
    let p = s.files.initrd.clone();
    send_file(&s, &p, "initrd").await
}

async fn metrics(State(s): State<BootService>) -> Response {
    bc_net::http::metrics_response(s.metrics.encode())
}

/// Checks the files, binds `addr` and serves the boot service in a spawned task for the life of
/// the runtime. Returns the bound address (port 0 picks one).
///
/// Errors: [`BootError::File`] when the kernel or initramfs cannot be opened,
/// [`BootError::Bind`].
pub async fn serve(addr: SocketAddr, service: BootService) -> Result<SocketAddr, BootError> {
    for (what, path) in [
        ("kernel", &service.files.kernel),
        ("initramfs", &service.files.initrd),
    ] {
        std::fs::File::open(path).map_err(|source| BootError::File {
            what,
            path: path.clone(),
            source,
        })?;
    }
    let stats = service.metrics.listener.clone();
    let app = axum::Router::new()
        .route("/boot.ipxe", axum::routing::get(boot_ipxe))
        .route("/ramdisk/vmlinuz", axum::routing::get(kernel))
        .route("/ramdisk/initrd", axum::routing::get(initrd))
        .route("/metrics", axum::routing::get(metrics))
        .layer(Extension(Arc::new(FetchLimiter::default())))
        .with_state(service);
    let limits = bc_net::http::Limits {
        max_connections: MAX_CONNECTIONS,
        max_per_address: MAX_CONNECTIONS_PER_ADDRESS,
        header_timeout: HEADER_TIMEOUT,
        idle: IDLE_TIMEOUT,
        stats,
    };
    let (bound, _task) =
        bc_net::http::serve(addr, app, limits, "bcd site boot", std::future::pending())
            .await
            .map_err(|source| BootError::Bind { addr, source })?;
    tracing::info!(url = %bc_net::http::url(bound, "/boot.ipxe"), "serving network boots");
    Ok(bound)
}

#[cfg(test)]
#[path = "boot_tests.rs"]
mod slow_client_tests;

#[cfg(test)]
#[path = "boot_limit_tests.rs"]
mod limit_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::pb;

    fn entry(ramdisk: bool) -> BootEntry {
        BootEntry {
            node_id: "node_a".into(),
            plan: pb::BootPlan {
                macs: vec!["00:1b:21:aa:bb:01".into()],
                ramdisk: ramdisk.then(|| pb::RamdiskBoot {
                    kernel_args: "bcd.url=https://cp:7443 bcd.token=boot_x.s".into(),
                    purpose: "inspecting".into(),
                    expires_at_ms: 0,
                }),
                reason: "ready: boot from disk".into(),
            },
        }
    }

    fn files() -> BootFiles {
        BootFiles {
            kernel: "/k".into(),
            initrd: "/i".into(),
            kernel_args: DEFAULT_KERNEL_ARGS.into(),
            lldp_wait_s: 30,
        }
    }

    #[test]
    fn macs_are_normalized_or_refused() {
        assert_eq!(
            normalize_mac("00:1B:21:AA:bb:01").as_deref(),
            Some("00:1b:21:aa:bb:01")
        );
        assert_eq!(
            normalize_mac("00-1b-21-aa-bb-01").as_deref(),
            Some("00:1b:21:aa:bb:01")
        );
        for bad in [
            "",
            "00:1b:21:aa:bb",
            "00:1b:21:aa:bb:zz",
            "001b21aabb01",
            "0:1b:21:aa:bb:01",
        ] {
            assert_eq!(normalize_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_pending_boot_gets_the_ramdisk_with_both_argument_sets_and_others_exit() {
        let (o, s) = script(&entry(true), &files());
        assert_eq!(o, Outcome::Ramdisk);
        assert!(s.starts_with("#!ipxe\n"), "{s}");
        let kernel = s
            .lines()
            .find(|l| l.starts_with("kernel "))
            .unwrap_or_default();
        assert!(kernel.contains(DEFAULT_KERNEL_ARGS), "{kernel}");
        assert!(kernel.contains("bcd.token=boot_x.s"), "{kernel}");
        assert!(kernel.contains(" bcd.lldp_wait=30 "), "{kernel}");
        // The NIC iPXE booted from (its last opened, `netX`), as pxelinux names it: the ramdisk
        // asks DHCP on it first.
        assert!(
            kernel.contains(" BOOTIF=01-${netX/mac:hexhyp} "),
            "{kernel}"
        );
        assert!(s.contains("initrd --name initrd /ramdisk/initrd"), "{s}");
        let (o, s) = script(&entry(false), &files());
        assert_eq!(o, Outcome::Disk);
        assert!(s.ends_with("exit\n"), "{s}");
        assert!(!s.contains("bcd.token"), "{s}");
    }
}
