//! The PostgreSQL backend: a pool of tokio-postgres connections, transactions with SQLite's
//! semantics, and the translation of the store's SQL.
//!
//! # Design
//! - Connections live on a private two-thread tokio runtime owned by the store (their I/O tasks
//!   run there). A transaction checks one out of an r2d2 pool and waits on its requests with a
//!   plain executor (`futures_executor::block_on`), so the store's closures run the same way on
//!   tokio's blocking pool, on a test's thread or inside an async test, with no runtime nested in
//!   another.
//! - A write transaction is `BEGIN` then `pg_advisory_xact_lock(WRITE_LOCK)`: one writer at a
//!   time across every replica on the database, which is what SQLite's `BEGIN IMMEDIATE` gives
//!   the code above (a read-check-write never interleaves with another writer). A read
//!   transaction is `REPEATABLE READ READ ONLY`: one snapshot, as SQLite's read transaction.
//! - A node's write ([`PgStore::node_transaction`]: what one node's session reports) takes the
//!   same lock *shared*, then its node row `FOR UPDATE`: writers of different nodes run at once,
//!   writers of one node queue on its row, and a global writer (exclusive) still waits for all
//!   of them and excludes them while it runs. Its statements run at READ COMMITTED, so one that
//!   waited on a lock sees what the holder committed. The one cross-node fact such a write
//!   checks, a trusted hardware key's holder, is serialized by an advisory lock on the key
//!   ([`Session::lock_hardware_key`]). A node write that finds it needs more
//!   ([`Session::require_write_lock`]), or that a race with another one failed (a deadlock, a
//!   unique index: `LOCK_CONFLICTS`), is rolled back and run again as a global write.
//! - Statements are prepared once per connection and cached by their text; `?N` placeholders
//!   become `$N` there. Parameters bind by the type PostgreSQL inferred (an integer binds to
//!   `int2`/`int4`/`int8`/`bool`, text to `text`/`json`/`jsonb`); columns decode by their type.
//! - Migrations are SQLite's, version for version ([`crate::pg_schema`]), recorded in
//!   `bc_schema_version` and applied under a session advisory lock, so replicas starting together
//!   migrate once.
//!
//! # Limitations
//! Everything but a node's own reports (joins, tokens, operator verbs, controllers, heartbeat
//! flushes) still serializes on the global write lock, as on SQLite.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio_postgres::types::{FromSql, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, Statement};

use crate::db::{Params, Value, ValueRef};
use crate::{BackendError, DatabaseError, PostgresOptions, StoreError};

/// The advisory lock key of write transactions ("bcdwrite").
const WRITE_LOCK: i64 = 0x6263_6477_7269_7465;
/// The advisory lock key of schema migrations ("bcdmigra").
const MIGRATE_LOCK: i64 = 0x6263_646d_6967_7261;
/// The first key of the two-key advisory locks on trusted hardware keys ("hk"); PostgreSQL
/// keeps two-key locks apart from one-key ones, so they never meet the two above.
const HARDWARE_KEY_LOCKS: i64 = 0x686b;
/// SQLSTATEs that a node write may get from racing another one: a deadlock, a serialization
/// failure, a unique index another node's write filled first. A node write that gets one runs
/// again under the global lock, where it either passes or fails for good.
const LOCK_CONFLICTS: [&str; 3] = ["40P01", "40001", "23505"];

fn db_err(e: tokio_postgres::Error) -> StoreError {
    StoreError::Database(DatabaseError(BackendError::Postgres(e)))
}

fn other(message: String) -> StoreError {
    StoreError::Database(DatabaseError(BackendError::Unavailable(message)))
}

/// Shuts the I/O runtime down without waiting, so the last store handle may drop anywhere
/// (inside an async task too).
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A pooled connection and its prepared statements.
pub(crate) struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// Set when the connection may be inside a transaction it could not end: the pool drops it.
    broken: bool,
}

