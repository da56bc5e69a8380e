//! The driver's operations: `bmc.verify`'s facts, the power state, a power action (with the
//! boot override armed right before the boot) and the boot override, each change read back.
//!
//! - Power (issue 31, rules 3, 4 and 10): the reset type is the first the system lists of the
//!   action's fallback order ([`super::map::reset_candidates`]); a machine that is off is not
//!   "restarted" but powered on, one that is on and must boot again is restarted — or, where the
//!   system lists no restart, powered off, read back off, then armed and powered on, so a
//!   one-time override never sees a power-off. The result is the state read back once the BMC
//!   settled (a `PoweringOn` is read again), within `[site] power_settle_ms`. A power action
//!   that fails leaves no override armed.
//! - Boot override (rules 1 and 4): target and enabled value chosen from what the system lists
//!   (a `Once` where only `Continuous` is offered becomes `Continuous`, said in the result's
//!   note); sent without `BootSourceOverrideMode` first, and once more with the mode the system
//!   reports only if the BMC refused the first (try once, fall back once: a BMC that refuses or
//!   re-queues an unchanged mode never gets one); the PATCH carries the document's ETag (a 412
//!   or 428 is read again and sent once more); read back, and a change that reads back
//!   different is sent once more, then reported with both values ([`BmcError::NotApplied`]).
//!   A BMC that stores `Once` as `Continuous` is taken at its word (the result says
//!   `persistent: true`): the control plane clears the override once the ramdisk joined.
//! - Clearing ([`BootDevice::None`]): `BootSourceOverrideEnabled: Disabled`; refused, or taken
//!   but not held, the same with the mode the system reports; then a target of `None` (where
//!   listed, else `Hdd`: sushy-tools keeps no `Disabled`). An override that boots no network
//!   any more counts as cleared.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::commands::bmc::{
    BmcFacts, BmcNic, BootDevice, BootDeviceResult, PowerAction, PowerState,
};
use nv_redfish::core::{Bmc as _, ODataETag, ODataId};
use nv_redfish::schema::computer_system::{
    BootSource, BootSourceOverrideEnabled, BootSourceOverrideMode, BootUpdate, ComputerSystem,
    ComputerSystemUpdate,
};
use nv_redfish::schema::ethernet_interface::EthernetInterface;
use nv_redfish::schema::ethernet_interface_collection::EthernetInterfaceCollection;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::RedfishBmc;
use super::map::{What, choose, normalize_mac, reset_candidates, reset_type};
use super::system::{BootState, SystemDoc};
use crate::bmc::{BmcError, BootOverride, PowerDone, PowerReading};

/// Between two reads while a power change settles.
const SETTLE_POLL: Duration = Duration::from_secs(1);

/// A boot-override PATCH: what it sets.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BootPatch {
    target: Option<&'static str>,
    enabled: Option<&'static str>,
    mode: Option<String>,
}

impl BootPatch {
    fn update(&self) -> Result<ComputerSystemUpdate, String> {
        let mut b = BootUpdate::builder();
        if let Some(t) = self.target {
            let t: BootSource = serde_json::from_value(json!(t)).map_err(|e| e.to_string())?;
            b = b.with_boot_source_override_target(t);
        }
        if let Some(e) = self.enabled {
            let e: BootSourceOverrideEnabled =
                serde_json::from_value(json!(e)).map_err(|e| e.to_string())?;
            b = b.with_boot_source_override_enabled(e);
        }
        if let Some(m) = &self.mode {
            let m: BootSourceOverrideMode =
                serde_json::from_value(json!(m)).map_err(|e| e.to_string())?;
            b = b.with_boot_source_override_mode(m);
        }
        Ok(ComputerSystemUpdate::builder().with_boot(b.build()).build())
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(t) = self.target {
            parts.push(format!("BootSourceOverrideTarget={t}"));
        }
        if let Some(e) = self.enabled {
            parts.push(format!("BootSourceOverrideEnabled={e}"));
        }
        if let Some(m) = &self.mode {
            parts.push(format!("BootSourceOverrideMode={m}"));
        }
        parts.join(", ")
    }
}

/// How a read-back compares with what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// What was asked (or what the site agent accepts instead, with a note).
    Holds(Option<String>),
    /// Something else.
    Differs,
}

fn listed(values: Option<&Vec<String>>, v: &str) -> bool {
    values.is_none_or(|l| l.iter().any(|x| x == v))
}

