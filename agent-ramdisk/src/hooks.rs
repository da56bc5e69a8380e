//! The ramdisk's side of the session core. A ramdisk converges no node spec: each Spec is
//! answered with `converged: false`, reason [`NOT_CONVERGED_REASON`], so the control plane's
//! `SpecConverged` condition says why and `observedGeneration` never moves for it (the node
//! agent of the installed OS converges the spec later). An identity revoked or refused ends the
//! boot: the token was one-time, so no new one can come, and the init powers the machine off.

use std::time::Duration;

use bc_protocol::pb::{self, SpecStatus};
use bcd_core::join::JoinError;
use bcd_core::mode::{Observer, SessionHooks};
use bcd_core::state::Identity;
use tokio::sync::watch;

/// `SpecStatus.reason` of every Spec the ramdisk receives (CamelCase, as the condition's
/// reasons are).
pub const NOT_CONVERGED_REASON: &str = "RamdiskAgent";

/// The hooks `bcd ramdisk` runs the session core with.
#[derive(Debug)]
pub struct RamdiskHooks {
    stop: watch::Sender<bool>,
    ended: Option<String>,
}

impl RamdiskHooks {
    /// Hooks that turn `stop` true when the boot's identity ends.
    pub fn new(stop: watch::Sender<bool>) -> Self {
        Self { stop, ended: None }
    }

    /// Why the boot's identity ended (revoked, refused), when it did: the ramdisk then exits
    /// with an error.
    pub fn ended(&self) -> Option<&str> {
        self.ended.as_deref()
    }

    fn end(&mut self, why: &str) {
        tracing::error!(reason = %why, "this boot's identity is gone and its token was one-time: stopping (the machine powers off)");
        self.ended = Some(why.to_owned());
        let _ = self.stop.send(true);
    }
}

impl SessionHooks for RamdiskHooks {
    fn on_spec(&mut self, generation: u64, _spec: pb::NodeSpec) -> Option<SpecStatus> {
        Some(SpecStatus {
            generation,
            converged: false,
            reason: NOT_CONVERGED_REASON.to_owned(),
            message: "the ramdisk agent does not converge node specs (GPU binding, SSH keys); the node agent of the installed OS does".to_owned(),
        })
    }
}

impl Observer for RamdiskHooks {
    fn joining(&mut self, control_plane: &str) {
        tracing::info!(control_plane = %control_plane, "joining with the boot token");
    }

    fn join_failed(&mut self, error: &JoinError) {
        if error.is_fatal() {
            tracing::error!(error = %error, "JOIN REFUSED: the control plane will not take this boot's token; this boot cannot join");
        }
    }

    fn session_open(&mut self, epoch: u64, gateway_id: &str, control_plane: &str) {
        tracing::info!(epoch, gateway_id = %gateway_id, control_plane = %control_plane, "session open");
    }

    fn disconnected(&mut self, reason: &str, retry_in: Duration) {
        tracing::warn!(reason = %reason, retry_in = ?retry_in, "session ended; reconnecting");
    }

    fn identity_ready(&mut self, identity: &Identity) {
        tracing::info!(node_id = %identity.node.node_id, "identity in memory");
    }

    fn revoked(&mut self, why: &str) {
        self.end(&format!("identity revoked: {why}"));
    }

    fn refused(&mut self, why: &str) {
        self.end(why);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_answered_not_converged_with_the_reason() {
        let (tx, _rx) = watch::channel(false);
        let mut h = RamdiskHooks::new(tx);
        let s = h.on_spec(7, pb::NodeSpec::default()).unwrap();
        assert_eq!(s.generation, 7);
        assert!(!s.converged);
        assert_eq!(s.reason, NOT_CONVERGED_REASON);
        assert!(h.on_open().is_none());
    }

    #[test]
    fn a_revocation_or_refusal_stops_the_ramdisk() {
        for revoke in [true, false] {
            let (tx, rx) = watch::channel(false);
            let mut h = RamdiskHooks::new(tx);
            assert!(h.ended().is_none());
            if revoke {
                h.revoked("node deleted");
            } else {
                h.refused("PERMISSION_DENIED: identity generation 1 is retired");
            }
            assert!(*rx.borrow(), "stop not requested");
            let why = h.ended().unwrap();
            assert!(
                why.contains("node deleted") || why.contains("retired"),
                "{why}"
            );
        }
    }
}
