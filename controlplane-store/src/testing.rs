//! Test support for crates above the store (feature `test-support`): views of what the SQL
//! computes, so their tests can compare it with the Rust side without writing SQL themselves.

use crate::params;
use bc_protocol::CapacityBucket;

use super::{NewNode, PostgresOptions, Reader, Store, StoreError, parse_enum};

/// A node as JoinService would create it for host `id`: no site, pool, tenant, key or
/// identifiers; set the fields a test needs on the value returned.
pub fn new_node(id: &str) -> NewNode {
    NewNode {
        id: id.to_owned(),
        site_id: None,
        pool_id: None,
        owner_tenant_id: None,
        role: bc_protocol::NodeRole::Host,
        trust: bc_protocol::Trust::Platform,
        adapter: bc_protocol::Adapter::BcdV1,
        drivers: Default::default(),
        hostname: None,
        hardware_key: None,
        hardware_key_trusted: false,
        identifier_digests: vec![],
    }
}

impl Reader<'_> {
    /// `(id, capacity bucket, schedulable)` of every node as the SQL predicate computes them, by
    /// id (the schedulable predicate's agreement test).
    pub fn sql_verdicts(&self) -> Result<Vec<(String, CapacityBucket, bool)>, StoreError> {
        let sql = format!(
            "SELECT n.id, {}, CASE WHEN {} THEN 1 ELSE 0 END FROM nodes n \
             LEFT JOIN pools p ON p.id = n.pool_id ORDER BY n.id",
            super::schedulable::capacity_bucket_sql(),
            super::schedulable::schedulable_sql()
        );
        let mut stmt = self.db().prepare(&sql)?;
        let rows = stmt.query_map(params![], |r| {
            Ok((r.get::<String>(0)?, r.get::<String>(1)?, r.get::<bool>(2)?))
        })?;
        let rows: Vec<(String, String, bool)> = rows.collect::<Result<_, _>>()?;
        rows.into_iter()
            .map(|(id, b, s)| Ok((id, parse_enum("capacity bucket", &b)?, s)))
            .collect()
    }
}

/// The environment variable that picks the test store's backend: `postgres` for PostgreSQL,
/// anything else (or unset) for in-memory SQLite.
pub const BACKEND_VAR: &str = "BC_TEST_STORE";
/// The environment variable with the PostgreSQL URL the tests use (`tests/pg/cluster.sh start`
/// prints one).
pub const POSTGRES_URL_VAR: &str = "BC_TEST_POSTGRES";

/// Whether the tests run their stores on PostgreSQL (`BC_TEST_STORE=postgres`).
pub fn on_postgres() -> bool {
    std::env::var(BACKEND_VAR).is_ok_and(|v| v == "postgres")
}

/// A fresh, empty store for one test: in-memory SQLite; or, with `BC_TEST_STORE=postgres`, a new
/// schema (`t_` and 16 random characters) in the database `BC_TEST_POSTGRES` names, so tests
/// running at once never see each other's rows.
///
/// # Errors
/// `BC_TEST_STORE=postgres` without `BC_TEST_POSTGRES`, or the database unreachable.
pub fn store() -> Result<Store, StoreError> {
    if !on_postgres() {
        return Store::open_in_memory();
    }
    let url = std::env::var(POSTGRES_URL_VAR).map_err(|_| {
        StoreError::Database(crate::DatabaseError(crate::BackendError::Unavailable(format!(
            "{BACKEND_VAR}=postgres needs {POSTGRES_URL_VAR} (tests/pg/cluster.sh start prints it)"
        ))))
    })?;
    let mut opts = PostgresOptions::new(url);
    opts.schema = Some(format!("t_{}", crate::random_lowercase(16)));
    opts.max_connections = 4;
    Store::open_postgres(&opts)
}

impl super::Tx<'_> {
    /// Removes `key` from the `meta` table, as a store written before that fact was recorded
    /// would be.
    pub fn forget_meta(&self, key: &str) -> Result<(), StoreError> {
        self.db()
            .execute("DELETE FROM meta WHERE key = ?1", params![key])?;
        Ok(())
    }
}
