//! The site agent's state, shared by its command handlers ([`crate::machine`]), its session
//! hooks ([`crate::hooks`]) and the power sync loop ([`crate::sync`]): the lease, the assignment
//! (the BMCs with their drivers and limits), and the observations waiting to be reported.
//!
//! # Design
//! - An assignment replaces the previous one entirely. A BMC whose endpoint and limit did not
//!   change keeps its driver (and so its open connections); every other driver, and every
//!   credential it held, is dropped with the old assignment. A standby (`lease_held = false`)
//!   holds no BMCs at all.
//! - Every BMC operation goes through [`Site::with_bmc`]: the lease of the command's epoch must
//!   be valid, the node must be assigned, the BMC's and the site's permits are taken, the lease
//!   is checked again (it may have lapsed while waiting), and the operation runs under the
//!   operation timeout. Nothing reaches a BMC without a valid lease.
//! - Changes (assignment, lease) bump a version on a `watch` channel: the sync loop restarts its
//!   pollers on a new assignment and resumes them after a renewal.
//! - A BMC's permits are held until the BMC is done: an operation whose driver gave up on a
//!   request (or that ran past the operation timeout) keeps them for one more request timeout
//!   ([`Bmc::busy_until`]), since the BMC is still working on it (issue 31, rule 7).
//! - Credentials a BMC refused are not sent again (issue 31, rule 9): the refusal is latched per
//!   node and credential set ([`Site::with_bmc`] fails at once, `BMC_AUTH_FAILED`, naming when),
//!   until the assignment brings other credentials for it.
//! - The boot service reports which machine asked for its script ([`Site::note_script_request`]):
//!   the evidence a network boot happened ([`Site::script_requested`], issue 31 rule 5).
//! - The power state last reported per node is shared by the sync loop and the power commands
//!   ([`Site::note_power`]): a reading is reported when it differs from what the control plane
//!   was last told, whoever told it (issue 31 rule 10).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::PowerState;
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb;
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::bmc::{Bmc, BmcError, Connector, Endpoint};
use crate::config::SiteConfig;
use crate::lease::{Lease, LeaseError};
use crate::limiter::{BmcLimit, SiteLimit};
use crate::report::Reports;

/// Heartbeat send times remembered, to date the renewal an acknowledgement brings.
const HEARTBEATS_KEPT: usize = 64;

/// A driver, or why there is none (a bad address is reported by every operation on it).
pub type Driver = Result<Arc<dyn Bmc>, BmcError>;

/// What the sync loop and the power commands last reported of a node: power, reachability,
/// the error's code.
pub type PowerKey = (PowerState, bool, String);

/// When a BMC refused a set of credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// On the local clock.
    pub at: Instant,
    /// On the wall clock (for messages), ms since the Unix epoch.
    pub wall_ms: i64,
}

impl Refusal {
    fn now() -> Self {
        Self {
            at: Instant::now(),
            wall_ms: chrono::Utc::now().timestamp_millis(),
        }
    }
}

/// A time for messages (RFC 3339, seconds).
pub fn when(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| ms.to_string())
}

/// One BMC of the assignment.
#[derive(Debug)]
pub struct ManagedBmc {
    /// The bare-metal node it controls.
    pub node_id: String,
    /// Its address as errors name it.
    pub address: String,
    endpoint: Option<Endpoint>,
    driver: Driver,
    candidate: Option<(Option<Endpoint>, Driver)>,
    /// Whether the sync loop polls it.
    pub sync_power: bool,
    /// Its concurrency bound (shared by its candidate: the same physical BMC).
    pub limit: BmcLimit,
}

impl ManagedBmc {
    /// The driver of the current credentials (or of the candidate ones).
    pub fn driver(&self, candidate: bool) -> Option<&Driver> {
        if candidate {
            self.candidate.as_ref().map(|(_, d)| d)
        } else {
            Some(&self.driver)
        }
    }
}

