//! Bounded concurrency toward BMCs: at most `max_requests_per_bmc` operations in flight per BMC
//! and `max_requests_per_site` across the site, shared by commands and the power sync loop.
//!
//! # Design
//! One semaphore per BMC and one for the site. A caller takes its BMC's permit first (waiting
//! for its own BMC delays nobody else) and the site's second, so a permit of the site is held
//! only while a request is really in flight. Each operation runs its requests one after the
//! other, so permits bound requests in flight too. BMC session tables are small (many BMCs allow
//! four or five sessions), which is what the per-BMC bound protects.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The site-wide bound.
#[derive(Debug, Clone)]
pub struct SiteLimit {
    sem: Arc<Semaphore>,
    limit: usize,
}

impl SiteLimit {
    /// At most `limit` (at least 1) in flight across the site.
    pub fn new(limit: usize) -> Self {
        let limit = limit.max(1);
        Self {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

/// One BMC's bound, tied to the site's.
#[derive(Debug, Clone)]
pub struct BmcLimit {
    sem: Arc<Semaphore>,
    limit: usize,
    site: SiteLimit,
}

/// Both permits of one operation; dropping it releases them.
#[derive(Debug)]
pub struct Permit {
    _bmc: OwnedSemaphorePermit,
    _site: OwnedSemaphorePermit,
}

impl BmcLimit {
    /// At most `limit` (at least 1) in flight to this BMC, within `site`.
    pub fn new(limit: usize, site: &SiteLimit) -> Self {
        let limit = limit.max(1);
        Self {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
            site: site.clone(),
        }
    }

    /// The bound.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Waits for this BMC's permit, then the site's. `None` only if a semaphore was closed
    /// (never done here).
    pub async fn acquire(&self) -> Option<Permit> {
        let bmc = Arc::clone(&self.sem).acquire_owned().await.ok()?;
        let site = Arc::clone(&self.site.sem).acquire_owned().await.ok()?;
        Some(Permit {
            _bmc: bmc,
            _site: site,
        })
    }

    /// Whether no operation holds a permit of this BMC.
    pub fn idle(&self) -> bool {
        self.sem.available_permits() == self.limit
    }

    /// Whether this limit has the same bound and the same site semaphore as `site` would give.
    pub fn same_shape(&self, limit: usize, site: &SiteLimit) -> bool {
        self.limit == limit.max(1) && Arc::ptr_eq(&self.site.sem, &site.sem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Runs `n` tasks per BMC through `limits`, each holding its permit a while; returns the
    /// highest concurrency seen per BMC and across the site.
    async fn run(limits: Vec<BmcLimit>, n: usize) -> (Vec<usize>, usize) {
        let site_now = Arc::new(AtomicUsize::new(0));
        let site_max = Arc::new(AtomicUsize::new(0));
        let mut per_bmc = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for l in limits {
            let now = Arc::new(AtomicUsize::new(0));
            let max = Arc::new(AtomicUsize::new(0));
            per_bmc.push(Arc::clone(&max));
            for _ in 0..n {
                let (l, now, max) = (l.clone(), Arc::clone(&now), Arc::clone(&max));
                let (site_now, site_max) = (Arc::clone(&site_now), Arc::clone(&site_max));
                tasks.spawn(async move {
                    let _p = l.acquire().await;
                    max.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    site_max.fetch_max(
                        site_now.fetch_add(1, Ordering::SeqCst) + 1,
                        Ordering::SeqCst,
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    site_now.fetch_sub(1, Ordering::SeqCst);
                    now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
        while tasks.join_next().await.is_some() {}
        (
            per_bmc.iter().map(|m| m.load(Ordering::SeqCst)).collect(),
            site_max.load(Ordering::SeqCst),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn never_more_than_the_bounds_and_they_are_reached() {
        let site = SiteLimit::new(5);
        let limits = (0..4).map(|_| BmcLimit::new(2, &site)).collect();
        let (per_bmc, site_max) = run(limits, 10).await;
        assert!(per_bmc.iter().all(|m| *m == 2), "{per_bmc:?}");
        assert_eq!(site_max, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn zero_means_one() {
        let site = SiteLimit::new(0);
        assert_eq!(site.limit(), 1);
        let l = BmcLimit::new(0, &site);
        assert_eq!(l.limit(), 1);
        assert!(l.same_shape(1, &site));
        assert!(!l.same_shape(1, &SiteLimit::new(1)));
        let (per_bmc, site_max) = run(vec![l], 3).await;
        assert_eq!((per_bmc, site_max), (vec![1], 1));
    }
}
