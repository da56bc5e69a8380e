//! Caps on open connections, in total and per source address: the part of a listener's limits
//! that needs the peer's address, shared by the gateway's listener (`bcctl serve`) and the
//! small HTTP endpoints ([`crate::http::serve`]: the site agent's boot service, `/metrics`).
//!
//! A connection takes a [`ConnSlot`] right after `accept(2)`, before any byte is read; past a
//! cap it gets none and the caller closes the socket at once. Dropping the slot frees it.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refused {
    /// All addresses together hold the total cap.
    Total,
    /// Its source address holds the per-address cap.
    PerAddress,
}

impl Refused {
    /// `total` or `per_address` (a metric label).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Total => "total",
            Self::PerAddress => "per_address",
        }
    }
}

/// Open connections, in total and per source address.
#[derive(Debug, Default)]
struct Tracker {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// Called with the number of open connections after every change (a gauge).
pub type OpenObserver = Arc<dyn Fn(usize) + Send + Sync>;

/// The caps of one listener. Cheap to clone (the count is shared).
#[derive(Clone)]
pub struct ConnCaps {
    tracker: Arc<Mutex<Tracker>>,
    max_total: usize,
    max_per_address: usize,
    observer: Option<OpenObserver>,
}

impl fmt::Debug for ConnCaps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnCaps")
            .field("max_total", &self.max_total)
            .field("max_per_address", &self.max_per_address)
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

impl ConnCaps {
    /// At most `max_total` open connections and `max_per_address` from one source IP; `0`
    /// turns either cap off.
    pub fn new(max_total: usize, max_per_address: usize) -> Self {
        Self {
            tracker: Arc::default(),
            max_total,
            max_per_address,
            observer: None,
        }
    }

    /// The same caps, telling `observer` the open count after every change.
    pub fn observed(mut self, observer: OpenObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tracker> {
        self.tracker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.lock().total
    }

    /// A slot for a connection from `ip`, or which cap is full.
    pub fn take(&self, ip: IpAddr) -> Result<ConnSlot, Refused> {
        let total = {
            let mut t = self.lock();
            if self.max_total > 0 && t.total >= self.max_total {
                return Err(Refused::Total);
            }
            let mine = t.per_address.get(&ip).copied().unwrap_or(0);
            if self.max_per_address > 0 && mine >= self.max_per_address {
                return Err(Refused::PerAddress);
            }
            t.total += 1;
            t.per_address.insert(ip, mine + 1);
            t.total
        };
        if let Some(o) = &self.observer {
            o(total);
        }
        Ok(ConnSlot {
            caps: self.clone(),
            ip,
        })
    }
}

/// A connection's place under the caps; dropping it frees the place.
pub struct ConnSlot {
    caps: ConnCaps,
    ip: IpAddr,
}

impl fmt::Debug for ConnSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnSlot").field("ip", &self.ip).finish()
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let total = {
            let mut t = self.caps.lock();
            t.total = t.total.saturating_sub(1);
            if let Some(n) = t.per_address.get_mut(&self.ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    t.per_address.remove(&self.ip);
                }
            }
            t.total
        };
        if let Some(o) = &self.caps.observer {
            o(total);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn slots_are_capped_in_total_and_per_address_and_freed_on_drop() {
        let seen = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&seen);
        let caps = ConnCaps::new(3, 2).observed(Arc::new(move |n| s.store(n, Ordering::SeqCst)));
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = caps.take(a);
        let a2 = caps.take(a);
        assert!(a1.is_ok() && a2.is_ok());
        assert_eq!(caps.take(a).err(), Some(Refused::PerAddress));
        let b1 = caps.take(b);
        assert!(b1.is_ok());
        assert_eq!(caps.take(b).err(), Some(Refused::Total));
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        drop(a1);
        assert_eq!(seen.load(Ordering::SeqCst), 2, "the observer sees the drop");
        assert!(caps.take(a).is_ok(), "a freed slot is taken again");
        let off = ConnCaps::new(0, 0);
        let many: Vec<_> = (0..100).map(|_| off.take(a)).collect();
        assert!(many.iter().all(Result::is_ok), "0 turns the caps off");
        assert_eq!(off.open(), 100);
        drop(many);
        assert_eq!(off.open(), 0);
        drop((a2, b1));
    }
}
