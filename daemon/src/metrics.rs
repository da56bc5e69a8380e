//! Prometheus metrics of `bcd agent`, served as OpenMetrics text at `GET /metrics` on
//! `metrics_listen` (bcd.toml, `--metrics-listen`, `BCD_METRICS_LISTEN`; off unless set).
//!
//! # Design
//! One process-wide [`Metrics`] ([`global`]) so the agent's hooks are single lines and nothing
//! has to be threaded through the session and executor structs. Values are plain atomics
//! (prometheus-client): a scrape copies them and never waits on the agent, and the agent never
//! waits on a scrape.
//!
//! # Limitations
//! `bcd_gpu_health` is as fresh as the last `diag.nvml` the control plane asked for; before the
//! first one there are no series. `bcd sim` runs many agents in one process: they share these
//! counters.

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use bcd_probes::nvml::{CheckStatus, DiagReport};

/// The content type of the exposition (what prometheus-client's text encoder writes).
pub const CONTENT_TYPE: &str = bc_net::http::OPENMETRICS_CONTENT_TYPE;

/// What went wrong starting the metrics listener or encoding.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The text encoder failed (a formatting error; not expected).
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CommandLabels {
    name: String,
    outcome: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct GpuLabels {
    gpu_index: u32,
    uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct XidLabels {
    xid: String,
    class: &'static str,
    source: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

#[derive(Debug)]
struct Inner {
    registry: Registry,
    session_connected: Gauge,
    heartbeats_sent: Counter,
    heartbeat_acks: Counter,
    reconnects: Counter,
    commands: Family<CommandLabels, Counter>,
    inventory_collect: Histogram,
    gpu_health: Family<GpuLabels, Gauge>,
    heartbeat_rtt: Histogram,
    xids: Family<XidLabels, Counter>,
}

/// The agent's metrics; cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process-wide metrics the agent updates and `bcd agent --metrics-listen` serves.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

/// Command names that become label values; anything else is `other` so a confused or hostile
/// control plane cannot grow the label set without bound.
fn command_label(name: &str) -> String {
    match name.parse::<bc_protocol::CommandName>() {
        Ok(n) => n.as_str().to_owned(),
        Err(_) => "other".to_owned(),
    }
}

/// XID numbers at or above this are counted as `other`: NVIDIA's catalog ends well below, and a
/// garbled kernel log line must not grow the label set.
const MAX_XID_LABEL: u64 = 1000;

/// The `class` label of an XID, spelled as in the event's JSON.
impl Metrics {
    /// Every family registered; `bcd_build_info{version}` is 1.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let session_connected = Gauge::default();
        registry.register(
            "bcd_session_connected",
            "1 while a session with the gateway is open (after Welcome), else 0",
            session_connected.clone(),
        );
        let heartbeats_sent = Counter::default();
        registry.register(
            "bcd_heartbeats_sent",
            "Heartbeats sent to the gateway",
            heartbeats_sent.clone(),
        );
        let heartbeat_acks = Counter::default();
        registry.register(
            "bcd_heartbeat_acks",
            "Heartbeat acknowledgements received from the gateway",
            heartbeat_acks.clone(),
        );
        let reconnects = Counter::default();
        registry.register(
            "bcd_reconnects",
            "Sessions that ended and were retried after a backoff",
            reconnects.clone(),
        );
        let commands = Family::<CommandLabels, Counter>::default();
        // Families without series until something happens are still listed (bc_net::metrics).
        bc_net::metrics::register_described(
            &mut registry,
            "bcd_commands",
            "Commands finished, by name and outcome (succeeded, failed, cancelled)",
            None,
            commands.clone(),
        );
        let inventory_collect = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "bcd_inventory_collect_duration",
            "Time to collect the inventory document and hardware identity",
            Unit::Seconds,
            inventory_collect.clone(),
        );
        let gpu_health = Family::<GpuLabels, Gauge>::default();
        bc_net::metrics::register_described(
            &mut registry,
            "bcd_gpu_health",
            "Per GPU: 1 unless the last diag.nvml verdict for it was fail, then 0",
            None,
            gpu_health.clone(),
        );
        // Loopback to a busy control plane: 1 ms doubling to about 33 s.
        let heartbeat_rtt = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "bcd_heartbeat_rtt",
            "Time from sending a heartbeat to its acknowledgement",
            Unit::Seconds,
            heartbeat_rtt.clone(),
        );
        let xids = Family::<XidLabels, Counter>::default();
        bc_net::metrics::register_described(
            &mut registry,
            "bcd_xid_events",
            "XID events seen on this node's GPUs, by XID number (other from 1000 up), catalog class \
             (unknown: an Xid NVIDIA's catalog as bcd carries it does not list) and source (nvml, kmsg)",
            None,
            xids.clone(),
        );
        let build_info = Family::<VersionLabel, Gauge>::default();
        build_info
            .get_or_create(&VersionLabel {
                version: bc_protocol::VERSION,
            })
            .set(1);
        registry.register(
            "bcd_build_info",
            "The agent's version; always 1",
            build_info,
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                session_connected,
                heartbeats_sent,
                heartbeat_acks,
                reconnects,
                commands,
                inventory_collect,
                gpu_health,
                heartbeat_rtt,
                xids,
            }),
        }
    }

    /// A session opened (true, at Welcome) or ended (false).
    pub fn set_connected(&self, connected: bool) {
        self.inner.session_connected.set(i64::from(connected));
    }

    /// A heartbeat was sent.
    pub fn heartbeat_sent(&self) {
        self.inner.heartbeats_sent.inc();
    }

    /// A heartbeat acknowledgement arrived.
    pub fn heartbeat_acked(&self) {
        self.inner.heartbeat_acks.inc();
    }

    /// A heartbeat was acknowledged `d` after it was sent.
    pub fn observe_heartbeat_rtt(&self, d: Duration) {
        self.inner.heartbeat_rtt.observe(d.as_secs_f64());
    }

    /// An XID event was seen (`bcd_xid_events_total{xid, class}`).
    pub fn xid(&self, x: &bcd_probes::nvml::XidEvent) {
        let xid = if x.xid < MAX_XID_LABEL {
            x.xid.to_string()
        } else {
            "other".to_owned()
        };
        self.inner
            .xids
            .get_or_create(&XidLabels {
                xid,
                class: x.class.as_str(),
                source: match x.source {
                    bcd_probes::nvml::XidSource::Nvml => "nvml",
                    bcd_probes::nvml::XidSource::Kmsg => "kmsg",
                },
            })
            .inc();
    }

    /// A session ended and the agent will reconnect.
    pub fn reconnect(&self) {
        self.inner.reconnects.inc();
    }

    /// A command finished; `outcome` is its journal state (`succeeded`, `failed`, `cancelled`).
    pub fn command_finished(&self, name: &str, outcome: &str) {
        self.inner
            .commands
            .get_or_create(&CommandLabels {
                name: command_label(name),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Collecting one inventory took `d`.
    pub fn observe_inventory(&self, d: Duration) {
        self.inner.inventory_collect.observe(d.as_secs_f64());
    }

    /// Replaces `bcd_gpu_health` with the GPUs of a `diag.nvml` report. A report without NVML
    /// says nothing about the GPUs and changes nothing.
    pub fn record_diag(&self, report: &DiagReport) {
        if !report.nvml_available {
            return;
        }
        // GPUs that left the report (removed, fallen off the bus) must not stay "healthy".
        self.inner.gpu_health.clear();
        for g in &report.gpus {
            self.inner
                .gpu_health
                .get_or_create(&GpuLabels {
                    gpu_index: g.index,
                    uuid: g.uuid.clone(),
                })
                .set(i64::from(g.verdict != CheckStatus::Fail));
        }
    }

    /// The current values as OpenMetrics text (ends with `# EOF`).
    pub fn encode(&self) -> Result<String, MetricsError> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)?;
        Ok(out)
    }
}

