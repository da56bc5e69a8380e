//! The cloud-init NoCloud config drive: a vfat filesystem labelled `cidata` holding
//! `meta-data` and `user-data` (cloud-init's NoCloud datasource, "Source 2: Drive with
//! labeled filesystem"), in a GPT partition the ramdisk adds after the image's last one.
//!
//! The image was made for a disk no larger than itself, so its GPT says the disk ends where
//! the image does: its backup header (UEFI 2.10 §5.3.2: at the disk's last LBA, the partition
//! entries just before it) is moved to the real disk's end and `LastUsableLBA` follows, as
//! `sgdisk -e` does; the protective MBR's 0xEE entry is widened to the disk. The image's old
//! backup header, now in the middle of the disk, is zeroed so no tool mistakes it for the
//! table.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use bc_protocol::commands::deploy::ConfigDrive;
use gptman::{GPT, GPTPartitionEntry};
use sha2::{Digest, Sha256};

use super::region::Region;

/// The partition's size when the disk has room, bytes.
pub const PARTITION_BYTES: u64 = 64 << 20;
/// The smallest partition written, bytes: a FAT12 volume with room for two small files.
pub const MIN_PARTITION_BYTES: u64 = 1 << 20;
/// Where partitions start, bytes (what `sfdisk` and `parted` align to).
const ALIGN_BYTES: u64 = 1 << 20;
/// The FAT volume label cloud-init looks for (it also accepts `CIDATA`).
pub const LABEL: &str = "cidata";
/// "Microsoft basic data" (EBD0A0A2-B9E5-4433-87C0-68B6B72699C7), in the GPT's mixed-endian
/// byte order: the type Linux tools give a vfat partition that is not an ESP.
const BASIC_DATA: [u8; 16] = [
    0xa2, 0xa0, 0xd0, 0xeb, 0xe5, 0xb9, 0x33, 0x44, 0x87, 0xc0, 0x68, 0xb6, 0xb7, 0x26, 0x99, 0xc7,
];

/// A config drive to write: what the command asked for and its `instance-id`.
#[derive(Debug, Clone)]
pub struct Drive {
    pub drive: ConfigDrive,
    /// `instance-id` of `meta-data`.
    pub instance_id: String,
    /// The deployed system's identity, written as [`JOIN_TOKEN_FILE`] (issue 30.1).
    pub deploy_token: Option<String>,
}

/// The file that holds the deploy's identity for the deployed system's `bcd agent
/// --join-token-file` (the control plane's `deploy_identity::CONFIG_DRIVE_FILE`).
pub const JOIN_TOKEN_FILE: &str = "bcd-join-token";