/// Whether `got` holds what `device`/`persistent` asked for.
fn verdict(device: BootDevice, persistent: bool, got: &BootState) -> Verdict {
    let target = got.target.as_deref();
    let enabled = got.enabled.as_deref();
    match device {
        BootDevice::None => match (enabled, target) {
            (Some("Disabled"), _) | (_, Some("None")) | (None, None) => Verdict::Holds(None),
            (_, Some(t)) if t != "Pxe" => Verdict::Holds(Some(format!(
                "the BMC takes no Disabled override: it holds {}, which boots no network",
                got.describe()
            ))),
            _ => Verdict::Differs,
        },
        BootDevice::Pxe | BootDevice::Disk => {
            let want = if device == BootDevice::Pxe {
                "Pxe"
            } else {
                "Hdd"
            };
            if target != Some(want) {
                return Verdict::Differs;
            }
            match (persistent, enabled) {
                (_, None) | (false, Some("Once")) | (true, Some("Continuous")) => {
                    Verdict::Holds(None)
                }
                (false, Some("Continuous")) => Verdict::Holds(Some(
                    "asked BootSourceOverrideEnabled=Once; the BMC holds Continuous".to_owned(),
                )),
                _ => Verdict::Differs,
            }
        }
    }
}

/// The device and persistence the BMC reports.
fn reported(got: &BootState) -> (Option<BootDevice>, Option<bool>) {
    let enabled = got.enabled.as_deref();
    if enabled == Some("Disabled") || got.target.as_deref() == Some("None") {
        return (Some(BootDevice::None), Some(false));
    }
    let device = match got.target.as_deref() {
        Some("Pxe") => Some(BootDevice::Pxe),
        Some("Hdd") => Some(BootDevice::Disk),
        _ => None,
    };
    let persistent = match enabled {
        Some("Continuous") => Some(true),
        Some("Once") => Some(false),
        _ => None,
    };
    (device, persistent)
}

impl RedfishBmc {
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

