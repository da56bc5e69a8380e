//! The ramdisk's settings from the kernel command line (`/proc/cmdline`), as the site agent's
//! iPXE script writes them:
//!
//! `bcd.url=https://10.0.2.2:7443 bcd.pin=sha256:<64 hex> bcd.token=<token> bcd.node=<node id>`
//!
//! `bcd.url` may list several gateway URLs (one per control-plane replica), comma-separated.
//!
//! and optionally `bcd.log=<tracing filter>`, `bcd.modules=a,b,c` (modules to load besides the
//! defaults), `bcd.dhcp_timeout=<seconds>` and `bcd.lldp_wait=<seconds>`, and the boot NIC as
//! pxelinux and iPXE name it, `BOOTIF=01-aa-bb-cc-dd-ee-ff` (DHCP asks on it first; a malformed
//! one is reported and ignored, see [`crate::nics`]). Words are split as the kernel splits them
//! (`next_arg()` in the kernel's `lib/cmdline.c`): on whitespace outside double quotes, with the
//! quotes around a value (`key="a b"`) or a whole word (`"key=a b"`) removed. Everything after a
//! lone `--` is for init, not for us.

use std::fmt;
use std::time::Duration;

/// Every `bcd.` key this module reads; another `bcd.` key is reported, not refused.
pub const KEYS: [&str; 8] = [
    "bcd.url",
    "bcd.pin",
    "bcd.token",
    "bcd.node",
    "bcd.log",
    "bcd.modules",
    "bcd.dhcp_timeout",
    "bcd.lldp_wait",
];

/// How long the ramdisk waits for LLDP on its links before joining when the command
/// line has no `bcd.lldp_wait`: a switch sends an LLDPDU every 30 s by default (IEEE 802.1AB
/// `msgTxInterval`).
pub const DEFAULT_LLDP_WAIT: Duration = Duration::from_secs(30);
/// The longest `bcd.lldp_wait`, seconds.
pub const MAX_LLDP_WAIT_S: u64 = 600;

/// Why the command line cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CmdlineError {
    /// A required key is absent (or has no value).
    #[error(
        "the kernel command line has no {0}=...: the boot script must pass bcd.url, bcd.pin and bcd.token"
    )]
    Missing(&'static str),
    /// A key is given twice: which one the boot script meant is unknowable.
    #[error("the kernel command line gives {0} twice")]
    Duplicate(String),
    /// A value is not what the key takes.
    #[error("{key}={value:?} is malformed: {why}")]
    Malformed {
        /// The key.
        key: &'static str,
        /// The value as given (never the token's).
        value: String,
        /// What was expected.
        why: &'static str,
    },
}

/// The ramdisk's settings. `Debug` leaves the token out.
#[derive(Clone, PartialEq, Eq)]
pub struct BootParams {
    /// The gateway URLs to join and hold the session with (`bcd.url`, `https://host:port`;
    /// several, one per control-plane replica, comma-separated), tried in a shuffled order.
    pub urls: Vec<String>,
    /// The control plane's CA pin (`bcd.pin`), `sha256:<hex>`, as `bcd agent --ca-pin` takes.
    pub pin: String,
    /// The one-time token (`bcd.token`), sent verbatim as `JoinRequest.token`.
    pub token: String,
    /// The node id the control plane booted this machine for (`bcd.node`): for logs and as the
    /// hostname when neither the kernel nor DHCP gives one.
    pub node: Option<String>,
    /// The log filter (`bcd.log`, tracing `EnvFilter` syntax).
    pub log: Option<String>,
    /// Modules to load besides the defaults (`bcd.modules`, comma-separated).
    pub modules: Vec<String>,
    /// How long DHCP may take in all (`bcd.dhcp_timeout`, seconds).
    pub dhcp_timeout: Option<Duration>,
    /// How long the boot waits, before joining, for each link to hear an LLDPDU (`bcd.lldp_wait`,
    /// whole seconds, 0 to 600; [`DEFAULT_LLDP_WAIT`] when absent; 0: no wait).
    pub lldp_wait: Duration,
    /// `bcd.` keys this version does not know (a newer boot script): logged, not fatal.
    pub unknown: Vec<String>,
    /// The boot NIC's MAC (`BOOTIF=01-aa-bb-…`, lowercase with colons): DHCP asks on it first.
    pub boot_mac: Option<String>,
    /// Why a `BOOTIF` given was not used (malformed): logged, not fatal.
    pub boot_if_ignored: Option<String>,
}

