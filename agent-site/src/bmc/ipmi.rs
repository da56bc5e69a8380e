//! The IPMI driver: the `ipmitool` program (Debian package `ipmitool`) over IPMI 2.0 LAN
//! (`-I lanplus`, RMCP+).
//!
//! # Design
//! One process per operation, under a timeout (killed when it passes): `ipmitool -I lanplus -H
//! host -p port -U user -E -N <s> -R <n> -v <command>`. The password reaches the child only
//! through its `IPMI_PASSWORD` environment variable (`-E`, ipmitool(1)), never its command line,
//! which every local user can read in `/proc`. `-N`/`-R` bound ipmitool's own retries (its
//! defaults wait 14–20 s for a dead BMC). `-v` makes a failure say why: `RAKP 2 HMAC is invalid`
//! (wrong password), `RAKP 2 message indicates an error : unauthorized name` (unknown user),
//! `Get Auth Capabilities error` (no answer).
//!
//! Outputs read (ipmitool(1), `chassis` commands): `Chassis Power is on|off`; `chassis
//! bootparam get 5` prints `Boot Device Selector : Force PXE` / `Force Boot from default
//! Hard-Drive` and `Options apply to only next boot` / `Options apply to all future boots`.
//!
//! # Limitations
//! IPMI does not list NICs; the system GUID (`mc guid`, Get System GUID) is read when the BMC
//! answers it. A reboot of a machine that is off powers it on (`chassis power cycle` is refused
//! by BMCs while off, completion code 0xd5).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bc_protocol::commands::bmc::{BmcFacts, BootDevice, BootDeviceResult, PowerAction, PowerState};

use super::{Bmc, BmcError, BmcFuture, BootOverride, Endpoint, PowerDone, PowerReading, Secret};
use crate::address::BmcAddress;
use crate::config::SiteConfig;

/// One IPMI BMC.
pub struct IpmiBmc {
    address: String,
    host: String,
    port: u16,
    username: String,
    password: Secret,
    ipmitool: PathBuf,
    answer_timeout_s: u32,
    retries: u32,
    timeout: Duration,
    settle: Duration,
}

impl std::fmt::Debug for IpmiBmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpmiBmc")
            .field("address", &self.address)
            .field("ipmitool", &self.ipmitool)
            .finish_non_exhaustive()
    }
}

/// The power state in `chassis power status` output.
pub fn parse_power(stdout: &str) -> Option<PowerState> {
    stdout.lines().find_map(|l| {
        let l = l.trim().to_ascii_lowercase();
        let state = l.strip_prefix("chassis power is ")?;
        match state.trim() {
            "on" => Some(PowerState::On),
            "off" => Some(PowerState::Off),
            _ => Some(PowerState::Unknown),
        }
    })
}

/// The boot device and persistence in `chassis bootparam get 5` output.
pub fn parse_bootparam(stdout: &str) -> BootDeviceResult {
    let mut r = BootDeviceResult {
        device: None,
        persistent: None,
        note: None,
        transient_faults: 0,
    };
    for l in stdout.lines() {
        let l = l.trim().trim_start_matches("- ").to_ascii_lowercase();
        if let Some(sel) = l.strip_prefix("boot device selector :") {
            let sel = sel.trim();
            if sel.contains("pxe") {
                r.device = Some(BootDevice::Pxe);
            } else if sel.contains("hard-drive") || sel.contains("hard drive") {
                r.device = Some(BootDevice::Disk);
            } else if sel.contains("no override") {
                r.device = Some(BootDevice::None);
            }
        } else if l.contains("options apply to only next boot") {
            r.persistent = Some(false);
        } else if l.contains("options apply to all future boots") {
            r.persistent = Some(true);
        }
    }
    r
}

/// The `chassis power` verb of an action on a machine in `now` state.
pub fn power_verb(action: PowerAction, now: PowerState) -> &'static str {
    match action {
        PowerAction::On => "on",
        PowerAction::Off => "off",
        PowerAction::SoftOff => "soft",
        PowerAction::Reboot if now == PowerState::Off => "on",
        PowerAction::Reboot => "reset",
    }
}