/// The error r2d2 sees while connecting.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("{}", crate::postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("connection task failed: {0}")]
    Task(String),
}

struct Manager {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    io: tokio::runtime::Handle,
}

impl r2d2::ManageConnection for Manager {
    type Connection = Conn;
    type Error = ConnectError;

    fn connect(&self) -> Result<Conn, ConnectError> {
        let config = self.config.clone();
        let tls = self.tls.clone();
        let task = self.io.spawn(async move {
            let client = match tls {
                Some(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(connection);
                    client
                }
                None => {
                    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
                    tokio::spawn(connection);
                    client
                }
            };
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client =
            futures_executor::block_on(task).map_err(|e| ConnectError::Task(e.to_string()))??;
        Ok(Conn {
            client,
            statements: HashMap::new(),
            broken: false,
        })
    }

    fn is_valid(&self, conn: &mut Conn) -> Result<(), ConnectError> {
        futures_executor::block_on(conn.client.simple_query(""))?;
        Ok(())
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken || conn.client.is_closed()
    }
}

/// The PostgreSQL side of a [`crate::Store`].
pub(crate) struct PgStore {
    pool: r2d2::Pool<Manager>,
    /// How the pool connects, for the LISTEN connections made outside it.
    listen: ListenConfig,
    /// This replica's writers queue here, before they take a connection: every write
    /// transaction takes the database's one write lock anyway, so a second local writer holding
    /// a pooled connection would only wait on it, and a storm of writers would empty the pool
    /// (reads and the controller lease included) and fail after the checkout timeout.
    write_gate: parking_lot::Mutex<()>,
    /// This replica's node writers queue here: at most half the pool at once, so reads and the
    /// controller lease always find a connection while a storm of reports waits.
    node_gate: Permits,
    /// Node writes run again under the global lock (a `require_write_lock`, a `LOCK_CONFLICTS`).
    escalations: std::sync::atomic::AtomicU64,
    _io: Arc<IoRuntime>,
}

/// A counting semaphore for blocking threads.
struct Permits {
    free: parking_lot::Mutex<usize>,
    freed: parking_lot::Condvar,
}

struct Permit<'a>(&'a Permits);

impl Permits {
    fn new(n: usize) -> Self {
        Self {
            free: parking_lot::Mutex::new(n.max(1)),
            freed: parking_lot::Condvar::new(),
        }
    }

    fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock();
        while *free == 0 {
            self.freed.wait(&mut free);
        }
        *free -= 1;
        Permit(self)
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        *self.0.free.lock() += 1;
        self.0.freed.notify_one();
    }
}

#[derive(Clone)]
struct ListenConfig {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    io: tokio::runtime::Handle,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.pool.state();
        f.debug_struct("PgStore")
            .field("connections", &state.connections)
            .field("idle", &state.idle_connections)
            .finish()
    }
}

/// Splits our own `sslrootcert=FILE` out of a `postgres://` URL (tokio-postgres does not parse
/// it): the URL without it, and the file.
fn split_root_cert(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut cert = None;
    // Our TLS always verifies the certificate and the host name: libpq's verify-full, which
    // tokio-postgres spells `require`.
    let kept: Vec<&str> = query
        .split('&')
        .filter_map(|kv| match kv.strip_prefix("sslrootcert=") {
            Some(v) => {
                cert = Some(v.to_owned());
                None
            }
            None if kv == "sslmode=verify-full" || kv == "sslmode=verify-ca" => {
                Some("sslmode=require")
            }
            None => Some(kv),
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), cert)
    } else {
        (format!("{base}?{}", kept.join("&")), cert)
    }
}

