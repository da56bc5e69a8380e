//! The store's one door to SQL: a connection inside one transaction, on SQLite or PostgreSQL.
//!
//! # Why
//! Every domain module (nodes, commands, tokens, …) writes its SQL once, in the dialect both
//! databases accept: `?N` placeholders (rewritten to `$N` for PostgreSQL), integers for booleans
//! and times, TEXT for JSON. The few places where the dialects part (JSON functions) ask
//! [`Db::is_postgres`] and say so next to the SQL.
//!
//! # Shapes
//! - [`Db`]: `execute`, `query_row`, `query_map`, `prepare` (a [`Stmt`] run many times),
//!   `execute_batch`. Errors are [`StoreError`]; "no row" is [`StoreError::is_no_rows`], turned into
//!   `None` by [`OptionalExt::optional`].
//! - Parameters: [`params!`](crate::params) builds a `&[&dyn ToValue]`.
//! - [`Row::get`] decodes a column as `i64`, `bool`, `f64`, `String`, `Vec<u8>` or an `Option` of
//!   one. PostgreSQL's `int2`/`int4`/`int8`/`bool`/`numeric` (an integral `SUM`) all read as
//!   integers, as SQLite's INTEGER does.
use crate::pg;
use crate::{BackendError, DatabaseError, StoreError};

/// A value bound to a placeholder.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// Something that binds to a placeholder.
pub(crate) trait ToValue {
    fn to_value(&self) -> Value;
}

impl<T: ToValue + ?Sized> ToValue for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl<T: ToValue> ToValue for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToValue::to_value)
    }
}

macro_rules! int_to_value {
    ($($t:ty),*) => {$(
        impl ToValue for $t {
            fn to_value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
int_to_value!(i64, i32, u32, u16, u8, bool);

impl ToValue for f64 {
    fn to_value(&self) -> Value {
        Value::Real(*self)
    }
}

impl ToValue for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}

impl ToValue for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToValue for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToValue for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl ToValue for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}

/// The parameters of one statement.
pub(crate) type Params<'a> = &'a [&'a dyn ToValue];

/// `params![a, b, …]`: the parameters `?1`, `?2`, … of one statement.
#[macro_export]
#[doc(hidden)]
macro_rules! params {
    () => {
        &[] as &[&dyn $crate::db::ToValue]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::db::ToValue),+] as &[&dyn $crate::db::ToValue]
    };
}

/// One column's value as the database returned it.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ValueRef<'a> {
    Null,
    Int(i64),
    Real(f64),
    Text(&'a str),
    Blob(&'a [u8]),
}

impl ValueRef<'_> {
    fn kind(&self) -> &'static str {
        match self {
            ValueRef::Null => "NULL",
            ValueRef::Int(_) => "an integer",
            ValueRef::Real(_) => "a real",
            ValueRef::Text(_) => "text",
            ValueRef::Blob(_) => "a blob",
        }
    }
}

/// A Rust value read from a column.
pub(crate) trait FromValue: Sized {
    /// The value, or what was found instead ("expected an integer, found text").
    fn from_value(v: ValueRef<'_>) -> Result<Self, String>;
}

fn mismatch<T>(expected: &str, v: ValueRef<'_>) -> Result<T, String> {
    Err(format!("expected {expected}, found {}", v.kind()))
}

impl FromValue for i64 {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Int(i) => Ok(i),
            other => mismatch("an integer", other),
        }
    }
}

impl FromValue for u32 {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        let i = i64::from_value(v)?;
        u32::try_from(i).map_err(|_| format!("{i} is outside 0..=4294967295"))
    }
}

impl FromValue for u64 {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        let i = i64::from_value(v)?;
        u64::try_from(i).map_err(|_| format!("{i} is negative"))
    }
}

impl FromValue for bool {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        Ok(i64::from_value(v)? != 0)
    }
}

impl FromValue for f64 {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Real(r) => Ok(r),
            #[allow(clippy::cast_precision_loss)]
            // an integer column read as a real, as SQLite does
            ValueRef::Int(i) => Ok(i as f64),
            other => mismatch("a real", other),
        }
    }
}

impl FromValue for String {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Text(s) => Ok(s.to_owned()),
            other => mismatch("text", other),
        }
    }
}

impl FromValue for Vec<u8> {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Blob(b) => Ok(b.to_vec()),
            ValueRef::Text(s) => Ok(s.as_bytes().to_vec()),
            other => mismatch("a blob", other),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: ValueRef<'_>) -> Result<Self, String> {
        match v {
            ValueRef::Null => Ok(None),
            other => T::from_value(other).map(Some),
        }
    }
}

/// One result row.
pub(crate) enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Pg(&'r tokio_postgres::Row),
}

impl Row<'_> {
    /// Column `idx` (0-based) as `T`.
    pub(crate) fn get<T: FromValue>(&self, idx: usize) -> Result<T, StoreError> {
        let column = |message: String| {
            StoreError::Database(DatabaseError(BackendError::Column { idx, message }))
        };
        match self {
            Row::Sqlite(r) => {
                let v = r.get_ref(idx)?;
                let v = match v {
                    rusqlite::types::ValueRef::Null => ValueRef::Null,
                    rusqlite::types::ValueRef::Integer(i) => ValueRef::Int(i),
                    rusqlite::types::ValueRef::Real(f) => ValueRef::Real(f),
                    rusqlite::types::ValueRef::Text(t) => ValueRef::Text(
                        std::str::from_utf8(t)
                            .map_err(|e| column(format!("text not UTF-8: {e}")))?,
                    ),
                    rusqlite::types::ValueRef::Blob(b) => ValueRef::Blob(b),
                };
                T::from_value(v).map_err(column)
            }
            Row::Pg(r) => pg::column(r, idx, |v| T::from_value(v)).map_err(column),
        }
    }
}