/// What went wrong writing the config drive.
#[derive(Debug, thiserror::Error)]
pub enum ConfigDriveError {
    /// No primary GPT header at LBA 1 (512- or 4096-byte sectors).
    #[error("a config drive needs a GPT image ({0})")]
    NoGpt(String),
    /// The disk has too little room after the image's last partition.
    #[error("no room after the image's last partition: {free_bytes} bytes free, {need} needed")]
    NoRoom { free_bytes: u64, need: u64 },
    /// Every partition entry of the GPT is taken.
    #[error("the image's GPT has no free partition entry")]
    NoEntry,
    /// The GPT could not be updated or written.
    #[error("GPT: {0}")]
    Gpt(String),
    /// Writing the filesystem or the table failed.
    #[error("{op}: {source}")]
    Io { op: &'static str, source: io::Error },
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> ConfigDriveError {
    move |source| ConfigDriveError::Io { op, source }
}

fn gpt_err(e: gptman::Error) -> ConfigDriveError {
    let mut s = e.to_string();
    let mut cur = std::error::Error::source(&e);
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    ConfigDriveError::Gpt(s)
}

/// `instance-id` when the command gave none: the hostname and the image, so a new image or
/// host makes cloud-init run again.
pub fn default_instance_id(hostname: &str, image_sha256: &str) -> String {
    let short: String = image_sha256.chars().take(12).collect();
    format!("iid-bcd-{hostname}-{short}")
}

/// Adds the config drive to the image just written on `disk` (kernel name `device`); returns
/// the partition's kernel name (`vda3`, `nvme0n1p3`).
pub fn write(disk: &mut File, device: &str, d: &Drive) -> Result<String, ConfigDriveError> {
    let mut gpt = read_primary(disk)?;
    let ss = gpt.sector_size;
    let old_backup = gpt.header.backup_lba;
    gpt.header.update_from(disk, ss).map_err(gpt_err)?;
    let first = gpt.header.first_usable_lba;
    let last = gpt.header.last_usable_lba;
    let after = gpt
        .iter()
        .filter(|(_, p)| p.is_used())
        .map(|(_, p)| p.ending_lba.saturating_add(1))
        .max()
        .unwrap_or(first);
    let align = (ALIGN_BYTES / ss).max(1);
    let start = after.div_ceil(align).saturating_mul(align).max(first);
    let free = (last + 1).saturating_sub(start);
    let sectors = free.min(PARTITION_BYTES / ss);
    if sectors * ss < MIN_PARTITION_BYTES {
        return Err(ConfigDriveError::NoRoom {
            free_bytes: free * ss,
            need: MIN_PARTITION_BYTES,
        });
    }
    let slot = gpt
        .iter()
        .find(|(_, p)| p.is_unused())
        .map(|(i, _)| i)
        .ok_or(ConfigDriveError::NoEntry)?;
    gpt[slot] = GPTPartitionEntry {
        partition_type_guid: BASIC_DATA,
        unique_partition_guid: partition_guid(device, d),
        starting_lba: start,
        ending_lba: start + sectors - 1,
        attribute_bits: 0,
        partition_name: LABEL.into(),
    };
    // The image's own backup header lies after its partitions and before the disk's end; a
    // header pointing anywhere else (into a partition, past the disk, at an LBA whose byte
    // offset overflows) names no header of this image, and nothing is zeroed there.
    let old_backup_at = old_backup
        .checked_mul(ss)
        .filter(|_| old_backup >= after && old_backup < gpt.header.backup_lba);
    if let Some(at) = old_backup_at {
        disk.seek(SeekFrom::Start(at))
            .and_then(|_| disk.write_all(&vec![0u8; usize::try_from(ss).unwrap_or(512)]))
            .map_err(io_err("zeroing the image's backup GPT header"))?;
    }
    format(Region::new(disk, start * ss, sectors * ss), d)?;
    gpt.write_into(disk).map_err(gpt_err)?;
    if has_protective_mbr(disk)? {
        GPT::write_protective_mbr_into(disk, ss).map_err(gpt_err)?;
    }
    disk.sync_all().map_err(io_err("fsync"))?;
    Ok(partition_name(device, slot))
}

/// The primary GPT only: a backup header at the disk's end is a previous deploy's, not this
/// image's, so it must not make a GPT-less image look like one. Both headers gptman may read
/// (LBA 1, then the last LBA) are first checked by [`header_sane`]: gptman trusts their
/// fields in arithmetic and allocations.
fn read_primary(disk: &mut File) -> Result<GPT, ConfigDriveError> {
    let mut why = Vec::new();
    let len = disk
        .seek(SeekFrom::End(0))
        .map_err(io_err("sizing the disk"))?;
    for ss in [512u64, 4096] {
        let last = (len / ss).saturating_sub(1);
        if let Some(bad) = [1, last]
            .into_iter()
            .find_map(|lba| header_sane(disk, ss, lba, len).err())
        {
            why.push(format!("{ss}-byte sectors: {bad}"));
            continue;
        }
        match GPT::read_from(disk, ss) {
            Ok(g) if g.header.is_primary() => return Ok(g),
            Ok(_) => why.push(format!("{ss}-byte sectors: only a backup header")),
            Err(e) => why.push(format!("{ss}-byte sectors: {e}")),
        }
    }
    Err(ConfigDriveError::NoGpt(why.join("; ")))
}

/// Most partition entries a GPT header may declare (the usual array holds 128; UEFI asks for
/// at least 16 KiB of entries, which 128-byte entries fill with 128).
pub const MAX_GPT_ENTRIES: u32 = 16_384;

/// `Err(why)` when the GPT header at `lba` (sectors of `ss` bytes, disk of `len` bytes) has
/// the `EFI PART` signature but fields no real table has: no entries or more than
/// [`MAX_GPT_ENTRIES`], an entry size outside 128..=4096, an entry array that does not fit on
/// the disk with both headers. `Ok` for a sane header and for no header at all.
fn header_sane(disk: &mut File, ss: u64, lba: u64, len: u64) -> Result<(), String> {
    let mut h = [0u8; 92];
    let Some(at) = lba.checked_mul(ss) else {
        return Ok(());
    };
    if disk
        .seek(SeekFrom::Start(at))
        .and_then(|_| disk.read_exact(&mut h))
        .is_err()
        || &h[..8] != b"EFI PART"
    {
        return Ok(());
    }
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let mut entries_lba = [0u8; 8];
    entries_lba.copy_from_slice(&h[72..80]);
    let entries_lba = u64::from_le_bytes(entries_lba);
    let (count, size) = (u32_at(80), u32_at(84));
    if count == 0 || count > MAX_GPT_ENTRIES {
        return Err(format!(
            "the GPT header at LBA {lba} declares {count} partition entries (1 to {MAX_GPT_ENTRIES})"
        ));
    }
    if !(128..=4096).contains(&size) {
        return Err(format!(
            "the GPT header at LBA {lba} declares {size}-byte partition entries (128 to 4096)"
        ));
    }
    let array_bytes = u64::from(count) * u64::from(size);
    let fits = entries_lba
        .checked_mul(ss)
        .and_then(|a| a.checked_add(array_bytes))
        .is_some_and(|end| end <= len)
        && array_bytes.div_ceil(ss).saturating_add(3) <= len / ss;
    if !fits {
        return Err(format!(
            "the GPT header at LBA {lba} puts its partition entries (LBA {entries_lba}, {array_bytes} bytes) outside the disk"
        ));
    }
    Ok(())
}

/// True when the first MBR entry is the GPT's protective 0xEE one (not a hybrid MBR, whose
/// entries the image's maker chose).
fn has_protective_mbr(disk: &mut File) -> Result<bool, ConfigDriveError> {
    let mut ty = [0u8; 1];
    disk.seek(SeekFrom::Start(446 + 4))
        .and_then(|_| disk.read_exact(&mut ty))
        .map_err(io_err("reading the MBR"))?;
    Ok(ty[0] == 0xee)
}

/// `vda` + 3 → `vda3`; a name ending in a digit takes a `p` (`nvme0n1p3`, `mmcblk0p3`), as
/// the kernel names partitions (`block/partitions/core.c`).
pub fn partition_name(device: &str, n: u32) -> String {
    if device.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{device}p{n}")
    } else {
        format!("{device}{n}")
    }
}

/// A version-4-shaped GUID from the disk, the drive and the time: unique enough for one
/// partition table, without a random source in the crate.
fn partition_guid(device: &str, d: &Drive) -> [u8; 16] {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.as_nanos())
        .unwrap_or(0);
    let h = Sha256::new()
        .chain_update(device)
        .chain_update(&d.instance_id)
        .chain_update(&d.drive.hostname)
        .chain_update(now.to_le_bytes())
        .finalize();
    let mut g = [0u8; 16];
    g.copy_from_slice(&h[..16]);
    // Version 4 in the high nibble of the little-endian third field, variant 10 in byte 8.
    g[7] = (g[7] & 0x0f) | 0x40;
    g[8] = (g[8] & 0x3f) | 0x80;
    g
}

