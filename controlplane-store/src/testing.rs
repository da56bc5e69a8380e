//! Test support for crates above the store (feature `test-support`): views of what the SQL
//! computes, so their tests can compare it with the Rust side without writing SQL themselves.

use bc_protocol::CapacityBucket;

use super::{Reader, StoreError, parse_enum};

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
        let mut stmt = self.sqlite().prepare(&sql)?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, bool>(2)?,
            ))
        })?;
        let rows: Vec<(String, String, bool)> = rows.collect::<Result<_, _>>()?;
        rows.into_iter()
            .map(|(id, b, s)| Ok((id, parse_enum("capacity bucket", &b)?, s)))
            .collect()
    }
}