/// The assignment in force.
#[derive(Debug)]
pub struct Assignment {
    /// The site.
    pub site_id: String,
    /// Whether this appliance was granted the lease.
    pub held: bool,
    /// The lease epoch (0 for a standby).
    pub epoch: u64,
    /// Bumped by every assignment applied here.
    pub generation: u64,
    /// The BMCs by node id.
    pub bmcs: HashMap<String, Arc<ManagedBmc>>,
    /// The power sync period.
    pub sync_interval: Duration,
    /// The site-wide bound.
    pub site_limit: SiteLimit,
    /// How the boot service answers each machine, by MAC (lowercase `aa:bb:…`): the node and
    /// its plan (issue 15). Empty for a standby.
    pub boots: HashMap<String, BootEntry>,
}

/// A machine the boot service knows: its node and how it boots now. Its `Debug` leaves out the
/// kernel arguments (they hold the boot token).
#[derive(Clone, PartialEq)]
pub struct BootEntry {
    /// The bare-metal node.
    pub node_id: String,
    /// The control plane's plan for its next network boot.
    pub plan: pb::BootPlan,
}

impl std::fmt::Debug for BootEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootEntry")
            .field("node_id", &self.node_id)
            .field("macs", &self.plan.macs)
            .field("ramdisk", &self.plan.ramdisk.as_ref().map(|r| &r.purpose))
            .field("reason", &self.plan.reason)
            .finish()
    }
}

#[derive(Debug)]
struct Inner {
    lease: Lease,
    assignment: Option<Arc<Assignment>>,
    generation: u64,
    heartbeats: VecDeque<(u64, Instant)>,
    unreachable: HashSet<String>,
    /// Each BMC's bound by node id. It outlives assignments: operations started under an earlier
    /// assignment (one before a lapse and a standby interlude, say) still hold its permits, so a
    /// fresh semaphore per assignment would let the BMC see twice its limit. An entry goes when
    /// its BMC is in no holder assignment and nothing holds a permit of it.
    limits: HashMap<String, BmcLimit>,
    /// Credentials refused, by node and whether they are the candidate ones.
    refused: HashMap<(String, bool), Refusal>,
    /// The newest script request of each node's machine: when, and from which MAC.
    script_requests: HashMap<String, (Instant, String)>,
    /// What was last reported of each node's power.
    reported: HashMap<String, PowerKey>,
}

/// The site agent's shared state.
#[derive(Debug)]
pub struct Site {
    config: SiteConfig,
    connector: Arc<dyn Connector>,
    inner: Mutex<Inner>,
    version: watch::Sender<u64>,
    /// Bumped by every script request of a known machine.
    scripts: watch::Sender<u64>,
    /// Observations waiting for the session.
    pub reports: Reports,
}

/// What status.json and `bcd status` show about the site (never credentials).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SiteView {
    /// The site, once an assignment named it.
    pub site_id: Option<String>,
    /// The lease epoch held (valid or not).
    pub lease_epoch: Option<u64>,
    /// Whether BMC work is allowed now.
    pub lease_valid: bool,
    /// How long it stays allowed without another renewal.
    pub lease_left: Option<Duration>,
    /// BMCs assigned.
    pub bmcs: usize,
    /// BMCs whose last poll found no answer.
    pub unreachable: usize,
}

fn lease_lost(e: &LeaseError) -> CommandFailure {
    CommandFailure::new(
        CommandErrorCode::LeaseLost,
        format!("{e}; nothing was done"),
    )
}

impl Site {
    /// A site agent with `config`, making drivers with `connector`.
    pub fn new(config: SiteConfig, connector: Arc<dyn Connector>) -> Self {
        let lease = Lease::new(config.lease_margin());
        Self {
            config,
            connector,
            inner: Mutex::new(Inner {
                lease,
                assignment: None,
                generation: 0,
                heartbeats: VecDeque::new(),
                unreachable: HashSet::new(),
                limits: HashMap::new(),
                refused: HashMap::new(),
                script_requests: HashMap::new(),
                reported: HashMap::new(),
            }),
            version: watch::channel(0).0,
            scripts: watch::channel(0).0,
            reports: Reports::default(),
        }
    }

