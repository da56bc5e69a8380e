//! The node's desired state (`NodeSpec`), as the operator API spells it in JSON and as it travels
//! in `Spec{generation, spec}` (`bcd.v1.NodeSpec`).
//!
//! # Background
//! Spec "Identity, ownership and generations": a node has the desired-state `generation` and the
//! `observedGeneration` it last reported converged. The node agent "binds GPUs through the devices
//! section and converges break-glass SSH". This module is the schema of that desired state and the
//! one validation both sides run: the control plane in `nodes.updateSpec` (every error is an
//! `INVALID_ARGUMENT`), the agent before it applies a spec.
//!
//! # Design
//! - [`NodeSpec`] is a serde type in camelCase:
//!   `{"devices":{"gpus":[{"match":{"uuid":"GPU-…"},"driver":"vfio-pci"}]},
//!     "breakGlassSsh":{"user":"ops","keys":[{"publicKey":"ssh-ed25519 AAAA…","comment":"…",
//!     "expiresAt":"2026-12-01T00:00:00Z"}]}}`. Unknown fields are an error.
//! - Conversions to and from [`crate::pb::NodeSpec`] (`expiresAt` becomes `expires_at_ms`, 0 = none).
//! - [`validate`] checks what a spec alone cannot say: the SSH keys parse (`ssh-key` crate, OpenSSH
//!   public key format), expiry is in the future, each GPU is in the node's inventory, and a
//!   `tenant-controlled` node receives no keys (spec "Trust": the gateway never sends platform
//!   secrets to it).
//!
//! # Limitations
//! Only plain public keys are accepted: no `authorized_keys` options (`from=`, `command=`) and no
//! certificates. DSA and RSA keys under 2048 bits are refused.

use std::collections::BTreeSet;

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::pb;
use crate::types::Trust;

/// Smallest RSA modulus accepted for a break-glass key, in bits (OpenSSH 9's own minimum is 1024;
/// NIST SP 800-131A asks for 2048).
pub const MIN_RSA_BITS: usize = 2048;

/// Longest user name accepted, in bytes (`useradd`'s limit on Linux, `LOGIN_NAME_MAX` - 1).
pub const MAX_USER_LEN: usize = 32;

/// Desired state of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// GPU driver bindings.
    #[serde(default)]
    pub devices: Devices,
    /// Emergency SSH access; absent = no managed keys on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub break_glass_ssh: Option<BreakGlassSsh>,
}

/// The `devices` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    /// One binding per GPU. GPUs not listed are left as they are.
    #[serde(default)]
    pub gpus: Vec<GpuBinding>,
}

/// Which kernel driver one GPU is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuBinding {
    /// How the GPU is named.
    #[serde(rename = "match")]
    pub match_: GpuMatch,
    /// The driver it must be bound to.
    pub driver: GpuDriver,
}

/// How a binding names its GPU: `{"uuid": "GPU-…"}` (NVML `nvmlDeviceGetUUID`) or
/// `{"pciAddress": "0000:3b:00.0"}` (sysfs bus id, `domain:bus:device.function`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum GpuMatch {
    /// NVML UUID, e.g. `GPU-5c3a…`.
    Uuid(String),
    /// PCI address; `3b:00.0` and NVML's `00000000:3B:00.0` are accepted and normalized by
    /// [`normalize_pci_address`].
    PciAddress(String),
}

impl std::fmt::Display for GpuMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GpuMatch::Uuid(u) => write!(f, "uuid {u}"),
            GpuMatch::PciAddress(a) => write!(f, "pciAddress {a}"),
        }
    }
}

/// Kernel driver a GPU can be bound to; the spelling is the driver's name under
/// `/sys/bus/pci/drivers/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuDriver {
    /// NVIDIA's kernel driver: the GPU serves CUDA on the host.
    #[serde(rename = "nvidia")]
    Nvidia,
    /// VFIO: the GPU is passed through to a virtual machine.
    #[serde(rename = "vfio-pci")]
    VfioPci,
}

