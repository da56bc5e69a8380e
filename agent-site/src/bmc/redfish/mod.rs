//! The Redfish driver: `nv-redfish` (its generated `ComputerSystem` and `EthernetInterface`
//! schema types, its HTTP transport `HttpBmc`, sessions, task monitors and the platform-quirk
//! layer `CompatBmc`) over a reqwest client of our own.
//!
//! # Design
//! - One reqwest client per BMC (connections are reused), built on rustls with the ring provider
//!   and the BMC's [`BmcCertVerifier`]; connect and whole-request timeouts from `[site]`; a
//!   redirect policy that follows only same-origin redirects (nv-redfish asks for it when it is
//!   given a client: credentials must never follow a redirect elsewhere).
//! - Everything goes through nv-redfish: the service root (platform classification,
//!   `CompatBmc::classify`), the system read as a raw document (its annotations: the allowable
//!   values) and decoded into the generated `ComputerSystem`, its NICs (`NavProperty::get`),
//!   `ComputerSystem.Reset` through the generated action, the boot override PATCHed as a
//!   generated `ComputerSystemUpdate` (to the `@Redfish.Settings` object when the system names
//!   one) with the document's ETag, sessions (`create_session`, `delete`) and task monitors
//!   (`poll`). nv-redfish's high-level `ComputerSystem` wrapper is not used: it can only be
//!   reached by reading every member of `/redfish/v1/Systems`, while an address names one system
//!   and the sync loop must read only that one. No request is written by hand.
//! - The request layer ([`call`]): one session per BMC where the BMC offers a SessionService
//!   ([`session`]), reused, logged in again once on a 401, deleted when the driver goes; no
//!   answer, a 5xx or a 429 retried with backoff and jitter — a change only after reading back
//!   that it did not take; a 202 followed to the end of its task ([`task`]) with nothing else
//!   sent to the BMC meanwhile; a request abandoned at its timeout counted at the BMC for one
//!   more timeout ([`crate::bmc::Bmc::busy_until`]).
//! - The operations ([`ops`]): values chosen from what the system advertises ([`system`]), a
//!   boot override armed right before the boot, every change read back.
//! - Errors are classified into [`BmcError`]: 401/403 → credentials; a refused certificate →
//!   TLS mismatch; connect failures and timeouts → unreachable; 404 on the system → not a
//!   system; other 4xx → refused; 5xx, 429 and malformed documents → the BMC's error. The BMC's
//!   words are its `@Message.ExtendedInfo` (`MessageId: Message`).

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use bc_protocol::commands::bmc::{BmcFacts, BootDevice, BootDeviceResult, PowerAction};
use nv_redfish::bmc_http::reqwest::{BmcError as HttpError, Client};
use nv_redfish::bmc_http::{BmcCredentials, CacheSettings, HttpBmc};
use nv_redfish::core::{ODataId, RepairError};
use nv_redfish::quirks::CompatBmc;
use parking_lot::Mutex;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use url::Url;

mod call;
mod map;
mod ops;
mod session;
mod system;
mod task;

use map::{chain, same_origin};
pub use map::{choose, normalize_mac, reading_of, reset_candidates, reset_type};

use super::tls::BmcCertVerifier;
use super::{
    Bmc, BmcError, BmcFuture, BootOverride, Endpoint, PowerDone, PowerReading, Secret, TlsMode,
};
use crate::address::BmcAddress;
use crate::config::SiteConfig;

type Http = HttpBmc<Client>;
type Compat = CompatBmc<Http>;
type CompatErr = RepairError<HttpError>;

/// `/redfish/v1/Systems` (DSP0266 mandates this URI for the systems collection).
const SYSTEMS: &str = "/redfish/v1/Systems";

/// The timings and bounds of one driver, from `[site]`.
#[derive(Debug, Clone, Copy)]
struct Policy {
    /// Retries of a request that got no answer, a 5xx or a 429.
    retries: u32,
    /// The first wait before a retry; doubled per retry, ±50 %.
    backoff: Duration,
    /// A request's whole timeout (how long an abandoned request may still run at the BMC).
    request_timeout: Duration,
    /// How long a power action's result waits for the BMC to settle.
    settle: Duration,
    /// How long a task may run.
    task_limit: Duration,
}

