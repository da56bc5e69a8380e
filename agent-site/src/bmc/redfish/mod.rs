//! The Redfish driver: `nv-redfish` (its generated `ComputerSystem` and `EthernetInterface`
//! schema types, its HTTP transport `HttpBmc` and the platform-quirk layer `CompatBmc`) over a
//! reqwest client of our own.
//!
//! # Design
//! - One reqwest client per BMC (connections are reused), built on rustls with the ring provider
//!   and the BMC's [`BmcCertVerifier`]; connect and whole-request timeouts from `[site]`; a
//!   redirect policy that follows only same-origin redirects (nv-redfish asks for it when it is
//!   given a client: credentials must never follow a redirect elsewhere).
//! - Everything goes through nv-redfish: the service root (platform classification,
//!   `CompatBmc::classify`), the system and its NICs read as typed documents
//!   (`NavProperty::get`), `ComputerSystem.Reset` through the generated action, the boot
//!   override PATCHed as a generated `ComputerSystemUpdate` (to the `@Redfish.Settings` object
//!   when the system names one). nv-redfish's high-level `ComputerSystem` wrapper is not used: it
//!   can only be reached by reading every member of `/redfish/v1/Systems`, while an address names
//!   one system and the sync loop must read only that one. No request is written by hand.
//! - Reads (GET) are retried on no answer or a 5xx, with exponential backoff and jitter, at most
//!   `read_retries` times; actions and PATCHes are sent once.
//! - Errors are classified into [`BmcError`]: 401/403 → credentials; a refused certificate →
//!   TLS mismatch; connect failures and timeouts → unreachable; 404 on the system → not a
//!   system; 5xx and malformed documents → the BMC's error.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::{
    BmcFacts, BmcNic, BootDevice, BootDeviceResult, PowerAction, PowerState,
};
use nv_redfish::bmc_http::reqwest::{BmcError as HttpError, Client};
use nv_redfish::bmc_http::{BmcCredentials, CacheSettings, HttpBmc};
use nv_redfish::core::{
    Bmc as _, ModificationResponse, NavProperty, ODataId, RedfishSettings as _, RepairError,
};
use nv_redfish::quirks::CompatBmc;
use nv_redfish::schema::computer_system::{
    BootSource, BootSourceOverrideEnabled, BootUpdate, ComputerSystem, ComputerSystemUpdate,
};
use nv_redfish::schema::computer_system_collection::ComputerSystemCollection;
use nv_redfish::schema::ethernet_interface::EthernetInterface;
use nv_redfish::schema::ethernet_interface_collection::EthernetInterfaceCollection;
use rand::Rng as _;
use tokio::sync::OnceCell;
use url::Url;

mod map;

use map::{What, chain, excerpt, same_origin};
pub use map::{normalize_mac, power_of, reset_type};

use super::tls::BmcCertVerifier;
use super::{Bmc, BmcError, BmcFuture, Endpoint, Secret, TlsMode};
use crate::address::BmcAddress;
use crate::config::SiteConfig;

type Http = HttpBmc<Client>;
type Compat = CompatBmc<Http>;
type CompatErr = RepairError<HttpError>;

/// `/redfish/v1/Systems` (DSP0266 mandates this URI for the systems collection).
const SYSTEMS: &str = "/redfish/v1/Systems";