fn tls_config(ca_file: Option<&std::path::Path>) -> Result<rustls::ClientConfig, StoreError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let file_err = |source| StoreError::File {
                path: path.to_owned(),
                source,
            };
            let pem = std::fs::read(path).map_err(file_err)?;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                let cert = cert.map_err(file_err)?;
                roots
                    .add(cert)
                    .map_err(|e| other(format!("{}: {e}", path.display())))?;
            }
            if roots.is_empty() {
                return Err(other(format!(
                    "{}: no PEM certificate in it",
                    path.display()
                )));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| other(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl PgStore {
    /// Connects (the first connection is opened now, so a wrong URL or password fails here) and
    /// migrates.
    pub(crate) fn open(opts: &PostgresOptions) -> Result<Self, StoreError> {
        let (url, url_cert) = split_root_cert(&opts.url);
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| other(format!("store URL: {e}")))?;
        config.connect_timeout(opts.connect_timeout);
        if let Some(password) = &opts.password {
            config.password(password.as_bytes());
        }
        if config.get_application_name().is_none() {
            config.application_name("bcctl");
        }
        if let Some(schema) = &opts.schema {
            // Spliced into `-c search_path=` and `CREATE SCHEMA`: a plain identifier only.
            if schema.is_empty()
                || !schema
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                return Err(other(format!(
                    "schema name {schema:?}: only a-z, 0-9 and _ are taken"
                )));
            }
            config.options(format!("-c search_path={schema}"));
        }
        let ca = opts
            .ca_file
            .clone()
            .or(url_cert.map(std::path::PathBuf::from));
        let tls = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => None,
            _ => Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(
                ca.as_deref(),
            )?)),
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("store-pg")
            .enable_all()
            .build()
            .map_err(|e| other(format!("store I/O runtime: {e}")))?;
        let io = Arc::new(IoRuntime(Some(rt)));
        let handle = match &io.0 {
            Some(rt) => rt.handle().clone(),
            None => return Err(other("store I/O runtime gone".to_owned())),
        };
        let pool = r2d2::Pool::builder()
            .max_size(opts.max_connections.max(1))
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(opts.connect_timeout)
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build_unchecked(Manager {
                config: config.clone(),
                tls: tls.clone(),
                io: handle.clone(),
            });
        let store = Self {
            pool,
            listen: ListenConfig {
                config,
                tls,
                io: handle,
            },
            write_gate: parking_lot::Mutex::new(()),
            node_gate: Permits::new(opts.max_connections as usize / 2),
            escalations: std::sync::atomic::AtomicU64::new(0),
            _io: io,
        };
        store.migrate(opts.schema.as_deref())?;
        Ok(store)
    }

    fn session(&self) -> Result<Session, StoreError> {
        let conn = self.pool.get().map_err(|e| {
            other(format!(
                "no connection to PostgreSQL within the timeout: {e}"
            ))
        })?;
        Ok(Session {
            conn: RefCell::new(conn),
            open: Cell::new(false),
            node_scope: Cell::new(false),
            escalate: Cell::new(false),
        })
    }

    /// Runs `f` outside any transaction: each statement commits on its own, without the write
    /// lock (the controller lease: single statements that are atomic by themselves, and must not
    /// queue behind a storm of writers).
    pub(crate) fn autocommit<T, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&Session) -> Result<T, E>,
    ) -> Result<T, E> {
        let s = self.session()?;
        f(&s)
    }

    /// Runs `f` in one transaction; `write` queues behind this replica's other writers
    /// (`write_gate`), then takes the database's write lock.
    pub(crate) fn transaction<T, E: From<StoreError>>(
        &self,
        write: bool,
        f: impl FnOnce(&Session) -> Result<T, E>,
    ) -> Result<T, E> {
        let _gate = write.then(|| self.write_gate.lock());
        let s = self.session()?;
        // Open before the first statement: a BEGIN whose lock statement failed leaves an
        // aborted transaction that the drop must roll back.
        s.open.set(true);
        if write {
            s.batch(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})"
            ))?;
        } else {
            s.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
        }
        let out = f(&s);
        match out {
            Ok(v) => {
                s.batch("COMMIT")?;
                s.open.set(false);
                Ok(v)
            }
            Err(e) => {
                s.rollback();
                Err(e)
            }
        }
    }

    /// Runs `f` as a write of node `node_id` alone (module docs): the write lock shared, the
    /// node's row `FOR UPDATE` (a node not there locks nothing; `f` finds it missing). When `f`
    /// fails after asking for the global lock, or on a race with another write
    /// (`LOCK_CONFLICTS`), it is rolled back and run again by [`Self::transaction`] (hence `Fn`).
    pub(crate) fn node_transaction<T, E: From<StoreError>>(
        &self,
        node_id: &str,
        f: impl Fn(&Session) -> Result<T, E>,
    ) -> Result<T, E> {
        {
            let _permit = self.node_gate.acquire();
            let s = self.session()?;
            s.open.set(true);
            s.node_scope.set(true);
            s.batch(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock_shared({WRITE_LOCK})"
            ))?;
            let out = s
                .query(
                    "SELECT 1 FROM nodes WHERE id = ?1 FOR UPDATE",
                    crate::params![node_id],
                )
                .map_err(E::from)
                .and_then(|_| f(&s));
            match out {
                Ok(v) => {
                    s.batch("COMMIT")?;
                    s.open.set(false);
                    return Ok(v);
                }
                Err(e) => {
                    s.rollback();
                    if !s.escalate.get() {
                        return Err(e);
                    }
                }
            }
        }
        self.escalations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(
            node = node_id,
            "a node's write runs again under the write lock"
        );
        self.transaction(true, f)
    }

    /// How many node writes ran again under the global lock since the store opened.
    pub(crate) fn escalations(&self) -> u64 {
        self.escalations.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn migrate(&self, schema: Option<&str>) -> Result<(), StoreError> {
        let s = self.session()?;
        if let Some(schema) = schema {
            s.batch(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))?;
        }
        s.batch(&format!(
            "SELECT pg_advisory_lock({MIGRATE_LOCK}); \
             CREATE TABLE IF NOT EXISTS bc_schema_version (version BIGINT NOT NULL)"
        ))?;
        let result = (|| {
            let rows = s.query("SELECT MAX(version) FROM bc_schema_version", &[])?;
            let current = rows
                .first()
                .map(|r| {
                    column(r, 0, |v| match v {
                        ValueRef::Int(i) => Ok(i),
                        _ => Ok(0),
                    })
                })
                .transpose()
                .map_err(other)?
                .unwrap_or(0);
            for (version, sql) in crate::pg_schema::migrations()? {
                if version <= current {
                    continue;
                }
                s.batch("BEGIN")?;
                s.open.set(true);
                let step = s.batch(&sql).and_then(|()| {
                    s.execute(
                        "INSERT INTO bc_schema_version (version) VALUES (?1)",
                        crate::params![version],
                    )
                    .map(|_| ())
                });
                match step {
                    Ok(()) => {
                        s.batch("COMMIT")?;
                        s.open.set(false);
                    }
                    Err(e) => {
                        s.rollback();
                        return Err(StoreError::Migration(match e {
                            StoreError::Database(d) => d,
                            other => DatabaseError(BackendError::Unavailable(other.to_string())),
                        }));
                    }
                }
            }
            Ok(())
        })();
        let unlock = s.batch(&format!("SELECT pg_advisory_unlock({MIGRATE_LOCK})"));
        result.and(unlock)
    }
}

