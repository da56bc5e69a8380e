//! BMC drivers behind one small trait, [`Bmc`]: read the system's facts (`bmc.verify`), read its
//! power state, act on its power, set its next boot device.
//!
//! # Design
//! - [`redfish::RedfishBmc`]: Redfish through `nv-redfish` over our own reqwest client (rustls
//!   with ring, the TLS mode's certificate verifier, one client per BMC so connections are
//!   reused).
//! - [`ipmi::IpmiBmc`]: IPMI over LAN through the `ipmitool` program (the password in the
//!   child's environment only).
//! - `fake::FakeBmc` (tests and feature `test-utils`): scripted answers, delays and a
//!   concurrency counter.
//!
//! Every failure is a [`BmcError`] naming the BMC by its address (never its credentials) and
//! saying what it answered; [`BmcError::code`] is the one mapping to the command error codes.
//! A [`Connector`] turns an endpoint of the assignment into a driver, so tests can hand the site
//! fakes instead.
//!
//! What a driver promises (issue 31; docs/bare-metal.md, "what the site agent does about BMC
//! behaviour X"): a change is read back before it is called done ([`Bmc::power`] returns the
//! settled power state, [`Bmc::set_boot_device`] what the BMC holds), a boot override is armed
//! only with the machine off or right before a restart, and a request it gave up on is counted
//! at the BMC until [`Bmc::busy_until`].

pub mod ipmi;
pub mod redfish;
pub mod secret;
pub mod tls;

pub use secret::Secret;

#[cfg(any(test, feature = "test-utils"))]
pub mod fake;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bc_protocol::commands::bmc::{BmcFacts, BootDevice, BootDeviceResult, PowerAction, PowerState};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb;
use tokio::time::Instant;

use crate::address::{AddressError, BmcAddress};
use crate::config::SiteConfig;

/// What a driver call returns: a boxed future, so drivers can sit behind `dyn Bmc`.
pub type BmcFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BmcError>> + Send + 'a>>;

/// One BMC, as the site agent drives it. Every method is one whole operation (possibly several
/// requests); the caller holds the BMC's concurrency permit around it.
pub trait Bmc: Send + Sync + fmt::Debug {
    /// The BMC's address as errors and logs name it ([`BmcAddress::display`]).
    fn address(&self) -> &str;

    /// `bmc.verify`: the credentials work, the address names a system, and what the BMC says
    /// about it (identity, NICs, power state, certificate fingerprint).
    fn facts(&self) -> BmcFuture<'_, BmcFacts>;

    /// The system's power state (the power sync loop's read; an idempotent read, retried).
    fn power_state(&self) -> BmcFuture<'_, PowerReading>;

    /// Acts on the system's power and returns the power state read back once the BMC settled.
    /// With `boot`, that override is armed first, only with the machine off or right before a
    /// restart (never with a power-off in between: some BMCs forget a one-time override at a
    /// power-off). A failed action is read back before it is called failed, and retried only
    /// when the read-back shows it did not take.
    fn power(&self, action: PowerAction, boot: Option<BootOverride>) -> BmcFuture<'_, PowerDone>;

    /// Sets the device the system boots from next (or from now on, when `persistent`; no
    /// override with [`BootDevice::None`]), and reads back what the BMC holds: a change that
    /// reads back different is [`BmcError::NotApplied`].
    fn set_boot_device(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> BmcFuture<'_, BootDeviceResult>;

    /// Until when a request this driver gave up on (its timeout passed) may still be running at
    /// the BMC: the operation's permit is held until then, so the BMC never serves more requests
    /// than its limit. `None` when there is none.
    fn busy_until(&self) -> Option<Instant> {
        None
    }

    /// Ends what the driver holds open at the BMC (a Redfish session), before it is dropped.
    fn close(&self) -> BmcFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// A power state as read: where a BMC reports a transition (`PoweringOn`), `power` is the state
/// it is heading to and `settling` is true.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerReading {
    /// The state (or the state it is heading to).
    pub power: PowerState,
    /// The BMC reports a transition, not a settled state.
    pub settling: bool,
}

impl PowerReading {
    /// A settled reading.
    pub fn settled(power: PowerState) -> Self {
        Self {
            power,
            settling: false,
        }
    }
}

/// A boot override armed with a power action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootOverride {
    /// The device.
    pub device: BootDevice,
    /// `Continuous` rather than `Once`.
    pub persistent: bool,
}

