//! The controllers' lease (issue 17): which replica runs Liveness, NodeLifecycle, the deadlines
//! and the bare-metal controllers. One row per lease name; a replica holds it until
//! `expires_at` unless it renews; another takes it once it has expired. `epoch` goes up with
//! every new holder, so a replica can tell it lost the lease and got it back.
use serde::Serialize;

use crate::db::OptionalExt;
use crate::params;

use super::{Reader, StoreError, Tx};

/// The name of the lease the controllers run under (`bcctl serve`'s leadership loop,
/// `controlPlane.status`).
pub const CONTROLLERS_LEASE: &str = "controllers";

/// A lease row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerLease {
    pub name: String,
    /// The replica holding it (its gateway id, `gw-…`).
    pub holder: String,
    /// 1 for the first holder, one more for each new one.
    pub epoch: u64,
    /// Milliseconds since the Unix epoch: when this holder took it.
    pub acquired_at: i64,
    /// Milliseconds since the Unix epoch: it lapses then unless renewed.
    pub expires_at: i64,
}

impl Reader<'_> {
    /// The lease `name`, if it was ever taken.
    pub fn controller_lease(&self, name: &str) -> Result<Option<ControllerLease>, StoreError> {
        self.db()
            .query_row(
                "SELECT name, holder, epoch, acquired_at, expires_at FROM controller_leases \
                 WHERE name = ?1",
                params![name],
                |r| {
                    Ok(ControllerLease {
                        name: r.get(0)?,
                        holder: r.get(1)?,
                        epoch: r.get(2)?,
                        acquired_at: r.get(3)?,
                        expires_at: r.get(4)?,
                    })
                },
            )
            .optional()
    }
}

impl Tx<'_> {
    /// `holder` takes or renews the lease `name` at `now` for `ttl_ms`: renewed when it holds it,
    /// taken (epoch + 1) when nobody does or the holder's time ran out, left alone otherwise.
    /// Returns the lease as it is afterwards: `holder` leads when `lease.holder == holder`.
    ///
    /// One statement (an upsert whose update applies only to the holder or a lapsed lease), so
    /// it is atomic without a transaction: [`crate::Store::claim_controller_lease`] runs it so.
    pub fn claim_controller_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<ControllerLease, StoreError> {
        let expires = now.saturating_add(ttl_ms);
        // SET reads the row as it was: a renewal keeps epoch and acquired_at, a takeover bumps
        // the one and resets the other.
        self.db().execute(
            "INSERT INTO controller_leases (name, holder, epoch, acquired_at, expires_at) \
             VALUES (?1, ?2, 1, ?3, ?4) \
             ON CONFLICT (name) DO UPDATE SET \
               epoch = CASE WHEN controller_leases.holder = excluded.holder \
                 THEN controller_leases.epoch ELSE controller_leases.epoch + 1 END, \
               acquired_at = CASE WHEN controller_leases.holder = excluded.holder \
                 THEN controller_leases.acquired_at ELSE excluded.acquired_at END, \
               holder = excluded.holder, \
               expires_at = excluded.expires_at \
             WHERE controller_leases.holder = excluded.holder \
               OR controller_leases.expires_at <= excluded.acquired_at",
            params![name, holder, now, expires],
        )?;
        self.controller_lease(name)?
            .ok_or_else(|| StoreError::Task(format!("controller lease {name} vanished")))
    }

    /// `holder` gives the lease up (a clean shutdown): it expires now, so another replica takes
    /// it at its next try instead of after the lease's time.
    pub fn release_controller_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
    ) -> Result<(), StoreError> {
        self.db().execute(
            "UPDATE controller_leases SET expires_at = ?3 WHERE name = ?1 AND holder = ?2",
            params![name, holder, now],
        )?;
        Ok(())
    }
}

