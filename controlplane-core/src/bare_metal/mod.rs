//! Bare metal through the site agent (issue 14, control-plane side): enrollment through a BMC,
//! the site lease, the power axis, BMC credentials.
//!
//! # Background
//! A bare-metal machine has no agent until it boots one; what the control plane can reach is its
//! BMC, and only from the site: a site agent (`bcd site`, a node with `role: site`) does the BMC
//! work. A site may run two appliances; exactly one of them may act on the BMCs at a time, and a
//! task must never run on both (a power cycle run twice is a second outage).
//!
//! # Design
//! - **The site lease** ([`lease`]): one per site, in the store (`site_leases`), granted by the
//!   control plane to one connected site agent of the site, with an epoch bumped by every grant.
//!   The holder's heartbeats renew it: the gateway answers each with the new expiry
//!   (`HeartbeatAck.site_lease_expires_at_ms`, from the in-memory [`lease::LeaseView`]) and the
//!   heartbeat flush writes the renewals in its one transaction. A lease whose holder went silent
//!   past the TTL moves to another live site agent of the site; `bmc.*` commands still open on
//!   the old holder fail at once with `LEASE_LOST` and are never re-sent. For one grace period
//!   after the control plane starts a lease never moves (its holder is reconnecting).
//! - **Assignments** ([`assignment`]): what a site agent may do, sent after its Welcome and
//!   whenever its lease or its site's BMCs change. Credentials leave the control plane only here,
//!   decrypted for the holder; a standby gets `lease_held = false` and no BMC.
//! - **Enrollment** ([`enroll`], [`verify`]): `nodes.enroll` creates the node in `enrolling` with
//!   its BMC (credentials sealed, [`credentials`]); the lease holder gets `bmc.verify`; its result
//!   stores the BMC-reported identifiers as digests (`bc_protocol::hwid`, the hardware key's
//!   lines), or fails the node with a `BmcVerified` condition saying what the BMC answered.
//! - **Power** ([`power`]): `nodes.power` and `nodes.setBootDevice` become `bmc.*` commands on
//!   the holder (the command names the bare-metal node in `subjectNodeId`); `PowerReport`s of
//!   the current holder and epoch move `power` (through [`crate::edit::Edit::report`]) and
//!   `BmcReachable`.
//! - **The workflows** ([`workflow`], [`table`]): each bare-metal state (`enrolling`,
//!   `inspecting`, `commissioning`, `deploying`, `rescue`, `releasing`, `retiring`) is one
//!   [`workflow::Workflow`] entry in its own module ([`verify`], [`inspect`], [`commission`],
//!   [`deploy`], [`rescue`], [`release`]): its deadline, condition and step events, whether it
//!   boots the ramdisk, the command it sends next, what a finished command means, what
//!   `nodes.abort` cancels ([`abort`]). [`table::WORKFLOWS`] lists them; the controller's pass
//!   ([`controller`]), the ramdisk's report, the command router
//!   (`crate::commands::finished`) and `nodes.abort` read them there. A ramdisk state's machine
//!   boots with a one-time token ([`boot`]) served by the site agent's boot service
//!   ([`assignment`]); the ramdisk joins only if the machine shows the BMC's identifiers.
//! - **Layers**: the workflow modules are transactions only (a `Tx` in, rows and events out)
//!   and never name [`BareMetal`]; what leaves the control plane — the passes
//!   ([`controller`], [`site_pass`]), the verbs' commits ([`verbs`], [`power`]), the
//!   assignments — is on [`BareMetal`], above them. So the command router, which the Commands
//!   controller calls, reaches the workflows without reaching back into the controller.
//! - [`BareMetal`] is the service the gateway, the verbs and the controller share.
//!
//! # Limitations
//! The lease view is in memory on the replica that runs the controller (the leader, with
//! several replicas on PostgreSQL): a site agent whose session is on another replica gets no
//! renewal through its heartbeats there. A workflow's work steps are an enum of the store's
//! (`cpl_store::WorkStep`): a new workflow with steps of its own adds its variants there too.

pub mod abort;
pub mod address;
pub mod assignment;
pub mod bmc;
pub mod boot;
pub mod commission;
pub mod controller;
pub mod credentials;
pub mod deploy;
pub mod deploy_identity;
pub mod enroll;
pub mod inspect;
pub mod lease;
pub mod power;
pub mod release;
pub mod rescue;
pub mod scrub;
pub mod site_detail;
pub mod site_pass;
pub mod table;
pub mod user_data;
pub mod verbs;
pub mod verify;
pub mod workflow;

