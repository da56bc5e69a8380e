//! The controllers' lease (issue 17): which replica runs Liveness, NodeLifecycle, the deadlines
//! and the bare-metal controllers. One row per lease name; a replica holds it until
//! `expires_at` unless it renews; another takes it once it has expired. `epoch` goes up with
//! every new holder, so a replica can tell it lost the lease and got it back.
use serde::Serialize;

use crate::db::OptionalExt;
use crate::params;

use super::{Reader, StoreError, Tx, sql_u64};

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
    pub fn claim_controller_lease(
        &self,
        name: &str,
        holder: &str,
        now: i64,
        ttl_ms: i64,
    ) -> Result<ControllerLease, StoreError> {
        let expires = now.saturating_add(ttl_ms);
        match self.controller_lease(name)? {
            None => {
                self.db().execute(
                    "INSERT INTO controller_leases (name, holder, epoch, acquired_at, expires_at) \
                     VALUES (?1, ?2, 1, ?3, ?4)",
                    params![name, holder, now, expires],
                )?;
            }
            Some(l) if l.holder == holder => {
                self.db().execute(
                    "UPDATE controller_leases SET expires_at = ?2 WHERE name = ?1",
                    params![name, expires],
                )?;
            }
            Some(l) if l.expires_at <= now => {
                self.db().execute(
                    "UPDATE controller_leases SET holder = ?2, epoch = ?3, acquired_at = ?4, \
                     expires_at = ?5 WHERE name = ?1",
                    params![name, holder, sql_u64(l.epoch + 1), now, expires],
                )?;
            }
            Some(l) => return Ok(l),
        }
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
}
