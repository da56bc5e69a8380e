//! `rescue.start {sshKeys}`: the ramdisk's rescue — an SSH server (dropbear, in the image) that
//! accepts only the given keys, for an operator to repair a deployed machine's disk — and what
//! it reports.
//!
//! # Design
//! Only the rescue workflow queues this command (`nodes.rescue`; the control plane refuses it
//! from `commands.create`), and only the ramdisk serves it. Password logins are off; the server
//! listens on every address of the ramdisk. A failure is `RESCUE_FAILED` with what failed
//! (the server's binary missing, the keys not written, the server not listening).

use serde::{Deserialize, Serialize};

/// Most keys a rescue accepts.
pub const MAX_RESCUE_KEYS: usize = 64;

/// The args of `rescue.start` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RescueArgs {
    /// OpenSSH public keys (`ssh-ed25519 AAAA… comment`), one line each, 1 to
    /// [`MAX_RESCUE_KEYS`]: root's `authorized_keys` in the ramdisk, nothing else.
    pub ssh_keys: Vec<String>,
}

/// The result of `rescue.start` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RescueResult {
    /// The TCP port the SSH server listens on (22).
    pub port: u16,
    /// The server's host key fingerprints, as `ssh-keygen -l` prints them
    /// (`SHA256:<base64>`), for the operator's `known_hosts` check.
    #[serde(default)]
    pub host_key_fingerprints: Vec<String>,
    /// The ramdisk's IPv4 addresses with their prefix (`192.0.2.7/24`), where to connect.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// How many keys root's `authorized_keys` holds.
    pub authorized_keys: u32,
}
