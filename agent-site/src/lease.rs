//! The site lease as this appliance sees it: held or not, its epoch, and until when it is valid
//! on the local clock.
//!
//! # Design
//! The control plane grants the lease (`SiteAssignment{lease_held, lease_epoch, lease_ttl_ms}`)
//! and renews it with every acknowledged heartbeat of the holder
//! (`HeartbeatAck.site_lease_expires_at_ms` non-zero). Its clock is never trusted for the
//! expiry: a renewal counts from the moment the acknowledged heartbeat was *sent* here (the
//! control plane renewed it when it received it, later), a grant from the moment the assignment
//! arrived, and the lease is taken as lapsed a safety margin (at most half the TTL) before
//! `renewal + ttl`. An acknowledgement saying 0 for a heartbeat sent after the grant means the
//! control plane no longer counts this appliance as the holder.

use std::time::Duration;

use tokio::time::Instant;

/// Why BMC work is refused under the lease.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// This appliance holds no lease (a standby, or it was released).
    #[error("this site agent does not hold the site lease")]
    NotHeld,
    /// The command was issued under another lease epoch.
    #[error("the command was issued under lease epoch {asked}; this site agent holds epoch {held}")]
    OtherEpoch {
        /// The epoch held here.
        held: u64,
        /// The command's epoch.
        asked: u64,
    },
    /// The lease of this epoch lapsed: no renewal in time.
    #[error("the site lease (epoch {epoch}) lapsed {ago:?} ago without a renewal")]
    Lapsed {
        /// The epoch that lapsed.
        epoch: u64,
        /// How long ago (local clock).
        ago: Duration,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    epoch: u64,
    ttl: Duration,
    granted_at: Instant,
    renewed_at: Instant,
    /// Set once an acknowledgement said the control plane no longer counts this holder.
    revoked: bool,
}

/// The lease state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lease {
    held: Option<Held>,
    margin: Duration,
}

impl Lease {
    /// No lease yet; `margin` is the safety margin before the local expiry.
    pub fn new(margin: Duration) -> Self {
        Self { held: None, margin }
    }

    /// An assignment granted (or re-confirmed) the lease of `epoch` for `ttl`, arriving at `at`.
    /// A re-confirmation of the same epoch moves the renewal forward, never back.
    pub fn grant(&mut self, epoch: u64, ttl: Duration, at: Instant) {
        let renewed_at = match self.held {
            Some(h) if h.epoch == epoch && !h.revoked => h.renewed_at.max(at),
            _ => at,
        };
        self.held = Some(Held {
            epoch,
            ttl,
            granted_at: at,
            renewed_at,
            revoked: false,
        });
    }

    /// An assignment said this appliance does not hold the lease.
    pub fn release(&mut self) {
        self.held = None;
    }

    /// A heartbeat sent at `sent_at` was acknowledged with `expires_at_ms` (0: not the holder).
    /// Returns whether the lease state changed.
    pub fn acknowledged(&mut self, sent_at: Instant, expires_at_ms: i64) -> bool {
        let Some(h) = self.held.as_mut() else {
            return false;
        };
        if expires_at_ms > 0 {
            if h.revoked || sent_at <= h.renewed_at {
                return false;
            }
            h.renewed_at = sent_at;
            return true;
        }
        // A heartbeat sent before the grant arrived was answered under the old state.
        if sent_at >= h.granted_at && !h.revoked {
            h.revoked = true;
            return true;
        }
        false
    }

    fn margin_for(&self, ttl: Duration) -> Duration {
        self.margin.min(ttl / 2)
    }

    /// The epoch held, if any (valid or not).
    pub fn epoch(&self) -> Option<u64> {
        self.held.map(|h| h.epoch)
    }

    /// Until when BMC work is allowed (local clock); `None` without a lease.
    pub fn valid_until(&self) -> Option<Instant> {
        let h = self.held.filter(|h| !h.revoked)?;
        Some(h.renewed_at + h.ttl.saturating_sub(self.margin_for(h.ttl)))
    }

