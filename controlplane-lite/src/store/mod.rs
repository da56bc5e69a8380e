//! The store: SQLite (bundled, WAL) behind one module whose SQL is portable to PostgreSQL.
//!
//! # Design
//! One connection behind a mutex; every method is a short transaction. Async callers go through
//! [`Store::run`], which moves the work onto tokio's blocking pool so no request thread waits on
//! SQLite's lock. Every state change and its `noScheduleReasons` update happen in one transaction
//! (spec "State is several axes, not one status").

pub mod commands;
pub mod events;
pub mod migrations;
pub mod nodes;
pub mod reports;
pub mod sessions;
pub mod tokens;

// Model layer tables (branch `model`).
pub mod allocations;
pub mod leases;
pub mod pools;
pub mod sites;
pub mod taints;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::Connection;
use rusqlite_migration::{M, Migrations};

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed (I/O, a full disk, a constraint).
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A migration failed; the store is not opened.
    #[error("schema migration: {0}")]
    Migration(#[from] rusqlite_migration::Error),
    /// A JSON column held something that is not valid JSON of its shape.
    #[error("corrupt JSON in column {column}: {source}")]
    Json {
        column: &'static str,
        source: serde_json::Error,
    },
    /// A text column held a value outside its enum.
    #[error("corrupt value in column {column}: {source}")]
    Enum {
        column: &'static str,
        source: bc_protocol::ParseEnumError,
    },
    /// The blocking task running the query panicked or was cancelled.
    #[error("store task failed: {0}")]
    Task(String),
}

/// The control plane's store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
}

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(migrations::M001_NODE_MODEL),
        M::up(migrations::M002_PLACEMENT),
        M::up(migrations::M003_COMMANDS),
        M::up(migrations::M004_SCALE),
    ])
}

impl Store {
    /// Opens (creating if needed) `path`, turns on WAL and foreign keys, applies migrations.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// An in-memory store, for tests.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Self, StoreError> {
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations().to_latest(&mut conn)?;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` with the connection on the calling thread. For synchronous callers and tests.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn.lock();
        f(&mut conn)
    }

    /// Runs `f` with the connection on tokio's blocking pool.
    pub async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock();
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
    }
}

/// `n` random characters of `[a-z0-9]`: ids and secrets (token ids and secrets, `node_…`,
/// `cmd_…`).
pub fn random_lowercase(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A model-layer error met inside a store transaction, as a store error.
pub(crate) fn op_err(e: crate::model::error::OpError) -> StoreError {
    match e {
        crate::model::error::OpError::Store(s) => s,
        other => StoreError::Task(other.to_string()),
    }
}

/// Decodes a JSON column, naming the column in the error.
pub(crate) fn from_json<T: serde::de::DeserializeOwned>(
    column: &'static str,
    text: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|source| StoreError::Json { column, source })
}

/// Encodes a value for a JSON column. Our own types always serialize.
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

/// Parses an enum column, naming the column in the error.
pub(crate) fn parse_enum<T>(column: &'static str, text: &str) -> Result<T, StoreError>
where
    T: std::str::FromStr<Err = bc_protocol::ParseEnumError>,
{
    text.parse()
        .map_err(|source| StoreError::Enum { column, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_valid_and_reopen_is_idempotent() -> Result<(), StoreError> {
        assert!(migrations().validate().is_ok());
        let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
        let path = dir.path().join("state.db");
        drop(Store::open(&path)?);
        let store = Store::open(&path)?;
        let mode: String =
            store.with(|c| Ok(c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?))?;
        assert_eq!(mode, "wal");
        Ok(())
    }

    #[test]
    fn migration_4_indexes_existing_identifiers_and_skips_junk_rows() -> Result<(), StoreError> {
        let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
        let path = dir.path().join("state.db");
        {
            // A store written before migration 4, with one hand-edited row of junk.
            let mut conn = Connection::open(&path)?;
            Migrations::new(vec![
                M::up(migrations::M001_NODE_MODEL),
                M::up(migrations::M002_PLACEMENT),
                M::up(migrations::M003_COMMANDS),
            ])
            .to_latest(&mut conn)?;
            for (id, digests) in [
                ("node_a", r#"["d1","d2","d2"]"#),
                ("node_b", "[]"),
                ("node_c", "not json"),
                ("node_d", r#"{"k":"v"}"#),
                ("node_e", r#"["d3",7,null]"#),
            ] {
                conn.execute(
                    "INSERT INTO nodes (id, provision_state, identifier_digests, created_at, updated_at) \
                     VALUES (?1, 'adopting', ?2, 0, 0)",
                    rusqlite::params![id, digests],
                )?;
            }
        }
        let store = Store::open(&path)?;
        let rows: Vec<(String, String)> = store.with(|c| {
            let mut st = c.prepare(
                "SELECT node_id, digest FROM node_identifier_digests ORDER BY node_id, digest",
            )?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<Result<_, _>>()?)
        })?;
        let expect = [("node_a", "d1"), ("node_a", "d2"), ("node_e", "d3")];
        let expect: Vec<(String, String)> = expect
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect();
        assert_eq!(rows, expect);
        let version: i64 =
            store.with(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))?;
        assert_eq!(version, 4);
        Ok(())
    }
}
