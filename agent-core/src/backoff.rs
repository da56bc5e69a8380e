//! Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff And
//! Jitter"): the n-th wait is uniform in [0, min(cap, base * 2^n)], so a fleet that lost its
//! control plane at once does not come back at once.

use std::time::Duration;

use rand::Rng;

/// Backoff state.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// Waits start at `base` and never exceed `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The ceiling of the next wait, before jitter.
    pub fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(30)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next wait: uniform in [0, ceiling]; the ceiling doubles.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.delay();
        self.attempt = self.attempt.saturating_add(1);
        d
    }

    /// A wait uniform in [0, ceiling] that leaves the ceiling as it is: between attempts at
    /// the URLs of one round ([`crate::endpoints::Endpoints`]), which still spreads a fleet's
    /// reconnects out, while the ceiling doubles only once per round.
    pub fn delay(&self) -> Duration {
        let ms = u64::try_from(self.ceiling().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rand::rng().random_range(0..=ms))
    }

    /// Back to the first step (after a session that worked).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_to_the_cap_and_waits_stay_under_it() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(120));
        let mut ceilings = Vec::new();
        for _ in 0..20 {
            let c = b.ceiling();
            let d = b.next_delay();
            assert!(d <= c, "{d:?} > {c:?}");
            ceilings.push(c);
        }
        assert_eq!(ceilings[0], Duration::from_millis(100));
        assert_eq!(ceilings[3], Duration::from_millis(800));
        assert_eq!(
            *ceilings.last().unwrap_or(&Duration::ZERO),
            Duration::from_secs(120)
        );
        b.reset();
        assert_eq!(b.ceiling(), Duration::from_millis(100));
    }

    #[test]
    fn delay_draws_under_the_ceiling_without_raising_it() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(120));
        b.next_delay();
        for _ in 0..50 {
            assert!(b.delay() <= Duration::from_millis(200));
        }
        assert_eq!(b.ceiling(), Duration::from_millis(200));
    }
}
