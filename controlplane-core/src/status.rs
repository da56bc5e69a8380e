//! `controlPlane.status` (issue 17): which replica answered, which replica runs the controllers
//! (the store's controller lease, [`cpl_store::CONTROLLERS_LEASE`]), and how the fleet's
//! sessions spread over the replicas. Read in one read transaction; on SQLite there is one
//! replica and it leads once its leadership loop first claimed the lease.

use cpl_store::{CONTROLLERS_LEASE, ControllerLease, Reader};
use serde::Serialize;
use utoipa::ToSchema;

use crate::conditions::rfc3339_ms;
use crate::error::OpError;

/// The replica answering, as `bcctl serve` started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaIdentity {
    /// Its gateway id (`gw-` and 8 hex digits, new at every start): what the sessions' rows and
    /// the controller lease name it by.
    pub id: String,
    /// Its gateway URL.
    pub gateway_url: String,
}

/// `controlPlane.status` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneStatus {
    /// The replica that answered (its gateway id).
    pub replica_id: String,
    /// Its gateway URL.
    pub gateway_url: String,
    /// True when the answering replica holds the controller lease and it has not lapsed.
    pub leads: bool,
    /// The store: `sqlite` (the state dir's state.db) or `postgres`.
    pub store: String,
    /// controlplane-lite's version.
    pub version: String,
    /// The controller lease; absent until a replica first took it.
    pub controllers: Option<ControllersView>,
    /// Connected nodes per replica, by the sessions' rows, most first. A replica holding no
    /// session is not listed.
    pub replicas: Vec<ReplicaSessions>,
    /// Nodes in the store.
    pub nodes: u64,
    /// Nodes `connected` (through any replica).
    pub connected: u64,
}

/// The controller lease as `controlPlane.status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllersView {
    /// The replica holding it (gateway id).
    pub holder: String,
    /// 1 for the first holder, one more for each new one: how many times leadership moved, + 1.
    pub epoch: u64,
    /// When this holder took it (RFC 3339, ms).
    pub since: String,
    /// When it lapses unless renewed (RFC 3339, ms).
    pub expires_at: String,
    /// False once `expiresAt` has passed: nobody leads until a replica claims it again.
    pub live: bool,
}

/// Sessions one replica holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSessions {
    /// Its gateway id.
    pub replica_id: String,
    /// Nodes connected through it.
    pub connected: u64,
}

fn view(lease: &ControllerLease, now_ms: i64) -> ControllersView {
    ControllersView {
        holder: lease.holder.clone(),
        epoch: lease.epoch,
        since: rfc3339_ms(lease.acquired_at),
        expires_at: rfc3339_ms(lease.expires_at),
        live: lease.expires_at > now_ms,
    }
}

/// Reads the status as `replica` sees it at `now_ms` (ms since the Unix epoch); `store` is the
/// backend's name ([`cpl_store::Store::backend_name`]). Errors: the store's.
pub fn read(
    r: &Reader<'_>,
    replica: &ReplicaIdentity,
    store: &str,
    now_ms: i64,
) -> Result<ControlPlaneStatus, OpError> {
    let lease = r.controller_lease(CONTROLLERS_LEASE)?;
    let controllers = lease.as_ref().map(|l| view(l, now_ms));
    let leads = controllers
        .as_ref()
        .is_some_and(|c| c.live && c.holder == replica.id);
    let replicas = r
        .sessions_per_gateway()?
        .into_iter()
        .map(|(replica_id, connected)| ReplicaSessions {
            replica_id,
            connected,
        })
        .collect();
    let connectivity = r.connectivity_counts()?;
    let nodes = connectivity.iter().map(|(_, n)| *n).sum::<i64>();
    let connected = connectivity
        .iter()
        .filter(|(c, _)| c == "connected")
        .map(|(_, n)| *n)
        .sum::<i64>();
    Ok(ControlPlaneStatus {
        replica_id: replica.id.clone(),
        gateway_url: replica.gateway_url.clone(),
        leads,
        store: store.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        controllers,
        replicas,
        nodes: u64::try_from(nodes).unwrap_or(0),
        connected: u64::try_from(connected).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_utils::TestResult;

    fn me() -> ReplicaIdentity {
        ReplicaIdentity {
            id: "gw-a".into(),
            gateway_url: "https://127.0.0.1:7443".into(),
        }
    }

    #[test]
    fn says_who_leads_until_the_lease_lapses() -> TestResult {
        let store = cpl_store::testing::store()?;
        let before = store.read_blocking(|r| read(r, &me(), "sqlite", 1_000))?;
        assert_eq!((before.controllers.clone(), before.leads), (None, false));
        assert_eq!((before.nodes, before.connected), (0, 0));
        assert!(before.replicas.is_empty());

        store.write_blocking(|tx| {
            tx.claim_controller_lease(CONTROLLERS_LEASE, "gw-b", 1_000, 5_000)
        })?;
        let s = store.read_blocking(|r| read(r, &me(), "sqlite", 2_000))?;
        let c = s.controllers.clone().ok_or("no lease shown")?;
        assert_eq!((c.holder.as_str(), c.epoch, c.live), ("gw-b", 1, true));
        assert_eq!(c.expires_at, "1970-01-01T00:00:06.000Z");
        assert!(!s.leads, "another replica holds it");

        store.write_blocking(|tx| {
            tx.claim_controller_lease(CONTROLLERS_LEASE, "gw-a", 7_000, 5_000)
        })?;
        let s = store.read_blocking(|r| read(r, &me(), "sqlite", 8_000))?;
        assert!(s.leads);
        assert_eq!(s.controllers.as_ref().map(|c| c.epoch), Some(2));
        // Past its expiry nobody leads, whoever held it last.
        let s = store.read_blocking(|r| read(r, &me(), "sqlite", 12_000))?;
        assert!(!s.leads);
        assert_eq!(s.controllers.map(|c| c.live), Some(false));
        Ok(())
    }
}