impl GpuDriver {
    /// The driver's name in sysfs and on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            GpuDriver::Nvidia => "nvidia",
            GpuDriver::VfioPci => "vfio-pci",
        }
    }
}

impl std::fmt::Display for GpuDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GpuDriver {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<Self, SpecError> {
        match s {
            "nvidia" => Ok(GpuDriver::Nvidia),
            "vfio-pci" => Ok(GpuDriver::VfioPci),
            other => Err(SpecError::UnknownDriver(other.to_owned())),
        }
    }
}

/// The `breakGlassSsh` section: keys in one user's `authorized_keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BreakGlassSsh {
    /// Local user whose `~/.ssh/authorized_keys` holds the managed block.
    pub user: String,
    /// Keys to install; each disappears at its `expiresAt`.
    #[serde(default)]
    pub keys: Vec<SshKey>,
}

/// One break-glass key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SshKey {
    /// OpenSSH public key line: `<type> <base64> [comment]`, e.g. `ssh-ed25519 AAAAC3… a@b`.
    pub public_key: String,
    /// Written after the key in `authorized_keys`; who the key is for and why.
    #[serde(default)]
    pub comment: String,
    /// RFC 3339 time the agent removes the key; absent = never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
}

impl SshKey {
    /// `expiresAt` in milliseconds since the Unix epoch; 0 = none (the wire's convention).
    pub fn expires_at_ms(&self) -> i64 {
        self.expires_at.map_or(0, |t| t.timestamp_millis())
    }

    /// Whether the key has expired at `now_ms` (ms since the Unix epoch).
    pub fn expired_at(&self, now_ms: i64) -> bool {
        self.expires_at
            .is_some_and(|t| t.timestamp_millis() <= now_ms)
    }

    /// The `authorized_keys` line for this key: `<type> <base64> <comment>`, no options, no
    /// newline. The comment is the spec's `comment`, or the key's own when that is empty.
    pub fn authorized_keys_line(&self) -> Result<String, SpecError> {
        let key = parse_public_key(&self.public_key)
            .map_err(|reason| SpecError::InvalidSshKey { index: 0, reason })?;
        check_comment(&self.comment)?;
        let comment = if self.comment.is_empty() {
            key.comment().to_owned()
        } else {
            self.comment.clone()
        };
        let mut bare = key;
        bare.set_comment("");
        let text = bare.to_openssh().map_err(|e| SpecError::InvalidSshKey {
            index: 0,
            reason: e.to_string(),
        })?;
        let text = text.trim_end();
        Ok(if comment.is_empty() {
            text.to_owned()
        } else {
            format!("{text} {comment}")
        })
    }
}

/// What is wrong with a spec. Every variant is `INVALID_ARGUMENT` in the operator API.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// A key that does not parse as an OpenSSH public key, or one of a refused kind.
    #[error("breakGlassSsh.keys[{index}].publicKey: {reason}")]
    InvalidSshKey { index: usize, reason: String },
    /// A comment with a newline or control character would inject lines into `authorized_keys`.
    #[error("breakGlassSsh key comment {0:?} has a control character")]
    InvalidComment(String),
    /// A key whose `expiresAt` is not after now.
    #[error("breakGlassSsh.keys[{index}].expiresAt {expires_at} is in the past")]
    ExpiryInPast { index: usize, expires_at: String },
    /// `breakGlassSsh.user` is not a valid Linux user name.
    #[error("breakGlassSsh.user {0:?} is not a valid user name")]
    InvalidUser(String),
    /// Spec "Trust": a tenant-controlled node never receives platform secrets.
    #[error("breakGlassSsh keys cannot be sent to a tenant-controlled node")]
    KeysOnTenantControlledNode,
    /// A binding names a GPU that is not in the node's inventory.
    #[error("devices.gpus[{index}]: unknown device ({reference})")]
    UnknownDevice { index: usize, reference: String },
    /// Two bindings name the same GPU.
    #[error("devices.gpus[{index}]: {reference} is already bound by an earlier entry")]
    DuplicateDevice { index: usize, reference: String },
    /// Not `domain:bus:device.function` in hex.
    #[error("devices.gpus[{index}].match.pciAddress {value:?} is not a PCI address")]
    InvalidPciAddress { index: usize, value: String },
    /// An empty `uuid`.
    #[error("devices.gpus[{index}].match.uuid is empty")]
    EmptyUuid { index: usize },
    /// A wire binding with neither `uuid` nor `pci_address`.
    #[error("devices.gpus[{index}].match is missing")]
    MissingMatch { index: usize },
    /// A driver other than `nvidia` or `vfio-pci`.
    #[error("unknown driver {0:?}: expected nvidia or vfio-pci")]
    UnknownDriver(String),
    /// A wire `expires_at_ms` outside chrono's range.
    #[error("breakGlassSsh.keys[{index}].expiresAt {ms} ms is out of range")]
    BadTimestamp { index: usize, ms: i64 },
}

