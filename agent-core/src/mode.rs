//! What a mode supplies to the session core: the small traits `bcd agent`, `bcd sim`,
//! `bcd site` and the coming `bcd ramdisk` implement, so that all of them drive the same join and
//! session code ([`crate::lifecycle::run`]).
//!
//! - [`Machine`]: the machine the mode speaks for — facts for Join and Hello, the inventory, the
//!   commands it serves. Shared (`Arc`): command runs outlive the session they came on.
//! - [`SessionHooks`]: what the mode does with a Spec and what it sends on its own (a converge
//!   status, XID events). `&mut`, lives across sessions.
//! - [`Observer`]: what happened, for the mode's own bookkeeping (`status.json`, metrics, systemd
//!   status, the simulator's counters). Every method has a no-op default.
//! - [`crate::identity::IdentityStore`] (disk or memory) and [`TokenSource`]: where the identity
//!   lives and where a join token comes from.

use std::future::Future;
use std::time::Duration;

use bc_protocol::Mode;
use bc_protocol::commands::CommandFailure;
use bc_protocol::pb::{self, HardwareIdentity, SpecStatus, agent_message};
use serde_json::Value;

use crate::executor::CommandRun;
use crate::join::JoinError;
use crate::session::SessionEnd;
use crate::state::Identity;

/// The machine a mode speaks for.
pub trait Machine: Send + Sync + 'static {
    /// `JoinRequest.mode` and `Hello.mode`.
    fn mode(&self) -> Mode;

    /// `Hello.boot_id`: the kernel's boot id (`/proc/sys/kernel/random/boot_id`) of this boot; the
    /// journal records it with each command (node.reboot compares it after the reboot).
    fn boot_id(&self) -> &str;

    /// `JoinRequest.hostname`, and the CN of the CSR (`bcd` when empty).
    fn hostname(&self) -> String;

    /// `JoinRequest.hardware`: the hardware key and identifier digests. An error fails the join
    /// attempt (retried like a network error).
    fn hardware(&self) -> impl Future<Output = Result<HardwareIdentity, String>> + Send;

    /// `Hello.observed_generation`: the newest spec generation that converged completely.
    fn observed_generation(&self) -> u64;

    /// The inventory sent after every Welcome and by `inventory.refresh`. An error is logged
    /// (at session open) or fails the command with `INVENTORY_FAILED`.
    fn inventory(&self) -> impl Future<Output = Result<pb::Inventory, String>> + Send;

    /// Runs one command. The executor has journaled it, reported it running and holds its
    /// deadline and cancel handle; the mode only does the work. The standard handlers are in
    /// [`crate::handlers`] and [`crate::ops`].
    fn run_command(
        &self,
        run: &CommandRun,
    ) -> impl Future<Output = Result<Value, CommandFailure>> + Send;
}

/// What the mode does with the session's traffic besides commands.
pub trait SessionHooks: Send {
    /// A `Spec{generation, spec}` arrived. A status returned here is sent at once (a mode that
    /// converges later sends it through [`SessionHooks::next_report`]).
    fn on_spec(&mut self, generation: u64, spec: pb::NodeSpec) -> Option<SpecStatus>;

    /// Sent right after the inventory of every new session: the newest SpecStatus, so a control
    /// plane that missed it (a reconnect) learns it.
    fn on_open(&mut self) -> Option<SpecStatus> {
        None
    }

    /// A `SiteAssignment` arrived (site agents only): the site lease and the BMCs to manage,
    /// replacing the previous assignment. It holds BMC credentials: keep it in memory, never log
    /// or write it. Other modes ignore it.
    fn on_site_assignment(&mut self, _assignment: pb::SiteAssignment) {}

    /// A `HeartbeatAck` arrived; a site agent reads its lease renewal
    /// (`site_lease_expires_at_ms`) from it.
    fn on_heartbeat_ack(&mut self, _ack: &pb::HeartbeatAck) {}

    /// The next message the mode sends on its own (a SpecStatus from a converge task, an XID
    /// `Event`). Must be cancel-safe: the session loop polls it in a `select!`. Never resolves for
    /// a mode that has nothing to say.
    fn next_report(&mut self) -> impl Future<Output = agent_message::Msg> + Send {
        std::future::pending()
    }
}

/// What happened, in order, for the mode's bookkeeping. Logging is the core's business; these
/// are for state a mode keeps (status.json, metrics, `STATUS=` lines, counters).
pub trait Observer: Send {
    /// A join is about to be attempted against `control_plane`.
    fn joining(&mut self, _control_plane: &str) {}
    /// The join attempt failed (the core logs it and backs off, or stops).
    fn join_failed(&mut self, _error: &JoinError) {}
    /// A join succeeded and the identity is stored.
    fn joined(&mut self, _identity: &Identity) {}
    /// No identity and no (new) join token: waiting for one. `why` is for people.
    fn waiting_for_token(&mut self, _why: &str) {}
    /// An identity (stored or just joined) is taken into use for sessions.
    fn identity_ready(&mut self, _identity: &Identity) {}
    /// The identity was revoked or the node deleted; it is retired. `why` is for people.
    fn revoked(&mut self, _why: &str) {}
    /// The control plane refuses this identity for good (a session refused with
    /// `PERMISSION_DENIED` or `UNAUTHENTICATED`); it is retired and a new join token is needed.
    /// `why` is the control plane's message and what to do, for people.
    fn refused(&mut self, _why: &str) {}
    /// The stored identity is unusable (a file missing, corrupt, or not matching the others;
    /// `why` names the file and what to do). `rejoining`: a join token is at hand, the identity
    /// was moved aside and a join follows; otherwise the agent waits for a token.
    fn identity_broken(&mut self, _why: &str, _rejoining: bool) {}
    /// A session to `control_plane` is being opened.
    fn connecting(&mut self, _control_plane: &str) {}
    /// Welcome arrived: the session of `epoch` is open, with the gateway `gateway_id` at the
    /// URL `control_plane` (one of the replicas).
    fn session_open(&mut self, _epoch: u64, _gateway_id: &str, _control_plane: &str) {}
    /// Heartbeat `seq` was sent.
    fn heartbeat_sent(&mut self, _seq: u64) {}
    /// Heartbeat `seq` was acknowledged.
    fn heartbeat_acked(&mut self, _seq: u64) {}
    /// A session attempt ended; `welcomed` says whether it had opened.
    fn session_closed(&mut self, _end: &SessionEnd, _welcomed: bool) {}
    /// The session ended and will be retried after `retry_in`; `reason` is for people.
    fn disconnected(&mut self, _reason: &str, _retry_in: Duration) {}
    /// The lifecycle ends (stop requested, or a fatal error).
    fn stopped(&mut self) {}
}

/// Where a join token comes from.
pub trait TokenSource: Send + Sync {
    /// The token to join with now, if any. Asked at every join attempt, so a token file can be
    /// replaced while the agent waits.
    fn token(&self) -> Option<String>;

    /// Whether a token may appear later (a token file is configured). Without one, a node that
    /// has never joined and has no token stops at once instead of waiting.
    fn can_wait(&self) -> bool;
}
