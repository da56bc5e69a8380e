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
//! - **Inspection and commissioning** ([`boot`], [`inspect`], [`commission`], issue 15): a
//!   verified enrollment goes to `inspecting`; the controller mints the machine's one-time boot
//!   token, sends the holder its boot plan and `bmc.power` with PXE; the ramdisk joins with the
//!   token only if the machine shows the BMC's identifiers; its inventory ends the inspection and
//!   commissioning's steps decide `ready` (powered off) or `failed`; every state has a deadline.
//! - **Release and retire** ([`release`], issue 16): `deployed -> releasing -> ready` and
//!   `retiring -> retired` boot the ramdisk the same way and clean every disk (`disk.clean`);
//!   an enrollment with `deployed: true` adopts a machine that runs its OS (`enrolling ->
//!   deployed`).
//! - [`BareMetal`] is the service the gateway, the verbs and the controller share.
//!
//! # Limitations
//! One control-plane process: the lease view is in memory beside the store. With several
//! replicas the renewal must be written by whichever replica holds the holder's session.

pub mod abort;
pub mod address;
pub mod assignment;
pub mod boot;
pub mod commission;
pub mod credentials;
pub mod deploy;
pub mod enroll;
pub mod inspect;
pub mod lease;
pub mod power;
pub mod release;
pub mod rescue;
pub mod site_detail;
pub mod verify;
pub mod work;

#[cfg(test)]
mod bare_metal_tests;
#[cfg(test)]
mod boot_tests;
#[cfg(test)]
mod commission_tests;
#[cfg(test)]
mod deploy_tests;
#[cfg(test)]
mod release_tests;

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
    /// Deadline of one `bmc.*` command (2 min: a BMC may be slow, the agent retries reads).
    pub command_timeout: Duration,
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
            command_timeout: Duration::from_secs(120),
            power_sync_interval: Duration::from_secs(60),
            max_requests_per_bmc: 4,
            max_requests_per_site: 64,
        }
    }
}

/// The effect of a finished command on its bare-metal node, in the transaction that finished it
/// (an agent's result, an expiry, a `LEASE_LOST`, a cancel): a `bmc.*` command's
/// ([`verify::on_command_final`]), the power-on of a ramdisk boot
/// ([`inspect::on_power_final`]), commissioning's `diag.nvml`
/// ([`commission::on_command_final`]), release and retire's `disk.clean`
/// ([`release::on_command_final`]).
pub fn on_command_final(
    tx: &cpl_store::Tx<'_>,
    cmd: &cpl_store::CommandRecord,
) -> Result<(), crate::error::OpError> {
    verify::on_command_final(tx, cmd)?;
    inspect::on_power_final(tx, cmd)?;
    commission::on_command_final(tx, cmd)?;
    release::on_command_final(tx, cmd)?;
    deploy::on_command_final(tx, cmd)?;
    rescue::on_command_final(tx, cmd)
}

/// Milliseconds of a duration, saturating.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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

    /// The same service with the ramdisk's boot settings (the gateway URL and CA pin).
    pub fn with_boot(mut self, settings: boot::BootSettings) -> Self {
        self.boot = Arc::new(settings);
        self
    }
}
