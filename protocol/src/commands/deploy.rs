//! `image.write {image, rootDevice?, configDrive?}`: the ramdisk's deploy step — stream an OS
//! image onto the root disk while hashing it, verify it, write a cloud-init config drive — and
//! the result it reports.
//!
//! # Background
//! Ironic's deploy writes the image to the disk its root-device hints pick (serial, WWN, name,
//! size), else the smallest disk that fits, and adds a config drive; its users report images
//! verified only after a temporary copy filled the ramdisk's memory, and machines left with a
//! half-written disk that still booted. Here the image is streamed (bounded memory, no
//! temporary copy) and hashed as it is written; a checksum mismatch or a short read leaves the
//! disk's first and last MiB zeroed, so what is there never boots.
//!
//! # Design
//! Only the deploy workflow queues this command (the control plane refuses it from
//! `commands.create`) and only the ramdisk serves it. A failure is a failed command with one of
//! the codes [`crate::commands::CommandErrorCode::ImageUnreachable`], `ChecksumMismatch`,
//! `NoRootDevice` or `ImageWriteFailed`, its message saying what and where.

use serde::{Deserialize, Serialize};

/// Longest image URL accepted, bytes.
pub const MAX_URL_LEN: usize = 2048;
/// Most SSH keys a config drive carries.
pub const MAX_SSH_KEYS: usize = 64;
/// Longest SSH public key line accepted, bytes (a 16384-bit RSA key is under 2,800).
pub const MAX_SSH_KEY_LEN: usize = 8 * 1024;
/// Longest root-device hint (`serial`, `wwn`, `name`), bytes.
pub const MAX_HINT_LEN: usize = 256;
/// Longest `instanceId`, bytes.
pub const MAX_INSTANCE_ID_LEN: usize = 256;
/// Largest `userData`, bytes (cloud-init's NoCloud has no limit; 64 KiB is what EC2 allows).
pub const MAX_USER_DATA_BYTES: usize = 64 * 1024;

/// How the image file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// The disk's bytes as they are, from LBA 0.
    #[default]
    Raw,
    /// QEMU's copy-on-write format.
    Qcow2,
}

/// How the image file is compressed on the server (the sha256 is of the file as served).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Zstd,
}

/// The image to deploy (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageSource {
    /// `http://` or `https://` URL of the image file, at most [`MAX_URL_LEN`] bytes.
    pub url: String,
    /// Lowercase hex SHA-256 of the file as served (before decompression), 64 digits.
    pub sha256: String,
    #[serde(default)]
    pub format: ImageFormat,
    #[serde(default)]
    pub compression: Compression,
}

/// Root-device hints: which disk receives the image. Every given hint must match; without any,
/// the smallest disk that fits the image is chosen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RootDeviceHints {
    /// The disk's serial, as the inventory's `disks[].serial`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The disk's WWN, as the inventory's `disks[].wwn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wwn: Option<String>,
    /// The kernel name (`nvme0n1`, `sda`, `vda`), or a `/dev/disk/by-path/…` or
    /// `/dev/disk/by-id/…` name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The disk must hold at least this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size_bytes: Option<u64>,
}

/// A cloud-init NoCloud config drive: a vfat filesystem labelled `cidata` in a partition the
/// ramdisk adds after the image's last one, with `meta-data` (instance-id, local-hostname,
/// public-keys) and `user-data`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigDrive {
    /// `local-hostname` (RFC 1123 label or name).
    pub hostname: String,
    /// OpenSSH public keys, one line each, at most [`MAX_SSH_KEYS`].
    #[serde(default)]
    pub ssh_keys: Vec<String>,
    /// `user-data` as given (a `#cloud-config` document, a script), at most
    /// [`MAX_USER_DATA_BYTES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
}

/// The args of `image.write` (camelCase JSON; unknown keys are refused).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageWriteArgs {
    pub image: ImageSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_device: Option<RootDeviceHints>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive: Option<ConfigDrive>,
    /// `instance-id` of the config drive's `meta-data`: the node id and its deploy, so
    /// cloud-init runs again for each deploy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The identity the deploy issues to the system it writes (`deploy_<id>.<secret>`, issue
    /// 30.1): the ramdisk writes it onto the config drive as `bcd-join-token`, where the
    /// deployed system's `bcd agent --join-token-file` reads it. Set by the control plane
    /// only; never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy_token: Option<String>,
}

/// The result of `image.write` (camelCase JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageWriteResult {
    /// The root disk's kernel name (`vda`).
    pub device: String,
    /// Why that disk: the hints it matched, or `smallest disk that fits (of N)`.
    pub chosen_because: String,
    /// The disk's size, bytes.
    pub device_size_bytes: u64,
    /// Bytes read from the server (the file as served).
    pub image_bytes: u64,
    /// Bytes written onto the disk (the image after decompression / conversion).
    pub written_bytes: u64,
    /// The SHA-256 computed while streaming; equal to the one asked for.
    pub sha256: String,
    /// The config drive's partition (`vda3`), when one was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_drive_partition: Option<String>,
    /// Download to fsync, ms.
    pub duration_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn args_keep_their_spelling_and_refuse_unknown_keys() {
        let a: ImageWriteArgs = serde_json::from_value(json!({
            "image": {"url": "http://10.0.2.2:8080/img.raw", "sha256": "ab".repeat(32)},
            "rootDevice": {"serial": "S1", "minSizeBytes": 1024},
            "configDrive": {"hostname": "h1", "sshKeys": ["ssh-ed25519 AAAA t@h"]}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.image.format, ImageFormat::Raw);
        assert_eq!(a.image.compression, Compression::None);
        assert_eq!(
            a.root_device.as_ref().and_then(|r| r.min_size_bytes),
            Some(1024)
        );
        assert!(
            serde_json::from_value::<ImageWriteArgs>(json!({
                "image": {"url": "u", "sha256": "s", "checksum": "md5"}
            }))
            .is_err()
        );
        let r = ImageWriteResult {
            device: "vda".into(),
            chosen_because: "serial S1".into(),
            device_size_bytes: 1,
            image_bytes: 2,
            written_bytes: 3,
            sha256: "ab".into(),
            config_drive_partition: None,
            duration_ms: 4,
        };
        let v = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(v["chosenBecause"], "serial S1");
        assert!(v.get("configDrivePartition").is_none());
    }
}
