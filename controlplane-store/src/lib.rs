//! cpl-store: the control plane's store. The only crate of the workspace that knows SQL, SQLite
//! (rusqlite) or the schema.
//!
//! # Background
//! controlplane-lite keeps the node model of the spec ("Nodes") in one SQLite file (bundled, WAL).
//! A larger deployment moves it to PostgreSQL (DESIGN.md "More than one control-plane replica"),
//! so no caller may hold a database connection or write a query: they would all have to change.
//!
//! # Design
//! - [`Store`] is a cheap handle. [`Store::read`] runs a closure in a read transaction and hands it
//!   a [`Reader`]; [`Store::write`] runs one in a write transaction (SQLite `BEGIN IMMEDIATE`: the
//!   database write lock is taken before the first read, so a read-check-write cannot interleave
//!   with another writer) and hands it a [`Tx`], which also reads (`Deref<Target = Reader>`). The
//!   transaction commits when the closure returns `Ok` and rolls back on `Err`. The async forms
//!   run on tokio's blocking pool; `*_blocking` run on the calling thread (tests, the CLI).
//! - [`Reader`] and [`Tx`] carry typed methods only (nodes, events, tokens, taints, pools, sites,
//!   leases, BMCs and site leases, allocations, commands, heartbeats, sweeps, the identifier index, the placer's locked
//!   candidates, capacity rows, fleet gauges, bench counts). Each domain module adds its methods
//!   with its own `impl` blocks; the SQL is inside them.
//! - Which database is underneath is private: a `Backend` enum (SQLite, PostgreSQL). The
//!   domain modules write SQL once through the `db` module's `Db`, in the dialect both accept;
//!   PostgreSQL's connection pool, transactions and schema are the `pg` and `pg_schema` modules.
//!   SQLite: one connection behind a mutex, WAL, `synchronous=NORMAL`, foreign keys on, schema
//!   migrations through `user_version` (rusqlite_migration). Times are integer milliseconds since
//!   the Unix epoch; JSON columns hold camelCase JSON.
//! - The store keeps rows consistent (the identifier index follows `identifier_digests`, a node
//!   row is saved only at the version it was read at); what a change *means* (which axis, which
//!   event, which `noScheduleReasons`) is the core crate's edit path (`cpl-core`).
//!
//! # Must not depend on
//! The core crate or any adapter (axum, tonic): the store is the bottom of the control plane.
//!
//! # Limitations
//! On PostgreSQL, global writers take one advisory lock (`pg` module): they serialize across
//! replicas as SQLite's writers do on one file. A node's own reports ([`Store::write_node`])
//! take it shared and lock their node's row, so they run at once for different nodes; the
//! controller lease's claim runs outside it ([`Store::claim_controller_lease`]).
#![forbid(unsafe_code)]

mod allocations;
mod bare_metal;
mod bench;
mod boots;
mod commands;
mod controller_lease;
pub(crate) mod db;
mod deploy_identities;
mod events;
mod firmware;
mod fleet;
mod leases;
mod meta;
pub mod migrations;
mod node_writes;
mod nodes;
mod pg;
mod pg_schema;
mod pools;
mod rejoin;
pub mod remediation;
mod remediation_rows;
mod schedulable;
mod sessions;
mod sites;
mod taints;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod tokens;

use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rusqlite::{Connection, OpenFlags, TransactionBehavior};
use rusqlite_migration::{M, Migrations};

