//! A bound on how fast one node's agent may send reports that need the store (Inventory,
//! SpecStatus, CommandUpdate, Event): a token bucket per node id, shared by all of the node's
//! sessions (a reconnect does not refill it). What goes over is dropped, counted in
//! `bcctl_reports_dropped_total{kind}`, and logged at most once per [`LOG_EVERY`] per node with
//! the number dropped since (issue 19.2: a flood must cost the store a bounded rate, and the log
//! must not become the flood). Heartbeats are not bounded here: they are acknowledged without a
//! store write each and flushed in batches.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Reports per second one node may send, sustained. An agent sends a handful per minute (an
/// Inventory and a SpecStatus per session and spec, a few CommandUpdates per command).
pub const REPORTS_PER_SECOND: f64 = 20.0;
/// Reports one node may send at once after a quiet spell (a reconnect re-sends its pending
/// command results in one go).
pub const REPORT_BURST: f64 = 100.0;
/// At most one "reports dropped" log line per node this often.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Buckets kept before idle (full) ones are forgotten.
const MAX_TRACKED: usize = 100_000;

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    dropped_since_log: u64,
    logged_at: Option<Instant>,
}

/// What [`ReportLimiter::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Within the rate: handle it.
    Yes,
    /// Over the rate: drop it. `log`: the number dropped since the last log line, when it is
    /// time for the next one.
    Dropped { log: Option<u64> },
}

/// Token buckets of agent reports, by node id.
#[derive(Debug)]
pub struct ReportLimiter {
    per_second: f64,
    burst: f64,
    nodes: Mutex<HashMap<String, Bucket>>,
}

impl Default for ReportLimiter {
    fn default() -> Self {
        Self::new(REPORTS_PER_SECOND, REPORT_BURST)
    }
}

impl ReportLimiter {
    /// `per_second` sustained, `burst` at once.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self {
            per_second,
            burst,
            nodes: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one report of `node_id` now.
    pub fn admit(&self, node_id: &str) -> Admit {
        self.admit_at(node_id, Instant::now())
    }

    fn admit_at(&self, node_id: &str, now: Instant) -> Admit {
        let mut nodes = self.nodes.lock();
        if nodes.len() > MAX_TRACKED {
            let (rate, burst) = (self.per_second, self.burst);
            nodes.retain(|_, b| b.tokens + rate * now.duration_since(b.at).as_secs_f64() < burst);
        }
        let b = nodes.entry(node_id.to_owned()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
            dropped_since_log: 0,
            logged_at: None,
        });
        let refill = self.per_second * now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + refill).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Admit::Yes;
        }
        b.dropped_since_log += 1;
        let due = b
            .logged_at
            .is_none_or(|t| now.saturating_duration_since(t) >= LOG_EVERY);
        if !due {
            return Admit::Dropped { log: None };
        }
        b.logged_at = Some(now);
        let n = std::mem::take(&mut b.dropped_since_log);
        Admit::Dropped { log: Some(n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_rate_and_logged_seldom() {
        let l = ReportLimiter::new(20.0, 100.0);
        let t0 = Instant::now();
        // 200 reports a second for 10 s, as the flood: 100 (burst) + 20/s pass.
        let mut passed = 0;
        let mut logs = 0;
        for i in 0..2000u64 {
            let t = t0 + Duration::from_millis(i * 5);
            match l.admit_at("node_a", t) {
                Admit::Yes => passed += 1,
                Admit::Dropped { log: Some(_) } => logs += 1,
                Admit::Dropped { log: None } => {}
            }
        }
        assert!((290..=302).contains(&passed), "{passed}");
        assert_eq!(logs, 1, "one log line per 10 s");
        // Another node has its own bucket.
        assert_eq!(
            l.admit_at("node_b", t0 + Duration::from_secs(10)),
            Admit::Yes
        );
        // After a quiet spell the bucket is full again.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(l.admit_at("node_a", later), Admit::Yes);
        let next_log = (0..200).find_map(|_| match l.admit_at("node_a", later) {
            Admit::Dropped { log } => Some(log),
            Admit::Yes => None,
        });
        // Every drop since the last line is counted: all but the first of the flood, and this one.
        assert_eq!(next_log, Some(Some(2000 - passed)));
    }
}