    /// The boot entry of the machine with `mac` (any case), if the assignment in force names it
    /// and the lease is valid now: an appliance whose lease lapsed (a partition) must not keep
    /// serving plans the control plane may have changed since.
    pub fn boot_entry(&self, mac: &str) -> Option<BootEntry> {
        let inner = self.inner.lock();
        if !inner.lease.is_valid(Instant::now()) {
            return None;
        }
        let a = inner.assignment.clone()?;
        drop(inner);
        a.boots.get(&mac.to_ascii_lowercase()).cloned()
    }

    /// The settings.
    pub fn config(&self) -> &SiteConfig {
        &self.config
    }

    /// A receiver that sees every change of the assignment or the lease.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// The assignment in force.
    pub fn assignment(&self) -> Option<Arc<Assignment>> {
        self.inner.lock().assignment.clone()
    }

    /// Until when BMC work is allowed (local clock), if a lease is held.
    pub fn lease_valid_until(&self) -> Option<Instant> {
        self.inner.lock().lease.valid_until()
    }

    /// Whether BMC work under `epoch` is allowed now.
    pub fn check_lease(&self, epoch: u64) -> Result<(), LeaseError> {
        self.inner.lock().lease.check(epoch, Instant::now())
    }

    /// Applies a `SiteAssignment` (it replaces the previous one). Consumes it, so the only copy
    /// of the credentials is the one the drivers hold.
    pub fn apply(&self, a: pb::SiteAssignment) {
        let now = Instant::now();
        let per_bmc = usize::try_from(if a.max_requests_per_bmc > 0 {
            a.max_requests_per_bmc
        } else {
            self.config.max_requests_per_bmc
        })
        .unwrap_or(1);
        let per_site = usize::try_from(if a.max_requests_per_site > 0 {
            a.max_requests_per_site
        } else {
            self.config.max_requests_per_site
        })
        .unwrap_or(1);
        let interval = Duration::from_millis(if a.power_sync_interval_ms > 0 {
            u64::from(a.power_sync_interval_ms)
        } else {
            self.config.power_sync_interval_ms
        });
        let mut inner = self.inner.lock();
        let old = inner.assignment.take();
        let site_limit = match &old {
            Some(o) if o.site_limit.limit() == per_site.max(1) => o.site_limit.clone(),
            _ => SiteLimit::new(per_site),
        };
        if a.lease_held {
            if a.lease_ttl_ms == 0 {
                tracing::warn!(
                    "the site assignment grants the lease with a TTL of 0: it is lapsed at once"
                );
            }
            inner.lease.grant(
                a.lease_epoch,
                Duration::from_millis(u64::from(a.lease_ttl_ms)),
                now,
            );
        } else {
            inner.lease.release();
            self.reports.clear();
        }
        let mut bmcs = HashMap::new();
        let mut boots = HashMap::new();
        if a.lease_held {
            for m in a.bmcs {
                if let Some(plan) = &m.boot {
                    for mac in &plan.macs {
                        boots.insert(
                            mac.to_ascii_lowercase(),
                            BootEntry {
                                node_id: m.node_id.clone(),
                                plan: plan.clone(),
                            },
                        );
                    }
                }
                let prev = old.as_ref().and_then(|o| o.bmcs.get(&m.node_id));
                let limit = match inner.limits.get(&m.node_id) {
                    Some(l) if l.same_shape(per_bmc, &site_limit) => l.clone(),
                    _ => BmcLimit::new(per_bmc, &site_limit),
                };
                inner.limits.insert(m.node_id.clone(), limit.clone());
                let bmc = self.managed(m, prev.map(Arc::as_ref), limit);
                // Other credentials than the refused ones (a new driver) may be tried.
                for candidate in [false, true] {
                    let same = prev
                        .and_then(|p| p.driver(candidate))
                        .zip(bmc.driver(candidate));
                    let kept = matches!(same, Some((Ok(a), Ok(b))) if Arc::ptr_eq(a, b));
                    if !kept {
                        inner.refused.remove(&(bmc.node_id.clone(), candidate));
                    }
                }
                bmcs.insert(bmc.node_id.clone(), Arc::new(bmc));
            }
            inner
                .limits
                .retain(|node_id, l| bmcs.contains_key(node_id) || !l.idle());
        } else if !a.bmcs.is_empty() {
            tracing::warn!(
                bmcs = a.bmcs.len(),
                "a standby assignment came with BMCs: ignored (only the lease holder manages BMCs)"
            );
        }
        inner.generation += 1;
        inner.unreachable.retain(|n| bmcs.contains_key(n));
        inner.refused.retain(|(n, _), _| bmcs.contains_key(n));
        inner.reported.retain(|n, _| bmcs.contains_key(n));
        tracing::info!(
            site_id = %a.site_id,
            lease_held = a.lease_held,
            lease_epoch = a.lease_epoch,
            bmcs = bmcs.len(),
            sync_interval = ?interval,
            max_requests_per_bmc = per_bmc,
            max_requests_per_site = per_site,
            "site assignment applied"
        );
        inner.assignment = Some(Arc::new(Assignment {
            site_id: a.site_id,
            held: a.lease_held,
            epoch: if a.lease_held { a.lease_epoch } else { 0 },
            generation: inner.generation,
            bmcs,
            sync_interval: interval,
            site_limit,
            boots,
        }));
        drop(inner);
        // The old assignment (and the credentials in its drivers) goes once the last command
        // that still runs on it finishes.
        drop(old);
        self.bump();
    }

