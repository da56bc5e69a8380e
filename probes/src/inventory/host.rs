//! Hostname, memory total, OS facts and boot mode (procfs, os-release, `/sys/firmware/efi`).

use bc_protocol::inventory::{BootMode, Dimm, Memory, Note, Os};

use super::note;
use crate::hostroot::HostRoot;

/// `/proc/sys/kernel/hostname`, else `/etc/hostname`.
pub fn hostname(root: &HostRoot, notes: &mut Vec<Note>) -> Option<String> {
    let h = root
        .read_trimmed("/proc/sys/kernel/hostname")
        .or_else(|| root.read_trimmed("/etc/hostname"));
    if h.is_none() {
        note(
            notes,
            "hostname",
            "neither /proc/sys/kernel/hostname nor /etc/hostname is readable",
        );
    }
    h
}

/// `MemTotal` of `/proc/meminfo` in bytes (the file says kB, meaning KiB). DIMMs are added by the
/// caller from SMBIOS.
pub fn memory(root: &HostRoot, notes: &mut Vec<Note>) -> Option<Memory> {
    let text = match root.read_to_string("/proc/meminfo") {
        Ok(t) => t,
        Err(e) => {
            note(notes, "memory", format!("/proc/meminfo: {e}"));
            return None;
        }
    };
    let kib = text.lines().find_map(|l| {
        let rest = l.strip_prefix("MemTotal:")?;
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse::<u64>()
            .ok()
    });
    let Some(kib) = kib else {
        note(notes, "memory", "/proc/meminfo has no MemTotal line");
        return None;
    };
    Some(Memory {
        total_bytes: kib.saturating_mul(1024),
        ..Memory::default()
    })
}

/// The installed memory, bytes: the sum of the DIMMs' SMBIOS type 17 sizes; `None` when no
/// DIMM states its size.
pub fn dimm_total(dimms: &[Dimm]) -> Option<u64> {
    dimms
        .iter()
        .filter_map(|d| d.size_bytes)
        .reduce(u64::saturating_add)
}

/// Parses os-release (`KEY=value`, values optionally quoted) into (PRETTY_NAME, ID, VERSION_ID).
fn os_release(text: &str) -> (Option<String>, Option<String>, Option<String>) {
    let mut pretty = None;
    let mut id = None;
    let mut version = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches(['"', '\'']).to_owned();
        if v.is_empty() {
            continue;
        }
        match k.trim() {
            "PRETTY_NAME" => pretty = Some(v),
            "ID" => id = Some(v),
            "VERSION_ID" => version = Some(v),
            _ => {}
        }
    }
    (pretty, id, version)
}

/// Kernel release, distribution, boot id and uptime.
pub fn os(root: &HostRoot, notes: &mut Vec<Note>) -> Os {
    let kernel = root.read_trimmed("/proc/sys/kernel/osrelease");
    if kernel.is_none() {
        note(notes, "os", "/proc/sys/kernel/osrelease is not readable");
    }
    let rel = root
        .read_to_string("/etc/os-release")
        .or_else(|_| root.read_to_string("/usr/lib/os-release"));
    let (distro, distro_id, distro_version) = match rel {
        Ok(t) => os_release(&t),
        Err(e) => {
            note(notes, "os", format!("os-release: {e}"));
            (None, None, None)
        }
    };
    let boot_id = root.read_trimmed("/proc/sys/kernel/random/boot_id");
    if boot_id.is_none() {
        note(
            notes,
            "os",
            "/proc/sys/kernel/random/boot_id is not readable",
        );
    }
    let uptime_s = root
        .read_trimmed("/proc/uptime")
        .and_then(|u| u.split_whitespace().next()?.parse::<f64>().ok());
    if uptime_s.is_none() {
        note(notes, "os", "/proc/uptime is not readable");
    }
    Os {
        kernel,
        distro,
        distro_id,
        distro_version,
        boot_id,
        uptime_s,
    }
}

/// UEFI when `/sys/firmware/efi` exists, BIOS when `/sys/firmware` exists without it.
pub fn boot_mode(root: &HostRoot, notes: &mut Vec<Note>) -> Option<BootMode> {
    if root.exists("/sys/firmware/efi") {
        Some(BootMode::Uefi)
    } else if root.exists("/sys/firmware") {
        Some(BootMode::Bios)
    } else {
        note(
            notes,
            "bootMode",
            "/sys/firmware is absent: boot mode unknown",
        );
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_fields() {
        let (p, i, v) = os_release(
            "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian\"\nVERSION_ID=\"13\"\nID=debian\n",
        );
        assert_eq!(p.as_deref(), Some("Debian GNU/Linux 13 (trixie)"));
        assert_eq!(i.as_deref(), Some("debian"));
        assert_eq!(v.as_deref(), Some("13"));
    }
}