/// What a power action came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowerDone {
    /// The power state read back once the BMC settled (`Unknown` when it did not answer).
    pub power: PowerState,
    /// BMC faults retried on the way.
    pub transient_faults: u32,
}

/// A BMC operation that failed. The `address` is [`BmcAddress::display`] (no credentials); the
/// `detail` is what the BMC (or the network) answered, scrubbed of the password in every form
/// by the driver ([`Secret::scrub`]; a 401 or 403 keeps no body at all).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcError {
    /// No answer: connection refused, no route, timed out.
    #[error("BMC {address} unreachable: {detail}")]
    Unreachable {
        /// The BMC.
        address: String,
        /// What happened.
        detail: String,
    },
    /// The BMC refused the credentials (HTTP 401/403, IPMI RAKP failure).
    #[error("BMC {address} refused the credentials: {detail}")]
    AuthFailed {
        /// The BMC.
        address: String,
        /// What it answered.
        detail: String,
    },
    /// The BMC's certificate is not the pinned one, or does not verify.
    #[error("BMC {address} TLS certificate not accepted: {detail}")]
    TlsMismatch {
        /// The BMC.
        address: String,
        /// Which certificate was presented and what was expected.
        detail: String,
    },
    /// The address does not name a system (404, or several systems and no path).
    #[error("BMC {address}: not a system: {detail}")]
    NotASystem {
        /// The BMC.
        address: String,
        /// What it answered.
        detail: String,
    },
    /// The BMC answered with an error that may pass: a 5xx, a 429, a malformed body.
    #[error("BMC {address} answered with an error: {detail}")]
    Faulty {
        /// The BMC.
        address: String,
        /// Status and message.
        detail: String,
    },
    /// The BMC refused the request (a 4xx other than 401/403: a value it does not take, an
    /// action it does not offer); asking again the same way gets the same answer.
    #[error("BMC {address} refused the request: {detail}")]
    Refused {
        /// The BMC.
        address: String,
        /// The HTTP status (0 when the refusal was no HTTP answer: a task's end, an action
        /// the system does not list).
        status: u16,
        /// Status, `MessageId` and message.
        detail: String,
    },
    /// The BMC answered a change as done but reads back something else.
    #[error("BMC {address} did not apply the change: {detail}")]
    NotApplied {
        /// The BMC.
        address: String,
        /// What was asked, and what reads back.
        detail: String,
    },
    /// The address cannot be used at all.
    #[error(transparent)]
    Address(#[from] AddressError),
}

impl BmcError {
    /// The command error code of this failure.
    pub fn code(&self) -> CommandErrorCode {
        match self {
            Self::Unreachable { .. } => CommandErrorCode::BmcUnreachable,
            Self::AuthFailed { .. } => CommandErrorCode::BmcAuthFailed,
            Self::TlsMismatch { .. } => CommandErrorCode::BmcTlsMismatch,
            Self::NotASystem { .. } | Self::Address(AddressError::NotASystem { .. }) => {
                CommandErrorCode::BmcNotASystem
            }
            Self::NotApplied { .. } => CommandErrorCode::BmcNotApplied,
            Self::Faulty { .. } | Self::Refused { .. } | Self::Address(_) => {
                CommandErrorCode::BmcError
            }
        }
    }

    /// As a command failure (code and message).
    pub fn to_failure(&self) -> CommandFailure {
        CommandFailure::new(self.code(), self.to_string())
    }

    /// Whether a request that failed this way may succeed when retried (no answer, a 5xx, a
    /// 429).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unreachable { .. } | Self::Faulty { .. })
    }

    /// The BMC refused the credentials.
    pub fn is_auth(&self) -> bool {
        matches!(self, Self::AuthFailed { .. })
    }
}

/// How the site agent checks a Redfish BMC's certificate (`bcd.v1` `BmcTlsMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Trust on first use: the fingerprint recorded at enrollment, and only it, afterwards.
    Pin,
    /// The WebPKI roots.
    Verify,
    /// No check; warned about on every use.
    Insecure,
}

impl TlsMode {
    /// From the wire enum (unspecified means pin).
    pub fn from_pb(v: i32) -> Self {
        match pb::BmcTlsMode::try_from(v).unwrap_or(pb::BmcTlsMode::Unspecified) {
            pb::BmcTlsMode::Verify => Self::Verify,
            pb::BmcTlsMode::Insecure => Self::Insecure,
            pb::BmcTlsMode::Pin | pb::BmcTlsMode::Unspecified => Self::Pin,
        }
    }
}