/// One Redfish BMC.
pub struct RedfishBmc {
    address: String,
    system_path: Option<String>,
    http: Arc<Http>,
    verifier: Option<Arc<BmcCertVerifier>>,
    tls: TlsMode,
    user: String,
    secret: Secret,
    compat: OnceCell<Compat>,
    system: OnceCell<ODataId>,
    policy: Policy,
    session: tokio::sync::Mutex<session::State>,
    /// Held shared by each request, exclusively while a change and its task run: nothing else
    /// is sent to the system until a task ends.
    exclusive: tokio::sync::RwLock<()>,
    /// Transient faults retried so far (a flaky BMC).
    faults: AtomicU32,
    /// Until when a request given up on may still run at the BMC.
    abandoned: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for RedfishBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishBmc")
            .field("address", &self.address)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl RedfishBmc {
    /// A driver for `endpoint` (a Redfish address); builds its HTTP client, connects later.
    pub fn new(endpoint: &Endpoint, cfg: &SiteConfig) -> Result<Self, BmcError> {
        let BmcAddress::Redfish { base, system_path } = &endpoint.address else {
            return Err(BmcError::Faulty {
                address: endpoint.address.display(),
                detail: "not a Redfish address".to_owned(),
            });
        };
        let address = endpoint.address.display();
        let build_err = |e: String| BmcError::Faulty {
            address: address.clone(),
            detail: format!("building the HTTP client: {e}"),
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout())
            .timeout(cfg.request_timeout())
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_keepalive(Duration::from_secs(60))
            .user_agent(format!("bcd-site/{}", bc_protocol::VERSION))
            .redirect(same_origin(base.origin()));
        let mut verifier = None;
        if base.scheme() == "https" {
            let v = Arc::new(
                BmcCertVerifier::new(endpoint.tls, endpoint.cert_sha256.as_deref())
                    .map_err(|e| build_err(e.to_string()))?,
            );
            let config = BmcCertVerifier::client_config(Arc::clone(&v))
                .map_err(|e| build_err(e.to_string()))?;
            builder = builder.use_preconfigured_tls(config);
            verifier = Some(v);
        }
        let client = builder.build().map_err(|e| build_err(chain(&e)))?;
        let credentials = BmcCredentials::new(
            endpoint.username.clone(),
            endpoint.password.expose().to_owned(),
        );
        // No response cache: every power read must reach the BMC.
        let http = HttpBmc::new(
            Client::with_client(client),
            Url::clone(base),
            credentials,
            CacheSettings::with_capacity(0),
        );
        Ok(Self {
            address,
            system_path: system_path.clone(),
            http: Arc::new(http),
            verifier,
            tls: endpoint.tls,
            user: endpoint.username.clone(),
            secret: endpoint.password.clone(),
            compat: OnceCell::new(),
            system: OnceCell::new(),
            policy: Policy {
                retries: cfg.read_retries,
                backoff: cfg.retry_backoff(),
                request_timeout: cfg.request_timeout(),
                settle: cfg.power_settle(),
                task_limit: cfg.operation_timeout(),
            },
            session: tokio::sync::Mutex::new(session::State::Unknown),
            exclusive: tokio::sync::RwLock::new(()),
            faults: AtomicU32::new(0),
            abandoned: Mutex::new(None),
        })
    }

    /// Refuses anything but `bmc.verify` while pin mode has no pin, and warns about insecure.
    fn check_tls(&self, first_contact_allowed: bool) -> Result<(), BmcError> {
        if self.verifier.is_none() {
            return Ok(());
        }
        match self.tls {
            TlsMode::Insecure => {
                tracing::warn!(bmc = %self.address, "the BMC's TLS certificate is not checked (tls: insecure)");
            }
            TlsMode::Pin
                if !first_contact_allowed
                    && self.verifier.as_ref().is_some_and(|v| v.awaiting_pin()) =>
            {
                return Err(BmcError::TlsMismatch {
                    address: self.address.clone(),
                    detail: "no certificate is pinned yet: bmc.verify records it first".to_owned(),
                });
            }
            TlsMode::Pin | TlsMode::Verify => {}
        }
        Ok(())
    }
}

impl Drop for RedfishBmc {
    fn drop(&mut self) {
        // The session goes with the driver (a new assignment, new credentials): deleted in the
        // background where a runtime runs, as `close` would.
        if let session::State::Open { location } =
            std::mem::replace(self.session.get_mut(), session::State::Unknown)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let http = Arc::clone(&self.http);
            let address = self.address.clone();
            rt.spawn(async move { session::delete(&http, &location, &address).await });
        }
    }
}

impl Bmc for RedfishBmc {
    fn address(&self) -> &str {
        &self.address
    }

    fn facts(&self) -> BmcFuture<'_, BmcFacts> {
        Box::pin(self.do_facts())
    }

    fn power_state(&self) -> BmcFuture<'_, PowerReading> {
        Box::pin(self.do_power_state())
    }

    fn power(&self, action: PowerAction, boot: Option<BootOverride>) -> BmcFuture<'_, PowerDone> {
        Box::pin(self.do_power(action, boot))
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> BmcFuture<'_, BootDeviceResult> {
        Box::pin(self.do_boot(device, persistent))
    }

    fn busy_until(&self) -> Option<Instant> {
        (*self.abandoned.lock()).filter(|t| *t > Instant::now())
    }

    fn close(&self) -> BmcFuture<'_, ()> {
        Box::pin(async {
            self.logout().await;
            Ok(())
        })
    }
}