impl PgStore {
    /// `SELECT pg_notify(channel, payload)` outside any transaction: every session listening on
    /// `channel` gets `payload` (PostgreSQL's NOTIFY; at most 8,000 bytes).
    pub(crate) fn notify(&self, channel: &str, payload: &str) -> Result<(), StoreError> {
        let s = self.session()?;
        s.query("SELECT pg_notify(?1, ?2)", crate::params![channel, payload])
            .map(|_| ())
    }

    /// Listens on `channel` on a connection of its own, reconnecting with a backoff (0.2 s
    /// doubling to 5 s) when it drops. `out` gets [`crate::Notice::Resync`] after every
    /// (re)connection, then each payload; the task ends when `out` is dropped.
    pub(crate) fn listen(
        &self,
        channel: &str,
        out: tokio::sync::mpsc::UnboundedSender<crate::Notice>,
    ) {
        let ListenConfig { config, tls, io } = self.listen.clone();
        let channel = channel.to_owned();
        io.spawn(async move {
            let mut pause = Duration::from_millis(200);
            while !out.is_closed() {
                match listen_once(&config, tls.clone(), &channel, &out).await {
                    Ok(()) => pause = Duration::from_millis(200),
                    Err(e) => tracing::warn!(error = %crate::postgres_message(&e), channel = %channel, "LISTEN connection lost; reconnecting"),
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        });
    }
}

type Pumped = Result<tokio_postgres::AsyncMessage, tokio_postgres::Error>;

/// Drives a LISTEN connection, handing its asynchronous messages (notifications, notices, the
/// error that ends it) to `tx` until it closes.
async fn pump<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    tx: tokio::sync::mpsc::UnboundedSender<Pumped>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    while let Some(m) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
        let end = m.is_err();
        if tx.send(m).is_err() || end {
            break;
        }
    }
}