/// What a failed run means, from ipmitool's `-v` text: (is it the credentials, is it no answer).
fn classify(text: &str) -> (bool, bool) {
    let t = text.to_ascii_lowercase();
    let auth = [
        "rakp 2 hmac is invalid",
        "unauthorized name",
        "invalid user name",
        "insufficient privilege",
        "no response from rakp 1",
        "rakp 4 message has invalid integrity check",
    ]
    .iter()
    .any(|m| t.contains(m));
    let unreachable = t.contains("get auth capabilities error")
        || t.contains("no response")
        || t.contains("unable to establish");
    (auth, unreachable)
}

impl IpmiBmc {
    /// A driver for `endpoint` (an `ipmi://` address).
    pub fn new(endpoint: &Endpoint, cfg: &SiteConfig) -> Self {
        let (host, port) = match &endpoint.address {
            BmcAddress::Ipmi { host, port } => (host.clone(), *port),
            BmcAddress::Redfish { base, .. } => (
                base.host_str().unwrap_or_default().to_owned(),
                crate::address::IPMI_PORT,
            ),
        };
        Self {
            address: endpoint.address.display(),
            host,
            port,
            username: endpoint.username.clone(),
            password: endpoint.password.clone(),
            ipmitool: cfg.ipmitool.clone(),
            answer_timeout_s: cfg.ipmi_timeout_s.max(1),
            retries: cfg.ipmi_retries,
            timeout: Duration::from_millis(cfg.ipmi_command_timeout_ms.max(1)),
            settle: cfg.power_settle(),
        }
    }

    fn faulty(&self, detail: &str) -> BmcError {
        BmcError::Faulty {
            address: self.address.clone(),
            detail: self.password.scrub(detail),
        }
    }