/// Turns "the query returned no row" into `None`.
pub(crate) trait OptionalExt<T> {
    fn optional(self) -> Result<Option<T>, StoreError>;
}

impl<T> OptionalExt<T> for Result<T, StoreError> {
    fn optional(self) -> Result<Option<T>, StoreError> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_no_rows() => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Rows mapped by a closure, in order (already read: both backends hand whole results).
pub(crate) type MappedRows<T> = std::vec::IntoIter<Result<T, StoreError>>;

/// The connection of one transaction.
#[derive(Clone, Copy)]
pub(crate) enum Db<'c> {
    Sqlite(&'c rusqlite::Connection),
    Pg(&'c pg::Session),
}

impl std::fmt::Debug for Db<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_postgres() {
            "Db::Pg"
        } else {
            "Db::Sqlite"
        })
    }
}

fn sqlite_params(p: Params<'_>) -> Vec<rusqlite::types::Value> {
    p.iter()
        .map(|v| match v.to_value() {
            Value::Null => rusqlite::types::Value::Null,
            Value::Int(i) => rusqlite::types::Value::Integer(i),
            Value::Real(f) => rusqlite::types::Value::Real(f),
            Value::Text(s) => rusqlite::types::Value::Text(s),
            Value::Blob(b) => rusqlite::types::Value::Blob(b),
        })
        .collect()
}

impl<'c> Db<'c> {
    /// Whether this is PostgreSQL (for the few statements whose SQL differs).
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Db::Pg(_))
    }

    /// Runs one statement; the number of rows it changed.
    pub(crate) fn execute(&self, sql: &str, p: Params<'_>) -> Result<usize, StoreError> {
        match self {
            Db::Sqlite(c) => Ok(c
                .prepare_cached(sql)?
                .execute(rusqlite::params_from_iter(sqlite_params(p)))?),
            Db::Pg(s) => s.execute(sql, p),
        }
    }

    /// Runs statements without parameters (savepoints, DDL).
    pub(crate) fn execute_batch(&self, sql: &str) -> Result<(), StoreError> {
        match self {
            Db::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Db::Pg(s) => s.batch(sql),
        }
    }

    /// Every row of a query, each through `f`.
    pub(crate) fn query_map<T>(
        &self,
        sql: &str,
        p: Params<'_>,
        mut f: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<MappedRows<T>, StoreError> {
        let out: Vec<Result<T, StoreError>> = match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(sqlite_params(p)))?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(f(&Row::Sqlite(r)));
                }
                out
            }
            Db::Pg(s) => s.query(sql, p)?.iter().map(|r| f(&Row::Pg(r))).collect(),
        };
        Ok(out.into_iter())
    }

    /// The first row of a query through `f`; [`StoreError::is_no_rows`] when there is none.
    pub(crate) fn query_row<T>(
        &self,
        sql: &str,
        p: Params<'_>,
        f: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(c) => {
                let mut stmt = c.prepare_cached(sql)?;
                let mut rows = stmt.query(rusqlite::params_from_iter(sqlite_params(p)))?;
                match rows.next()? {
                    Some(r) => f(&Row::Sqlite(r)),
                    None => Err(StoreError::from(rusqlite::Error::QueryReturnedNoRows)),
                }
            }
            Db::Pg(s) => match s.query(sql, p)?.first() {
                Some(r) => f(&Row::Pg(r)),
                None => Err(StoreError::Database(DatabaseError(BackendError::NoRows))),
            },
        }
    }

    /// A statement to run several times (prepared once per connection and cached).
    pub(crate) fn prepare(&self, sql: &str) -> Result<Stmt<'c>, StoreError> {
        Ok(Stmt {
            db: *self,
            sql: sql.to_owned(),
        })
    }

    /// Same as [`Db::prepare`]: both backends cache prepared statements per connection.
    pub(crate) fn prepare_cached(&self, sql: &str) -> Result<Stmt<'c>, StoreError> {
        self.prepare(sql)
    }
}

/// A statement of one transaction, run with different parameters.
pub(crate) struct Stmt<'c> {
    db: Db<'c>,
    sql: String,
}

impl Stmt<'_> {
    /// See [`Db::execute`].
    pub(crate) fn execute(&mut self, p: Params<'_>) -> Result<usize, StoreError> {
        self.db.execute(&self.sql, p)
    }

    /// See [`Db::query_map`].
    pub(crate) fn query_map<T>(
        &mut self,
        p: Params<'_>,
        f: impl FnMut(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<MappedRows<T>, StoreError> {
        self.db.query_map(&self.sql, p, f)
    }

    /// See [`Db::query_row`].
    pub(crate) fn query_row<T>(
        &mut self,
        p: Params<'_>,
        f: impl FnOnce(&Row<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.db.query_row(&self.sql, p, f)
    }
}
