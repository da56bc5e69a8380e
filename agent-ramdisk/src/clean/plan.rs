//! What `disk.clean` would do to one disk, without writing to it (`bcd disk clean --dry-run`):
//! the disk as sysfs and its own partition table describe it, the places the metadata erase
//! zeroes, and in mode `full` the erase methods in the order [`super::full`] tries them, with
//! what the drive answers about each (NVMe Identify Controller, ATA IDENTIFY DEVICE: both
//! read-only commands).

use std::fs::File;

use bc_protocol::commands::clean::CleanMode;
use bcd_probes::erase::{ata_security, nvme_format};
use bcd_probes::hostroot::HostRoot;

use super::{discover, metadata, table};

/// `1048576` bytes as `1 MiB`, else bytes.
fn size(b: u64) -> String {
    const MIB: u64 = 1 << 20;
    if b >= MIB && b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else {
        format!("{b} bytes")
    }
}

/// The plan for the disk `name` under `root`, one line per step.
pub fn plan(root: &HostRoot, mode: CleanMode, name: &str) -> Vec<String> {
    let info = discover::read_disk(root, name);
    let mut out = Vec::new();
    let Some(bytes) = info.size_bytes else {
        out.push(format!(
            "{name}: size unknown (/sys/block/{name}/size unreadable): it would fail"
        ));
        return out;
    };
    out.push(format!(
        "{name}: {} ({bytes} bytes), serial {}, {}-byte logical blocks, discard {}",
        size(bytes),
        info.serial.as_deref().unwrap_or("(none)"),
        info.logical_block_bytes,
        if info.discard_max_bytes > 0 {
            "supported"
        } else {
            "not supported"
        }
    ));
    if info.read_only {
        out.push("read-only (ro is 1): nothing would be written".to_owned());
        return out;
    }
    if bytes == 0 {
        out.push("size 0 (no medium): nothing to erase".to_owned());
        return out;
    }
    let dev = root.path(format!("/dev/{name}"));
    let file = File::open(&dev);
    let mut parts = info.partitions.clone();
    if let Ok(f) = &file {
        for p in table::read(f, bytes, info.logical_block_bytes) {
            if !parts
                .iter()
                .any(|k| (k.start_bytes, k.size_bytes) == (p.start_bytes, p.size_bytes))
            {
                parts.push(p);
            }
        }
    }
    let ranges = metadata::ranges(&parts, bytes);
    let zeroed: u64 = ranges.iter().map(|r| r.end - r.start).sum();
    out.push(format!(
        "metadata: would zero {} at {} place(s) (first and last MiB of the disk and of {} partition(s)): {}",
        size(zeroed),
        ranges.len(),
        parts.len(),
        ranges
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Err(e) = &file {
        out.push(format!(
            "{}: {e} (the table on the disk was not read)",
            dev.display()
        ));
    }
    if mode == CleanMode::Full {
        out.extend(full_plan(&info, file.as_ref().ok()));
        out.push("metadata again (a format may leave the old bytes)".to_owned());
    }
    out.push("rereadPartitions".to_owned());
    out
}

/// The full erase's methods in order, with what the drive says of each.
fn full_plan(info: &discover::DiskInfo, file: Option<&File>) -> Vec<String> {
    let mut out = Vec::new();
    if info.is_nvme_namespace() {
        out.push(match file.map(nvme_format::format_caps) {
            Some(Ok(c)) if !c.format => {
                "nvmeFormat: not supported (Identify Controller OACS bit 1 clear)".to_owned()
            }
            Some(Ok(c)) => format!(
                "nvmeFormat: would try {} (crypto erase {} by FNA bit 2), each refusal a step",
                if c.crypto_erase {
                    "ses=2, then 1, then 0"
                } else {
                    "ses=1, then 0"
                },
                if c.crypto_erase {
                    "supported"
                } else {
                    "not supported"
                }
            ),
            Some(Err(e)) => format!("nvmeFormat: Identify Controller failed ({e})"),
            None => "nvmeFormat: the device could not be opened".to_owned(),
        });
    }
    if info.ata {
        let shown = format!("/dev/{}", info.name);
        out.push(match file.map(|f| ata_security::identify(f, &shown)) {
            Some(Ok(s)) if !s.supported => "ataSecureErase: not supported".to_owned(),
            Some(Ok(s)) if s.frozen => {
                "ataSecureErase: frozen (the firmware froze the security state at boot): skipped"
                    .to_owned()
            }
            Some(Ok(s)) if s.locked || s.enabled => {
                "ataSecureErase: a password is set: skipped".to_owned()
            }
            Some(Ok(s)) => format!(
                "ataSecureErase: would run ({} erase)",
                if s.enhanced { "enhanced" } else { "normal" }
            ),
            Some(Err(e)) => format!("ataSecureErase: IDENTIFY DEVICE failed ({e})"),
            None => "ataSecureErase: the device could not be opened".to_owned(),
        });
    }
    if info.discard_max_bytes > 0 {
        out.push(format!(
            "secureDiscard, else discard checked by reading back {} places",
            super::full::SAMPLES
        ));
    }
    out.push("zero (BLKZEROOUT) when nothing before erased the disk".to_owned());
    out
}