    /// Runs `ipmitool … args`; its stdout on success.
    async fn run(&self, args: &[&str]) -> Result<String, BmcError> {
        let what = args.join(" ");
        let mut cmd = tokio::process::Command::new(&self.ipmitool);
        cmd.args(["-I", "lanplus", "-H", &self.host, "-p"])
            .arg(self.port.to_string())
            .args(["-U", &self.username, "-E", "-N"])
            .arg(self.answer_timeout_s.to_string())
            .arg("-R")
            .arg(self.retries.to_string())
            .arg("-v")
            .args(args)
            .env("IPMI_PASSWORD", self.password.expose())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|e| {
            self.faulty(&format!(
                "cannot run {} ({what}): {e}",
                self.ipmitool.display()
            ))
        })?;
        let out = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(self.faulty(&format!("ipmitool {what}: {e}"))),
            Err(_) => {
                return Err(BmcError::Unreachable {
                    address: self.address.clone(),
                    detail: format!("ipmitool {what}: no answer within {:?}", self.timeout),
                });
            }
        };
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        // The lines that say what went wrong, without -v's chatter.
        let said: Vec<&str> = stderr
            .lines()
            .map(str::trim)
            .filter(|l| {
                !l.is_empty()
                    && !l.starts_with("Loading IANA")
                    && !l.starts_with("Using best available")
                    && !l.starts_with("Running Get")
                    && !l.starts_with("Discovered IPMB")
            })
            .collect();
        let detail = format!("ipmitool {what}: {}", self.password.scrub(&said.join("; ")));
        let (auth, unreachable) = classify(&stderr);
        Err(if auth {
            BmcError::AuthFailed {
                address: self.address.clone(),
                detail,
            }
        } else if unreachable {
            BmcError::Unreachable {
                address: self.address.clone(),
                detail,
            }
        } else {
            BmcError::Faulty {
                address: self.address.clone(),
                detail,
            }
        })
    }

    async fn do_power_state(&self) -> Result<PowerState, BmcError> {
        let out = self.run(&["chassis", "power", "status"]).await?;
        parse_power(&out).ok_or_else(|| {
            self.faulty(&format!(
                "chassis power status: unexpected output {:?}",
                out.trim()
            ))
        })
    }

    async fn do_facts(&self) -> Result<BmcFacts, BmcError> {
        let power = self.do_power_state().await?;
        // Get System GUID is optional for BMCs (fakebmc answers "Invalid command").
        let uuid = match self.run(&["mc", "guid"]).await {
            Ok(out) => out.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                let v = v.trim().to_ascii_lowercase();
                (k.trim().eq_ignore_ascii_case("System GUID") && v.len() == 36).then_some(v)
            }),
            Err(e) => {
                tracing::debug!(bmc = %self.address, error = %e, "no system GUID");
                None
            }
        };
        Ok(BmcFacts {
            uuid,
            power,
            ..BmcFacts::default()
        })
    }

    async fn do_power(
        &self,
        action: PowerAction,
        boot: Option<BootOverride>,
    ) -> Result<PowerDone, BmcError> {
        let now = self.do_power_state().await?;
        if let Some(b) = boot {
            // Right before the power-on or restart that boots it.
            self.do_boot(b.device, b.persistent).await?;
        }
        let r = self
            .run(&["chassis", "power", power_verb(action, now)])
            .await;
        if let Err(e) = r {
            if boot.is_some_and(|b| b.device != BootDevice::None) {
                let _ = self.do_boot(BootDevice::None, false).await;
            }
            return Err(e);
        }
        let expect = match action {
            PowerAction::On | PowerAction::Reboot => PowerState::On,
            PowerAction::Off | PowerAction::SoftOff => PowerState::Off,
        };
        let until = tokio::time::Instant::now() + self.settle;
        let mut last = PowerState::Unknown;
        while tokio::time::Instant::now() < until {
            if let Ok(p) = self.do_power_state().await {
                last = p;
                if p == expect {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(PowerDone {
            power: last,
            transient_faults: 0,
        })
    }

    async fn do_boot(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> Result<BootDeviceResult, BmcError> {
        let dev = match device {
            BootDevice::Pxe => "pxe",
            BootDevice::Disk => "disk",
            BootDevice::None => "none",
        };
        let mut args = vec!["chassis", "bootdev", dev];
        if persistent {
            args.push("options=persistent");
        }
        self.run(&args).await?;
        match self.run(&["chassis", "bootparam", "get", "5"]).await {
            Ok(out) => Ok(parse_bootparam(&out)),
            Err(e) => {
                tracing::debug!(bmc = %self.address, error = %e, "boot flags not readable");
                Ok(BootDeviceResult {
                    device: None,
                    persistent: None,
                    note: None,
                    transient_faults: 0,
                })
            }
        }
    }
}

impl Bmc for IpmiBmc {
    fn address(&self) -> &str {
        &self.address
    }

    fn facts(&self) -> BmcFuture<'_, BmcFacts> {
        Box::pin(self.do_facts())
    }

    fn power_state(&self) -> BmcFuture<'_, PowerReading> {
        Box::pin(async { self.do_power_state().await.map(PowerReading::settled) })
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_status_output_is_read() {
        assert_eq!(parse_power("Chassis Power is on\n"), Some(PowerState::On));
        assert_eq!(parse_power("Chassis Power is off"), Some(PowerState::Off));
        assert_eq!(
            parse_power("Chassis Power is unknown"),
            Some(PowerState::Unknown)
        );
        assert_eq!(parse_power("garbage"), None);
    }

    #[test]
    fn bootparam_output_is_read() {
        let once = "Boot parameter version: 1\n Boot Flags :\n   - Boot Flag Valid\n   - Options apply to only next boot\n   - Boot Device Selector : Force PXE\n";
        assert_eq!(
            parse_bootparam(once),
            BootDeviceResult {
                device: Some(BootDevice::Pxe),
                persistent: Some(false),
                note: None,
                transient_faults: 0,
            }
        );
        let disk = "   - Options apply to all future boots\n   - Boot Device Selector : Force Boot from default Hard-Drive\n";
        assert_eq!(
            parse_bootparam(disk),
            BootDeviceResult {
                device: Some(BootDevice::Disk),
                persistent: Some(true),
                note: None,
                transient_faults: 0,
            }
        );
        assert_eq!(
            parse_bootparam("nothing"),
            BootDeviceResult {
                device: None,
                persistent: None,
                note: None,
                transient_faults: 0,
            }
        );
    }

    #[test]
    fn failures_are_classified_from_verbose_output() {
        assert_eq!(
            classify(
                "> RAKP 2 HMAC is invalid\nError: Unable to establish IPMI v2 / RMCP+ session"
            ),
            (true, true)
        );
        assert_eq!(
            classify(
                "Get Auth Capabilities error\nError: Unable to establish IPMI v2 / RMCP+ session"
            ),
            (false, true)
        );
        assert_eq!(classify("Invalid completion code"), (false, false));
        assert_eq!(power_verb(PowerAction::Reboot, PowerState::Off), "on");
        assert_eq!(power_verb(PowerAction::Reboot, PowerState::On), "reset");
        assert_eq!(power_verb(PowerAction::SoftOff, PowerState::On), "soft");
    }
}
