//! The store's own tests: migrations, reopening, and a state dir written before migration 4.

use super::*;

fn sqlite(store: &Store) -> Arc<Mutex<Connection>> {
    match &store.backend {
        Backend::Sqlite(c) => Arc::clone(c),
    }
}

#[test]
fn migrations_are_valid_and_reopen_is_idempotent() -> Result<(), StoreError> {
    assert!(migrations().validate().is_ok());
    let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
    let path = dir.path().join("state.db");
    drop(Store::open(&path)?);
    let store = Store::open(&path)?;
    let mode: String = sqlite(&store)
        .lock()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
    assert_eq!(mode, "wal");
    Ok(())
}

#[test]
fn the_database_and_its_wal_are_private_whatever_the_umask() -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
    let path = dir.path().join("state.db");
    let mode = |p: &Path| -> Result<u32, StoreError> {
        let m = std::fs::metadata(p).map_err(|e| StoreError::Task(e.to_string()))?;
        Ok(m.permissions().mode() & 0o777)
    };
    // SQLite alone creates the file 0644 under the usual umask 022 (the process umask cannot be
    // changed safely in a threaded test, so this test relies on a umask that lets 0644 through).
    let store = Store::open(&path)?;
    store.write_blocking(|tx| {
        tx.record_event(&NewEvent {
            node_id: "n",
            at: 0,
            kind: "k",
            from: None,
            to: None,
            actor: "t",
            message: "",
        })
    })?;
    assert_eq!(mode(&path)?, 0o600, "state.db");
    let wal = dir.path().join("state.db-wal");
    if wal.exists() {
        assert_eq!(mode(&wal)?, 0o600, "state.db-wal");
    }
    drop(store);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| StoreError::Task(e.to_string()))?;
    drop(Store::open(&path)?);
    assert_eq!(mode(&path)?, 0o600, "an existing 0644 file is made private");
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
    let conn = sqlite(&store);
    let conn = conn.lock();
    let mut st = conn
        .prepare("SELECT node_id, digest FROM node_identifier_digests ORDER BY node_id, digest")?;
    let rows: Vec<(String, String)> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let expect = [("node_a", "d1"), ("node_a", "d2"), ("node_e", "d3")];
    let expect: Vec<(String, String)> = expect
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    assert_eq!(rows, expect);
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    // Every later migration runs too (5: session_broken, pool acceptance).
    assert_eq!(version, 5);
    Ok(())
}

#[test]
fn a_failed_write_rolls_back_and_a_read_only_store_refuses_writes() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
    let path = dir.path().join("state.db");
    let store = Store::open(&path)?;
    let site = Site {
        id: "site_a".into(),
        name: "a".into(),
        kind: bc_protocol::SiteKind::Platform,
        owner_tenant_id: None,
        version: 1,
        created_at: 0,
    };
    let failed: Result<(), StoreError> = store.write_blocking(|tx| {
        tx.insert_site(&site)?;
        Err(StoreError::Task("abandon".into()))
    });
    assert!(failed.is_err());
    assert!(store.read_blocking(|r| r.site("site_a"))?.is_none());
    store.write_blocking(|tx| tx.insert_site(&site))?;
    let ro = Store::open_read_only(&path)?;
    assert!(ro.read_blocking(|r| r.site("site_a"))?.is_some());
    let mut other = site.clone();
    other.id = "site_b".into();
    assert!(ro.write_blocking(|tx| tx.insert_site(&other)).is_err());
    Ok(())
}