pub use allocations::{Allocation, AllocationFilter, WorkloadFault};
pub use bare_metal::{BmcIdentifier, BmcRecord, SiteLease};
pub use bench::BenchCounts;
pub use boots::{BootRecord, WorkStep};
pub use commands::{CommandRecord, CommandState};
pub use controller_lease::{CONTROLLERS_LEASE, ControllerLease};
pub use deploy_identities::DeployIdentity;
pub use events::{NewEvent, NodeEvent};
pub use fleet::{BareMetalCounts, FleetCounts};
pub use leases::DedicatedRootLease;
pub use nodes::{MAX_INDEXED_DIGESTS, NewNode, NodeQuery, NodeRecord};
pub use pools::{Acceptance, HardwareProfile, LinkDegradedPolicy, Pool};
pub use rejoin::RejoinRequest;
pub use remediation::{
    DrainPolicy, Fault, FaultKind, RemediationCounts, RemediationFilter, RemediationMode,
    RemediationPhase, RemediationPolicy, RemediationRecord, RemediationState, RemediationStep,
    StepOutcome, StepRecord, Suspension, XidObservation,
};
pub use sites::Site;
pub use taints::Taint;
pub use tokens::{JoinToken, NewToken, TokenRefusal};

/// What went wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed (I/O, a full disk, a constraint).
    #[error("database: {0}")]
    Database(#[source] DatabaseError),
    /// A migration failed; the store is not opened.
    #[error("schema migration: {0}")]
    Migration(#[source] DatabaseError),
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
    /// A node would share a trusted hardware key with another node: the store's unique index
    /// (migration 5) refused the write, whatever the code above checked.
    #[error(
        "DUPLICATE_HARDWARE_KEY: another node already holds trusted hardware key {key}; a trusted key is unique"
    )]
    DuplicateTrustedKey { key: String },
    /// The blocking task running the query panicked or was cancelled.
    #[error("store task failed: {0}")]
    Task(String),
    /// A node's write ([`Store::write_node`]) reached something only a global write may do
    /// ([`Tx::require_write_lock`]); the store runs it again under the global lock, so a caller
    /// sees this only from a closure that swallowed the first attempt's error.
    #[error("this write needs the store's global write lock; it runs again under it")]
    WriteLockNeeded,
    /// The database file (or its WAL and shared-memory files) could not be created or made
    /// private; `path` names it.
    #[error("{path}: {source}")]
    File {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

/// The database's own error, kept opaque so no caller matches on a backend's error type.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct DatabaseError(BackendError);

#[derive(Debug, thiserror::Error)]
enum BackendError {
    #[error(transparent)]
    Sqlite(rusqlite::Error),
    #[error(transparent)]
    SqliteMigration(rusqlite_migration::Error),
    #[error("PostgreSQL: {}", postgres_message(.0))]
    Postgres(tokio_postgres::Error),
    /// The database could not be reached or refused the session (pool timeout, TLS, URL).
    #[error("{0}")]
    Unavailable(String),
    #[error("query returned no rows")]
    NoRows,
    #[error("column {idx}: {message}")]
    Column { idx: usize, message: String },
}

/// tokio-postgres's `Display` of a server error is only "db error": add the server's message,
/// detail and SQLSTATE.
pub(crate) fn postgres_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(d) = db.detail() {
                s.push_str(": ");
                s.push_str(d);
            }
            s
        }
        None => {
            use std::error::Error;
            match e.source() {
                Some(src) => format!("{e}: {src}"),
                None => e.to_string(),
            }
        }
    }
}

impl StoreError {
    /// Whether this is "the query returned no row" (turned into `None` by `.optional()`).
    pub(crate) fn is_no_rows(&self) -> bool {
        matches!(
            self,
            StoreError::Database(DatabaseError(
                BackendError::NoRows | BackendError::Sqlite(rusqlite::Error::QueryReturnedNoRows)
            ))
        )
    }

    /// Whether this is a unique-index violation of `index` (SQLite names the indexed columns,
    /// `table.column`; PostgreSQL the index).
    pub(crate) fn is_unique_violation(&self, sqlite_columns: &str, pg_index: &str) -> bool {
        match self {
            StoreError::Database(DatabaseError(BackendError::Sqlite(
                rusqlite::Error::SqliteFailure(f, Some(msg)),
            ))) => {
                f.code == rusqlite::ErrorCode::ConstraintViolation && msg.contains(sqlite_columns)
            }
            StoreError::Database(DatabaseError(BackendError::Postgres(e))) => {
                e.as_db_error().is_some_and(|d| {
                    *d.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION
                        && d.constraint() == Some(pg_index)
                })
            }
            _ => false,
        }
    }