impl fmt::Debug for BootParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootParams")
            .field("urls", &self.urls)
            .field("pin", &self.pin)
            .field("token", &"<redacted>")
            .field("node", &self.node)
            .field("log", &self.log)
            .field("modules", &self.modules)
            .field("dhcp_timeout", &self.dhcp_timeout)
            .field("lldp_wait", &self.lldp_wait)
            .field("unknown", &self.unknown)
            .field("boot_mac", &self.boot_mac)
            .field("boot_if_ignored", &self.boot_if_ignored)
            .finish()
    }
}

/// Splits a command line into `(key, value)` words the way the kernel does: `value` is `None`
/// for a word without `=`. Stops at a lone `--` (the rest is init's).
pub fn words(cmdline: &str) -> Vec<(String, Option<String>)> {
    let b = cmdline.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= b.len() {
            return out;
        }
        // One word, as next_arg() finds it: a leading quote opens a quoted word; quotes toggle.
        let quoted = b[i] == b'"';
        let start = if quoted { i + 1 } else { i };
        let mut in_quote = quoted;
        let mut equals = None;
        let mut j = start;
        while j < b.len() {
            if b[j].is_ascii_whitespace() && !in_quote {
                break;
            }
            if equals.is_none() && b[j] == b'=' {
                equals = Some(j);
            }
            if b[j] == b'"' {
                in_quote = !in_quote;
            }
            j += 1;
        }
        let mut end = j;
        if quoted && end > start && b[end - 1] == b'"' {
            end -= 1;
        }
        let word = &cmdline[start..end.max(start)];
        i = j;
        if !quoted && word == "--" {
            return out;
        }
        match equals {
            None => out.push((word.to_owned(), None)),
            Some(eq) => {
                let key = &cmdline[start..eq];
                let mut value = &cmdline[(eq + 1).min(end)..end.max(eq + 1)];
                // "Don't include quotes in value": the opening one, and the closing one if it ends
                // the word.
                if let Some(v) = value.strip_prefix('"') {
                    value = v.strip_suffix('"').unwrap_or(v);
                }
                out.push((key.to_owned(), Some(value.to_owned())));
            }
        }
    }
}

