//! Builders for core tests: a store with a site, a pool and nodes in chosen states, written
//! through the store's typed primitives (no SQL here).

use bc_protocol::{Connectivity, PoolAgent, PoolKind, ProvisionState, SiteKind};
use cpl_store::{HardwareProfile, NewNode, NodeRecord, Pool, Site, StoreError, Tx, now_ms};

use crate::error::OpError;
use crate::ops::pools::{self, NewPool};
use crate::ops::sites::{self, NewSite};

pub(crate) type TestResult = Result<(), Box<dyn std::error::Error>>;

pub(crate) fn site(tx: &Tx<'_>, kind: SiteKind, owner: Option<&str>) -> Result<Site, OpError> {
    sites::create(
        tx,
        &NewSite {
            name: "s".into(),
            kind,
            owner_tenant_id: owner.map(Into::into),
        },
    )
}

pub(crate) fn pool(tx: &Tx<'_>, kind: PoolKind, owner: Option<&str>) -> Result<Pool, OpError> {
    pools::create(
        tx,
        &NewPool {
            name: "p".into(),
            kind,
            agent: PoolAgent::Bcd,
            site_id: None,
            owner_tenant_id: owner.map(Into::into),
            hardware_profile: HardwareProfile::default(),
            acceptance: Default::default(),
        },
    )
}

/// A host node in `pool_id`, freshly joined (`adopting`), hostname = id.
pub(crate) fn node(tx: &Tx<'_>, id: &str, pool_id: Option<&str>) -> Result<NodeRecord, StoreError> {
    tx.insert_node(
        &NewNode {
            pool_id: pool_id.map(str::to_owned),
            hostname: Some(id.to_owned()),
            ..cpl_store::testing::new_node(id)
        },
        now_ms(),
    )?;
    tx.node(id)?
        .ok_or_else(|| StoreError::Task(format!("node {id} vanished")))
}

/// Overwrites fields of `id` as `f` sets them, without an event or a version bump: these columns
/// belong to other writers, whose paths the test is not about.
pub(crate) fn force(
    tx: &Tx<'_>,
    id: &str,
    f: impl FnOnce(&mut NodeRecord),
) -> Result<NodeRecord, StoreError> {
    let before = tx
        .node(id)?
        .ok_or_else(|| StoreError::Task(format!("node {id} vanished")))?;
    let mut after = before.clone();
    f(&mut after);
    tx.update_node(&before, &after, false, now_ms())?;
    tx.node(id)?
        .ok_or_else(|| StoreError::Task(format!("node {id} vanished")))
}

/// Makes `id` schedulable the way the controllers would (adopted, converged, connected) and gives
/// it `gpus` GPUs in its inventory.
pub(crate) fn ready_host(tx: &Tx<'_>, id: &str, gpus: usize) -> Result<NodeRecord, StoreError> {
    let inv = serde_json::json!({
        "schemaVersion": 1,
        "gpus": (0..gpus).map(|i| serde_json::json!({"uuid": format!("GPU-{id}-{i}"), "pciBusId": format!("0000:{:02x}:00.0", i + 1), "source": "nvml"})).collect::<Vec<_>>()
    });
    force(tx, id, |n| {
        n.provision_state = ProvisionState::Adopted;
        n.observed_generation = 1;
        n.connectivity = Connectivity::Connected;
        n.inventory_json = Some(inv.to_string());
    })
}

/// `store.with(|c| ...)`: a test body in one write transaction.
pub(crate) trait StoreExt {
    fn with<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, StoreError>) -> Result<T, StoreError>;
}

impl StoreExt for cpl_store::Store {
    fn with<T>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, StoreError>) -> Result<T, StoreError> {
        self.write_blocking(f)
    }
}

/// An operation in its own (nested) transaction: undone when it fails, as a verb's own write
/// transaction would be.
pub(crate) fn write_tx<T>(
    tx: &Tx<'_>,
    f: impl FnOnce(&Tx<'_>) -> Result<T, OpError>,
) -> Result<T, OpError> {
    tx.savepoint(f)
}

/// Reads of the store as the tests use them.
pub(crate) mod nodes {
    use cpl_store::{NodeRecord, Reader, StoreError};

    pub(crate) fn get(r: &Reader<'_>, id: &str) -> Result<Option<NodeRecord>, StoreError> {
        r.node(id)
    }
}

/// See [`nodes`].
pub(crate) mod events {
    pub(crate) use cpl_store::NodeEvent;
    use cpl_store::{Reader, StoreError};

    pub(crate) fn list(r: &Reader<'_>, id: &str) -> Result<Vec<NodeEvent>, StoreError> {
        r.events(id)
    }
}

/// See [`nodes`].
pub(crate) mod taints {
    use cpl_store::{Reader, StoreError, Taint};

    pub(crate) fn list(r: &Reader<'_>, id: &str) -> Result<Vec<Taint>, StoreError> {
        r.taints(id)
    }
}
