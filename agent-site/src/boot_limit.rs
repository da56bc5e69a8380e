//! The boot service's limit on iPXE script fetches per source address (issue 30.2).
//!
//! # Background
//! A script request names its machine by MAC alone (PXE has nothing better), and the answer to
//! a machine with a boot pending holds its one-time boot token. Without a limit, one host on the
//! provisioning network asked 256 MACs in half a second.
//!
//! # Design
//! A token bucket per source IP: [`FETCH_BURST`] fetches at once, then [`FETCHES_PER_SECOND`].
//! A machine fetches its script once or twice per boot (once per NIC iPXE tries), so a rack
//! powering on behind one address stays well inside the burst, while guessing MACs runs at two
//! a second. A refused fetch is answered `429 Too Many Requests` and counted
//! (`bcd_site_boot_requests_total{outcome="rate_limited"}`). Kernel and initramfs downloads are
//! not limited here (they carry no secret; the listener's connection caps bound them).
//!
//! # Limitations
//! Per address: many addresses guess faster together (keep the provisioning network to the
//! site's machines). At most [`MAX_TRACKED`] addresses are tracked; past that, addresses whose
//! bucket has refilled are forgotten first, then the oldest.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Instant;

use parking_lot::Mutex;

/// Script fetches one address may make at once.
pub const FETCH_BURST: u32 = 64;
/// Script fetches one address may make per second once its burst is spent.
pub const FETCHES_PER_SECOND: u32 = 2;
/// Addresses tracked at most (a bound on memory whatever the network sends).
pub const MAX_TRACKED: usize = 65_536;

/// Token buckets of script fetches, one per source address.
#[derive(Debug)]
pub struct FetchLimiter {
    burst: f64,
    per_second: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for FetchLimiter {
    fn default() -> Self {
        Self::new(FETCH_BURST, FETCHES_PER_SECOND)
    }
}

impl FetchLimiter {
    /// `burst` fetches at once (at least 1), then `per_second`.
    pub fn new(burst: u32, per_second: u32) -> Self {
        Self {
            burst: f64::from(burst.max(1)),
            per_second: f64::from(per_second),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a fetch from `ip` at `now`: false when its bucket is empty.
    pub fn allow_at(&self, ip: IpAddr, now: Instant) -> bool {
        let mut buckets = self.buckets.lock();
        if buckets.len() >= MAX_TRACKED && !buckets.contains_key(&ip) {
            self.forget(&mut buckets, now);
        }
        let b = buckets.entry(ip).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refill = now.saturating_duration_since(b.at).as_secs_f64() * self.per_second;
        b.tokens = (b.tokens + refill).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// [`Self::allow_at`] now.
    pub fn allow(&self, ip: IpAddr) -> bool {
        self.allow_at(ip, Instant::now())
    }

    /// Makes room: addresses whose bucket is full again, else the least recently seen half.
    fn forget(&self, buckets: &mut HashMap<IpAddr, Bucket>, now: Instant) {
        let full = |b: &Bucket| {
            b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.per_second
                >= self.burst
        };
        buckets.retain(|_, b| !full(b));
        if buckets.len() >= MAX_TRACKED {
            let mut seen: Vec<Instant> = buckets.values().map(|b| b.at).collect();
            seen.sort_unstable();
            let cut = seen[seen.len() / 2];
            buckets.retain(|_, b| b.at > cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate_per_address() {
        let l = FetchLimiter::new(3, 2);
        let t0 = Instant::now();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        assert!((0..3).all(|_| l.allow_at(a, t0)));
        assert!(!l.allow_at(a, t0), "the burst is spent");
        // Another address has its own bucket.
        assert!(l.allow_at(b, t0));
        // Half a second gives one fetch back at 2 a second; never more than the burst.
        assert!(l.allow_at(a, t0 + Duration::from_millis(500)));
        assert!(!l.allow_at(a, t0 + Duration::from_millis(500)));
        let later = t0 + Duration::from_secs(3600);
        assert_eq!((0..5).filter(|_| l.allow_at(a, later)).count(), 3);
    }

    #[test]
    fn tracked_addresses_are_bounded() {
        let l = FetchLimiter::new(2, 1);
        let t0 = Instant::now();
        for i in 0..(MAX_TRACKED as u32 + 10) {
            let ip: IpAddr = std::net::Ipv4Addr::from(0x0a00_0000 + i).into();
            l.allow_at(ip, t0 + Duration::from_micros(u64::from(i)));
        }
        assert!(l.buckets.lock().len() <= MAX_TRACKED);
    }
}
