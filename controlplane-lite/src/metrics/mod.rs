//! Prometheus metrics of `bcctl serve`, served as OpenMetrics text at `GET /metrics` on
//! `--metrics-listen` (off unless given).
//!
//! # Design
//! Counters and histograms are updated where things happen (heartbeats and inventories in the
//! gateway session, join outcomes in JoinService, heartbeat flushes). Gauges that describe the
//! fleet (sessions, commands by state, nodes by connectivity and provisionState, nodes with an
//! unhealthy GPU) are read at scrape time: one store call per scrape, so they are never stale
//! and nothing has to keep them in step with every state change.
//!
//! # Limitations
//! A label value the store holds that is not one of the spelled states (a hand-edited row) gets
//! its own series, which stays at its last value after the row is gone.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Unit;
use tokio::sync::watch;

use cpl_store::{BareMetalCounts, CommandState, FleetCounts, Store, StoreError};

use crate::gateway::registry::Registry as Sessions;

mod bare_metal;
mod outcomes;
mod remediation;
pub use outcomes::{ConnClosed, ConnRefused, JoinOutcome};

/// The content type of the exposition (what prometheus-client's text encoder writes).
pub const CONTENT_TYPE: &str = bc_net::http::OPENMETRICS_CONTENT_TYPE;

/// What went wrong serving or computing metrics.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The metrics address could not be bound.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The scrape-time store query failed.
    #[error("reading fleet gauges from the store: {0}")]
    Store(#[from] StoreError),
    /// The text encoder failed (a formatting error; not expected).
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Every command state, spelled as in the store.
const COMMAND_STATES: &[CommandState] = &[
    CommandState::Queued,
    CommandState::Sent,
    CommandState::Running,
    CommandState::Succeeded,
    CommandState::Failed,
    CommandState::Cancelled,
    CommandState::Expired,
];

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ConnectivityLabel {
    connectivity: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ProvisionStateLabel {
    pub(crate) provision_state: String,
}

#[derive(Debug)]
struct Inner {
    registry: prometheus_client::registry::Registry,
    sessions: Gauge,
    heartbeats: Counter,
    joins: Family<OutcomeLabel, Counter>,
    reports_dropped: Family<KindLabel, Counter>,
    commands: Family<StateLabel, Gauge>,
    nodes: Family<ConnectivityLabel, Gauge>,
    nodes_by_provision_state: Family<ProvisionStateLabel, Gauge>,
    nodes_gpu_unhealthy: Gauge,
    inventory_record: Histogram,
    heartbeat_flush: Histogram,
    bundles_pruned: Counter,
    bundles_refused: Counter,
    gateway_connections: Gauge,
    gateway_refused: Family<ReasonLabel, Counter>,
    gateway_closed: Family<ReasonLabel, Counter>,
    leader: Gauge,
    node_write_escalations: Counter,
    bare_metal: bare_metal::Gauges,
    remediation: remediation::Gauges,
    /// One scrape at a time: the scrape-time gauges are set and encoded together.
    scrape: tokio::sync::Mutex<()>,
}

/// The control plane's metrics; cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Buckets for store writes, seconds: 0.5 ms doubling to about 16 s.
fn store_buckets() -> impl Iterator<Item = f64> {
    exponential_buckets(0.0005, 2.0, 16)
}

impl Metrics {
    /// Every family registered, fleet gauges at 0 for every known label value.
    pub fn new() -> Self {
        let mut registry = prometheus_client::registry::Registry::default();
        let sessions = Gauge::default();
        registry.register(
            "bcctl_sessions",
            "Live agent sessions on this gateway",
            sessions.clone(),
        );
        let heartbeats = Counter::default();
        registry.register(
            "bcctl_heartbeats",
            "Heartbeats received from agents",
            heartbeats.clone(),
        );
        let joins = Family::<OutcomeLabel, Counter>::default();
        registry.register("bcctl_join", "Join attempts by outcome", joins.clone());
        let reports_dropped = Family::<KindLabel, Counter>::default();
        // Listed before the first drop (bc_net::metrics).
        bc_net::metrics::register_described(
            &mut registry,
            "bcctl_reports_dropped",
            "Agent reports dropped because their node sent more than its report rate allows",
            None,
            reports_dropped.clone(),
        );
        let commands = Family::<StateLabel, Gauge>::default();
        registry.register(
            "bcctl_commands",
            "Commands in the store by state",
            commands.clone(),
        );
        let nodes = Family::<ConnectivityLabel, Gauge>::default();
        registry.register("bcctl_nodes", "Nodes by connectivity", nodes.clone());
        let nodes_by_provision_state = Family::<ProvisionStateLabel, Gauge>::default();
        registry.register(
            "bcctl_nodes_by_provision_state",
            "Nodes by provisionState",
            nodes_by_provision_state.clone(),
        );
        let nodes_gpu_unhealthy = Gauge::default();
        registry.register(
            "bcctl_nodes_gpu_unhealthy",
            "Nodes whose GpuUnhealthy condition is true",
            nodes_gpu_unhealthy.clone(),
        );
        let inventory_record = Histogram::new(store_buckets());
        registry.register_with_unit(
            "bcctl_inventory_record_duration",
            "Time to store one Inventory from an agent",
            Unit::Seconds,
            inventory_record.clone(),
        );
        let heartbeat_flush = Histogram::new(store_buckets());
        registry.register_with_unit(
            "bcctl_heartbeat_flush_duration",
            "Time to write one batch of buffered heartbeats",
            Unit::Seconds,
            heartbeat_flush.clone(),
        );
        registry.register_collector(Box::new(TruncatedText));
        let bundles_pruned = Counter::default();
        registry.register(
            "bcctl_bundles_pruned",
            "logs.collect bundles deleted by the retention rules (age, count, bytes)",
            bundles_pruned.clone(),
        );
        let gateway_connections = Gauge::default();
        registry.register(
            "bcctl_gateway_connections",
            "Open gateway connections (TLS handshakes in progress included)",
            gateway_connections.clone(),
        );
        let gateway_refused = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "bcctl_gateway_connections_refused",
            "Gateway connections closed at accept because a connection cap was reached, by reason (total, per_address)",
            gateway_refused.clone(),
        );
        let gateway_closed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "bcctl_gateway_connections_closed",
            "Gateway connections closed before they were served, by reason (handshake_timeout, handshake_failed, preface_timeout)",
            gateway_closed.clone(),
        );
        for r in [ConnRefused::Total, ConnRefused::PerAddress] {
            let _ = gateway_refused.get_or_create(&ReasonLabel { reason: r.as_str() });
        }
        for r in [
            ConnClosed::HandshakeTimeout,
            ConnClosed::HandshakeFailed,
            ConnClosed::PrefaceTimeout,
        ] {
            let _ = gateway_closed.get_or_create(&ReasonLabel { reason: r.as_str() });
        }
        let bundles_refused = Counter::default();
        registry.register(
            "bcctl_bundle_uploads_refused",
            "Bundle uploads refused because the bundle store or the disk had no room",
            bundles_refused.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "bcctl_controllers_leader",
            "1 while this replica holds the controller lease and runs Liveness, NodeLifecycle and the deadlines",
            leader.clone(),
        );
        let node_write_escalations = Counter::default();
        registry.register(
            "bcctl_store_node_write_escalations",
            "Writes of one node's reports that ran again under the store's global write lock (PostgreSQL: a bare-metal step, a deadlock)",
            node_write_escalations.clone(),
        );
        let bare_metal = bare_metal::Gauges::register(&mut registry);
        let remediation = remediation::Gauges::register(&mut registry);
        for o in JoinOutcome::ALL {
            let _ = joins.get_or_create(&OutcomeLabel {
                outcome: o.as_str(),
            });
        }
        let m = Self {
            inner: Arc::new(Inner {
                registry,
                sessions,
                heartbeats,
                joins,
                reports_dropped,
                commands,
                nodes,
                nodes_by_provision_state,
                nodes_gpu_unhealthy,
                inventory_record,
                heartbeat_flush,
                bundles_pruned,
                bundles_refused,
                gateway_connections,
                gateway_refused,
                gateway_closed,
                leader,
                node_write_escalations,
                bare_metal,
                remediation,
                scrape: tokio::sync::Mutex::new(()),
            }),
        };
        m.set_fleet(&FleetCounts::default(), 0);
        m.inner.bare_metal.set(&BareMetalCounts::default(), 0);
        m
    }

    /// Whether this replica leads (`bcctl_controllers_leader`).
    pub fn set_leader(&self, leads: bool) {
        self.inner.leader.set(i64::from(leads));
    }

    /// A heartbeat arrived (`bcctl_heartbeats_total`).
    pub fn heartbeat(&self) {
        self.inner.heartbeats.inc();
    }

    /// A join attempt ended with `outcome` (`bcctl_join_total{outcome}`).
    pub fn join(&self, outcome: JoinOutcome) {
        self.inner
            .joins
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    /// A report of `kind` (`inventory`, `specStatus`, `commandUpdate`, `event`) was dropped over
    /// its node's report rate (`bcctl_reports_dropped_total{kind}`).
    pub fn report_dropped(&self, kind: &'static str) {
        self.inner
            .reports_dropped
            .get_or_create(&KindLabel { kind })
            .inc();
    }

    /// Storing one Inventory took `d` (`bcctl_inventory_record_duration_seconds`).
    pub fn observe_inventory(&self, d: Duration) {
        self.inner.inventory_record.observe(d.as_secs_f64());
    }

    /// `n` gateway connections are open (`bcctl_gateway_connections`).
    pub fn gateway_connections(&self, n: usize) {
        self.inner
            .gateway_connections
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The gateway refused a connection at accept (`bcctl_gateway_connections_refused_total`).
    pub fn gateway_refused(&self, why: ConnRefused) {
        self.inner
            .gateway_refused
            .get_or_create(&ReasonLabel {
                reason: why.as_str(),
            })
            .inc();
    }

    /// The gateway closed a connection before serving it
    /// (`bcctl_gateway_connections_closed_total`).
    pub fn gateway_closed(&self, why: ConnClosed) {
        self.inner
            .gateway_closed
            .get_or_create(&ReasonLabel {
                reason: why.as_str(),
            })
            .inc();
    }

    /// `n` bundles were deleted by the retention rules (`bcctl_bundles_pruned_total`).
    pub fn bundles_pruned(&self, n: usize) {
        self.inner.bundles_pruned.inc_by(n as u64);
    }

    /// A bundle upload was refused for room (`bcctl_bundle_uploads_refused_total`).
    pub fn bundle_refused(&self) {
        self.inner.bundles_refused.inc();
    }

    /// Writing one heartbeat batch took `d` (`bcctl_heartbeat_flush_duration_seconds`).
    pub fn observe_heartbeat_flush(&self, d: Duration) {
        self.inner.heartbeat_flush.observe(d.as_secs_f64());
    }

    fn set_fleet(&self, f: &FleetCounts, sessions: usize) {
        let i = &self.inner;
        i.sessions.set(i64::try_from(sessions).unwrap_or(i64::MAX));
        let count = |rows: &[(String, i64)], key: &str| {
            rows.iter()
                .filter(|(k, _)| k == key)
                .map(|(_, n)| *n)
                .sum::<i64>()
        };
        let mut known: Vec<&str> = COMMAND_STATES.iter().map(|s| s.as_str()).collect();
        known.extend(f.commands.iter().map(|(k, _)| k.as_str()));
        for s in known {
            i.commands
                .get_or_create(&StateLabel {
                    state: s.to_owned(),
                })
                .set(count(&f.commands, s));
        }
        let mut known: Vec<&str> = bc_protocol::Connectivity::ALL
            .iter()
            .map(|c| c.as_str())
            .collect();
        known.extend(f.connectivity.iter().map(|(k, _)| k.as_str()));
        for c in known {
            i.nodes
                .get_or_create(&ConnectivityLabel {
                    connectivity: c.to_owned(),
                })
                .set(count(&f.connectivity, c));
        }
        let mut known: Vec<&str> = bc_protocol::ProvisionState::ALL
            .iter()
            .map(|p| p.as_str())
            .collect();
        known.extend(f.provision_states.iter().map(|(k, _)| k.as_str()));
        for p in known {
            i.nodes_by_provision_state
                .get_or_create(&ProvisionStateLabel {
                    provision_state: p.to_owned(),
                })
                .set(count(&f.provision_states, p));
        }
        i.nodes_gpu_unhealthy.set(f.condition_true);
    }

    /// Reads the fleet gauges from `store` and `sessions` (one store call), then encodes every
    /// family as OpenMetrics text (ends with `# EOF`).
    pub async fn scrape(&self, store: &Store, sessions: &Sessions) -> Result<String, MetricsError> {
        let _one = self.inner.scrape.lock().await;
        let (counts, bare_metal, remediation) = store
            .read(|r| {
                Ok::<_, StoreError>((
                    r.fleet_counts(cpl_core::health::GPU_UNHEALTHY)?,
                    r.bare_metal_counts(cpl_store::WorkStep::RescueReady.as_str())?,
                    r.remediation_counts()?,
                ))
            })
            .await?;
        self.inner.remediation.set(&remediation);
        self.set_fleet(&counts, sessions.len());
        self.inner
            .bare_metal
            .set(&bare_metal, chrono::Utc::now().timestamp_millis());
        let escalations = &self.inner.node_write_escalations;
        escalations.inc_by(
            store
                .node_write_escalations()
                .saturating_sub(escalations.get()),
        );
        self.encode()
    }

    /// The current values as OpenMetrics text, without reading the store.
    pub fn encode(&self) -> Result<String, MetricsError> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.inner.registry)?;
        Ok(out)
    }
}