/// One BMC endpoint of the assignment, with its credentials (memory only).
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The parsed address.
    pub address: BmcAddress,
    /// The BMC user.
    pub username: String,
    /// The BMC password.
    pub password: Secret,
    /// The certificate check.
    pub tls: TlsMode,
    /// The pinned leaf certificate's SHA-256 (lowercase hex), if recorded.
    pub cert_sha256: Option<String>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("address", &self.address.display())
            .field("tls", &self.tls)
            .field("cert_sha256", &self.cert_sha256)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// From the wire message (which it consumes, so no second copy of the password stays
    /// behind).
    pub fn from_pb(e: pb::BmcEndpoint) -> Result<Self, AddressError> {
        let address = BmcAddress::parse(&e.address)?;
        let cert = e.cert_sha256.trim().to_ascii_lowercase();
        Ok(Self {
            address,
            username: e.username,
            password: Secret::new(e.password),
            tls: TlsMode::from_pb(e.tls),
            cert_sha256: (!cert.is_empty()).then_some(cert),
        })
    }
}

/// Turns endpoints into drivers.
pub trait Connector: Send + Sync + fmt::Debug {
    /// A driver for `endpoint` (no I/O yet: the first operation connects).
    fn connect(&self, endpoint: &Endpoint) -> Result<Arc<dyn Bmc>, BmcError>;
}

/// The real drivers: Redfish over reqwest, IPMI through ipmitool, with the site's settings.
#[derive(Debug, Clone)]
pub struct RealConnector {
    config: SiteConfig,
}

impl RealConnector {
    /// With the `[site]` settings (timeouts, retries, the ipmitool path).
    pub fn new(config: SiteConfig) -> Self {
        Self { config }
    }
}

impl Connector for RealConnector {
    fn connect(&self, endpoint: &Endpoint) -> Result<Arc<dyn Bmc>, BmcError> {
        match &endpoint.address {
            BmcAddress::Redfish { .. } => {
                Ok(Arc::new(redfish::RedfishBmc::new(endpoint, &self.config)?))
            }
            BmcAddress::Ipmi { .. } => Ok(Arc::new(ipmi::IpmiBmc::new(endpoint, &self.config))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_code() {
        let a = || "redfish+http://h".to_owned();
        let d = || "x".to_owned();
        let cases = [
            (
                BmcError::Unreachable {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcUnreachable,
            ),
            (
                BmcError::AuthFailed {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcAuthFailed,
            ),
            (
                BmcError::TlsMismatch {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcTlsMismatch,
            ),
            (
                BmcError::NotASystem {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcNotASystem,
            ),
            (
                BmcError::Faulty {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcError,
            ),
            (
                BmcError::Refused {
                    address: a(),
                    status: 400,
                    detail: d(),
                },
                CommandErrorCode::BmcError,
            ),
            (
                BmcError::NotApplied {
                    address: a(),
                    detail: d(),
                },
                CommandErrorCode::BmcNotApplied,
            ),
            (
                BmcError::Address(AddressError::Scheme("x".into())),
                CommandErrorCode::BmcError,
            ),
            (
                BmcError::Address(AddressError::NotASystem {
                    address: a(),
                    path: "/x".into(),
                }),
                CommandErrorCode::BmcNotASystem,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e}");
            assert!(
                e.to_failure().message.contains("redfish+http://h")
                    || e.code() == CommandErrorCode::BmcError
            );
        }
    }

    #[test]
    fn secrets_never_show_and_are_scrubbed_from_text() {
        let s = Secret::new("hunter2".to_owned());
        assert_eq!(format!("{s:?}"), "Secret([redacted])");
        assert_eq!(s.scrub("pw=hunter2!"), "pw=[redacted]!");
        let e = Endpoint::from_pb(pb::BmcEndpoint {
            address: "redfish+https://h".into(),
            username: "admin".into(),
            password: "hunter2".into(),
            tls: 0,
            cert_sha256: "AB".into(),
        });
        let shown = format!("{e:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(
            matches!(e, Ok(Endpoint { tls: TlsMode::Pin, cert_sha256: Some(ref c), .. }) if c == "ab")
        );
    }
}
