//! Counters shared by all simulated nodes, and the JSON snapshot `bcd sim --stats` writes.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// Live counters.
#[derive(Debug, Default)]
pub struct Stats {
    pub joined: AtomicU64,
    pub join_errors: AtomicU64,
    pub connected: AtomicU64,
    pub session_errors: AtomicU64,
    pub sessions_opened: AtomicU64,
    pub heartbeats_acked: AtomicU64,
    pub specs_converged: AtomicU64,
    pub commands_answered: AtomicU64,
    /// Commands to nodes of the `--fault-fraction` share, and to the others.
    pub commands_to_faulted: AtomicU64,
    pub commands_to_healthy: AtomicU64,
    /// XIDs injected (reported on a session).
    pub faults_injected: AtomicU64,
    /// When faults started (Unix ms; 0: not yet).
    pub faults_started_at_ms: AtomicI64,
    /// Heartbeat ack latencies since the last clear, microseconds.
    latencies_us: Mutex<Vec<u32>>,
}

/// What `--stats` holds (camelCase JSON).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub nodes: u64,
    pub joined: u64,
    pub join_errors: u64,
    /// Sessions open now (Welcome received, stream not ended).
    pub connected: u64,
    pub session_errors: u64,
    pub sessions_opened: u64,
    pub heartbeats_acked: u64,
    pub specs_converged: u64,
    pub commands_answered: u64,
    /// Commands received by the nodes of the faulted share (`--fault-fraction`), from the start.
    pub commands_to_faulted: u64,
    /// Commands received by the other nodes: a remediation that touches one is a false one.
    pub commands_to_healthy: u64,
    /// Nodes of the faulted share that reported their XID.
    pub faults_injected: u64,
    /// Nodes of the faulted share (`round(fraction × nodes)`).
    pub faulted_nodes: u64,
    /// When faults started (Unix ms; absent: not yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults_started_at_ms: Option<i64>,
    /// Heartbeat acks in the current latency window.
    pub latency_samples: u64,
    /// Send of a Heartbeat to receipt of its HeartbeatAck, milliseconds.
    pub heartbeat_ack_p50_ms: f64,
    pub heartbeat_ack_p99_ms: f64,
    pub heartbeat_ack_max_ms: f64,
}

fn pct(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[idx.min(sorted.len() - 1)]) / 1000.0
}

impl Stats {
    /// Records one heartbeat ack latency.
    pub fn latency(&self, d: std::time::Duration) {
        self.heartbeats_acked.fetch_add(1, Ordering::Relaxed);
        let us = u32::try_from(d.as_micros()).unwrap_or(u32::MAX);
        self.latencies_us.lock().push(us);
    }

    /// Starts a new latency window.
    pub fn clear_latencies(&self) {
        self.latencies_us.lock().clear();
    }

    /// The counters now and the percentiles of the current window.
    pub fn snapshot(&self, nodes: usize, faulted_nodes: usize) -> Snapshot {
        let mut lat = self.latencies_us.lock().clone();
        lat.sort_unstable();
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            nodes: nodes as u64,
            joined: g(&self.joined),
            join_errors: g(&self.join_errors),
            connected: g(&self.connected),
            session_errors: g(&self.session_errors),
            sessions_opened: g(&self.sessions_opened),
            heartbeats_acked: g(&self.heartbeats_acked),
            specs_converged: g(&self.specs_converged),
            commands_answered: g(&self.commands_answered),
            commands_to_faulted: g(&self.commands_to_faulted),
            commands_to_healthy: g(&self.commands_to_healthy),
            faults_injected: g(&self.faults_injected),
            faulted_nodes: faulted_nodes as u64,
            faults_started_at_ms: Some(self.faults_started_at_ms.load(Ordering::Relaxed))
                .filter(|t| *t > 0),
            latency_samples: lat.len() as u64,
            heartbeat_ack_p50_ms: pct(&lat, 0.50),
            heartbeat_ack_p99_ms: pct(&lat, 0.99),
            heartbeat_ack_max_ms: pct(&lat, 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn percentiles_come_from_the_current_window() {
        let s = Stats::default();
        for ms in 1..=100 {
            s.latency(Duration::from_millis(ms));
        }
        let snap = s.snapshot(3, 0);
        assert_eq!(snap.latency_samples, 100);
        assert!((snap.heartbeat_ack_p50_ms - 51.0).abs() < 1.01);
        assert!((snap.heartbeat_ack_p99_ms - 99.0).abs() < 1.01);
        assert_eq!(snap.heartbeats_acked, 100);
        s.clear_latencies();
        let snap = s.snapshot(3, 0);
        assert_eq!(snap.latency_samples, 0);
        assert_eq!(snap.heartbeats_acked, 100);
    }
}