/// Zeroes the region (no stale signature of an older filesystem survives under the FAT one),
/// formats it vfat `cidata` and writes both files.
fn format(mut region: Region<'_>, d: &Drive) -> Result<(), ConfigDriveError> {
    region.zero().map_err(io_err("zeroing the partition"))?;
    let mut label = [b' '; 11];
    label[..LABEL.len()].copy_from_slice(LABEL.as_bytes());
    fatfs::format_volume(
        &mut region,
        fatfs::FormatVolumeOptions::new().volume_label(label),
    )
    .map_err(io_err("formatting vfat"))?;
    let fs = fatfs::FileSystem::new(&mut region, fatfs::FsOptions::new())
        .map_err(io_err("opening the new vfat"))?;
    let mut files = vec![
        ("meta-data", meta_data(d)),
        ("user-data", user_data(&d.drive)),
    ];
    if let Some(t) = &d.deploy_token {
        files.push((JOIN_TOKEN_FILE, format!("{}\n", t.trim())));
    }
    for (name, text) in files {
        let mut f = fs
            .root_dir()
            .create_file(name)
            .map_err(io_err("creating a file on the vfat"))?;
        f.truncate()
            .map_err(io_err("truncating a file on the vfat"))?;
        f.write_all(text.as_bytes())
            .map_err(io_err("writing a file on the vfat"))?;
        f.flush().map_err(io_err("writing a file on the vfat"))?;
    }
    fs.unmount().map_err(io_err("closing the vfat"))
}