/// The ramdisk's settings from `cmdline` (the text of `/proc/cmdline`).
pub fn parse(cmdline: &str) -> Result<BootParams, CmdlineError> {
    let mut found: Vec<(&'static str, String)> = Vec::new();
    let mut unknown = Vec::new();
    let mut boot_if = None;
    for (key, value) in words(cmdline) {
        if key == "BOOTIF" {
            // pxelinux appends its own after the configured line's: the last one counts.
            boot_if = Some(value.unwrap_or_default());
            continue;
        }
        if !key.starts_with("bcd.") {
            continue;
        }
        let Some(&known) = KEYS.iter().find(|k| **k == key) else {
            unknown.push(key);
            continue;
        };
        if found.iter().any(|(k, _)| *k == known) {
            return Err(CmdlineError::Duplicate(key));
        }
        found.push((known, value.unwrap_or_default()));
    }
    let get = |k: &str| {
        found
            .iter()
            .find(|(key, v)| *key == k && !v.is_empty())
            .map(|(_, v)| v.clone())
    };
    let url = get("bcd.url").ok_or(CmdlineError::Missing("bcd.url"))?;
    let pin = get("bcd.pin").ok_or(CmdlineError::Missing("bcd.pin"))?;
    let token = get("bcd.token").ok_or(CmdlineError::Missing("bcd.token"))?;
    let urls = bcd_core::endpoints::split_list(&url);
    if urls.is_empty() {
        return Err(CmdlineError::Missing("bcd.url"));
    }
    for u in &urls {
        check_url(u)?;
    }
    if bcd_core::tls::parse_pin(&pin).is_err() {
        return Err(CmdlineError::Malformed {
            key: "bcd.pin",
            value: pin,
            why: "expected sha256:<64 hex digits> (what `bcctl tokens create` prints)",
        });
    }
    if token.chars().any(|c| c.is_control() || c == '"') {
        return Err(CmdlineError::Malformed {
            key: "bcd.token",
            value: "<redacted>".to_owned(),
            why: "a token has no control characters or quotes",
        });
    }
    Ok(BootParams {
        urls,
        pin,
        token,
        node: get("bcd.node"),
        log: get("bcd.log"),
        modules: modules(get("bcd.modules"))?,
        dhcp_timeout: dhcp_timeout(get("bcd.dhcp_timeout"))?,
        lldp_wait: lldp_wait(get("bcd.lldp_wait"))?,
        unknown,
        boot_mac: boot_if
            .as_deref()
            .and_then(|v| crate::nics::boot_mac(v).ok()),
        boot_if_ignored: boot_if.as_deref().and_then(|v| {
            crate::nics::boot_mac(v)
                .err()
                .map(|why| format!("BOOTIF={v:?}: {why}"))
        }),
    })
}

/// `bcd.url` must be `https://host[:port]`: the session is mutual TLS.
fn check_url(url: &str) -> Result<(), CmdlineError> {
    let host = url
        .strip_prefix("https://")
        .map(|r| r.trim_end_matches('/'));
    match host {
        Some(h) if !h.is_empty() && !h.contains(['/', '?', '#', '@']) => Ok(()),
        _ => Err(CmdlineError::Malformed {
            key: "bcd.url",
            value: url.to_owned(),
            why: "expected https://host:port of the control plane's gateway",
        }),
    }
}

/// `bcd.modules=a,b,c`: module names (letters, digits, `_`, `-`).
fn modules(value: Option<String>) -> Result<Vec<String>, CmdlineError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let names: Vec<String> = value
        .split(',')
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    let bad = |m: &String| {
        !m.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if names.iter().any(bad) {
        return Err(CmdlineError::Malformed {
            key: "bcd.modules",
            value,
            why: "expected comma-separated module names",
        });
    }
    Ok(names)
}

/// `bcd.dhcp_timeout=<seconds>`, 1 to 3600.
fn dhcp_timeout(value: Option<String>) -> Result<Option<Duration>, CmdlineError> {
    let Some(value) = value else {
        return Ok(None);
    };
    match value.parse::<u64>() {
        Ok(s) if (1..=3600).contains(&s) => Ok(Some(Duration::from_secs(s))),
        _ => Err(CmdlineError::Malformed {
            key: "bcd.dhcp_timeout",
            value,
            why: "expected whole seconds from 1 to 3600",
        }),
    }
}

/// `bcd.lldp_wait=<seconds>`, 0 to [`MAX_LLDP_WAIT_S`].
fn lldp_wait(value: Option<String>) -> Result<Duration, CmdlineError> {
    let Some(value) = value else {
        return Ok(DEFAULT_LLDP_WAIT);
    };
    match value.parse::<u64>() {
        Ok(s) if s <= MAX_LLDP_WAIT_S => Ok(Duration::from_secs(s)),
        _ => Err(CmdlineError::Malformed {
            key: "bcd.lldp_wait",
            value,
            why: "expected whole seconds from 0 to 600",
        }),
    }
}

#[cfg(test)]
#[path = "cmdline_tests.rs"]
mod tests;