/// A GPU in the node's inventory that a binding may name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KnownGpu {
    /// NVML UUID, when known.
    pub uuid: Option<String>,
    /// PCI address in any form [`normalize_pci_address`] accepts.
    pub pci_address: Option<String>,
}

/// What [`validate`] checks a spec against.
#[derive(Debug, Clone, Copy)]
pub struct ValidationContext<'a> {
    /// Now, in milliseconds since the Unix epoch.
    pub now_ms: i64,
    /// The node's `trust`.
    pub trust: Trust,
    /// GPUs from the node's last inventory; `None` when no inventory has arrived yet, and then
    /// device references are not checked (the agent reports `DeviceNotFound` instead).
    pub known_gpus: Option<&'a [KnownGpu]>,
}

/// Checks a spec; the first problem found is returned.
pub fn validate(spec: &NodeSpec, ctx: &ValidationContext<'_>) -> Result<(), SpecError> {
    validate_devices(&spec.devices, ctx.known_gpus)?;
    if let Some(ssh) = &spec.break_glass_ssh {
        validate_ssh(ssh, ctx)?;
    }
    Ok(())
}

impl NodeSpec {
    /// Whether the spec carries break-glass keys (platform secrets in spec "Trust" terms).
    pub fn has_break_glass_keys(&self) -> bool {
        self.break_glass_ssh
            .as_ref()
            .is_some_and(|s| !s.keys.is_empty())
    }

    /// The spec as a tenant-controlled node may receive it: without break-glass keys.
    pub fn without_break_glass_keys(&self) -> NodeSpec {
        NodeSpec {
            devices: self.devices.clone(),
            break_glass_ssh: None,
        }
    }
}

fn validate_devices(devices: &Devices, known: Option<&[KnownGpu]>) -> Result<(), SpecError> {
    let mut seen = BTreeSet::new();
    for (index, b) in devices.gpus.iter().enumerate() {
        let key = match &b.match_ {
            GpuMatch::Uuid(u) => {
                if u.trim().is_empty() {
                    return Err(SpecError::EmptyUuid { index });
                }
                format!("uuid:{}", u.trim().to_ascii_lowercase())
            }
            GpuMatch::PciAddress(a) => {
                let norm =
                    normalize_pci_address(a).ok_or_else(|| SpecError::InvalidPciAddress {
                        index,
                        value: a.clone(),
                    })?;
                format!("pci:{norm}")
            }
        };
        if let Some(known) = known {
            let found = known.iter().any(|g| gpu_matches(g, &b.match_));
            if !found {
                return Err(SpecError::UnknownDevice {
                    index,
                    reference: b.match_.to_string(),
                });
            }
            // A uuid and a pciAddress entry can name the same GPU: fold a uuid onto its bus id.
            if let GpuMatch::Uuid(_) = b.match_
                && let Some(addr) = known
                    .iter()
                    .find(|g| gpu_matches(g, &b.match_))
                    .and_then(|g| g.pci_address.as_deref())
                    .and_then(normalize_pci_address)
                && !seen.insert(format!("pci:{addr}"))
            {
                return Err(SpecError::DuplicateDevice {
                    index,
                    reference: b.match_.to_string(),
                });
            }
        }
        if !seen.insert(key) {
            return Err(SpecError::DuplicateDevice {
                index,
                reference: b.match_.to_string(),
            });
        }
    }
    Ok(())
}