#[cfg(test)]
mod bare_metal_tests;
#[cfg(test)]
mod boot_tests;
#[cfg(test)]
mod commission_tests;
#[cfg(test)]
mod deploy_tests;
#[cfg(test)]
mod duplicate_tests;
#[cfg(test)]
mod release_tests;
#[cfg(test)]
mod scrub_tests;
#[cfg(test)]
mod takeover_tests;

use std::sync::Arc;
use std::time::Duration;

use cpl_store::Store;

use crate::commands::Commands;
use crate::port::AgentSessions;

pub use credentials::{CredentialError, CredentialKey, Credentials};
pub use lease::LeaseView;

/// Bare-metal timings and limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BareMetalConfig {
    /// How long a site lease lasts without a renewal (`bcctl serve --site-lease-ttl`, 15 s).
    pub lease_ttl: Duration,
    /// No lease moves for this long after the control plane starts (Liveness's grace).
    pub grace: Duration,
    /// How long an enrollment may wait for its verification, queue time (no site agent holding
    /// the lease) included (`--bmc-verify-deadline`, 5 min).
    pub verify_deadline: Duration,
    /// Deadline of one `bmc.*` command (5 min: a BMC may answer in a minute, run a change as a
    /// task, and the agent retries what it did not take).
    pub command_timeout: Duration,
    /// How long after a power-on with PXE the machine may take to ask the site's boot service
    /// for its script (`--network-boot-timeout`, 5 min; issue 31 rule 5).
    pub network_boot_timeout: Duration,
    /// Power-ons with PXE before a machine that never asks for its script fails (the last with
    /// a persistent override).
    pub network_boot_attempts: u32,
    /// The site agent's power sync period (`--power-sync-interval`, 60 s).
    pub power_sync_interval: Duration,
    /// Requests in flight per BMC (`--max-requests-per-bmc`, 4) and per site (64) the site agent
    /// allows itself.
    pub max_requests_per_bmc: u32,
    pub max_requests_per_site: u32,
}

impl Default for BareMetalConfig {
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(15),
            grace: Duration::from_secs(40),
            verify_deadline: Duration::from_secs(300),
            command_timeout: Duration::from_secs(300),
            network_boot_timeout: Duration::from_secs(300),
            network_boot_attempts: 3,
            power_sync_interval: Duration::from_secs(60),
            max_requests_per_bmc: 4,
            max_requests_per_site: 64,
        }
    }
}

/// What the gateway, the verbs and the lease controller share. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BareMetal {
    pub store: Store,
    pub sessions: Arc<dyn AgentSessions>,
    pub commands: Commands,
    /// Seals and opens BMC credentials.
    pub key: Arc<CredentialKey>,
    pub cfg: BareMetalConfig,
    /// Who holds which lease, for heartbeat acknowledgements and renewals.
    pub leases: Arc<LeaseView>,
    /// Where the ramdisk joins and which CA it pins (its kernel command line, issue 15).
    pub boot: Arc<boot::BootSettings>,
}

impl BareMetal {
    /// The service over `commands` (its store and sessions), with `key` and `cfg`; the lease
    /// view is loaded from the store by [`BareMetal::load_leases`].
    pub fn new(commands: Commands, key: CredentialKey, cfg: BareMetalConfig) -> Self {
        Self {
            store: commands.store.clone(),
            sessions: Arc::clone(&commands.sessions),
            commands,
            key: Arc::new(key),
            cfg,
            leases: Arc::new(LeaseView::default()),
            boot: Arc::new(boot::BootSettings::default()),
        }
    }

    /// A heartbeat of `node_id` at `now` (ms): renews the site lease it holds for one TTL and
    /// returns the new expiry (for `HeartbeatAck.site_lease_expires_at_ms`), 0 when it holds
    /// none. The heartbeat flush writes the renewal.
    pub fn renew_lease(&self, node_id: &str, now: i64) -> i64 {
        let ttl = cpl_store::duration_ms(self.cfg.lease_ttl);
        self.leases.renew(node_id, now, ttl)
    }

    /// The same service with the ramdisk's boot settings (the gateway URL and CA pin).
    pub fn with_boot(mut self, settings: boot::BootSettings) -> Self {
        self.boot = Arc::new(settings);
        self
    }
}