async fn get_metrics(axum::extract::State(m): axum::extract::State<Metrics>) -> Response {
    bc_net::http::metrics_response(m.encode())
}

/// `http://host:port/metrics` for a bound address (an unspecified IP reads as loopback).
pub fn url(bound: SocketAddr) -> String {
    bc_net::http::url(bound, "/metrics")
}

/// Binds `addr` and serves `GET /metrics` from `metrics` in a spawned task for the life of the
/// runtime. Returns the bound address (port 0 picks one). A non-loopback address is allowed but
/// logged as a warning.
pub async fn serve(addr: SocketAddr, metrics: Metrics) -> Result<SocketAddr, MetricsError> {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(get_metrics))
        .with_state(metrics);
    // Idle or stuck clients must not take the descriptors the agent needs to reach its control
    // plane: a few connections at most, closed after 30 s of silence.
    let limits = bc_net::http::Limits::small(16, Duration::from_secs(30));
    let (bound, _task) =
        bc_net::http::serve(addr, app, limits, "bcd metrics", std::future::pending())
            .await
            .map_err(|source| MetricsError::Bind { addr, source })?;
    tracing::info!(url = %url(bound), "serving metrics");
    Ok(bound)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use bcd_probes::nvml::GpuReport;
    use bcd_probes::nvml::xid::RecommendedAction;

    fn has(text: &str, want: &str) -> bool {
        text.lines().any(|l| l == want)
    }

    fn gpu(index: u32, uuid: &str, verdict: CheckStatus) -> GpuReport {
        GpuReport {
            index,
            uuid: uuid.to_owned(),
            pci_bus_id: format!("0000:{index:02x}:00.0"),
            name: "NVIDIA H100".to_owned(),
            checks: Vec::new(),
            verdict,
            action: RecommendedAction::None,
        }
    }

    fn report(gpus: Vec<GpuReport>) -> DiagReport {
        DiagReport {
            nvml_available: true,
            unavailable_reason: None,
            driver_version: None,
            nvml_version: None,
            node_checks: Vec::new(),
            gpus,
            verdict: CheckStatus::Pass,
            action: RecommendedAction::None,
            summary: String::new(),
        }
    }

    #[test]
    fn xid_events_are_counted_by_class_and_an_xid_the_catalog_lacks_is_unknown() {
        use bcd_probes::nvml::kmsg::{KmsgEvent, parse_event};
        use bcd_probes::nvml::{XidEvent, XidSource, xid};
        let m = Metrics::new();
        // Two kernel messages of an Xid NVIDIA's catalog does not list, one it does.
        for line in [
            "NVRM: Xid (PCI:0000:1a:00): 999, pid=7, a future driver's new error",
            "NVRM: Xid (PCI:0000:1a:00): 999, pid=7, again",
            "NVRM: Xid (PCI:0000:1a:00): 48, pid=7, DBE",
        ] {
            let Some(KmsgEvent::Xid(x)) = parse_event(line) else {
                panic!("{line} does not parse");
            };
            let (class, action, description) = xid::judge(x.xid, None);
            m.xid(&XidEvent {
                xid: x.xid,
                pci_bus_id: Some(x.addr.to_bus_id()),
                uuid: None,
                class,
                action,
                description,
                message: Some(x.text),
                pid: x.pid,
                source: XidSource::Kmsg,
                observed_at: chrono::Utc::now(),
                driver_message: false,
            });
        }
        let t = m.encode().unwrap();
        for want in [
            "bcd_xid_events_total{xid=\"999\",class=\"unknown\",source=\"kmsg\"} 2",
            "bcd_xid_events_total{xid=\"48\",class=\"resetRequired\",source=\"kmsg\"} 1",
        ] {
            assert!(has(&t, want), "no line {want:?} in\n{t}");
        }
    }

    #[test]
    fn hooks_show_up_in_the_exposition_with_their_values() {
        let m = Metrics::new();
        m.set_connected(true);
        m.heartbeat_sent();
        m.heartbeat_sent();
        m.heartbeat_acked();
        m.reconnect();
        m.command_finished("inventory.refresh", "succeeded");
        m.command_finished("inventory.refresh", "succeeded");
        m.command_finished("diag.nvml", "failed");
        m.command_finished("rm.rf", "failed");
        m.observe_inventory(Duration::from_millis(20));
        let t = m.encode().unwrap();
        for want in [
            "bcd_session_connected 1",
            "bcd_heartbeats_sent_total 2",
            "bcd_heartbeat_acks_total 1",
            "bcd_reconnects_total 1",
            "bcd_commands_total{name=\"inventory.refresh\",outcome=\"succeeded\"} 2",
            "bcd_commands_total{name=\"diag.nvml\",outcome=\"failed\"} 1",
            "bcd_commands_total{name=\"other\",outcome=\"failed\"} 1",
            "bcd_inventory_collect_duration_seconds_count 1",
            "bcd_inventory_collect_duration_seconds_sum 0.02",
            &format!("bcd_build_info{{version=\"{}\"}} 1", bc_protocol::VERSION),
        ] {
            assert!(has(&t, want), "no line {want:?} in\n{t}");
        }
        assert!(
            t.contains("# UNIT bcd_inventory_collect_duration_seconds seconds"),
            "{t}"
        );
        m.set_connected(false);
        assert!(has(&m.encode().unwrap(), "bcd_session_connected 0"));
    }

    #[test]
    fn gpu_health_follows_the_last_diag_and_drops_gone_gpus() {
        let m = Metrics::new();
        m.record_diag(&report(vec![
            gpu(0, "GPU-aaaa", CheckStatus::Pass),
            gpu(1, "GPU-bbbb", CheckStatus::Fail),
            gpu(2, "GPU-cccc", CheckStatus::Warn),
        ]));
        let t = m.encode().unwrap();
        for want in [
            "bcd_gpu_health{gpu_index=\"0\",uuid=\"GPU-aaaa\"} 1",
            "bcd_gpu_health{gpu_index=\"1\",uuid=\"GPU-bbbb\"} 0",
            "bcd_gpu_health{gpu_index=\"2\",uuid=\"GPU-cccc\"} 1",
        ] {
            assert!(has(&t, want), "no line {want:?} in\n{t}");
        }
        // GPU 2 is gone and GPU 1 recovered.
        m.record_diag(&report(vec![
            gpu(0, "GPU-aaaa", CheckStatus::Pass),
            gpu(1, "GPU-bbbb", CheckStatus::Pass),
        ]));
        let t = m.encode().unwrap();
        assert!(
            has(&t, "bcd_gpu_health{gpu_index=\"1\",uuid=\"GPU-bbbb\"} 1"),
            "{t}"
        );
        assert!(!t.contains("GPU-cccc"), "{t}");
        // A report without NVML changes nothing.
        let mut none = report(Vec::new());
        none.nvml_available = false;
        m.record_diag(&none);
        assert!(m.encode().unwrap().contains("GPU-aaaa"));
    }

    #[test]
    fn xids_count_by_number_and_class_and_heartbeat_rtts_are_observed() {
        use bc_protocol::commands::xid::{XidClass, XidEvent, XidSource};
        let m = Metrics::new();
        let xid = |n: u64| XidEvent {
            xid: n,
            pci_bus_id: Some("0000:1a:00.0".to_owned()),
            uuid: None,
            class: XidClass::of(n),
            action: XidClass::of(n).action(),
            description: None,
            message: None,
            pid: None,
            source: XidSource::Kmsg,
            observed_at: chrono::Utc::now(),
            driver_message: false,
        };
        m.xid(&xid(79));
        m.xid(&xid(79));
        m.xid(&xid(48));
        // A number from a garbled log line does not become a label of its own.
        m.xid(&xid(123_456_789));
        m.observe_heartbeat_rtt(Duration::from_millis(4));
        let t = m.encode().unwrap();
        for want in [
            "bcd_xid_events_total{xid=\"79\",class=\"rebootRequired\",source=\"kmsg\"} 2",
            "bcd_xid_events_total{xid=\"48\",class=\"resetRequired\",source=\"kmsg\"} 1",
            "bcd_xid_events_total{xid=\"other\",class=\"unknown\",source=\"kmsg\"} 1",
            "bcd_heartbeat_rtt_seconds_count 1",
            "bcd_heartbeat_rtt_seconds_sum 0.004",
        ] {
            assert!(has(&t, want), "no line {want:?} in\n{t}");
        }
        assert!(!t.contains("123456789"), "{t}");
    }

    #[tokio::test]
    async fn serves_get_metrics_and_refuses_a_taken_address() {
        let m = Metrics::new();
        m.heartbeat_sent();
        let bound = serve("127.0.0.1:0".parse().unwrap(), m.clone())
            .await
            .unwrap();
        assert_ne!(bound.port(), 0);
        // A plain HTTP/1.0 request: no client crate needed in bcd.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(bound).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
        assert!(
            resp.to_ascii_lowercase()
                .contains(&format!("content-type: {CONTENT_TYPE}")),
            "{resp}"
        );
        assert!(has(&resp, "bcd_heartbeats_sent_total 1"), "{resp}");

        let err = serve(bound, m).await.unwrap_err();
        assert!(matches!(err, MetricsError::Bind { .. }), "{err}");
        assert!(err.to_string().contains(&bound.to_string()), "{err}");
    }

    #[test]
    fn url_names_loopback_for_an_unspecified_bind() {
        assert_eq!(
            url("0.0.0.0:9464".parse().unwrap()),
            "http://127.0.0.1:9464/metrics"
        );
        assert_eq!(
            url("[::1]:9464".parse().unwrap()),
            "http://[::1]:9464/metrics"
        );
    }
}
