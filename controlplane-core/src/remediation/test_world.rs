//! A store, a pool with a remediation policy, hosts with GPUs, scripted live sessions and the
//! controller, for the remediation tests: faults are set as Health sets them, commands end as
//! an agent's updates end them (through the Commands controller and its router).

use std::collections::HashSet;
use std::sync::Arc;

use bc_protocol::commands::diag::{CheckStatus, DiagReport, GpuReport};
use bc_protocol::commands::reset::{GpuResetResult, GpuSnapshot, ResetReport};
use bc_protocol::commands::xid::{RecommendedAction, XidClass, XidEvent, XidSource};
use bc_protocol::pb::{CommandUpdate, ErrorInfo, GatewayMessage, GoodbyeReason};
use bc_protocol::{CommandName, PoolKind};
use cpl_store::{
    CommandRecord, NodeEvent, NodeRecord, Pool, RemediationMode, RemediationPolicy,
    RemediationRecord, Store, StoreError,
};
use parking_lot::Mutex;
use serde_json::Value;

use super::{PassReport, Remediation, RemediationConfig};
use crate::commands::Commands;
use crate::conditions::apply;
use crate::edit::Edit;
use crate::port::{AgentSessions, PortFuture};

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;
pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Sessions every listed node has.
#[derive(Debug, Default)]
pub(crate) struct Live(pub Mutex<HashSet<String>>);

impl AgentSessions for Live {
    fn live_epoch(&self, node_id: &str) -> Option<u64> {
        self.0.lock().contains(node_id).then_some(1)
    }
    fn send<'a>(&'a self, node_id: &'a str, _msg: GatewayMessage) -> PortFuture<'a, bool> {
        let live = self.live_epoch(node_id).is_some();
        Box::pin(async move { live })
    }
    fn close(&self, _: &str, _: GoodbyeReason, _: &str) -> Option<u64> {
        None
    }
}

pub(crate) struct World {
    pub store: Store,
    pub live: Arc<Live>,
    pub rem: Remediation,
    pub pool: String,
}

/// `policy` with `mode: auto` unless it names one.
pub(crate) fn auto(policy: RemediationPolicy) -> RemediationPolicy {
    RemediationPolicy {
        mode: policy.mode.or(Some(RemediationMode::Auto)),
        ..policy
    }
}

pub(crate) fn world(policy: RemediationPolicy) -> Res<World> {
    let store = cpl_store::testing::store()?;
    let live = Arc::new(Live::default());
    let commands = Commands {
        store: store.clone(),
        sessions: Arc::clone(&live) as Arc<dyn AgentSessions>,
    };
    let rem = Remediation::new(commands, RemediationConfig::default());
    let pool = store.write_blocking(|tx| {
        let p = crate::test_utils::pool(tx, PoolKind::MetalHost, None)?;
        let req = super::view::PoolRemediationRequest {
            pool_id: p.id.clone().into(),
            version: p.version,
            remediation: policy,
        };
        super::view::set_policy(tx, &req)
    })?;
    Ok(World {
        store,
        live,
        rem,
        pool: pool.id,
    })
}

/// The bus id of GPU `i` of a test host (`crate::test_utils::ready_host`).
pub(crate) fn bus(i: usize) -> String {
    format!("0000:{:02x}:00.0", i + 1)
}

impl World {
    /// A schedulable host of the pool with `gpus` GPUs (`GPU-<id>-<i>` at [`bus`]`(i)`).
    pub fn host(&self, id: &str, gpus: usize) -> Res<NodeRecord> {
        let pool = self.pool.clone();
        let n = self.store.write_blocking(|tx| {
            crate::test_utils::node(tx, id, Some(&pool))?;
            crate::test_utils::ready_host(tx, id, gpus)
        })?;
        self.live.0.lock().insert(id.to_owned());
        Ok(n)
    }