    pub(super) async fn do_facts(&self) -> Result<BmcFacts, BmcError> {
        self.check_tls(true)?;
        let sys = self.system_doc().await?;
        let system = &sys.typed;
        let nics = self.nics(system).await?;
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
            power: sys.power().power,
            cert_sha256: self.verifier.as_ref().and_then(|v| v.presented()),
            note: None,
        })
    }

    pub(super) async fn do_power_state(&self) -> Result<PowerReading, BmcError> {
        self.check_tls(false)?;
        Ok(self.system_doc().await?.power())
    }

    pub(super) async fn do_power(
        &self,
        action: PowerAction,
        boot: Option<BootOverride>,
    ) -> Result<PowerDone, BmcError> {
        self.check_tls(false)?;
        let before = self.faults_so_far();
        let sys = self.system_doc().await?;
        let allowed = self.reset_types(&sys).await?;
        let on = sys.power().power == PowerState::On;
        let r = self
            .act(&sys.typed, action, boot, on, allowed.as_deref())
            .await;
        if let Err(e) = &r
            && boot.is_some_and(|b| b.device != BootDevice::None)
        {
            // A failed power action leaves no override armed: a later power-on by hand must
            // not boot the network.
            tracing::warn!(bmc = %self.address, error = %e, "the power action failed: disarming the boot override");
            if let Err(d) = self.set_override(BootDevice::None, false).await {
                tracing::warn!(bmc = %self.address, error = %d, "the boot override could not be disarmed");
            }
        }
        let expect = r?;
        let power = self.settle(expect).await;
        Ok(PowerDone {
            power,
            transient_faults: self.faults_so_far().saturating_sub(before),
        })
    }

    /// Carries out `action` on `system`, which is `on` (or not); returns the state to expect.
    async fn act(
        &self,
        system: &Arc<ComputerSystem>,
        action: PowerAction,
        boot: Option<BootOverride>,
        on: bool,
        allowed: Option<&[String]>,
    ) -> Result<PowerState, BmcError> {
        match action {
            PowerAction::On | PowerAction::Reboot if !on => {
                self.arm(boot).await?;
                self.reset_for(system, PowerAction::On, allowed).await?;
                Ok(PowerState::On)
            }
            PowerAction::On if boot.is_none() => Ok(PowerState::On),
            PowerAction::On | PowerAction::Reboot => {
                if let Some(kind) = choose(reset_candidates(PowerAction::Reboot), allowed) {
                    self.arm(boot).await?;
                    self.reset(system, kind, None).await?;
                } else {
                    // No restart listed: off (read back off), then the override, then on.
                    self.reset_for(system, PowerAction::Off, allowed).await?;
                    let now = self.settle(PowerState::Off).await;
                    if now != PowerState::Off {
                        return Err(BmcError::NotApplied {
                            address: self.address.clone(),
                            detail: format!(
                                "the system lists no restart, so it was powered off first; after {:?} it still reads {}",
                                self.policy.settle,
                                now.as_str()
                            ),
                        });
                    }
                    self.arm(boot).await?;
                    self.reset_for(system, PowerAction::On, allowed).await?;
                }
                Ok(PowerState::On)
            }
            PowerAction::Off | PowerAction::SoftOff => {
                self.arm(boot).await?;
                if on || !self.reads_off().await {
                    self.reset_for(system, action, allowed).await?;
                }
                Ok(PowerState::Off)
            }
        }
    }

    async fn reads_off(&self) -> bool {
        self.system_doc()
            .await
            .is_ok_and(|s| s.power().power == PowerState::Off)
    }

    async fn arm(&self, boot: Option<BootOverride>) -> Result<(), BmcError> {
        if let Some(b) = boot {
            self.set_override(b.device, b.persistent).await?;
        }
        Ok(())
    }

    /// The first reset type the system lists for `action`, sent.
    async fn reset_for(
        &self,
        system: &Arc<ComputerSystem>,
        action: PowerAction,
        allowed: Option<&[String]>,
    ) -> Result<(), BmcError> {
        let candidates = reset_candidates(action);
        let Some(kind) = choose(candidates, allowed) else {
            return Err(self.refused(
                0,
                &format!(
                    "the system offers none of {} for {} (it lists {})",
                    candidates.join(", "),
                    action.as_str(),
                    allowed.map(|a| a.join(", ")).unwrap_or_default()
                ),
            ));
        };
        let expect = match action {
            PowerAction::On => Some(PowerState::On),
            PowerAction::Off | PowerAction::SoftOff => Some(PowerState::Off),
            PowerAction::Reboot => None,
        };
        self.reset(system, kind, expect).await
    }

    /// `ComputerSystem.Reset` with `kind`; a fault is read back: the change took when the power
    /// reads `expect` (or heads there), or — for a restart, `expect` `None` — when it reads a
    /// transition.
    async fn reset(
        &self,
        system: &Arc<ComputerSystem>,
        kind: &str,
        expect: Option<PowerState>,
    ) -> Result<(), BmcError> {
        let rt = reset_type(kind).ok_or_else(|| {
            self.refused(0, &format!("reset type {kind} is not a Redfish ResetType"))
        })?;
        if system.actions.is_none() {
            return Err(self.refused(0, "the system offers no ComputerSystem.Reset action"));
        }
        tracing::info!(bmc = %self.address, reset = kind, "ComputerSystem.Reset");
        self.change(
            What::Reset,
            |c| {
                let (system, rt) = (Arc::clone(system), rt);
                Box::pin(async move {
                    let Some(actions) = system.actions.as_ref() else {
                        return Err(nv_redfish::core::RepairError::Transport(
                            nv_redfish::bmc_http::reqwest::BmcError::ActionNotSupported,
                        ));
                    };
                    actions
                        .reset(c, Some(rt))
                        .await
                        .map(|r| r.map_entity(|()| Value::Null))
                })
            },
            || {
                Box::pin(async move {
                    let r = self.system_doc().await?.power();
                    Ok(match expect {
                        Some(p) => r.power == p,
                        None => r.settling,
                    })
                })
            },
        )
        .await
    }

    /// Reads the power state until it settles at `expect` or the settle time is over; the last
    /// reading (`Unknown` when none came).
    async fn settle(&self, expect: PowerState) -> PowerState {
        let until = Instant::now() + self.policy.settle;
        let mut last = PowerState::Unknown;
        loop {
            if let Ok(s) = self.system_doc().await {
                let r = s.power();
                last = r.power;
                if !r.settling && r.power == expect {
                    return last;
                }
            }
            if Instant::now() + SETTLE_POLL > until {
                if last != expect {
                    tracing::warn!(bmc = %self.address, expected = expect.as_str(), reads = last.as_str(), "the power state did not settle");
                }
                return last;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    pub(super) async fn do_boot(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> Result<BootDeviceResult, BmcError> {
        self.check_tls(false)?;
        let before = self.faults_so_far();
        let mut r = self.set_override(device, persistent).await?;
        r.transient_faults = self.faults_so_far().saturating_sub(before);
        Ok(r)
    }

    /// The boot override: chosen, sent, read back (see the module docs).
    pub(super) async fn set_override(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> Result<BootDeviceResult, BmcError> {
        let sys = self.system_doc().await?;
        let boot = sys.boot();
        let (plans, persistent, mut note) = self.plans(device, persistent, &boot)?;
        let settings = sys.settings();
        let mut resent = false;
        let mut i = 0;
        while let Some(plan) = plans.get(i) {
            let last = i + 1 >= plans.len();
            match self
                .patch_boot(&sys, settings.as_ref(), plan, device, persistent)
                .await
            {
                Ok(()) => {}
                // The BMC refused this form (a 4xx on the PATCH itself, not a task's end):
                // the next one, once.
                Err(
                    e @ BmcError::Refused {
                        status: 400..=499, ..
                    },
                ) if !last => {
                    tracing::info!(bmc = %self.address, error = %e, "the BMC refused {}: falling back once to {}", plan.describe(), plans[i + 1].describe());
                    i += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let got = self.read_boot(settings.as_ref()).await?;
            match verdict(device, persistent, &got) {
                Verdict::Holds(n) => {
                    if n.is_some() {
                        note = n;
                    }
                    let (device, persistent) = reported(&got);
                    return Ok(BootDeviceResult {
                        device,
                        persistent,
                        note,
                        transient_faults: 0,
                    });
                }
                // Clearing: a BMC that took the PATCH but kept the override gets the next form.
                Verdict::Differs if device == BootDevice::None && !last => {
                    tracing::info!(bmc = %self.address, asked = %plan.describe(), reads = %got.describe(), "the override was not cleared that way: trying the next form");
                    i += 1;
                }
                Verdict::Differs if !resent => {
                    tracing::warn!(bmc = %self.address, asked = %plan.describe(), reads = %got.describe(), "the boot override did not take: sending it once more");
                    resent = true;
                }
                Verdict::Differs => {
                    return Err(BmcError::NotApplied {
                        address: self.address.clone(),
                        detail: format!(
                            "asked {}; the BMC reads back {}",
                            plan.describe(),
                            got.describe()
                        ),
                    });
                }
            }
        }
        Err(self.refused(0, "no boot override could be sent"))
    }

    /// The PATCHes to try for `device` (the second only if the BMC refuses the first), the
    /// persistence chosen, and a note when it differs from what was asked.
    #[allow(clippy::type_complexity)]
    fn plans(
        &self,
        device: BootDevice,
        persistent: bool,
        boot: &BootState,
    ) -> Result<(Vec<BootPatch>, bool, Option<String>), BmcError> {
        let lists = |v: &Option<Vec<String>>| v.as_ref().map(|l| l.join(", ")).unwrap_or_default();
        match device {
            BootDevice::None => {
                let mut plans = Vec::new();
                if listed(boot.enabled_values.as_ref(), "Disabled") {
                    let disabled = BootPatch {
                        target: None,
                        enabled: Some("Disabled"),
                        mode: None,
                    };
                    plans.push(disabled.clone());
                    if let Some(mode) = &boot.mode {
                        plans.push(BootPatch {
                            mode: Some(mode.clone()),
                            ..disabled
                        });
                    }
                }
                let fallback = if listed(boot.targets.as_ref(), "None") {
                    "None"
                } else {
                    "Hdd"
                };
                plans.push(BootPatch {
                    target: Some(fallback),
                    enabled: None,
                    mode: None,
                });
                Ok((plans, false, None))
            }
            BootDevice::Pxe | BootDevice::Disk => {
                let target = if device == BootDevice::Pxe {
                    "Pxe"
                } else {
                    "Hdd"
                };
                if !listed(boot.targets.as_ref(), target) {
                    return Err(self.refused(
                        0,
                        &format!(
                            "the system offers no {target} boot target (it lists {})",
                            lists(&boot.targets)
                        ),
                    ));
                }
                let values = boot.enabled_values.as_ref();
                let (enabled, persistent, note) = match persistent {
                    false if listed(values, "Once") => ("Once", false, None),
                    false if listed(values, "Continuous") => (
                        "Continuous",
                        true,
                        Some(
                            "the system offers no one-time override (Once): Continuous was set"
                                .to_owned(),
                        ),
                    ),
                    true if listed(values, "Continuous") => ("Continuous", true, None),
                    _ => {
                        return Err(self.refused(
                            0,
                            &format!(
                                "the system offers no {} override (it lists {})",
                                if persistent { "Continuous" } else { "Once" },
                                lists(&boot.enabled_values)
                            ),
                        ));
                    }
                };
                let plain = BootPatch {
                    target: Some(target),
                    enabled: Some(enabled),
                    mode: None,
                };
                let mut plans = vec![plain.clone()];
                if let Some(mode) = &boot.mode {
                    plans.push(BootPatch {
                        mode: Some(mode.clone()),
                        ..plain
                    });
                }
                Ok((plans, persistent, note))
            }
        }
    }

    /// The boot override as the BMC holds it now (its settings object's, when it has one).
    async fn read_boot(&self, settings: Option<&ODataId>) -> Result<BootState, BmcError> {
        Ok(match settings {
            Some(s) => self.doc(s, What::Boot).await?.boot(),
            None => self.system_doc().await?.boot(),
        })
    }

    /// One boot-override PATCH (to the settings object when there is one) with the document's
    /// ETag; a 412 or 428 is read again and sent once more.
    async fn patch_boot(
        &self,
        sys: &SystemDoc,
        settings: Option<&ODataId>,
        plan: &BootPatch,
        device: BootDevice,
        persistent: bool,
    ) -> Result<(), BmcError> {
        let update = Arc::new(
            plan.update()
                .map_err(|e| self.refused(0, &format!("{}: {e}", plan.describe())))?,
        );
        let (path, mut etag): (ODataId, Option<ODataETag>) = match settings {
            Some(s) => (s.clone(), self.doc(s, What::Boot).await?.etag().cloned()),
            None => (self.system_id().await?, sys.etag().cloned()),
        };
        let mut fresh = false;
        loop {
            let r = self
                .change(
                    What::Boot,
                    |c| {
                        let (path, etag, update) =
                            (path.clone(), etag.clone(), Arc::clone(&update));
                        Box::pin(async move {
                            c.update::<_, Value>(&path, etag.as_ref(), update.as_ref())
                                .await
                        })
                    },
                    || {
                        let settings = settings.cloned();
                        Box::pin(async move {
                            let got = self.read_boot(settings.as_ref()).await?;
                            Ok(matches!(
                                verdict(device, persistent, &got),
                                Verdict::Holds(_)
                            ))
                        })
                    },
                )
                .await;
            match r {
                Err(BmcError::Refused {
                    status: 412 | 428, ..
                }) if !fresh => {
                    fresh = true;
                    etag = self.doc(&path, What::Boot).await?.etag().cloned();
                    tracing::info!(bmc = %self.address, etag = ?etag, "the BMC refused the ETag (or its absence): read again, sending once more");
                }
                r => return r,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(target: &str, enabled: &str) -> BootState {
        BootState {
            target: Some(target.to_owned()),
            enabled: Some(enabled.to_owned()),
            ..BootState::default()
        }
    }

    #[test]
    fn a_read_back_holds_or_differs() {
        assert_eq!(
            verdict(BootDevice::Pxe, false, &state("Pxe", "Once")),
            Verdict::Holds(None)
        );
        assert!(matches!(
            verdict(BootDevice::Pxe, false, &state("Pxe", "Continuous")),
            Verdict::Holds(Some(_))
        ));
        assert_eq!(
            verdict(BootDevice::Pxe, false, &state("None", "Disabled")),
            Verdict::Differs
        );
        assert_eq!(
            verdict(BootDevice::Disk, true, &state("Hdd", "Once")),
            Verdict::Differs
        );
        assert_eq!(
            verdict(BootDevice::None, false, &state("Pxe", "Disabled")),
            Verdict::Holds(None)
        );
        assert!(matches!(
            verdict(BootDevice::None, false, &state("Hdd", "Continuous")),
            Verdict::Holds(Some(_))
        ));
        assert_eq!(
            verdict(BootDevice::None, false, &state("Pxe", "Continuous")),
            Verdict::Differs
        );
        assert_eq!(
            reported(&state("Pxe", "Continuous")),
            (Some(BootDevice::Pxe), Some(true))
        );
        assert_eq!(
            reported(&state("Pxe", "Disabled")),
            (Some(BootDevice::None), Some(false))
        );
    }

    #[test]
    fn patches_carry_only_what_is_set() -> Result<(), Box<dyn std::error::Error>> {
        let p = BootPatch {
            target: Some("Pxe"),
            enabled: Some("Once"),
            mode: Some("UEFI".to_owned()),
        };
        assert_eq!(
            serde_json::to_value(p.update()?)?,
            json!({"Boot": {"BootSourceOverrideTarget": "Pxe",
                            "BootSourceOverrideEnabled": "Once",
                            "BootSourceOverrideMode": "UEFI"}})
        );
        let clear = BootPatch {
            target: None,
            enabled: Some("Disabled"),
            mode: None,
        };
        assert_eq!(
            serde_json::to_value(clear.update()?)?,
            json!({"Boot": {"BootSourceOverrideEnabled": "Disabled"}})
        );
        Ok(())
    }
}