fn gpu_matches(g: &KnownGpu, m: &GpuMatch) -> bool {
    match m {
        GpuMatch::Uuid(u) => g
            .uuid
            .as_deref()
            .is_some_and(|k| k.trim().eq_ignore_ascii_case(u.trim())),
        GpuMatch::PciAddress(a) => {
            let want = normalize_pci_address(a);
            want.is_some() && g.pci_address.as_deref().and_then(normalize_pci_address) == want
        }
    }
}

fn validate_ssh(ssh: &BreakGlassSsh, ctx: &ValidationContext<'_>) -> Result<(), SpecError> {
    if !ssh.keys.is_empty() && ctx.trust == Trust::TenantControlled {
        return Err(SpecError::KeysOnTenantControlledNode);
    }
    if !valid_user_name(&ssh.user) {
        return Err(SpecError::InvalidUser(ssh.user.clone()));
    }
    for (index, k) in ssh.keys.iter().enumerate() {
        parse_public_key(&k.public_key)
            .map_err(|reason| SpecError::InvalidSshKey { index, reason })?;
        check_comment(&k.comment)?;
        if k.expired_at(ctx.now_ms) {
            return Err(SpecError::ExpiryInPast {
                index,
                expires_at: k
                    .expires_at
                    .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                    .unwrap_or_default(),
            });
        }
    }
    Ok(())
}