impl crate::Store {
    /// Runs the lease's single statements: on SQLite in a write transaction, on PostgreSQL each
    /// on its own (autocommit), outside the write lock and this replica's queue of writers, so a
    /// leader renews in time while a storm of writes waits.
    fn lease_blocking<T>(
        &self,
        f: impl FnOnce(&Tx<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.backend {
            crate::Backend::Sqlite(_) => self.write_blocking(f),
            crate::Backend::Postgres(pg) => pg.autocommit(|s| f(&Tx::on_pg(s))),
        }
    }

    /// [`Tx::claim_controller_lease`], outside the write lock (see [`Self::lease_blocking`]), on
    /// tokio's blocking pool.
    pub async fn claim_controller_lease(
        &self,
        name: &'static str,
        holder: String,
        now: i64,
        ttl_ms: i64,
    ) -> Result<ControllerLease, StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            store.lease_blocking(|tx| tx.claim_controller_lease(name, &holder, now, ttl_ms))
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }

    /// [`Tx::release_controller_lease`], outside the write lock, on tokio's blocking pool.
    pub async fn release_controller_lease(
        &self,
        name: &'static str,
        holder: String,
        now: i64,
    ) -> Result<(), StoreError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || {
            store.lease_blocking(|tx| tx.release_controller_lease(name, &holder, now))
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_taken_over_after_it_lapses() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            let a = tx.claim_controller_lease("controllers", "gw-a", 1_000, 5_000)?;
            assert_eq!(
                (a.holder.as_str(), a.epoch, a.expires_at),
                ("gw-a", 1, 6_000)
            );
            // B cannot take it while A's time runs.
            let b = tx.claim_controller_lease("controllers", "gw-b", 3_000, 5_000)?;
            assert_eq!((b.holder.as_str(), b.epoch), ("gw-a", 1));
            // A renews: same epoch, later expiry.
            let a = tx.claim_controller_lease("controllers", "gw-a", 4_000, 5_000)?;
            assert_eq!(
                (a.holder.as_str(), a.epoch, a.expires_at),
                ("gw-a", 1, 9_000)
            );
            // A goes silent; at its expiry B takes over with the next epoch.
            let b = tx.claim_controller_lease("controllers", "gw-b", 9_000, 5_000)?;
            assert_eq!(
                (b.holder.as_str(), b.epoch, b.acquired_at),
                ("gw-b", 2, 9_000)
            );
            // A coming back finds B holding it.
            let a = tx.claim_controller_lease("controllers", "gw-a", 9_500, 5_000)?;
            assert_eq!(a.holder, "gw-b");
            // B gives it up on shutdown: A takes it at once.
            tx.release_controller_lease("controllers", "gw-b", 10_000)?;
            let a = tx.claim_controller_lease("controllers", "gw-a", 10_000, 5_000)?;
            assert_eq!((a.holder.as_str(), a.epoch), ("gw-a", 3));
            // Another lease name is independent.
            assert!(tx.controller_lease("other")?.is_none());
            Ok(())
        })
    }

    /// On PostgreSQL a claim does not queue behind writers: it completes while another write
    /// transaction holds the write lock (on SQLite one connection serializes everything, and one
    /// process needs no lease race).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_postgres_a_claim_goes_past_a_held_write_lock() -> Result<(), StoreError> {
        if !crate::testing::on_postgres() {
            return Ok(());
        }
        let store = crate::testing::store()?;
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let (claimed_tx, claimed_rx) = std::sync::mpsc::channel::<()>();
        let writer = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || {
                store.write_blocking(|tx| {
                    tx.db()
                        .execute("UPDATE controller_leases SET expires_at = 0", params![])?;
                    let _ = held_tx.send(());
                    // Holds the write lock until the claim is through, or gives up.
                    Ok::<_, StoreError>(
                        claimed_rx
                            .recv_timeout(std::time::Duration::from_secs(10))
                            .is_ok(),
                    )
                })
            })
        };
        held_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let lease = store
            .claim_controller_lease(CONTROLLERS_LEASE, "gw-a".into(), 1_000, 5_000)
            .await?;
        let _ = claimed_tx.send(());
        assert_eq!((lease.holder.as_str(), lease.epoch), ("gw-a", 1));
        let went_past = writer
            .await
            .map_err(|e| StoreError::Task(e.to_string()))??;
        assert!(went_past, "the claim waited for the writer");
        store
            .release_controller_lease(CONTROLLERS_LEASE, "gw-a".into(), 2_000)
            .await?;
        let after = store.read_blocking(|r| r.controller_lease(CONTROLLERS_LEASE))?;
        assert_eq!(after.map(|l| l.expires_at), Some(2_000));
        Ok(())
    }
}