    /// One BMC of a new assignment, reusing `prev`'s drivers where nothing changed.
    fn managed(&self, m: pb::ManagedBmc, prev: Option<&ManagedBmc>, limit: BmcLimit) -> ManagedBmc {
        let (endpoint, driver) = self.driver(m.endpoint, prev.map(|p| (&p.endpoint, &p.driver)));
        let candidate = m.candidate.map(|c| {
            let prev_c = prev.and_then(|p| p.candidate.as_ref()).map(|(e, d)| (e, d));
            self.driver(Some(c), prev_c)
        });
        let address = match (&endpoint, &driver) {
            (_, Ok(d)) => d.address().to_owned(),
            (Some(e), Err(_)) => e.address.display(),
            (None, Err(e)) => e.to_string(),
        };
        ManagedBmc {
            node_id: m.node_id,
            address,
            endpoint,
            driver,
            candidate,
            sync_power: m.sync_power,
            limit,
        }
    }

    fn driver(
        &self,
        e: Option<pb::BmcEndpoint>,
        prev: Option<(&Option<Endpoint>, &Driver)>,
    ) -> (Option<Endpoint>, Driver) {
        let Some(e) = e else {
            let err = BmcError::Faulty {
                address: "(none)".to_owned(),
                detail: "the assignment gives no endpoint for this node".to_owned(),
            };
            return (None, Err(err));
        };
        let endpoint = match Endpoint::from_pb(e) {
            Ok(ep) => ep,
            Err(err) => return (None, Err(BmcError::Address(err))),
        };
        if let Some((Some(pe), Ok(pd))) = prev
            && *pe == endpoint
        {
            return (Some(endpoint), Ok(Arc::clone(pd)));
        }
        let driver = self.connector.connect(&endpoint);
        (Some(endpoint), driver)
    }

    /// Records that heartbeat `seq` was sent now.
    pub fn heartbeat_sent(&self, seq: u64) {
        let mut inner = self.inner.lock();
        inner.heartbeats.push_back((seq, Instant::now()));
        while inner.heartbeats.len() > HEARTBEATS_KEPT {
            inner.heartbeats.pop_front();
        }
    }

    /// A `HeartbeatAck`: a renewal (dated by when its heartbeat was sent here) or a loss.
    pub fn heartbeat_acked(&self, ack: &pb::HeartbeatAck) {
        let mut inner = self.inner.lock();
        let Some(sent_at) = inner
            .heartbeats
            .iter()
            .find(|(s, _)| *s == ack.seq)
            .map(|(_, t)| *t)
        else {
            // Not sent by this process (or too long ago): cannot be dated, so it renews nothing.
            return;
        };
        let was_valid = inner.lease.is_valid(Instant::now());
        if !inner
            .lease
            .acknowledged(sent_at, ack.site_lease_expires_at_ms)
        {
            return;
        }
        let valid = inner.lease.is_valid(Instant::now());
        drop(inner);
        if was_valid && !valid {
            tracing::warn!(
                "the control plane no longer counts this site agent as the lease holder: BMC work stopped"
            );
            self.reports.clear();
        } else if !was_valid && valid {
            tracing::info!("site lease renewed after it had lapsed: BMC work resumes");
        }
        self.bump();
    }