/// One Redfish BMC.
pub struct RedfishBmc {
    address: String,
    system_path: Option<String>,
    http: Arc<Http>,
    verifier: Option<Arc<BmcCertVerifier>>,
    tls: TlsMode,
    secret: Secret,
    compat: OnceCell<Compat>,
    system: OnceCell<ODataId>,
    read_retries: u32,
    backoff: Duration,
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
            secret: endpoint.password.clone(),
            compat: OnceCell::new(),
            system: OnceCell::new(),
            read_retries: cfg.read_retries,
            backoff: cfg.retry_backoff(),
        })
    }

    fn err(&self, make: fn(String, String) -> BmcError, detail: &str) -> BmcError {
        make(self.address.clone(), self.secret.scrub(detail))
    }

    /// Classifies a failed request about `what`.
    fn classify(&self, e: CompatErr, what: What) -> BmcError {
        let unreachable = |a, d| BmcError::Unreachable {
            address: a,
            detail: d,
        };
        let auth = |a, d| BmcError::AuthFailed {
            address: a,
            detail: d,
        };
        let faulty = |a, d| BmcError::Faulty {
            address: a,
            detail: d,
        };
        let not_system = |a, d| BmcError::NotASystem {
            address: a,
            detail: d,
        };
        let tls = |a, d| BmcError::TlsMismatch {
            address: a,
            detail: d,
        };
        let w = what.as_str();
        let http = match e {
            RepairError::Decode(d) => return self.err(faulty, &format!("malformed {w}: {d}")),
            RepairError::Transport(h) => h,
        };
        match http {
            HttpError::ReqwestError(r) => {
                if let Some(why) = self.verifier.as_ref().and_then(|v| v.take_refusal()) {
                    return self.err(tls, &why);
                }
                if r.is_timeout() {
                    return self.err(unreachable, &format!("{w}: timed out: {}", chain(&r)));
                }
                if r.is_redirect() || r.is_decode() {
                    return self.err(faulty, &format!("{w}: {}", chain(&r)));
                }
                // Refused, reset, dropped mid-answer: no usable answer came.
                self.err(unreachable, &format!("{w}: {}", chain(&r)))
            }
            HttpError::InvalidResponse { status, text, .. } => {
                // The answer is scrubbed whole before it is cut to an excerpt (a cut must not
                // leave half an encoded password behind); a refusal of the credentials keeps no
                // body at all: it is where a BMC echoes what it was sent.
                let detail = match status.as_u16() {
                    401 | 403 => format!(
                        "{w}: HTTP {status} (its body is not kept: a BMC may echo the credentials there)"
                    ),
                    _ => format!("{w}: HTTP {status}: {}", excerpt(&self.secret.scrub(&text))),
                };
                match status.as_u16() {
                    401 | 403 => self.err(auth, &detail),
                    404 if matches!(what, What::System | What::Systems) => {
                        self.err(not_system, &detail)
                    }
                    _ => self.err(faulty, &detail),
                }
            }
            HttpError::ActionNotSupported => {
                self.err(faulty, &format!("the system offers no {w} action"))
            }
            other => self.err(faulty, &format!("{w}: {other}")),
        }
    }

    /// Waits before retry `attempt` (0-based): the backoff doubled per attempt, ±50 % jitter.
    async fn pause(&self, attempt: u32) {
        let base = self.backoff.saturating_mul(2u32.saturating_pow(attempt));
        let factor = rand::rng().random_range(0.5..1.5);
        tokio::time::sleep(base.mul_f64(factor)).await;
    }

    /// The platform layer over the transport (reads the service root once).
    async fn compat(&self) -> Result<&Compat, BmcError> {
        self.compat
            .get_or_try_init(|| async {
                let mut attempt = 0;
                loop {
                    match CompatBmc::classify(Arc::clone(&self.http)).await {
                        Ok(c) => return Ok(c),
                        Err(e) => {
                            let e = self.classify(e, What::Root);
                            if !e.is_transient() || attempt >= self.read_retries {
                                return Err(e);
                            }
                            self.pause(attempt).await;
                            attempt += 1;
                        }
                    }
                }
            })
            .await
    }

    /// GETs `id` as a `T`, retrying on no answer or a 5xx.
    async fn read<T>(&self, id: &ODataId, what: What) -> Result<Arc<T>, BmcError>
    where
        T: nv_redfish::core::EntityTypeRef
            + for<'de> serde::Deserialize<'de>
            + 'static
            + Send
            + Sync,
    {
        let compat = self.compat().await?;
        let mut attempt = 0;
        loop {
            match NavProperty::<T>::new_reference(id.clone())
                .get(compat)
                .await
            {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let e = self.classify(e, what);
                    if !e.is_transient() || attempt >= self.read_retries {
                        return Err(e);
                    }
                    tracing::debug!(bmc = %self.address, error = %e, attempt, "retrying a read");
                    self.pause(attempt).await;
                    attempt += 1;
                }
            }
        }
    }

    /// The system's path: the address's, or the service's only system.
    async fn system_id(&self) -> Result<ODataId, BmcError> {
        self.system
            .get_or_try_init(|| async {
                if let Some(p) = &self.system_path {
                    return Ok(ODataId::from(p.clone()));
                }
                let systems: Arc<ComputerSystemCollection> =
                    self.read(&ODataId::from(SYSTEMS.to_owned()), What::Systems).await?;
                match systems.members.as_slice() {
                    [one] => Ok(one.id().clone()),
                    [] => Err(BmcError::NotASystem {
                        address: self.address.clone(),
                        detail: "the service lists no system".to_owned(),
                    }),
                    many => Err(BmcError::NotASystem {
                        address: self.address.clone(),
                        detail: format!(
                            "the service lists {} systems; name one in the address (…/redfish/v1/Systems/<id>)",
                            many.len()
                        ),
                    }),
                }
            })
            .await
            .cloned()
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

    async fn system(&self) -> Result<Arc<ComputerSystem>, BmcError> {
        let id = self.system_id().await?;
        self.read(&id, What::System).await
    }

    async fn nics(&self, system: &ComputerSystem) -> Result<Vec<BmcNic>, BmcError> {
        let Some(nav) = &system.ethernet_interfaces else {
            return Ok(Vec::new());
        };
        let coll: Arc<EthernetInterfaceCollection> = self.read(nav.id(), What::Nics).await?;
        let mut out = Vec::new();
        for m in &coll.members {
            let nic: Arc<EthernetInterface> = self.read(m.id(), What::Nics).await?;
            let mac = [&nic.permanent_mac_address, &nic.mac_address]
                .into_iter()
                .filter_map(|m| m.as_ref().and_then(Option::as_deref))
                .find_map(normalize_mac);
            if let Some(mac) = mac {
                out.push(BmcNic {
                    id: nic.id.to_string(),
                    mac,
                });
            }
        }
        out.sort_by(|a, b| a.mac.cmp(&b.mac));
        out.dedup_by(|a, b| a.mac == b.mac);
        Ok(out)
    }

    async fn do_facts(&self) -> Result<BmcFacts, BmcError> {
        self.check_tls(true)?;
        let system = self.system().await?;
        let nics = self.nics(&system).await?;
        let text = |v: &Option<Option<String>>| {
            v.as_ref()
                .and_then(Option::as_deref)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        Ok(BmcFacts {
            system_path: system.odata_id.to_string(),
            uuid: system
                .uuid
                .as_ref()
                .and_then(Option::as_ref)
                .map(|u| u.to_string().to_ascii_lowercase()),
            serial: text(&system.serial_number),
            manufacturer: text(&system.manufacturer),
            model: text(&system.model),
            nics,
            power: power_of(system.power_state.flatten()),
            cert_sha256: self.verifier.as_ref().and_then(|v| v.presented()),
        })
    }

    async fn do_power_state(&self) -> Result<PowerState, BmcError> {
        self.check_tls(false)?;
        Ok(power_of(self.system().await?.power_state.flatten()))
    }

    async fn do_power(&self, action: PowerAction) -> Result<(), BmcError> {
        self.check_tls(false)?;
        let system = self.system().await?;
        let actions = system.actions.as_ref().ok_or_else(|| BmcError::Faulty {
            address: self.address.clone(),
            detail: "the system offers no actions (no ComputerSystem.Reset)".to_owned(),
        })?;
        let compat = self.compat().await?;
        let r = actions
            .reset(compat, Some(reset_type(action)))
            .await
            .map_err(|e| self.classify(e, What::Reset))?;
        // A BMC may run the action as a task; the sync loop sees the outcome either way.
        if let ModificationResponse::Task(t) = r {
            tracing::debug!(bmc = %self.address, task = ?t.location, "power action runs as a task");
        }
        Ok(())
    }

    async fn do_boot(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> Result<BootDeviceResult, BmcError> {
        self.check_tls(false)?;
        let system = self.system().await?;
        let target = match device {
            BootDevice::Pxe => BootSource::Pxe,
            BootDevice::Disk => BootSource::Hdd,
        };
        let enabled = if persistent {
            BootSourceOverrideEnabled::Continuous
        } else {
            BootSourceOverrideEnabled::Once
        };
        let update = ComputerSystemUpdate::builder()
            .with_boot(
                BootUpdate::builder()
                    .with_boot_source_override_target(target)
                    .with_boot_source_override_enabled(enabled)
                    .build(),
            )
            .build();
        // A system with a `@Redfish.Settings` object takes changes there (applied at the next
        // reset), as nv-redfish's own wrapper does.
        let (id, etag) = match system.settings_object() {
            Some(s) => (s.id().clone(), None),
            None => (system.odata_id.clone(), system.odata_etag.as_ref()),
        };
        let compat = self.compat().await?;
        let r = compat
            .update::<_, serde_json::Value>(&id, etag, &update)
            .await
            .map_err(|e| self.classify(e, What::Boot))?;
        if let ModificationResponse::Task(t) = r {
            tracing::debug!(bmc = %self.address, task = ?t.location, "boot override runs as a task");
        }
        let after = self.system().await?;
        let boot = after.boot.as_ref();
        let device = boot
            .and_then(|b| b.boot_source_override_target.flatten())
            .and_then(|t| match t {
                BootSource::Pxe => Some(BootDevice::Pxe),
                BootSource::Hdd => Some(BootDevice::Disk),
                _ => None,
            });
        let persistent = boot
            .and_then(|b| b.boot_source_override_enabled.flatten())
            .and_then(|e| match e {
                BootSourceOverrideEnabled::Continuous => Some(true),
                BootSourceOverrideEnabled::Once => Some(false),
                _ => None,
            });
        Ok(BootDeviceResult { device, persistent })
    }
}

impl Bmc for RedfishBmc {
    fn address(&self) -> &str {
        &self.address
    }

    fn facts(&self) -> BmcFuture<'_, BmcFacts> {
        Box::pin(self.do_facts())
    }

    fn power_state(&self) -> BmcFuture<'_, PowerState> {
        Box::pin(self.do_power_state())
    }

    fn power(&self, action: PowerAction) -> BmcFuture<'_, ()> {
        Box::pin(self.do_power(action))
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> BmcFuture<'_, BootDeviceResult> {
        Box::pin(self.do_boot(device, persistent))
    }
}