/// One LISTEN connection until it drops (`Ok` when it ended without an error).
async fn listen_once(
    config: &tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    channel: &str,
    out: &tokio::sync::mpsc::UnboundedSender<crate::Notice>,
) -> Result<(), tokio_postgres::Error> {
    use tokio_postgres::AsyncMessage;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let client = match tls {
        Some(tls) => {
            let (client, conn) = config.connect(tls).await?;
            tokio::spawn(pump(conn, tx));
            client
        }
        None => {
            let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(pump(conn, tx));
            client
        }
    };
    // `channel` is one of the store's own names, an identifier.
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    if out.send(crate::Notice::Resync).is_err() {
        return Ok(());
    }
    while let Some(m) = rx.recv().await {
        match m {
            Ok(AsyncMessage::Notification(n)) => {
                if out
                    .send(crate::Notice::Message(n.payload().to_owned()))
                    .is_err()
                {
                    return Ok(());
                }
            }
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One checked-out connection, inside a transaction while the store's closure runs.
pub(crate) struct Session {
    conn: RefCell<r2d2::PooledConnection<Manager>>,
    open: Cell<bool>,
    /// Inside [`PgStore::node_transaction`]: the write lock is held shared only.
    node_scope: Cell<bool>,
    /// The node transaction must run again under the global lock.
    escalate: Cell<bool>,
}

impl Drop for Session {
    fn drop(&mut self) {
        // A closure that panicked leaves its transaction open: end it, or drop the connection.
        if self.open.get() {
            self.rollback();
        }
    }
}

impl Session {
    /// In a node's write, marks it for a rerun under the global write lock and fails with
    /// [`StoreError::WriteLockNeeded`]; elsewhere (a global write holds it already) `Ok`.
    pub(crate) fn require_write_lock(&self) -> Result<(), StoreError> {
        if self.node_scope.get() {
            self.escalate.set(true);
            return Err(StoreError::WriteLockNeeded);
        }
        Ok(())
    }

    /// In a node's write, takes the transaction's advisory lock on trusted hardware key `key`
    /// (its 32-bit FNV-1a hash as the second key; a collision only serializes two unrelated
    /// claims): two nodes claiming one key serialize, and
    /// the second's holder query sees the first's commit. Under the global lock nobody else
    /// writes, so nothing is taken there.
    pub(crate) fn lock_hardware_key(&self, key: &str) -> Result<(), StoreError> {
        if !self.node_scope.get() {
            return Ok(());
        }
        let hash = key.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        self.query(
            "SELECT pg_advisory_xact_lock(CAST(?1 AS INTEGER), CAST(?2 AS INTEGER))",
            crate::params![HARDWARE_KEY_LOCKS, i64::from(hash as i32)],
        )
        .map(|_| ())
    }

    /// A server error, noting a lock conflict inside a node's write (it runs again).
    fn db_err(&self, e: tokio_postgres::Error) -> StoreError {
        if self.node_scope.get()
            && e.as_db_error()
                .is_some_and(|d| LOCK_CONFLICTS.contains(&d.code().code()))
        {
            self.escalate.set(true);
        }
        db_err(e)
    }

    fn rollback(&self) {
        let mut conn = self.conn.borrow_mut();
        if futures_executor::block_on(conn.client.batch_execute("ROLLBACK")).is_err() {
            conn.broken = true;
        }
        self.open.set(false);
    }

    fn statement(&self, sql: &str) -> Result<Statement, StoreError> {
        let mut conn = self.conn.borrow_mut();
        if let Some(st) = conn.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = futures_executor::block_on(conn.client.prepare(&placeholders(sql)))
            .map_err(|e| self.db_err(e))?;
        conn.statements.insert(sql.to_owned(), st.clone());
        Ok(st)
    }

    /// Runs one statement; rows changed.
    pub(crate) fn execute(&self, sql: &str, p: Params<'_>) -> Result<usize, StoreError> {
        let st = self.statement(sql)?;
        let values: Vec<PgParam> = p.iter().map(|v| PgParam(v.to_value())).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        let conn = self.conn.borrow();
        let n = futures_executor::block_on(conn.client.execute(&st, &refs))
            .map_err(|e| self.db_err(e))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    /// Every row of a query.
    pub(crate) fn query(
        &self,
        sql: &str,
        p: Params<'_>,
    ) -> Result<Vec<tokio_postgres::Row>, StoreError> {
        let st = self.statement(sql)?;
        let values: Vec<PgParam> = p.iter().map(|v| PgParam(v.to_value())).collect();
        let refs: Vec<&(dyn ToSql + Sync)> = values.iter().map(|v| v as _).collect();
        let conn = self.conn.borrow();
        futures_executor::block_on(conn.client.query(&st, &refs)).map_err(|e| self.db_err(e))
    }

    /// Statements without parameters.
    pub(crate) fn batch(&self, sql: &str) -> Result<(), StoreError> {
        let conn = self.conn.borrow();
        futures_executor::block_on(conn.client.batch_execute(sql)).map_err(|e| self.db_err(e))
    }
}

/// `?N` → `$N`, and a bare `?` → the next number, outside quoted text and identifiers.
pub(crate) fn placeholders(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut chars = sql.chars().peekable();
    let mut quote: Option<char> = None;
    let mut next = 1;
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                out.push(c);
                if c == q {
                    quote = None;
                }
            }
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                out.push(c);
            }
            None if c == '?' => {
                let mut digits = String::new();
                while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                out.push('$');
                if digits.is_empty() {
                    out.push_str(&next.to_string());
                    next += 1;
                } else {
                    out.push_str(&digits);
                }
            }
            None => out.push(c),
        }
    }
    out
}

