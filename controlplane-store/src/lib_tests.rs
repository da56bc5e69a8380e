//! The store's own tests: migrations, reopening, and a state dir written before migration 4.

use super::*;

fn sqlite(store: &Store) -> Arc<Mutex<Connection>> {
    match &store.backend {
        Backend::Sqlite(c) => Arc::clone(c),
        Backend::Postgres(_) => unreachable!("these tests open SQLite files"),
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
    // Every later migration runs too (5: trusted keys, rejoin requests; 6: session_broken, pool
    // acceptance; 7: bare metal; 8: ramdisk boots; 9: the workflows after ready; 10: the
    // controllers' lease; 11: remediation; 12: the boot
    // override's clearing; 13: mismatches on boots, deploy identities).
    assert_eq!(version, 13, "every migration ran");
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

#[test]
fn migration_5_demotes_duplicate_trusted_keys_and_then_refuses_them() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Task(e.to_string()))?;
    let path = dir.path().join("state.db");
    let trusted_cond = r#"[{"type":"SpecConverged","status":"true","reason":"Converged","message":"","lastTransitionTime":"2025-01-01T00:00:00.000Z","owner":"NodeLifecycle"},{"type":"HardwareKeyTrusted","status":"true","reason":"Trusted","message":"2 independent identifiers","lastTransitionTime":"2025-01-01T00:00:00.000Z","owner":"Inventory"}]"#;
    {
        // A store written before migration 5, where only code kept trusted keys apart: three
        // nodes claim key k1 (the oldest keeps it), one holds k2 alone.
        let mut conn = Connection::open(&path)?;
        Migrations::new(vec![
            M::up(migrations::M001_NODE_MODEL),
            M::up(migrations::M002_PLACEMENT),
            M::up(migrations::M003_COMMANDS),
            M::up(migrations::M004_SCALE),
        ])
        .to_latest(&mut conn)?;
        for (id, key, created, conditions) in [
            ("node_b", "k1", 20, trusted_cond),
            ("node_a", "k1", 10, trusted_cond),
            ("node_c", "k1", 30, "not json"),
            ("node_d", "k2", 40, trusted_cond),
        ] {
            conn.execute(
                "INSERT INTO nodes (id, provision_state, hardware_key, hardware_key_trusted, \
                 conditions, created_at, updated_at) VALUES (?1, 'adopted', ?2, 1, ?3, ?4, ?4)",
                rusqlite::params![id, key, conditions, created],
            )?;
        }
    }
    let store = Store::open(&path)?;
    // node_c's conditions column is junk (kept as it was): read the columns themselves.
    let rows: Vec<(String, bool, u64)> = {
        let c = sqlite(&store);
        let c = c.lock();
        let mut st =
            c.prepare("SELECT id, hardware_key_trusted, version FROM nodes ORDER BY id")?;
        st.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0),
            ))
        })?
        .collect::<Result<_, _>>()?
    };
    assert_eq!(
        rows,
        vec![
            ("node_a".to_owned(), true, 1),
            ("node_b".to_owned(), false, 2),
            ("node_c".to_owned(), false, 2),
            ("node_d".to_owned(), true, 1),
        ]
    );
    let b = store
        .read_blocking(|r| r.node("node_b"))?
        .ok_or_else(|| StoreError::Task("node_b".into()))?;
    let cond = b
        .conditions
        .iter()
        .find(|c| c.type_ == "HardwareKeyTrusted")
        .ok_or_else(|| StoreError::Task("condition".into()))?;
    assert_eq!(cond.status, bc_protocol::ConditionStatus::False);
    assert_eq!(cond.reason, "DuplicateKey");
    assert!(cond.message.contains("node_a"), "{}", cond.message);
    assert_eq!(b.conditions.len(), 2, "other conditions stay");
    let events = store.read_blocking(|r| r.events("node_b"))?;
    assert!(
        events
            .iter()
            .any(|e| e.kind == "hardwareKey" && e.to.as_deref() == Some("duplicate")),
        "{events:?}"
    );
    // From now on the store itself refuses a second trusted holder, with the clear error.
    let mut again = b.clone();
    again.hardware_key_trusted = true;
    let refused = store.write_blocking(|tx| tx.update_node(&b, &again, true, 0));
    assert!(
        matches!(refused, Err(StoreError::DuplicateTrustedKey { ref key }) if key == "k1"),
        "{refused:?}"
    );
    assert!(
        refused
            .err()
            .is_some_and(|e| e.to_string().starts_with("DUPLICATE_HARDWARE_KEY"))
    );
    // An untrusted copy of the key is still allowed.
    let mut untrusted = b.clone();
    untrusted.hostname = Some("b".into());
    store.write_blocking(|tx| tx.update_node(&b, &untrusted, true, 0))?;
    let version: i64 = sqlite(&store)
        .lock()
        .query_row("PRAGMA user_version", [], |r| r.get(0))?;
    // Migrations 6 (session_broken, pool acceptance), 7 (bare metal) and 8 (ramdisk boots) run
    // after it, and the later ones (up to 13: remediation, the boot override's clearing, boot
    // mismatches and deploy identities).
    assert_eq!(version, 13);
    Ok(())
}

async fn recv(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Notice>,
) -> Result<Option<Notice>, StoreError> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .map_err(|_| StoreError::Task("no notice in 10 s".into()))
}

#[tokio::test]
async fn what_one_replica_notifies_another_hears() -> Result<(), StoreError> {
    let store = crate::testing::store()?;
    let Some(mut rx) = store.listen("bc_test_notices") else {
        // SQLite: one process, nobody to tell.
        assert!(!crate::testing::on_postgres());
        assert!(!store.notify("bc_test_notices", "x".into()).await?);
        return Ok(());
    };
    assert_eq!(recv(&mut rx).await?, Some(Notice::Resync));
    // A second store handle stands in for another replica.
    assert!(
        store
            .notify("bc_test_notices", "node_a open 3".into())
            .await?
    );
    assert_eq!(
        recv(&mut rx).await?,
        Some(Notice::Message("node_a open 3".into()))
    );
    Ok(())
}