    /// `host` for every id, in one write transaction: on PostgreSQL each commit waits for its
    /// WAL flush, and a thousand of them took minutes.
    pub fn hosts(&self, ids: &[String], gpus: usize) -> TestResult {
        let pool = self.pool.clone();
        self.store.write_blocking(|tx| {
            for id in ids {
                crate::test_utils::node(tx, id, Some(&pool))?;
                crate::test_utils::ready_host(tx, id, gpus)?;
            }
            Ok::<(), cpl_store::StoreError>(())
        })?;
        self.live.0.lock().extend(ids.iter().cloned());
        Ok(())
    }

    pub fn node(&self, id: &str) -> Res<NodeRecord> {
        Ok(self
            .store
            .read_blocking(|r| r.node(id))?
            .ok_or("node vanished")?)
    }

    pub fn pool(&self) -> Res<Pool> {
        let id = self.pool.clone();
        Ok(self
            .store
            .read_blocking(|r| r.pool(&id))?
            .ok_or("pool vanished")?)
    }

    pub fn events(&self, id: &str) -> Res<Vec<NodeEvent>> {
        Ok(self.store.read_blocking(|r| r.events(id))?)
    }

    /// The node's open remediation.
    pub fn open(&self, id: &str) -> Res<Option<RemediationRecord>> {
        Ok(self.store.read_blocking(|r| r.open_remediation(id))?)
    }

    /// The node's newest remediation.
    pub fn last(&self, id: &str) -> Res<RemediationRecord> {
        let f = cpl_store::RemediationFilter {
            node_id: Some(id.to_owned()),
            limit: 1,
            ..Default::default()
        };
        let r = self.store.read_blocking(|r| r.remediations(&f))?;
        Ok(r.into_iter().next().ok_or("no remediation")?)
    }

    /// The node's commands, oldest first.
    pub fn commands(&self, id: &str) -> Res<Vec<CommandRecord>> {
        let mut c = self.store.read_blocking(|r| r.commands(Some(id), 1000))?;
        c.reverse();
        Ok(c)
    }

    /// The node's open command named `name`.
    pub fn open_command(&self, id: &str, name: CommandName) -> Res<CommandRecord> {
        Ok(self
            .commands(id)?
            .into_iter()
            .find(|c| c.name == name && !c.state.is_final())
            .ok_or_else(|| format!("no open {name} on {id}"))?)
    }

    /// An XID `xid` on GPU `bus` as the agent reports it (Health's condition), at once.
    pub fn xid(&self, id: &str, n: u64, bus: &str) -> TestResult {
        let event = xid_event(n, Some(bus));
        self.store.write_blocking(|tx| {
            let mut edit = Edit::report(tx, id, "Health")?;
            if let Some(u) = crate::health::xid_update(&edit.node.conditions, &event) {
                apply(&mut edit, &u);
            }
            edit.save(tx).map(|_| ())
        })?;
        Ok(())
    }

    /// `xid` on every node of `ids`, in one write transaction (see `hosts`).
    pub fn xids(&self, ids: &[&String], n: u64, bus: &str) -> TestResult {
        let event = xid_event(n, Some(bus));
        self.store.write_blocking(|tx| {
            for id in ids {
                let mut edit = Edit::report(tx, id, "Health")?;
                if let Some(u) = crate::health::xid_update(&edit.node.conditions, &event) {
                    apply(&mut edit, &u);
                }
                edit.save(tx)?;
            }
            Ok::<(), crate::OpError>(())
        })?;
        Ok(())
    }

    pub async fn pass(&self, now: i64) -> PassReport {
        self.rem.pass(now).await
    }

    /// Ends command `c` as its agent would: succeeded with `result`, or failed.
    pub async fn finish(&self, c: &CommandRecord, result: Option<Value>) -> TestResult {
        let u = match result {
            Some(r) => CommandUpdate {
                id: c.id.clone(),
                state: bc_protocol::pb::CommandState::Succeeded as i32,
                progress: 100,
                result_json: serde_json::to_vec(&r)?,
                error: None,
            },
            None => CommandUpdate {
                id: c.id.clone(),
                state: bc_protocol::pb::CommandState::Failed as i32,
                progress: 100,
                result_json: Vec::new(),
                error: Some(ErrorInfo {
                    code: "RESET_FAILED".into(),
                    message: "nvidia-smi -r failed".into(),
                }),
            },
        };
        self.rem
            .commands
            .update(&c.node_id, u)
            .await
            .ok_or("the update was not applied")?;
        Ok(())
    }

