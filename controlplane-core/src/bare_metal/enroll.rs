//! `nodes.enroll`: a bare-metal machine enters the fleet through its BMC, in `enrolling`
//! (created by [`crate::edit::create_node`], the one way a node comes to exist), with its BMC's
//! address checked, its credentials sealed and the pool's drivers. Its verification is the
//! `enrolling` workflow's ([`super::verify`]).

use bc_protocol::{Adapter, NodeRole, PoolAgent, ProvisionState};
use cpl_store::{BmcRecord, NewNode, NodeRecord, Tx};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use super::address::{self, PowerDriver};
use super::bmc::{BmcFactsView, OWNER, pending};
use super::credentials::{CredentialKey, Credentials};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ownership::placement;

/// Longest BMC username accepted, characters.
pub const MAX_USERNAME: usize = 256;
/// Longest BMC password accepted, characters.
pub const MAX_PASSWORD: usize = 1024;
/// Most MACs one enrollment may name.
pub const MAX_MACS: usize = 64;
/// A secret the API takes and never gives back: deserialized from a string, and `Debug` shows
/// nothing of it. It serializes as the string only so that a client (`bcctl`) can send it in a
/// request; no answer of the API holds one ([`super::bmc::BmcView`] shows no credential).
#[derive(Clone, PartialEq, Eq, Serialize)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for sealing.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret(s)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

impl utoipa::PartialSchema for Secret {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Password,
            )))
            .write_only(Some(true))
            .description(Some("Write-only: no answer of the API ever contains it."))
            .into()
    }
}

impl ToSchema for Secret {}

/// How the site agent checks the BMC's TLS certificate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Trust on first use: the certificate seen at the first verification, and only it, later.
    #[default]
    Pin,
    /// The site agent's system roots.
    Verify,
    /// No check (chosen explicitly; the site agent warns on every use).
    Insecure,
}

impl TlsMode {
    /// `pin`, `verify` or `insecure`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pin => "pin",
            Self::Verify => "verify",
            Self::Insecure => "insecure",
        }
    }
}

/// The BMC of `nodes.enroll`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BmcInput {
    /// `redfish+https://host[:port][/redfish/v1/Systems/<id>]`, `redfish+http://…` or
    /// `ipmi://host[:port]`.
    pub address: String,
    pub username: String,
    /// Write-only.
    pub password: Secret,
    /// Default `pin`.
    #[serde(default)]
    pub tls: TlsMode,
}

/// `nodes.enroll` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnrollRequest {
    /// The site whose site agent reaches the BMC.
    pub site_id: crate::text::Id,
    /// The pool the machine will serve; without one it is `unassigned`.
    #[serde(default)]
    pub pool_id: Option<crate::text::Id>,
    /// A name for the machine (shown as its hostname until an agent reports one).
    #[serde(default)]
    pub name: Option<crate::text::Name>,
    pub bmc: BmcInput,
    /// The machine's NIC MACs, when known (PXE boot by MAC, next workflows).
    #[serde(default)]
    pub macs: Option<Vec<String>>,
    /// Whether the machine goes on to `inspecting` once its BMC is verified: powered on with
    /// PXE into the ramdisk, inspected and commissioned to `ready` (issue 15). Default `true`;
    /// `false` keeps it `enrolling` (verified) until `nodes.inspect`.
    #[serde(default = "default_inspect")]
    pub inspect: bool,
    /// The machine already runs its OS and keeps it (Metal3's `externallyProvisioned`, issue
    /// 16): once the BMC is verified the node goes `enrolling -> deployed` with no network boot
    /// and no inspection; its power is managed, and `nodes.release` cleans it into `ready`.
    /// Default `false`.
    #[serde(default)]
    pub deployed: bool,
}

fn default_inspect() -> bool {
    true
}

fn invalid(msg: impl Into<String>) -> OpError {
    OpError::InvalidArgument(msg.into())
}

/// Checks the username and password of a BMC (non-empty, bounded, no control characters).
pub fn check_credentials(username: &str, password: &str) -> Result<(), OpError> {
    if username.is_empty() || username.chars().count() > MAX_USERNAME {
        return Err(invalid(format!(
            "bmc.username must be 1 to {MAX_USERNAME} characters"
        )));
    }
    if username.chars().any(char::is_control) {
        return Err(invalid("bmc.username must not contain control characters"));
    }
    if password.is_empty() || password.chars().count() > MAX_PASSWORD {
        // The length rule only; never the password.
        return Err(invalid(format!(
            "bmc.password must be 1 to {MAX_PASSWORD} characters"
        )));
    }
    Ok(())
}