/// A YAML scalar: JSON's double-quoted string is one, with every character escaped safely.
fn q(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// NoCloud `meta-data`: `instance-id`, `local-hostname`, and `public-keys` (which cloud-init's
/// NoCloud hands to its SSH module as the default user's authorized keys).
pub fn meta_data(d: &Drive) -> String {
    let mut s = format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        q(&d.instance_id),
        q(&d.drive.hostname)
    );
    if !d.drive.ssh_keys.is_empty() {
        s.push_str("public-keys:\n");
        for k in &d.drive.ssh_keys {
            s.push_str(&format!("  - {}\n", q(k.trim())));
        }
    }
    s
}

/// `user-data`: the one given, else a `#cloud-config` with the hostname and the keys.
pub fn user_data(c: &ConfigDrive) -> String {
    if let Some(u) = &c.user_data {
        return u.clone();
    }
    let mut s = format!("#cloud-config\nhostname: {}\n", q(&c.hostname));
    if !c.ssh_keys.is_empty() {
        s.push_str("ssh_authorized_keys:\n");
        for k in &c.ssh_keys {
            s.push_str(&format!("  - {}\n", q(k.trim())));
        }
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "config_drive_gpt_tests.rs"]
mod gpt_tests;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_named_as_the_kernel_does() {
        assert_eq!(partition_name("vda", 3), "vda3");
        assert_eq!(partition_name("nvme0n1", 2), "nvme0n1p2");
    }

    #[test]
    fn meta_and_user_data_quote_what_they_are_given() {
        let d = Drive {
            drive: ConfigDrive {
                hostname: "h1".into(),
                ssh_keys: vec!["ssh-ed25519 AAAA a: #b".into()],
                user_data: None,
            },
            instance_id: "i-1".into(),
            deploy_token: None,
        };
        assert_eq!(
            meta_data(&d),
            "instance-id: \"i-1\"\nlocal-hostname: \"h1\"\npublic-keys:\n  - \"ssh-ed25519 AAAA a: #b\"\n"
        );
        assert!(user_data(&d.drive).starts_with("#cloud-config\nhostname: \"h1\"\n"));
        let given = ConfigDrive {
            user_data: Some("#!/bin/sh\necho hi\n".into()),
            ..d.drive
        };
        assert_eq!(user_data(&given), "#!/bin/sh\necho hi\n");
    }
}