    /// The node's session opened again at `at` (after a reboot or a power cycle).
    pub fn reconnected(&self, id: &str, at: i64) -> Result<NodeRecord, StoreError> {
        self.store.write_blocking(|tx| {
            crate::test_utils::force(tx, id, |n| {
                n.connectivity = bc_protocol::Connectivity::Connected;
                n.connected_at = Some(at);
            })
        })
    }
}

pub(crate) fn xid_event(n: u64, bus: Option<&str>) -> XidEvent {
    let class = XidClass::of(n);
    XidEvent {
        xid: n,
        pci_bus_id: bus.map(str::to_owned),
        uuid: None,
        class,
        action: class.action(),
        description: None,
        message: None,
        pid: None,
        source: XidSource::Kmsg,
        observed_at: chrono::DateTime::from_timestamp(0, 0).unwrap_or_default(),
        driver_message: false,
    }
}

/// A `diag.nvml` result of `gpus` GPUs: those in `failing` fail with `resetGpu`.
pub(crate) fn diag(gpus: usize, failing: &[&str]) -> Value {
    let reports: Vec<GpuReport> = (0..gpus)
        .map(|i| {
            let b = bus(i);
            let fails = failing.contains(&b.as_str());
            GpuReport {
                index: u32::try_from(i).unwrap_or(0),
                uuid: format!("GPU-{i}"),
                pci_bus_id: b,
                name: "NVIDIA H100 80GB HBM3".into(),
                checks: Vec::new(),
                verdict: if fails {
                    CheckStatus::Fail
                } else {
                    CheckStatus::Pass
                },
                action: if fails {
                    RecommendedAction::ResetGpu
                } else {
                    RecommendedAction::None
                },
            }
        })
        .collect();
    let verdict = if failing.is_empty() {
        CheckStatus::Pass
    } else {
        CheckStatus::Fail
    };
    serde_json::to_value(DiagReport {
        nvml_available: true,
        unavailable_reason: None,
        driver_version: None,
        nvml_version: None,
        node_checks: Vec::new(),
        gpus: reports,
        verdict,
        action: if failing.is_empty() {
            RecommendedAction::None
        } else {
            RecommendedAction::ResetGpu
        },
        summary: format!("{} of {gpus} GPUs fail", failing.len()),
    })
    .unwrap_or_default()
}

/// A `gpu.reset` result that verified `verified` (a GPU named in `failed` has a problem).
pub(crate) fn reset(verified: &[&str], failed: &[&str]) -> Value {
    let snap = GpuSnapshot {
        uuid: "GPU-x".into(),
        persistence_mode: true,
        volatile_corrected_ecc: Some(0),
        volatile_uncorrected_ecc: Some(0),
        recovery_action: None,
    };
    let gpu = |b: &str, problems: Vec<String>| GpuResetResult {
        pci_bus_id: b.to_owned(),
        requested: true,
        before: snap.clone(),
        after: Some(snap.clone()),
        persistence_mode_restored: Some(true),
        problems,
    };
    serde_json::to_value(ResetReport {
        gpus: verified
            .iter()
            .map(|b| gpu(b, Vec::new()))
            .chain(
                failed
                    .iter()
                    .map(|b| gpu(b, vec!["ECC errors remain".into()])),
            )
            .collect(),
        nvidia_smi_output: String::new(),
        verified: failed.is_empty(),
    })
    .unwrap_or_default()
}

/// The condition `t` of `n`.
pub(crate) fn condition(n: &NodeRecord, t: &str) -> Option<bc_protocol::Condition> {
    n.conditions.iter().find(|c| c.type_ == t).cloned()
}
