//! The `[site]` section of `/etc/bcd/bcd.toml`: what `bcd site` needs beyond the settings every
//! mode shares (control plane, join token, CA pin, log filter).
//!
//! # Design
//! One serde struct with `deny_unknown_fields` and a written [`Default`]; every key can also be
//! set through `BCD_SITE_<KEY>` (upper case, e.g. `BCD_SITE_IPMITOOL`), read by
//! [`SiteConfig::apply_env`]; the binary applies its flags last. The sync defaults and limits
//! apply only where the control plane's `SiteAssignment` leaves a value at 0.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What is wrong with the `[site]` settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SiteConfigError {
    /// An environment variable that does not parse.
    #[error("environment {var}={value:?}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
    /// Every problem [`SiteConfig::validate`] found, one per line.
    #[error("invalid [site] config:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// The site agent's settings (`[site]` in bcd.toml). Durations are milliseconds unless the key
/// says seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteConfig {
    /// The site agent's identity, journal and status. Default `/var/lib/bcd-site` (systemd's
    /// `StateDirectory=bcd-site`).
    pub state_dir: PathBuf,
    /// Power sync period when the assignment gives 0, ms (jittered by ±10 %). Default 60 000.
    pub power_sync_interval_ms: u64,
    /// Requests in flight per BMC at most when the assignment gives 0 (commands and the sync
    /// loop share them). Default 4.
    pub max_requests_per_bmc: u32,
    /// Requests in flight across the site at most when the assignment gives 0. Default 64.
    pub max_requests_per_site: u32,
    /// TCP connect timeout of a Redfish request, ms. Default 3 000.
    pub connect_timeout_ms: u64,
    /// Whole-request timeout of a Redfish request, ms. Default 75 000: BMCs answer in 30–60 s
    /// when busy, and a request given up on still runs at the BMC.
    pub request_timeout_ms: u64,
    /// Retries of a Redfish request that found no answer, a 5xx or a 429 (a read; a change only
    /// after reading back that it did not take). Default 4.
    pub read_retries: u32,
    /// First wait before such a retry, ms; doubles per retry, with jitter. Default 200.
    pub retry_backoff_ms: u64,
    /// Longest one BMC operation may take (a verify reads several resources; a change may run
    /// as a task), ms. Default 300 000.
    pub operation_timeout_ms: u64,
    /// How long a power action's result waits for the BMC to report the new state (a
    /// `PoweringOn` is read again), ms. Default 60 000.
    pub power_settle_ms: u64,
    /// How long after a BMC refused credentials new ones are tried again if the BMC refuses
    /// them too (its account lockout: they are tried once more after it), ms. Default 120 000;
    /// 0: no second try.
    pub bmc_lockout_window_ms: u64,
    /// The `ipmitool` binary (Debian package `ipmitool`). Default `ipmitool` on `PATH`.
    pub ipmitool: PathBuf,
    /// `ipmitool -N`: seconds to wait for each IPMI answer. Default 2.
    pub ipmi_timeout_s: u32,
    /// `ipmitool -R`: retries of each IPMI request. Default 2.
    pub ipmi_retries: u32,
    /// How long one ipmitool run may take at most before it is killed, ms. Default 20 000.
    pub ipmi_command_timeout_ms: u64,
    /// How long before the lease's local expiry the site agent already treats it as lapsed, ms
    /// (at most half the lease's TTL). Default 2 000.
    pub lease_margin_ms: u64,
    /// Where the boot service (iPXE scripts, the ramdisk's kernel and initramfs; issue 15)
    /// listens, e.g. `0.0.0.0:8080`. Unset: no boot service. The site's DHCP points PXE clients
    /// at `http://<this>/boot.ipxe?mac=${netX/mac}`.
    pub boot_listen: Option<std::net::SocketAddr>,
    /// The ramdisk's kernel (`packaging/ramdisk/` builds it beside the initramfs). Needed with
    /// `boot_listen`.
    pub boot_kernel: Option<PathBuf>,
    /// The ramdisk's initramfs. Needed with `boot_listen`.
    pub boot_initrd: Option<PathBuf>,
    /// Kernel arguments of the site, before each boot's own. Default
    /// `console=tty0 console=ttyS0,115200n8`.
    pub boot_kernel_args: String,
    /// How long a booted ramdisk waits, before it joins, for each link to hear an
    /// LLDPDU (`bcd.lldp_wait=<this>` on its kernel command line), seconds, 0 to 600. Default 30
    /// (a switch's default LLDP interval).
    pub ramdisk_lldp_wait_s: u32,
}

/// The longest `ramdisk_lldp_wait_s` (the ramdisk's own limit of `bcd.lldp_wait`).
pub const MAX_RAMDISK_LLDP_WAIT_S: u32 = 600;

