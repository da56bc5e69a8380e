//! The system as its BMC reports it, read once per decision: the raw document (its annotations:
//! `@Redfish.AllowableValues`, `@Redfish.ActionInfo`, `@Redfish.Settings`, its ETag) and the
//! generated `ComputerSystem` decoded from it. Values are chosen from what the system
//! advertises (issue 31, rule 3); where it advertises nothing, the standard values are taken as
//! offered.

use std::sync::Arc;

use nv_redfish::core::{ODataETag, ODataId, Raw};
use nv_redfish::schema::computer_system::ComputerSystem;
use serde_json::Value;

use super::RedfishBmc;
use super::map::{What, reading_of};
use crate::bmc::{BmcError, PowerReading};

/// One reading of the system.
pub(super) struct SystemDoc {
    pub raw: Arc<Raw>,
    pub typed: Arc<ComputerSystem>,
}

/// The boot override as the system reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct BootState {
    pub target: Option<String>,
    pub enabled: Option<String>,
    pub mode: Option<String>,
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`.
    pub targets: Option<Vec<String>>,
    /// `BootSourceOverrideEnabled@Redfish.AllowableValues`.
    pub enabled_values: Option<Vec<String>>,
}

fn list(v: Option<&Value>) -> Option<Vec<String>> {
    let a = v?.as_array()?;
    Some(
        a.iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
    )
}

impl BootState {
    fn of(boot: &Value) -> Self {
        let text = |k: &str| boot.get(k).and_then(Value::as_str).map(str::to_owned);
        Self {
            target: text("BootSourceOverrideTarget"),
            enabled: text("BootSourceOverrideEnabled"),
            mode: text("BootSourceOverrideMode"),
            targets: list(boot.get("BootSourceOverrideTarget@Redfish.AllowableValues")),
            enabled_values: list(boot.get("BootSourceOverrideEnabled@Redfish.AllowableValues")),
        }
    }

    /// `Target=…, Enabled=…` for messages.
    pub fn describe(&self) -> String {
        format!(
            "BootSourceOverrideTarget={}, BootSourceOverrideEnabled={}",
            self.target.as_deref().unwrap_or("(none)"),
            self.enabled.as_deref().unwrap_or("(none)")
        )
    }
}

impl SystemDoc {
    /// The ETag to send with a PATCH of this document, if the BMC gave one.
    pub fn etag(&self) -> Option<&ODataETag> {
        use nv_redfish::core::EntityTypeRef as _;
        self.raw.etag()
    }

    /// Its power state.
    pub fn power(&self) -> PowerReading {
        reading_of(self.typed.power_state.flatten())
    }

    /// Its boot override.
    pub fn boot(&self) -> BootState {
        self.raw
            .value()
            .get("Boot")
            .map(BootState::of)
            .unwrap_or_default()
    }

    /// The `@Redfish.Settings` object a change goes to, if the system names one.
    pub fn settings(&self) -> Option<ODataId> {
        self.raw.value()["@Redfish.Settings"]["SettingsObject"]["@odata.id"]
            .as_str()
            .map(|s| ODataId::from(s.to_owned()))
    }

    fn reset(&self) -> Option<&Value> {
        self.raw.value()["Actions"].get("#ComputerSystem.Reset")
    }
}

impl RedfishBmc {
    /// The system, read now.
    pub(super) async fn system_doc(&self) -> Result<SystemDoc, BmcError> {
        let id = self.system_id().await?;
        self.doc(&id, What::System).await
    }

    /// The document at `id` (the system or its settings object), raw and typed.
    pub(super) async fn doc(&self, id: &ODataId, what: What) -> Result<SystemDoc, BmcError> {
        let raw = self.read_raw(id, what).await?;
        let typed = serde_json::from_value::<ComputerSystem>(raw.value().clone()).map_err(|e| {
            BmcError::Faulty {
                address: self.address.clone(),
                detail: format!("malformed {}: {e}", what.as_str()),
            }
        })?;
        Ok(SystemDoc {
            raw,
            typed: Arc::new(typed),
        })
    }

    /// The reset types the system lists for `ComputerSystem.Reset` (on the action, or in its
    /// ActionInfo); `None` when it lists none (every standard type is taken as offered).
    pub(super) async fn reset_types(
        &self,
        sys: &SystemDoc,
    ) -> Result<Option<Vec<String>>, BmcError> {
        let Some(reset) = sys.reset() else {
            return Err(self.refused(0, "the system offers no ComputerSystem.Reset action"));
        };
        if let Some(l) = list(reset.get("ResetType@Redfish.AllowableValues")) {
            return Ok(Some(l));
        }
        let Some(info) = reset.get("@Redfish.ActionInfo").and_then(Value::as_str) else {
            return Ok(None);
        };
        let doc = self
            .read_raw(&ODataId::from(info.to_owned()), What::ActionInfo)
            .await?;
        Ok(doc.value()["Parameters"]
            .as_array()
            .and_then(|ps| {
                ps.iter()
                    .find(|p| p.get("Name").and_then(Value::as_str) == Some("ResetType"))
            })
            .and_then(|p| list(p.get("AllowableValues"))))
    }
}