/// `bcctl_agent_text_truncated_total{field}`: values agents sent that were cut to their limit
/// (`bc_protocol::limits`, which counts where it cuts), read at scrape time.
#[derive(Debug)]
struct TruncatedText;

impl prometheus_client::collector::Collector for TruncatedText {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let mut family = encoder.encode_descriptor(
            "bcctl_agent_text_truncated",
            "Values agents sent that were cut to their size limit, by field",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (field, n) in bc_protocol::limits::truncated_counts() {
            let labels = [("field", field.name())];
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct ScrapeState {
    metrics: Metrics,
    store: Store,
    sessions: Arc<Sessions>,
}

async fn get_metrics(State(s): State<ScrapeState>) -> Response {
    bc_net::http::metrics_response(s.metrics.scrape(&s.store, &s.sessions).await)
}

/// Binds `addr` and serves `GET /metrics` until `stop` turns true. Returns the bound address
/// (port 0 picks one) once listening; the server runs in a spawned task.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    store: Store,
    sessions: Arc<Sessions>,
    mut stop: watch::Receiver<bool>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsError> {
    let app = axum::Router::new()
        .route("/metrics", axum::routing::get(get_metrics))
        .with_state(ScrapeState {
            metrics,
            store,
            sessions,
        });
    let until = async move {
        let _ = stop.wait_for(|v| *v).await;
    };
    // A scraper needs one connection; a few spare, and idle ones are closed.
    let limits = bc_net::http::Limits::small(32, crate::limits::IDLE_TIMEOUT);
    bc_net::http::serve(addr, app, limits, "bcctl metrics", until)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })
}

#[cfg(test)]
mod metrics_tests;
