//! The background [`Watcher`] of the node agent and the ramdisk: one thread that listens on every
//! physical, up Ethernet link ([`super::default_interfaces`], looked at again every
//! [`RESCAN`]) and keeps their neighbours until their TTL runs out. Reading it never blocks on
//! the wire: [`Watcher::neighbors`] is a copy of the table.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::listen::{Sockets, report};
use super::table::{Neighbors, Table};
use crate::hostroot::HostRoot;

/// How often the watcher looks for links that came up or went away.
pub const RESCAN: Duration = Duration::from_secs(10);
/// The longest one `poll(2)` waits, so that a stop is seen within it.
const TICK: Duration = Duration::from_millis(250);

/// Why the watcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatcherError {
    /// The thread could not be spawned.
    #[error("cannot start the LLDP listener thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// What the thread and the readers share.
#[derive(Debug, Default)]
struct Shared {
    table: Mutex<Table>,
    /// Signalled whenever an LLDPDU is recorded or the links change.
    changed: Condvar,
    /// Why LLDP is not (fully) listened to, for the inventory's notes; replaced at each rescan.
    problems: Mutex<Vec<String>>,
    /// Set once the first scan of the links is done.
    scanned: AtomicBool,
    stop: AtomicBool,
}

/// A running listener; stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct Watcher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Starts listening on the default interfaces under `root` (a live root only: the sockets
    /// are this process's network namespace's). Without `CAP_NET_RAW` the thread logs it once,
    /// keeps the reason for [`Watcher::problems`] and ends; the table stays empty.
    pub fn spawn(root: HostRoot) -> Result<Self, WatcherError> {
        Self::start(move || super::default_interfaces(&root))
    }

    /// Starts listening on `interfaces` only (what `--lldp-interface` names), in the network
    /// namespace of the calling thread.
    pub fn spawn_on(interfaces: Vec<String>) -> Result<Self, WatcherError> {
        Self::start(move || interfaces.clone())
    }

    /// Starts the thread; `links` gives the interfaces at each rescan.
    fn start(links: impl Fn() -> Vec<String> + Send + 'static) -> Result<Self, WatcherError> {
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("bcd-lldp".into())
            .spawn(move || run(&links, &s))
            .map_err(WatcherError::Spawn)?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The neighbours heard and not expired, by interface.
    pub fn neighbors(&self) -> Neighbors {
        self.shared.table.lock().neighbors(Instant::now())
    }

    /// Why some link is not listened to (a missing `CAP_NET_RAW`, an interface that vanished).
    pub fn problems(&self) -> Vec<String> {
        self.shared.problems.lock().clone()
    }

    /// True once every link listened on has heard an LLDPDU (or the listener has ended): what
    /// [`Watcher::wait_heard`] waits for.
    pub fn heard_all(&self) -> bool {
        let table = self.shared.table.lock();
        self.done(&table)
    }

    fn done(&self, table: &Table) -> bool {
        (self.shared.scanned.load(Ordering::Acquire) && table.all_heard())
            || self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Blocks until every link listened on has heard an LLDPDU, the listener has ended, or
    /// `timeout` has passed; returns the neighbours then. For the ramdisk, before it joins.
    pub fn wait_heard(&self, timeout: Duration) -> Neighbors {
        let deadline = Instant::now() + timeout;
        let mut table = self.shared.table.lock();
        loop {
            if self.done(&table) {
                break;
            }
            if self
                .shared
                .changed
                .wait_until(&mut table, deadline)
                .timed_out()
            {
                break;
            }
        }
        table.neighbors(Instant::now())
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: rescan, then poll in ticks until the next rescan, until stopped.
fn run(links: &dyn Fn() -> Vec<String>, shared: &Shared) {
    let mut sockets = Sockets::default();
    while !shared.stop.load(Ordering::Acquire) {
        let ifaces = links();
        let errors = {
            let mut table = shared.table.lock();
            let errors = sockets.sync(&ifaces, &mut table);
            table.expire(Instant::now());
            // Under the table's lock, so a waiter cannot miss it between its check and its wait.
            shared.scanned.store(true, Ordering::Release);
            errors
        };
        let permission = errors.iter().any(|e| e.is_permission());
        // Logged once per change, not every rescan.
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        if lines != *shared.problems.lock() {
            *shared.problems.lock() = report(&errors);
        }
        shared.changed.notify_all();
        if permission {
            // Logged by `report`; the capability does not come back to a running process.
            return;
        }
        let next = Instant::now() + RESCAN;
        while !shared.stop.load(Ordering::Acquire) && Instant::now() < next {
            if sockets.is_empty() {
                std::thread::sleep(TICK);
                continue;
            }
            if sockets.read_into(TICK, &shared.table) {
                shared.changed.notify_all();
            }
        }
    }
}