/// A parameter, encoded for the type PostgreSQL inferred for its placeholder.
#[derive(Debug)]
struct PgParam(Value);

type BoxError = Box<dyn std::error::Error + Sync + Send>;

impl ToSql for PgParam {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        let text_like = [
            Type::TEXT,
            Type::VARCHAR,
            Type::BPCHAR,
            Type::NAME,
            Type::UNKNOWN,
            Type::JSON,
        ];
        match &self.0 {
            Value::Null => return Ok(IsNull::Yes),
            Value::Int(i) if *ty == Type::INT8 => out.put_i64(*i),
            Value::Int(i) if *ty == Type::INT4 => out.put_i32(i32::try_from(*i)?),
            Value::Int(i) if *ty == Type::INT2 => out.put_i16(i16::try_from(*i)?),
            Value::Int(i) if *ty == Type::BOOL => out.put_u8(u8::from(*i != 0)),
            #[allow(clippy::cast_precision_loss)] // as SQLite compares an integer with a real
            Value::Int(i) if *ty == Type::FLOAT8 => out.put_f64(*i as f64),
            Value::Int(i) if text_like.contains(ty) => out.put_slice(i.to_string().as_bytes()),
            Value::Real(f) if *ty == Type::FLOAT8 => out.put_f64(*f),
            #[allow(clippy::cast_possible_truncation)]
            Value::Real(f) if *ty == Type::FLOAT4 => out.put_f32(*f as f32),
            Value::Text(s) if text_like.contains(ty) => out.put_slice(s.as_bytes()),
            Value::Text(s) if *ty == Type::JSONB => {
                out.put_u8(1);
                out.put_slice(s.as_bytes());
            }
            Value::Blob(b) if *ty == Type::BYTEA => out.put_slice(b),
            v => return Err(format!("cannot bind {v:?} to a parameter of type {ty}").into()),
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

/// A column as its type and bytes, decoded by [`column`].
struct Raw<'a> {
    ty: Type,
    bytes: Option<&'a [u8]>,
}

impl<'a> FromSql<'a> for Raw<'a> {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        Ok(Raw {
            ty: ty.clone(),
            bytes: Some(raw),
        })
    }

    fn from_sql_null(ty: &Type) -> Result<Self, BoxError> {
        Ok(Raw {
            ty: ty.clone(),
            bytes: None,
        })
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

fn be<const N: usize>(b: &[u8]) -> Result<[u8; N], String> {
    b.try_into()
        .map_err(|_| format!("{} bytes where {N} were expected", b.len()))
}

/// PostgreSQL's binary `numeric` (base-10000 digits): an integer when it has no fraction, else
/// a real.
fn numeric(b: &[u8]) -> Result<ValueRef<'static>, String> {
    let word = |i: usize| -> Result<i16, String> {
        b.get(i..i + 2)
            .ok_or_else(|| "numeric cut short".to_owned())
            .and_then(|w| be::<2>(w).map(i16::from_be_bytes))
    };
    let ndigits = usize::try_from(word(0)?).map_err(|_| "negative numeric length".to_owned())?;
    let weight = i32::from(word(2)?);
    let sign = u16::from_be_bytes(be::<2>(b.get(4..6).unwrap_or_default())?);
    if sign == 0xC000 {
        return Ok(ValueRef::Real(f64::NAN));
    }
    let mut int: i128 = 0;
    let mut real = 0f64;
    let mut fraction = false;
    for k in 0..ndigits {
        let d = word(8 + 2 * k)?;
        let power = weight - i32::try_from(k).map_err(|_| "numeric too long".to_owned())?;
        real += f64::from(d) * 10f64.powi(4 * power);
        if power < 0 {
            fraction |= d != 0;
        } else {
            let scale = 10_000i128
                .checked_pow(u32::try_from(power).unwrap_or(u32::MAX))
                .ok_or_else(|| "numeric out of range".to_owned())?;
            int = int
                .checked_add(i128::from(d) * scale)
                .ok_or_else(|| "numeric out of range".to_owned())?;
        }
    }
    let negative = sign == 0x4000;
    if fraction {
        return Ok(ValueRef::Real(if negative { -real } else { real }));
    }
    let int = if negative { -int } else { int };
    i64::try_from(int)
        .map(ValueRef::Int)
        .map_err(|_| format!("{int} does not fit 64 bits"))
}