impl Default for SiteConfig {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/bcd-site"),
            power_sync_interval_ms: 60_000,
            max_requests_per_bmc: 4,
            max_requests_per_site: 64,
            connect_timeout_ms: 3_000,
            request_timeout_ms: 75_000,
            read_retries: 4,
            retry_backoff_ms: 200,
            operation_timeout_ms: 300_000,
            power_settle_ms: 60_000,
            bmc_lockout_window_ms: 120_000,
            ipmitool: PathBuf::from("ipmitool"),
            ipmi_timeout_s: 2,
            ipmi_retries: 2,
            ipmi_command_timeout_ms: 20_000,
            lease_margin_ms: 2_000,
            boot_listen: None,
            boot_kernel: None,
            boot_initrd: None,
            boot_kernel_args: crate::boot::DEFAULT_KERNEL_ARGS.to_owned(),
            ramdisk_lldp_wait_s: 30,
        }
    }
}

/// The keys [`SiteConfig::apply_env`] reads as `BCD_SITE_<KEY>`.
pub const ENV_KEYS: &[&str] = &[
    "state_dir",
    "power_sync_interval_ms",
    "max_requests_per_bmc",
    "max_requests_per_site",
    "connect_timeout_ms",
    "request_timeout_ms",
    "read_retries",
    "retry_backoff_ms",
    "operation_timeout_ms",
    "power_settle_ms",
    "bmc_lockout_window_ms",
    "ipmitool",
    "ipmi_timeout_s",
    "ipmi_retries",
    "ipmi_command_timeout_ms",
    "lease_margin_ms",
    "boot_listen",
    "boot_kernel",
    "boot_initrd",
    "boot_kernel_args",
    "ramdisk_lldp_wait_s",
];

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl SiteConfig {
    /// Replaces every key that has a non-empty `BCD_SITE_<KEY>` variable, looked up through
    /// `var` (tests pass a map).
    pub fn apply_env(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), SiteConfigError> {
        for key in ENV_KEYS {
            let name = format!("BCD_SITE_{}", key.to_ascii_uppercase());
            let Some(value) = var(&name).filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            let value = value.trim().to_owned();
            let bad = |reason: String| SiteConfigError::Env {
                var: name.clone(),
                value: value.clone(),
                reason,
            };
            let int = || value.parse::<u64>().map_err(|e| bad(e.to_string()));
            let small = || value.parse::<u32>().map_err(|e| bad(e.to_string()));
            match *key {
                "state_dir" => self.state_dir = PathBuf::from(&value),
                "ipmitool" => self.ipmitool = PathBuf::from(&value),
                "power_sync_interval_ms" => self.power_sync_interval_ms = int()?,
                "max_requests_per_bmc" => self.max_requests_per_bmc = small()?,
                "max_requests_per_site" => self.max_requests_per_site = small()?,
                "connect_timeout_ms" => self.connect_timeout_ms = int()?,
                "request_timeout_ms" => self.request_timeout_ms = int()?,
                "read_retries" => self.read_retries = small()?,
                "retry_backoff_ms" => self.retry_backoff_ms = int()?,
                "operation_timeout_ms" => self.operation_timeout_ms = int()?,
                "power_settle_ms" => self.power_settle_ms = int()?,
                "bmc_lockout_window_ms" => self.bmc_lockout_window_ms = int()?,
                "ipmi_timeout_s" => self.ipmi_timeout_s = small()?,
                "ipmi_retries" => self.ipmi_retries = small()?,
                "ipmi_command_timeout_ms" => self.ipmi_command_timeout_ms = int()?,
                "lease_margin_ms" => self.lease_margin_ms = int()?,
                "boot_listen" => {
                    self.boot_listen = Some(value.parse().map_err(|e| {
                        bad(format!("{e}: expected an address such as 0.0.0.0:8080"))
                    })?)
                }
                "boot_kernel" => self.boot_kernel = Some(PathBuf::from(&value)),
                "boot_initrd" => self.boot_initrd = Some(PathBuf::from(&value)),
                "boot_kernel_args" => self.boot_kernel_args.clone_from(&value),
                "ramdisk_lldp_wait_s" => self.ramdisk_lldp_wait_s = small()?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Checks what the types cannot; every problem is reported.
    pub fn validate(&self) -> Result<(), SiteConfigError> {
        let mut p = Vec::new();
        if !self.state_dir.is_absolute() {
            p.push(format!(
                "state_dir {}: must be an absolute path",
                self.state_dir.display()
            ));
        }
        for (key, v) in [
            ("power_sync_interval_ms", self.power_sync_interval_ms),
            ("max_requests_per_bmc", u64::from(self.max_requests_per_bmc)),
            (
                "max_requests_per_site",
                u64::from(self.max_requests_per_site),
            ),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("request_timeout_ms", self.request_timeout_ms),
            ("operation_timeout_ms", self.operation_timeout_ms),
            ("ipmi_timeout_s", u64::from(self.ipmi_timeout_s)),
            ("ipmi_command_timeout_ms", self.ipmi_command_timeout_ms),
        ] {
            if v == 0 {
                p.push(format!("{key}: must be more than 0"));
            }
        }
        if self.ramdisk_lldp_wait_s > MAX_RAMDISK_LLDP_WAIT_S {
            p.push(format!(
                "ramdisk_lldp_wait_s: at most {MAX_RAMDISK_LLDP_WAIT_S} seconds"
            ));
        }
        if self.ipmitool.as_os_str().is_empty() {
            p.push("ipmitool: must name a program".to_owned());
        }
        if self.boot_listen.is_some() {
            for (key, v) in [
                ("boot_kernel", &self.boot_kernel),
                ("boot_initrd", &self.boot_initrd),
            ] {
                if v.is_none() {
                    p.push(format!(
                        "{key}: needed with boot_listen (the ramdisk's files, from packaging/ramdisk/build.sh)"
                    ));
                }
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(SiteConfigError::Invalid(p))
        }
    }

    /// The TCP connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        ms(self.connect_timeout_ms)
    }

    /// The per-request timeout.
    pub fn request_timeout(&self) -> Duration {
        ms(self.request_timeout_ms)
    }

    /// The first retry wait.
    pub fn retry_backoff(&self) -> Duration {
        ms(self.retry_backoff_ms)
    }

    /// The whole-operation timeout.
    pub fn operation_timeout(&self) -> Duration {
        ms(self.operation_timeout_ms)
    }

    /// How long a power action's result waits for the BMC to settle.
    pub fn power_settle(&self) -> Duration {
        ms(self.power_settle_ms)
    }

    /// How long after a refusal new credentials are tried once more.
    pub fn bmc_lockout_window(&self) -> Duration {
        ms(self.bmc_lockout_window_ms)
    }

    /// The lease's safety margin.
    pub fn lease_margin(&self) -> Duration {
        ms(self.lease_margin_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn env_overrides_keys_and_names_a_bad_value() {
        let m: HashMap<&str, &str> = [
            ("BCD_SITE_IPMITOOL", "/opt/ipmitool"),
            ("BCD_SITE_MAX_REQUESTS_PER_BMC", "2"),
            ("BCD_SITE_STATE_DIR", " "),
        ]
        .into_iter()
        .collect();
        let mut c = SiteConfig::default();
        assert!(c.apply_env(|k| m.get(k).map(|v| (*v).to_owned())).is_ok());
        assert_eq!(c.ipmitool, PathBuf::from("/opt/ipmitool"));
        assert_eq!(c.max_requests_per_bmc, 2);
        assert_eq!(c.state_dir, SiteConfig::default().state_dir);
        let err = c
            .apply_env(|k| (k == "BCD_SITE_READ_RETRIES").then(|| "many".to_owned()))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("BCD_SITE_READ_RETRIES"), "{err}");
    }

    #[test]
    fn validate_reports_every_problem() {
        let c = SiteConfig {
            state_dir: PathBuf::from("relative"),
            max_requests_per_bmc: 0,
            request_timeout_ms: 0,
            ..SiteConfig::default()
        };
        match c.validate() {
            Err(SiteConfigError::Invalid(p)) => assert_eq!(p.len(), 3, "{p:?}"),
            other => panic!("{other:?}"),
        }
        assert!(SiteConfig::default().validate().is_ok());
        let c = SiteConfig {
            boot_listen: Some(([127, 0, 0, 1], 8080).into()),
            ..SiteConfig::default()
        };
        match c.validate() {
            Err(SiteConfigError::Invalid(p)) => {
                assert_eq!(p.len(), 2, "{p:?}");
                assert!(p[0].starts_with("boot_kernel:"), "{p:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_keys_are_refused() {
        let r: Result<SiteConfig, _> = toml_like("max_request_per_bmc = 3");
        assert!(r.is_err());
    }

    /// The section parsed the way bcd.toml's `[site]` is (serde, deny_unknown_fields).
    fn toml_like(text: &str) -> Result<SiteConfig, String> {
        let (k, v) = text.split_once(" = ").ok_or("no key")?;
        let json = format!("{{\"{}\": {}}}", k.trim(), v.trim());
        serde_json::from_str(&json).map_err(|e| e.to_string())
    }
}