    /// The boot service saw the machine of `node_id` ask for its script from `mac`.
    pub fn note_script_request(&self, node_id: &str, mac: &str) {
        self.inner
            .lock()
            .script_requests
            .insert(node_id.to_owned(), (Instant::now(), mac.to_owned()));
        self.scripts.send_modify(|v| *v += 1);
    }

    /// Waits until the machine of `node_id` asks for its script after `since`, at most until
    /// `until`; the MAC it asked from.
    pub async fn script_requested(
        &self,
        node_id: &str,
        since: Instant,
        until: Instant,
    ) -> Option<String> {
        let mut rx = self.scripts.subscribe();
        loop {
            let seen = self
                .inner
                .lock()
                .script_requests
                .get(node_id)
                .filter(|(t, _)| *t >= since)
                .map(|(_, mac)| mac.clone());
            if seen.is_some() {
                return seen;
            }
            match tokio::time::timeout_at(until, rx.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// The MACs the boot service answers for `node_id` (the machine's boot plan).
    pub fn boot_macs(&self, node_id: &str) -> Vec<String> {
        let Some(a) = self.assignment() else {
            return Vec::new();
        };
        let mut macs: Vec<String> = a
            .boots
            .iter()
            .filter(|(_, e)| e.node_id == node_id)
            .map(|(m, _)| m.clone())
            .collect();
        macs.sort();
        macs
    }

    /// What was last reported of `node_id`'s power.
    pub fn reported(&self, node_id: &str) -> Option<PowerKey> {
        self.inner.lock().reported.get(node_id).cloned()
    }

    /// Records `key` as reported for `node_id` (the sync loop's report, a power command's
    /// result).
    pub fn note_power(&self, node_id: &str, key: PowerKey) {
        self.inner.lock().reported.insert(node_id.to_owned(), key);
    }

    /// When the credentials of `node_id` (the candidate ones with `candidate`) were refused.
    pub fn refusal(&self, node_id: &str, candidate: bool) -> Option<Refusal> {
        self.inner
            .lock()
            .refused
            .get(&(node_id.to_owned(), candidate))
            .copied()
    }

    /// Lets the refused credentials of `node_id` be tried once more (a rotation after the
    /// lockout window).
    pub fn forget_refusal(&self, node_id: &str, candidate: bool) {
        self.inner
            .lock()
            .refused
            .remove(&(node_id.to_owned(), candidate));
    }

    /// Closes every driver of the assignment (their sessions at the BMCs), each within
    /// `limit`: the site agent stops.
    pub async fn close(&self, limit: Duration) {
        let Some(a) = self.assignment() else {
            return;
        };
        let mut drivers = Vec::new();
        for b in a.bmcs.values() {
            for candidate in [false, true] {
                if let Some(Ok(d)) = b.driver(candidate) {
                    drivers.push(Arc::clone(d));
                }
            }
        }
        let mut closing = tokio::task::JoinSet::new();
        for d in drivers {
            closing.spawn(async move {
                let _ = tokio::time::timeout(limit, d.close()).await;
            });
        }
        while closing.join_next().await.is_some() {}
    }

    /// Records a poll's outcome for the status (which BMCs do not answer).
    pub fn note_reachable(&self, node_id: &str, reachable: bool) {
        let mut inner = self.inner.lock();
        if reachable {
            inner.unreachable.remove(node_id);
        } else {
            inner.unreachable.insert(node_id.to_owned());
        }
    }

    /// What the status shows.
    pub fn view(&self) -> SiteView {
        let inner = self.inner.lock();
        let now = Instant::now();
        let a = inner.assignment.as_ref();
        SiteView {
            site_id: a.map(|a| a.site_id.clone()),
            lease_epoch: inner.lease.epoch(),
            lease_valid: inner.lease.is_valid(now),
            lease_left: inner
                .lease
                .valid_until()
                .map(|t| t.saturating_duration_since(now)),
            bmcs: a.map_or(0, |a| a.bmcs.len()),
            unreachable: inner.unreachable.len(),
        }
    }

    /// Runs `op` on the BMC of `node_id` under lease `epoch` (see the module docs), with the
    /// candidate credentials when `candidate`.
    pub async fn with_bmc<T, F>(
        &self,
        epoch: u64,
        node_id: &str,
        candidate: bool,
        op: F,
    ) -> Result<T, CommandFailure>
    where
        F: for<'a> FnOnce(&'a dyn Bmc) -> crate::bmc::BmcFuture<'a, T> + Send + 'static,
        T: Send + 'static,
    {
        self.check_lease(epoch).map_err(|e| lease_lost(&e))?;
        let assignment = self.assignment().ok_or_else(|| {
            CommandFailure::new(CommandErrorCode::LeaseLost, "no site assignment yet")
        })?;
        let bmc = assignment.bmcs.get(node_id).cloned().ok_or_else(|| {
            CommandFailure::new(
                CommandErrorCode::BmcUnknown,
                format!("node {node_id} is not among the BMCs assigned to this site agent"),
            )
        })?;
        let driver = match bmc.driver(candidate) {
            Some(Ok(d)) => Arc::clone(d),
            Some(Err(e)) => return Err(e.to_failure()),
            None => {
                return Err(CommandFailure::new(
                    CommandErrorCode::BmcUnknown,
                    format!("node {node_id} has no candidate credentials in the assignment"),
                ));
            }
        };
        if let Some(r) = self.refusal(node_id, candidate) {
            return Err(CommandFailure::new(
                CommandErrorCode::BmcAuthFailed,
                format!(
                    "BMC {} refused these credentials at {}: they are not sent again (a BMC locks the account after a few refusals) until new ones arrive (nodes.updateBmcCredentials)",
                    bmc.address,
                    when(r.wall_ms)
                ),
            ));
        }
        let limit = self.config.operation_timeout();
        let linger = self.config.request_timeout();
        let timed_out = || {
            CommandFailure::new(
                CommandErrorCode::BmcUnreachable,
                format!("BMC {} did not finish within {limit:?}", bmc.address),
            )
        };
        let deadline = Instant::now() + limit;
        let permit = tokio::time::timeout_at(deadline, bmc.limit.acquire())
            .await
            .map_err(|_| timed_out())?;
        // The lease may have lapsed (or changed hands) while this waited for its turn.
        self.check_lease(epoch).map_err(|e| lease_lost(&e))?;
        // The operation runs in its own task that holds the BMC's permit until its requests are
        // over at the BMC, even when this caller stops waiting (a cancelled command, a sync
        // round cut short) or the driver gave up on a request: the BMC is still serving it, and
        // a permit freed early let a new operation in beside it (issue 14, issue 31 rule 7).
        // The task is bounded by the same deadline, plus one request timeout when it ran into
        // it.
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let _permit = permit;
            let r = tokio::time::timeout_at(deadline, op(driver.as_ref())).await;
            let cut = r.is_err();
            let _ = tx.send(r);
            let busy = if cut {
                Some(Instant::now() + linger)
            } else {
                driver.busy_until()
            };
            if let Some(t) = busy {
                tokio::time::sleep_until(t).await;
            }
        });
        let r = match rx.await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err(timed_out()),
            Err(e) => {
                return Err(CommandFailure::new(
                    CommandErrorCode::BmcError,
                    format!("the operation on BMC {} ended abnormally: {e}", bmc.address),
                ));
            }
        };
        r.map_err(|e| {
            if e.is_auth() {
                let r = Refusal::now();
                tracing::warn!(node_id = %node_id, candidate, bmc = %bmc.address, "the BMC refused the credentials: they are not sent again until new ones arrive");
                self.inner
                    .lock()
                    .refused
                    .insert((node_id.to_owned(), candidate), r);
            }
            e.to_failure()
        })
    }
}
