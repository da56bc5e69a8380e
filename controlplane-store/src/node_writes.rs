//! Writes of one node's own rows: what its session reports (session open and close, inventory,
//! SpecStatus). On SQLite they are ordinary write transactions; on PostgreSQL they take the
//! global write lock shared and the node's row `FOR UPDATE` (`pg` module), so the reports of
//! different nodes commit at once across every replica, while a global writer still runs alone.
//!
//! # The contract of a node's write
//! The closure writes only `node_id`'s rows (its node row, events, identifier index, BMC and boot
//! rows) and decides only on facts that global writers own (pools, profiles, tokens): nothing
//! another node's write changes. The one exception, a trusted hardware key's uniqueness, is
//! locked per key inside [`Reader::trusted_key_holder`]. Code that would go further calls
//! [`Tx::require_write_lock`] first: on PostgreSQL the transaction is rolled back there and the
//! closure runs again as a global write, which is why it is `Fn`.

use crate::{Backend, Reader, Store, StoreError, Tx, db, sqlite_write};

impl Store {
    /// Runs `f` as a write of node `node_id`'s own rows (module docs) on the calling thread;
    /// commits when it returns `Ok`. `f` may run twice on PostgreSQL (once rolled back).
    pub fn write_node_blocking<T, E>(
        &self,
        node_id: &str,
        f: impl Fn(&Tx<'_>) -> Result<T, E>,
    ) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        match &self.backend {
            Backend::Sqlite(conn) => sqlite_write(&mut conn.lock(), f),
            Backend::Postgres(pg) => pg.node_transaction(node_id, |s| f(&Tx::on_pg(s))),
        }
    }

    /// [`Store::write_node_blocking`] on tokio's blocking pool.
    pub async fn write_node<T, E, F>(&self, node_id: String, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: Fn(&Tx<'_>) -> Result<T, E> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.write_node_blocking(&node_id, f))
            .await
            .map_err(|e| E::from(StoreError::Task(e.to_string())))?
    }

    /// How many node writes ran again as global writes since the store opened (0 on SQLite):
    /// `bcctl_store_node_write_escalations_total`.
    pub fn node_write_escalations(&self) -> u64 {
        match &self.backend {
            Backend::Sqlite(_) => 0,
            Backend::Postgres(pg) => pg.escalations(),
        }
    }
}

impl Tx<'_> {
    /// Says that what follows needs the global write lock (it reads or writes other nodes'
    /// rows). Inside [`Store::write_node`] on PostgreSQL this fails with
    /// [`StoreError::WriteLockNeeded`], and the store runs the closure again as a global write;
    /// everywhere else the lock is held already and this is `Ok`.
    pub fn require_write_lock(&self) -> Result<(), StoreError> {
        match self.db() {
            db::Db::Pg(s) => s.require_write_lock(),
            db::Db::Sqlite(_) => Ok(()),
        }
    }
}