    /// Whether BMC work under `epoch` is allowed at `now`.
    pub fn check(&self, epoch: u64, now: Instant) -> Result<(), LeaseError> {
        let h = self.held.ok_or(LeaseError::NotHeld)?;
        if h.epoch != epoch {
            return Err(LeaseError::OtherEpoch {
                held: h.epoch,
                asked: epoch,
            });
        }
        if h.revoked {
            return Err(LeaseError::NotHeld);
        }
        let until = self.valid_until().ok_or(LeaseError::NotHeld)?;
        if now >= until {
            return Err(LeaseError::Lapsed {
                epoch,
                ago: now.saturating_duration_since(until),
            });
        }
        Ok(())
    }

    /// Whether the lease held is valid at `now` (any epoch).
    pub fn is_valid(&self, now: Instant) -> bool {
        self.epoch().is_some_and(|e| self.check(e, now).is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);
    const MARGIN: Duration = Duration::from_secs(2);

    #[test]
    fn a_grant_is_valid_until_ttl_minus_margin() {
        let t0 = Instant::now();
        let mut l = Lease::new(MARGIN);
        assert_eq!(l.check(1, t0), Err(LeaseError::NotHeld));
        l.grant(5, TTL, t0);
        assert_eq!(l.check(5, t0 + Duration::from_secs(7)), Ok(()));
        assert!(matches!(
            l.check(5, t0 + Duration::from_secs(8)),
            Err(LeaseError::Lapsed { epoch: 5, .. })
        ));
        assert_eq!(
            l.check(4, t0),
            Err(LeaseError::OtherEpoch { held: 5, asked: 4 })
        );
    }

    #[test]
    fn the_margin_is_at_most_half_the_ttl() {
        let t0 = Instant::now();
        let mut l = Lease::new(Duration::from_secs(60));
        l.grant(1, TTL, t0);
        assert_eq!(l.valid_until(), Some(t0 + Duration::from_secs(5)));
    }

    #[test]
    fn renewals_count_from_the_heartbeat_send_time() {
        let t0 = Instant::now();
        let mut l = Lease::new(MARGIN);
        l.grant(1, TTL, t0);
        let sent = t0 + Duration::from_secs(5);
        assert!(l.acknowledged(sent, 123));
        assert_eq!(l.valid_until(), Some(sent + Duration::from_secs(8)));
        // An older heartbeat's late acknowledgement never moves it back.
        assert!(!l.acknowledged(t0 + Duration::from_secs(1), 123));
        assert_eq!(l.valid_until(), Some(sent + Duration::from_secs(8)));
        // A lapsed lease comes back with a renewal of a later heartbeat (same epoch).
        let late = t0 + Duration::from_secs(20);
        assert!(l.check(1, late).is_err());
        assert!(l.acknowledged(late, 456));
        assert_eq!(l.check(1, late + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn an_ack_of_zero_after_the_grant_means_not_the_holder() {
        let t0 = Instant::now();
        let mut l = Lease::new(MARGIN);
        l.grant(3, TTL, t0);
        // Sent before the grant arrived: answered under the old state; ignored.
        assert!(!l.acknowledged(t0 - Duration::from_millis(1), 0));
        assert_eq!(l.check(3, t0), Ok(()));
        assert!(l.acknowledged(t0 + Duration::from_secs(1), 0));
        assert_eq!(
            l.check(3, t0 + Duration::from_secs(1)),
            Err(LeaseError::NotHeld)
        );
        // Not revived by a later renewal: only a new grant brings it back.
        assert!(!l.acknowledged(t0 + Duration::from_secs(2), 99));
        assert!(!l.is_valid(t0 + Duration::from_secs(2)));
        l.grant(4, TTL, t0 + Duration::from_secs(3));
        assert!(l.is_valid(t0 + Duration::from_secs(3)));
        l.release();
        assert_eq!(l.epoch(), None);
    }
}