/// Column `idx` of `row` decoded and handed to `f`.
pub(crate) fn column<T>(
    row: &tokio_postgres::Row,
    idx: usize,
    f: impl FnOnce(ValueRef<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let raw: Raw<'_> = row.try_get(idx).map_err(|e| e.to_string())?;
    let Some(b) = raw.bytes else {
        return f(ValueRef::Null);
    };
    let text = |b| std::str::from_utf8(b).map_err(|e| format!("text not UTF-8: {e}"));
    let v = match raw.ty {
        Type::INT8 => ValueRef::Int(i64::from_be_bytes(be(b)?)),
        Type::INT4 => ValueRef::Int(i64::from(i32::from_be_bytes(be(b)?))),
        Type::INT2 => ValueRef::Int(i64::from(i16::from_be_bytes(be(b)?))),
        Type::OID => ValueRef::Int(i64::from(u32::from_be_bytes(be(b)?))),
        Type::BOOL => ValueRef::Int(i64::from(b.first().is_some_and(|x| *x != 0))),
        Type::FLOAT8 => ValueRef::Real(f64::from_be_bytes(be(b)?)),
        Type::FLOAT4 => ValueRef::Real(f64::from(f32::from_be_bytes(be(b)?))),
        Type::NUMERIC => numeric(b)?,
        Type::BYTEA => ValueRef::Blob(b),
        Type::JSONB => ValueRef::Text(text(b.get(1..).unwrap_or_default())?),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::JSON | Type::UNKNOWN => {
            ValueRef::Text(text(b)?)
        }
        ty => return Err(format!("column of type {ty} is not read by the store")),
    };
    f(v)
}

/// How long a transaction waits for a pooled connection before it fails: the pool's
/// `connect_timeout`.
pub(crate) fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_outside_quotes() {
        assert_eq!(
            placeholders("SELECT a FROM t WHERE b = ?2 AND c = ?1 AND d = '?3' AND e = ?"),
            "SELECT a FROM t WHERE b = $2 AND c = $1 AND d = '?3' AND e = $1"
        );
        assert_eq!(placeholders("x = ? AND y = ?"), "x = $1 AND y = $2");
        assert_eq!(
            placeholders(r#"SELECT "a?b" FROM t"#),
            r#"SELECT "a?b" FROM t"#
        );
    }

    #[test]
    fn root_cert_comes_out_of_the_url() {
        assert_eq!(
            split_root_cert("postgres://u@h/db?sslmode=require&sslrootcert=/tmp/ca.pem"),
            (
                "postgres://u@h/db?sslmode=require".to_owned(),
                Some("/tmp/ca.pem".to_owned())
            )
        );
        assert_eq!(
            split_root_cert("postgres://u@h/db?sslrootcert=/c"),
            ("postgres://u@h/db".to_owned(), Some("/c".to_owned()))
        );
        assert_eq!(
            split_root_cert("postgres://u@h/db"),
            ("postgres://u@h/db".to_owned(), None)
        );
        assert_eq!(
            split_root_cert("postgres://u@h/db?sslmode=verify-full"),
            ("postgres://u@h/db?sslmode=require".to_owned(), None)
        );
    }

    #[test]
    fn numeric_decodes_integers_and_fractions() {
        // 123456789 = digits [1, 2345, 6789], weight 2.
        let mut b = vec![0, 3, 0, 2, 0, 0, 0, 0];
        for d in [1i16, 2345, 6789] {
            b.extend_from_slice(&d.to_be_bytes());
        }
        assert!(matches!(numeric(&b), Ok(ValueRef::Int(123_456_789))));
        // -1.5 = digits [1, 5000], weight 0, sign negative.
        let mut b = vec![0, 2, 0, 0, 0x40, 0, 0, 1];
        for d in [1i16, 5000] {
            b.extend_from_slice(&d.to_be_bytes());
        }
        assert!(matches!(numeric(&b), Ok(ValueRef::Real(r)) if (r + 1.5).abs() < 1e-9));
        // zero: no digits.
        assert!(matches!(
            numeric(&[0, 0, 0, 0, 0, 0, 0, 0]),
            Ok(ValueRef::Int(0))
        ));
        assert!(numeric(&[0, 1]).is_err());
    }
}