    /// Whether the database could not be reached (a connection refused, dropped or timed out),
    /// as opposed to a query it refused: the caller may retry later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Database(DatabaseError(BackendError::Unavailable(_))) => true,
            StoreError::Database(DatabaseError(BackendError::Postgres(e))) => {
                match e.as_db_error() {
                    // Class 08: connection exception; 57P01..57P03: the server shutting down or
                    // starting.
                    Some(db) => {
                        let code = db.code().code();
                        code.starts_with("08") || ["57P01", "57P02", "57P03"].contains(&code)
                    }
                    None => {
                        let text = e.to_string();
                        e.is_closed()
                            || [
                                "error connecting",
                                "error communicating",
                                "timeout",
                                "connection closed",
                            ]
                            .iter()
                            .any(|p| text.starts_with(p))
                    }
                }
            }
            _ => false,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(DatabaseError(BackendError::Sqlite(e)))
    }
}

impl From<rusqlite_migration::Error> for StoreError {
    fn from(e: rusqlite_migration::Error) -> Self {
        StoreError::Migration(DatabaseError(BackendError::SqliteMigration(e)))
    }
}

/// The control plane's store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    backend: Backend,
}

/// The database underneath. Private: callers see [`Reader`] and [`Tx`] methods only.
#[derive(Clone, Debug)]
enum Backend {
    /// One SQLite connection; the mutex serializes transactions (SQLite has one writer anyway).
    Sqlite(Arc<Mutex<Connection>>),
    /// A pool of PostgreSQL connections (several replicas may share the database).
    Postgres(Arc<pg::PgStore>),
}

/// How to reach a PostgreSQL store (`bcctl serve --store postgres://…`).
#[derive(Clone, Debug)]
pub struct PostgresOptions {
    /// `postgres://user:password@host:port/database?sslmode=disable|prefer|require`; our own
    /// `sslrootcert=FILE` query parameter names the CA that signed the server's certificate
    /// (else the WebPKI roots). With `sslmode=require` the server's certificate is verified
    /// against those roots and its host name.
    pub url: String,
    /// The CA file, instead of `sslrootcert` in the URL.
    pub ca_file: Option<std::path::PathBuf>,
    /// The password, instead of one in the URL (read from a file by `bcctl serve`).
    pub password: Option<String>,
    /// Connections in the pool, at most (transactions beyond that wait for one).
    pub max_connections: u32,
    /// How long connecting, or waiting for a pooled connection, may take before a transaction
    /// fails with a "database unavailable" error.
    pub connect_timeout: Duration,
    /// A schema to use instead of `public` (`search_path`), e.g. one per test.
    pub schema: Option<String>,
}

impl PostgresOptions {
    /// `url` with the defaults: 16 connections, 5 s to connect, the `public` schema.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ca_file: None,
            password: None,
            max_connections: 16,
            connect_timeout: pg::default_connect_timeout(),
            schema: None,
        }
    }
}

/// What a [`Store::listen`] receiver yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The listening connection is (again) up: what was published while it was down is lost,
    /// so the listener should re-read what it keeps from the store.
    Resync,
    /// One payload, as published.
    Message(String),
}

/// Whether `location` names a PostgreSQL database (`postgres://` or `postgresql://`) rather than
/// an SQLite file.
pub fn is_postgres_url(location: &str) -> bool {
    location.starts_with("postgres://") || location.starts_with("postgresql://")
}

/// Read access inside one transaction: every query method of the store.
#[derive(Debug)]
pub struct Reader<'c> {
    conn: db::Db<'c>,
}

impl<'c> Reader<'c> {
    /// The connection of this transaction.
    fn db(&self) -> db::Db<'c> {
        self.conn
    }
}

/// Write access inside one write transaction (`BEGIN IMMEDIATE` on SQLite); reads through
/// `Deref<Target = Reader>`.
#[derive(Debug)]
pub struct Tx<'c> {
    reader: Reader<'c>,
}