/// A user name `useradd` accepts by default: `[a-z_][a-z0-9_-]*[$]?`, at most [`MAX_USER_LEN`].
pub fn valid_user_name(user: &str) -> bool {
    let b = user.as_bytes();
    let Some((&first, rest)) = b.split_first() else {
        return false;
    };
    let rest = rest.strip_suffix(b"$").unwrap_or(rest);
    b.len() <= MAX_USER_LEN
        && (first.is_ascii_lowercase() || first == b'_')
        && rest
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

fn check_comment(comment: &str) -> Result<(), SpecError> {
    if comment.chars().any(char::is_control) {
        return Err(SpecError::InvalidComment(comment.to_owned()));
    }
    Ok(())
}

/// Parses one OpenSSH public key line and refuses kinds not fit for break-glass access: options,
/// certificates, unknown algorithms, DSA, RSA under [`MIN_RSA_BITS`]. The error is a sentence.
pub fn parse_public_key(line: &str) -> Result<ssh_key::PublicKey, String> {
    if line.contains(['\n', '\r', '\0']) {
        return Err("must be a single line".to_owned());
    }
    let key = ssh_key::PublicKey::from_openssh(line.trim())
        .map_err(|e| format!("not an OpenSSH public key ({e})"))?;
    match key.key_data() {
        ssh_key::public::KeyData::Ed25519(_)
        | ssh_key::public::KeyData::Ecdsa(_)
        | ssh_key::public::KeyData::SkEd25519(_)
        | ssh_key::public::KeyData::SkEcdsaSha2NistP256(_) => Ok(key),
        ssh_key::public::KeyData::Rsa(rsa) => {
            let bits = rsa.n.as_positive_bytes().map_or(0, |b| {
                let lead = b.first().map_or(0, |x| x.leading_zeros() as usize);
                b.len() * 8 - lead
            });
            if bits < MIN_RSA_BITS {
                Err(format!(
                    "RSA key of {bits} bits; at least {MIN_RSA_BITS} needed"
                ))
            } else {
                Ok(key)
            }
        }
        ssh_key::public::KeyData::Dsa(_) => Err("DSA keys are not accepted".to_owned()),
        other => Err(format!("unsupported key algorithm {}", other.algorithm())),
    }
}

/// Normalizes a PCI address to sysfs's form `dddd:bb:dd.f` in lowercase. Accepts `bb:dd.f`
/// (domain 0) and NVML's 8-digit domain (`00000000:3B:00.0`, `nvmlPciInfo_t.busId`). `None` when
/// it is not an address.
pub fn normalize_pci_address(s: &str) -> Option<String> {
    let s = s.trim();
    let mut parts: Vec<&str> = s.split(':').collect();
    if parts.len() == 2 {
        parts.insert(0, "0");
    }
    let [domain, bus, devfn] = parts.as_slice() else {
        return None;
    };
    let (dev, func) = devfn.split_once('.')?;
    let hex = |t: &str, max_len: usize| {
        (!t.is_empty() && t.len() <= max_len && t.bytes().all(|c| c.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(t, 16).ok())
            .flatten()
    };
    let domain = hex(domain, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if domain > 0xffff || dev > 0x1f || func > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
}

impl From<&NodeSpec> for pb::NodeSpec {
    fn from(s: &NodeSpec) -> Self {
        pb::NodeSpec {
            devices: Some(pb::Devices {
                gpus: s
                    .devices
                    .gpus
                    .iter()
                    .map(|g| pb::GpuBinding {
                        r#match: Some(match &g.match_ {
                            GpuMatch::Uuid(u) => pb::gpu_binding::Match::Uuid(u.clone()),
                            GpuMatch::PciAddress(a) => {
                                pb::gpu_binding::Match::PciAddress(a.clone())
                            }
                        }),
                        driver: g.driver.as_str().to_owned(),
                    })
                    .collect(),
            }),
            break_glass_ssh: s.break_glass_ssh.as_ref().map(|b| pb::BreakGlassSsh {
                user: b.user.clone(),
                keys: b
                    .keys
                    .iter()
                    .map(|k| pb::SshKey {
                        public_key: k.public_key.clone(),
                        comment: k.comment.clone(),
                        expires_at_ms: k.expires_at_ms(),
                    })
                    .collect(),
            }),
        }
    }
}

impl TryFrom<&pb::NodeSpec> for NodeSpec {
    type Error = SpecError;
    fn try_from(p: &pb::NodeSpec) -> Result<Self, SpecError> {
        let gpus = p
            .devices
            .as_ref()
            .map(|d| d.gpus.as_slice())
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(index, g)| {
                let match_ = match &g.r#match {
                    Some(pb::gpu_binding::Match::Uuid(u)) => GpuMatch::Uuid(u.clone()),
                    Some(pb::gpu_binding::Match::PciAddress(a)) => GpuMatch::PciAddress(a.clone()),
                    None => return Err(SpecError::MissingMatch { index }),
                };
                Ok(GpuBinding {
                    match_,
                    driver: g.driver.parse()?,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let break_glass_ssh = p
            .break_glass_ssh
            .as_ref()
            .map(|b| {
                let keys = b
                    .keys
                    .iter()
                    .enumerate()
                    .map(|(index, k)| {
                        let expires_at = match k.expires_at_ms {
                            0 => None,
                            ms => Some(
                                Utc.timestamp_millis_opt(ms)
                                    .single()
                                    .ok_or(SpecError::BadTimestamp { index, ms })?,
                            ),
                        };
                        Ok(SshKey {
                            public_key: k.public_key.clone(),
                            comment: k.comment.clone(),
                            expires_at,
                        })
                    })
                    .collect::<Result<Vec<_>, SpecError>>()?;
                Ok::<_, SpecError>(BreakGlassSsh {
                    user: b.user.clone(),
                    keys,
                })
            })
            .transpose()?;
        Ok(NodeSpec {
            devices: Devices { gpus },
            break_glass_ssh,
        })
    }
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