impl Reader<'_> {
    /// Inside a node's write on PostgreSQL, the lock that serializes claims of trusted hardware
    /// key `key`; nothing elsewhere.
    pub(crate) fn lock_hardware_key(&self, key: &str) -> Result<(), StoreError> {
        match self.db() {
            db::Db::Pg(s) => s.lock_hardware_key(key),
            db::Db::Sqlite(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{Receiver, Sender, channel};
    use std::time::Duration;

    use crate::{Store, StoreError, Tx, testing};

    const WAIT: Duration = Duration::from_secs(20);

    fn task(e: impl std::fmt::Display) -> StoreError {
        StoreError::Task(e.to_string())
    }

    fn store_with(ids: &[&str]) -> Result<Store, StoreError> {
        let store = testing::store()?;
        store.write_blocking(|tx| {
            for id in ids {
                tx.insert_node(&testing::new_node(id), 1)?;
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(store)
    }

    /// Sets node `id`'s hostname inside `tx` (a saved change of that node's row alone).
    fn set_hostname(tx: &Tx<'_>, id: &str, hostname: &str) -> Result<(), StoreError> {
        let before = tx.node(id)?.ok_or_else(|| task("no row"))?;
        let mut after = before.clone();
        after.hostname = Some(hostname.to_owned());
        assert!(tx.update_node(&before, &after, false, 1)?);
        Ok(())
    }

    fn hostname(store: &Store, id: &str) -> Result<Option<String>, StoreError> {
        store.read_blocking(|r| Ok(r.node(id)?.and_then(|n| n.hostname)))
    }

    /// A node write of `id` that sets its hostname to `name`, says so on `held`, and holds its
    /// transaction open until `release` says go (or [`WAIT`] passes: then it fails).
    fn held_write(
        store: &Store,
        id: &'static str,
        name: &'static str,
        held: std::sync::mpsc::Sender<()>,
        release: Receiver<()>,
    ) -> std::thread::JoinHandle<Result<(), StoreError>> {
        let store = store.clone();
        std::thread::spawn(move || {
            store.write_node_blocking(id, |tx| {
                set_hostname(tx, id, name)?;
                let _ = held.send(());
                release.recv_timeout(WAIT).map_err(task)
            })
        })
    }

    /// On PostgreSQL two nodes' writes run at once: B commits while A's transaction is open.
    #[test]
    fn on_postgres_writes_of_two_nodes_commit_at_once() -> Result<(), StoreError> {
        if !testing::on_postgres() {
            return Ok(());
        }
        let store = store_with(&["a", "b"])?;
        let (held, held_rx) = channel();
        let (release, release_rx) = channel();
        let a = held_write(&store, "a", "from-a", held, release_rx);
        held_rx.recv_timeout(WAIT).map_err(task)?;
        // Would wait for A under one global lock, and A waits for us: the test would fail at
        // A's timeout instead.
        store.write_node_blocking("b", |tx| set_hostname(tx, "b", "from-b"))?;
        assert_eq!(hostname(&store, "b")?.as_deref(), Some("from-b"));
        assert_eq!(hostname(&store, "a")?, None, "A has not committed yet");
        release.send(()).map_err(task)?;
        a.join().map_err(|_| task("A panicked"))??;
        assert_eq!(hostname(&store, "a")?.as_deref(), Some("from-a"));
        assert_eq!(store.node_write_escalations(), 0);
        Ok(())
    }

    /// A global write runs alone: one started while a node's write is open waits for its commit
    /// and reads what it wrote; a node's write started while a global one is open likewise.
    #[test]
    fn on_postgres_global_writes_exclude_node_writes_both_ways() -> Result<(), StoreError> {
        if !testing::on_postgres() {
            return Ok(());
        }
        let store = store_with(&["a"])?;
        let (held, held_rx) = channel();
        let (release, release_rx) = channel();
        let a = held_write(&store, "a", "node-write", held, release_rx);
        held_rx.recv_timeout(WAIT).map_err(task)?;
        let global = {
            let store = store.clone();
            std::thread::spawn(move || {
                store.write_blocking(|tx| {
                    Ok::<_, StoreError>(tx.node("a")?.and_then(|n| n.hostname))
                })
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        release.send(()).map_err(task)?;
        a.join().map_err(|_| task("node write panicked"))??;
        let seen = global.join().map_err(|_| task("global write panicked"))??;
        assert_eq!(
            seen.as_deref(),
            Some("node-write"),
            "the global write ran inside the node's"
        );

        let (held, held_rx) = channel();
        let (release, release_rx) = channel::<()>();
        let global = {
            let store = store.clone();
            std::thread::spawn(move || {
                store.write_blocking(|tx| {
                    set_hostname(tx, "a", "global-write")?;
                    let _ = held.send(());
                    release_rx.recv_timeout(WAIT).map_err(task)
                })
            })
        };
        held_rx.recv_timeout(WAIT).map_err(task)?;
        let node = {
            let store = store.clone();
            std::thread::spawn(move || {
                store.write_node_blocking("a", |tx| {
                    Ok::<_, StoreError>(tx.node("a")?.and_then(|n| n.hostname))
                })
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        release.send(()).map_err(task)?;
        global.join().map_err(|_| task("global write panicked"))??;
        let seen = node.join().map_err(|_| task("node write panicked"))??;
        assert_eq!(
            seen.as_deref(),
            Some("global-write"),
            "the node's write ran inside the global one"
        );
        Ok(())
    }

    /// Writes of one node queue on its row: each read-modify-write sees the one before, none is
    /// lost and none fails on the version check (both backends).
    #[test]
    fn writes_of_one_node_queue_on_its_row() -> Result<(), StoreError> {
        let store = store_with(&["a"])?;
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for _ in 0..5 {
                        store.write_node_blocking("a", |tx| {
                            let before = tx.node("a")?.ok_or_else(|| task("no row"))?;
                            let mut after = before.clone();
                            after.session_epoch += 1;
                            if tx.update_node(&before, &after, false, 1)? {
                                Ok(())
                            } else {
                                Err(task("the row moved under the write"))
                            }
                        })?;
                    }
                    Ok::<_, StoreError>(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| task("writer panicked"))??;
        }
        let epoch =
            store.read_blocking(|r| Ok::<_, StoreError>(r.node("a")?.map(|n| n.session_epoch)))?;
        assert_eq!(epoch, Some(40));
        Ok(())
    }

    /// Two nodes claiming one trusted hardware key in writes that overlap: the second's holder
    /// query waits for the first's commit and names it.
    #[test]
    fn on_postgres_two_nodes_claiming_one_trusted_key_serialize() -> Result<(), StoreError> {
        if !testing::on_postgres() {
            return Ok(());
        }
        let key = "ab".repeat(32);
        let store = store_with(&["a", "b"])?;
        let claim = move |tx: &Tx<'_>, id: &str| -> Result<Option<String>, StoreError> {
            let holder = tx.trusted_key_holder(&key, id)?;
            let before = tx.node(id)?.ok_or_else(|| task("no row"))?;
            let mut after = before.clone();
            after.hardware_key = Some(key.clone());
            after.hardware_key_trusted = holder.is_none();
            assert!(tx.update_node(&before, &after, false, 1)?);
            Ok(holder)
        };
        let (held, held_rx) = channel();
        let (release, release_rx) = channel::<()>();
        let first = {
            let (store, claim) = (store.clone(), claim.clone());
            std::thread::spawn(move || {
                store.write_node_blocking("a", |tx| {
                    let holder = claim(tx, "a")?;
                    let _ = held.send(());
                    release_rx.recv_timeout(WAIT).map_err(task)?;
                    Ok::<_, StoreError>(holder)
                })
            })
        };
        held_rx.recv_timeout(WAIT).map_err(task)?;
        let second = {
            let store = store.clone();
            std::thread::spawn(move || store.write_node_blocking("b", |tx| claim(tx, "b")))
        };
        std::thread::sleep(Duration::from_millis(300));
        release.send(()).map_err(task)?;
        assert_eq!(first.join().map_err(|_| task("a panicked"))??, None);
        assert_eq!(
            second.join().map_err(|_| task("b panicked"))??.as_deref(),
            Some("a"),
            "b claimed a key a held"
        );
        let trusted = store.read_blocking(|r| {
            ["a", "b"]
                .iter()
                .map(|id| {
                    r.node(id)
                        .map(|n| n.is_some_and(|n| n.hardware_key_trusted))
                })
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        assert_eq!(trusted, [true, false]);
        Ok(())
    }

    /// A node's write that asks for the global lock is rolled back and runs again under it: its
    /// first part is not written twice (both backends; SQLite holds the lock already).
    #[test]
    fn a_node_write_that_needs_the_write_lock_runs_again_under_it() -> Result<(), StoreError> {
        let store = store_with(&["a", "b"])?;
        let runs = AtomicUsize::new(0);
        store.write_node_blocking("a", |tx| {
            runs.fetch_add(1, Ordering::SeqCst);
            let before = tx.node("a")?.ok_or_else(|| task("no row"))?;
            let mut after = before.clone();
            after.session_epoch += 1;
            assert!(tx.update_node(&before, &after, false, 1)?);
            tx.require_write_lock()?;
            set_hostname(tx, "b", "written under the global lock")
        })?;
        let expected_runs = if testing::on_postgres() { 2 } else { 1 };
        assert_eq!(runs.load(Ordering::SeqCst), expected_runs);
        assert_eq!(store.node_write_escalations(), expected_runs as u64 - 1);
        let epoch =
            store.read_blocking(|r| Ok::<_, StoreError>(r.node("a")?.map(|n| n.session_epoch)))?;
        assert_eq!(epoch, Some(1), "the rolled-back first run left nothing");
        assert_eq!(
            hostname(&store, "b")?.as_deref(),
            Some("written under the global lock")
        );
        Ok(())
    }

    /// Two node writes that lock each other's rows deadlock; PostgreSQL aborts one, which runs
    /// again under the global lock, and both land.
    #[test]
    fn on_postgres_a_deadlocked_node_write_runs_again_under_the_write_lock()
    -> Result<(), StoreError> {
        if !testing::on_postgres() {
            return Ok(());
        }
        let store = store_with(&["a", "b"])?;
        let cross =
            |own: &'static str, other: &'static str, mine: Sender<()>, theirs: Receiver<()>| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let first = AtomicUsize::new(0);
                    store.write_node_blocking(own, |tx| {
                        set_hostname(tx, own, own)?;
                        // Only the first run meets the other: the rerun holds the global lock.
                        if first.fetch_add(1, Ordering::SeqCst) == 0 {
                            let _ = mine.send(());
                            theirs.recv_timeout(WAIT).map_err(task)?;
                        }
                        let before = tx.node(other)?.ok_or_else(|| task("no row"))?;
                        let mut after = before.clone();
                        after.session_epoch += 1;
                        assert!(tx.update_node(&before, &after, false, 1)?);
                        Ok::<_, StoreError>(())
                    })
                })
            };
        let (a_holds, a_held) = channel();
        let (b_holds, b_held) = channel();
        let (a, b) = (
            cross("a", "b", a_holds, b_held),
            cross("b", "a", b_holds, a_held),
        );
        a.join().map_err(|_| task("a panicked"))??;
        b.join().map_err(|_| task("b panicked"))??;
        assert_eq!(store.node_write_escalations(), 1);
        let rows = store.read_blocking(|r| {
            ["a", "b"]
                .iter()
                .map(|id| r.node(id).map(|n| n.map(|n| (n.hostname, n.session_epoch))))
                .collect::<Result<Vec<_>, StoreError>>()
        })?;
        assert_eq!(
            rows,
            [
                Some((Some("a".to_owned()), 1)),
                Some((Some("b".to_owned()), 1))
            ]
        );
        Ok(())
    }
}