impl<'c> Deref for Tx<'c> {
    type Target = Reader<'c>;
    fn deref(&self) -> &Reader<'c> {
        &self.reader
    }
}

impl<'c> Tx<'c> {
    /// Write access through PostgreSQL session `s` (a transaction, or autocommit for the lease).
    fn on_pg(s: &'c pg::Session) -> Self {
        Tx {
            reader: Reader {
                conn: db::Db::Pg(s),
            },
        }
    }

    /// Runs `f` as a nested transaction (SQLite `SAVEPOINT`): its writes are undone when it
    /// returns `Err`, while the enclosing transaction goes on.
    pub fn savepoint<T, E>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let conn = self.db();
        conn.execute_batch("SAVEPOINT nested")?;
        match f(self) {
            Ok(v) => {
                conn.execute_batch("RELEASE nested")?;
                Ok(v)
            }
            Err(e) => {
                conn.execute_batch("ROLLBACK TO nested; RELEASE nested")?;
                Err(e)
            }
        }
    }
}

/// Creates `path` 0600 when it is missing, and sets 0600 on it and on SQLite's `-wal` and `-shm`
/// files beside it when they exist. SQLite creates its WAL and shared-memory files with the
/// database file's mode, so a private database keeps them private.
fn make_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file_err = |path: &Path| {
        let path = path.to_owned();
        move |source| StoreError::File { path, source }
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(file_err(path))?;
    for suffix in ["", "-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let p = std::path::PathBuf::from(name);
        match std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !suffix.is_empty() => {}
            r => r.map_err(file_err(&p))?,
        }
    }
    Ok(())
}

fn migrations() -> Migrations<'static> {
    Migrations::new(vec![
        M::up(migrations::M001_NODE_MODEL),
        M::up(migrations::M002_PLACEMENT),
        M::up(migrations::M003_COMMANDS),
        M::up(migrations::M004_SCALE),
        M::up(migrations::M005_ACCESS),
        M::up(migrations::M006_SESSIONS_AND_ACCEPTANCE),
        M::up(migrations::M007_BARE_METAL),
        M::up(migrations::M008_BOOTS),
        M::up(migrations::M009_WORKFLOWS),
        M::up(migrations::M010_CONTROLLER_LEASE),
        M::up(migrations::M011_REMEDIATION),
        M::up(migrations::M012_BOOT_OVERRIDE),
        M::up(migrations::M013_BOOT_EVIDENCE_AND_DEPLOY_IDENTITY),
    ])
}