/// The node's `drivers`: the pool profile's, with `power` from the address when the profile
/// names none, `boot: ipxe` and `deploy: bcd-ramdisk` by default. A profile whose `power` is
/// not the address's kind is refused.
fn drivers(
    profile: Option<&cpl_store::HardwareProfile>,
    driver: PowerDriver,
) -> Result<serde_json::Map<String, serde_json::Value>, OpError> {
    let mut out: serde_json::Map<String, serde_json::Value> = profile
        .map(|p| {
            p.drivers
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect()
        })
        .unwrap_or_default();
    if let Some(p) = out.get("power").and_then(|v| v.as_str())
        && p != driver.as_str()
    {
        return Err(invalid(format!(
            "the pool's hardware profile says drivers.power {p}, but bmc.address is a {} address",
            driver.as_str()
        )));
    }
    for (k, v) in [
        ("power", driver.as_str()),
        ("boot", "ipxe"),
        ("deploy", "bcd-ramdisk"),
    ] {
        out.entry(k.to_owned())
            .or_insert_with(|| serde_json::Value::String(v.to_owned()));
    }
    Ok(out)
}

/// The MACs given, checked and lowercased.
fn check_macs(macs: &[String]) -> Result<Vec<String>, OpError> {
    if macs.len() > MAX_MACS {
        return Err(invalid(format!("at most {MAX_MACS} macs")));
    }
    let mut out = Vec::new();
    for (i, m) in macs.iter().enumerate() {
        let line = bc_protocol::hwid::mac_line(m)
            .map_err(|why| invalid(format!("macs[{i}] {m:?}: {why}")))?;
        out.push(line.trim_start_matches("mac:").to_owned());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `nodes.enroll` in `tx` by `actor`: the node in `enrolling`, its BMC row (credentials sealed
/// under `key`), and `BmcVerified: unknown` until the site's lease holder verifies it. Returns
/// the node.
pub fn enroll(
    tx: &Tx<'_>,
    key: &CredentialKey,
    req: &EnrollRequest,
    actor: &str,
) -> Result<NodeRecord, OpError> {
    let addr = address::parse(&req.bmc.address).map_err(|e| invalid(e.to_string()))?;
    check_credentials(&req.bmc.username, req.bmc.password.expose())?;
    let macs = check_macs(req.macs.as_deref().unwrap_or_default())?;
    if let Some(name) = &req.name
        && (name.trim().is_empty() || name.len() > 253 || name.chars().any(char::is_control))
    {
        return Err(invalid(
            "name must be 1 to 253 characters without control characters",
        ));
    }
    for other in tx.site_bmcs(&req.site_id)? {
        let facts: Vec<String> = other
            .facts
            .as_ref()
            .and_then(|f| serde_json::from_value::<BmcFactsView>(f.clone()).ok())
            .map(|f| f.macs)
            .unwrap_or_default();
        if let Some(m) = macs.iter().find(|m| {
            other.macs.contains(m) || facts.iter().any(|f| f.eq_ignore_ascii_case(m.as_str()))
        }) {
            return Err(invalid(format!(
                "MAC {m} belongs to node {} already: a MAC names one machine (its network boot is answered by it)",
                other.node_id
            )));
        }
    }
    let site = tx.site(&req.site_id)?.ok_or_else(|| OpError::NotFound {
        kind: "site",
        id: req.site_id.to_string(),
    })?;
    let pool = match &req.pool_id {
        Some(id) => Some(tx.pool(id)?.ok_or_else(|| OpError::NotFound {
            kind: "pool",
            id: id.to_string(),
        })?),
        None => None,
    };
    if let Some(p) = &pool {
        if p.site_id.as_deref().is_some_and(|s| s != site.id) {
            return Err(invalid(format!(
                "pool {} is on site {}, not {}",
                p.id,
                p.site_id.as_deref().unwrap_or_default(),
                site.id
            )));
        }
        if p.agent == PoolAgent::None {
            return Err(invalid(format!(
                "pool {} has agent: none (provider machines); a bare-metal machine enrolled through its BMC needs a pool with agent: bcd",
                p.id
            )));
        }
    }
    // One BMC is one machine, however its address is spelled and on whichever site
    // (issue 30.8): its canonical origin and system against every enrolled one's.
    if let Some((other, theirs)) = tx.bmcs()?.into_iter().find_map(|b| {
        let o = address::parse(&b.address).ok()?.origin;
        o.same_bmc(&addr.origin).then_some((b, o))
    }) {
        return Err(OpError::InvalidState(format!(
            "BMC {} is already enrolled as node {} ({}, which reaches {theirs}): one BMC is enrolled once",
            addr.origin, other.node_id, other.address
        )));
    }
    let mut p = placement(pool.as_ref(), Some(&site), false);
    if pool.is_none() {
        p.role = NodeRole::Unassigned;
    }
    let node_id = crate::join::new_node_id();
    let new = NewNode {
        id: node_id.clone(),
        site_id: Some(site.id.clone()),
        pool_id: p.pool_id,
        owner_tenant_id: p.owner_tenant_id,
        role: p.role,
        trust: p.trust,
        adapter: Adapter::BcdV1,
        drivers: drivers(pool.as_ref().map(|p| &p.hardware_profile), addr.driver)?,
        hostname: req.name.as_ref().map(|n| n.trim().to_owned()),
        hardware_key: None,
        hardware_key_trusted: false,
        identifier_digests: Vec::new(),
    };
    let now = crate::edit::create_node(
        tx,
        &new,
        ProvisionState::Enrolling,
        actor,
        &format!(
            "enrolled through BMC {} (tls {}) on site {}",
            addr.normalized,
            req.bmc.tls.as_str(),
            site.id
        ),
    )?;
    let sealed = key.seal(
        &node_id,
        &Credentials {
            username: req.bmc.username.clone(),
            password: req.bmc.password.expose().to_owned(),
        },
    )?;
    tx.put_bmc(&BmcRecord {
        node_id: node_id.clone(),
        address: addr.normalized.clone(),
        tls: req.bmc.tls.as_str().to_owned(),
        credentials: sealed,
        candidate: None,
        cert_sha256: None,
        facts: None,
        identifiers: Vec::new(),
        macs,
        verified_at: None,
        verify_command_id: None,
        verify_started_at: Some(now),
        last_error: None,
        power_expected: None,
        power_expected_at: None,
        reachable: None,
        created_at: now,
        inspect: req.inspect && !req.deployed,
        deployed: req.deployed,
        deployment: None,
        rescue: None,
    })?;
    let mut edit = Edit::report(tx, &node_id, OWNER)?;
    pending(&mut edit, &site.id);
    edit.save(tx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drivers_come_from_the_profile_and_the_address() -> Result<(), OpError> {
        let d = drivers(None, PowerDriver::Ipmi)?;
        assert_eq!(d["power"], "ipmi");
        assert_eq!(d["boot"], "ipxe");
        assert_eq!(d["deploy"], "bcd-ramdisk");
        let mut p = cpl_store::HardwareProfile::default();
        p.drivers.insert("power".into(), "redfish".into());
        p.drivers.insert("deploy".into(), "image".into());
        let d = drivers(Some(&p), PowerDriver::Redfish)?;
        assert_eq!(d["deploy"], "image");
        assert!(matches!(
            drivers(Some(&p), PowerDriver::Ipmi),
            Err(OpError::InvalidArgument(_))
        ));
        Ok(())
    }

    #[test]
    fn credential_and_mac_rules() {
        assert!(check_credentials("admin", "pw").is_ok());
        assert!(check_credentials("", "pw").is_err());
        assert!(check_credentials("a\nb", "pw").is_err());
        let e = check_credentials("admin", "").map_err(|e| e.to_string());
        assert!(e.is_err());
        assert_eq!(
            check_macs(&["00-25-90-EB-96-28".into(), "00:25:90:eb:96:28".into()]).ok(),
            Some(vec!["00:25:90:eb:96:28".to_owned()])
        );
        assert!(check_macs(&["02:42:ac:11:00:02".into()]).is_err());
    }

    #[test]
    fn a_secret_never_prints() {
        let s: Secret = serde_json::from_str("\"hunter2\"").unwrap_or(Secret(String::new()));
        assert_eq!(s.expose(), "hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