impl Store {
    /// Opens (creating if needed) the SQLite file `path`, turns on WAL and foreign keys, applies
    /// migrations. The file is created 0600 whatever the umask, and an existing one (with its
    /// `-wal` and `-shm` files) is made 0600: it holds every token hash and node record.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        make_private(path)?;
        Self::init(Connection::open(path)?)
    }

    /// Opens the PostgreSQL database `opts` names: connects, and applies the migrations that
    /// are missing (under an advisory lock, so replicas starting together migrate once).
    pub fn open_postgres(opts: &PostgresOptions) -> Result<Self, StoreError> {
        Ok(Self {
            backend: Backend::Postgres(Arc::new(pg::PgStore::open(opts)?)),
        })
    }

    /// Opens `location`: a `postgres://` URL ([`Store::open_postgres`] with its defaults) or an
    /// SQLite file ([`Store::open`]).
    pub fn open_location(location: &str) -> Result<Self, StoreError> {
        if is_postgres_url(location) {
            Self::open_postgres(&PostgresOptions::new(location))
        } else {
            Self::open(Path::new(location))
        }
    }

    /// Which backend this is: `sqlite` or `postgres` (for `/metrics` and `bcctl status`).
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }

    /// Publishes `payload` (at most 8,000 bytes) to every replica listening on `channel`
    /// (PostgreSQL `NOTIFY`; `channel` a lowercase identifier). Returns false on SQLite: one
    /// process, nobody else to tell.
    pub async fn notify(&self, channel: &'static str, payload: String) -> Result<bool, StoreError> {
        match &self.backend {
            Backend::Sqlite(_) => Ok(false),
            Backend::Postgres(pg) => {
                let pg = Arc::clone(pg);
                tokio::task::spawn_blocking(move || pg.notify(channel, &payload))
                    .await
                    .map_err(|e| StoreError::Task(e.to_string()))??;
                Ok(true)
            }
        }
    }

    /// What the replicas publish on `channel` ([`Store::notify`]), as [`Notice`]s, on a
    /// connection of its own that comes back by itself after the database does. `None` on
    /// SQLite.
    pub fn listen(
        &self,
        channel: &'static str,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<Notice>> {
        match &self.backend {
            Backend::Sqlite(_) => None,
            Backend::Postgres(pg) => {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                pg.listen(channel, tx);
                Some(rx)
            }
        }
    }

    /// An in-memory store, for tests.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::init(Connection::open_in_memory()?)
    }

    /// Opens `path` read-only, without migrating: a reader beside the `bcctl serve` that owns the
    /// file (`bcctl bench`). Writes through it fail.
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        Ok(Self {
            backend: Backend::Sqlite(Arc::new(Mutex::new(conn))),
        })
    }

    fn init(mut conn: Connection) -> Result<Self, StoreError> {
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        migrations().to_latest(&mut conn)?;
        Ok(Self {
            backend: Backend::Sqlite(Arc::new(Mutex::new(conn))),
        })
    }

    /// Runs `f` in a read transaction on the calling thread.
    pub fn read_blocking<T, E>(&self, f: impl FnOnce(&Reader<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        match &self.backend {
            Backend::Sqlite(conn) => sqlite_read(&mut conn.lock(), f),
            Backend::Postgres(pg) => pg.transaction(false, |s| {
                f(&Reader {
                    conn: db::Db::Pg(s),
                })
            }),
        }
    }

    /// Runs `f` in a write transaction on the calling thread; commits when it returns `Ok`.
    pub fn write_blocking<T, E>(&self, f: impl FnOnce(&Tx<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        match &self.backend {
            Backend::Sqlite(conn) => sqlite_write(&mut conn.lock(), f),
            Backend::Postgres(pg) => pg.transaction(true, |s| f(&Tx::on_pg(s))),
        }
    }

    /// [`Store::read_blocking`] on tokio's blocking pool, so no request thread waits on the
    /// database's lock.
    pub async fn read<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Reader<'_>) -> Result<T, E> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.read_blocking(f))
            .await
            .map_err(|e| E::from(StoreError::Task(e.to_string())))?
    }

    /// [`Store::write_blocking`] on tokio's blocking pool.
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&Tx<'_>) -> Result<T, E> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.write_blocking(f))
            .await
            .map_err(|e| E::from(StoreError::Task(e.to_string())))?
    }
}

fn sqlite_read<T, E: From<StoreError>>(
    conn: &mut Connection,
    f: impl FnOnce(&Reader<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let tx = conn.transaction().map_err(StoreError::from)?;
    let out = f(&Reader {
        conn: db::Db::Sqlite(&tx),
    })?;
    tx.commit().map_err(StoreError::from)?;
    Ok(out)
}

fn sqlite_write<T, E: From<StoreError>>(
    conn: &mut Connection,
    f: impl FnOnce(&Tx<'_>) -> Result<T, E>,
) -> Result<T, E> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(StoreError::from)?;
    let out = f(&Tx {
        reader: Reader {
            conn: db::Db::Sqlite(&tx),
        },
    })?;
    tx.commit().map_err(StoreError::from)?;
    Ok(out)
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

/// A duration as the store's milliseconds (saturating: no deadline here comes near
/// `i64::MAX`).
pub fn duration_ms(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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

/// A `u64` as SQLite's signed 64-bit integer (saturating: no count here comes near `i64::MAX`).
pub(crate) fn sql_u64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod lib_tests;
