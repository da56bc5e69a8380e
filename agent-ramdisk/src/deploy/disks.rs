//! The root disk: which whole disk of `/sys/block` receives the image, and why.
//!
//! The disks are the inventory's (`bcd_probes::inventory::disks`, by its `disk_rule`: virtual
//! devices, hidden multipath paths, hardware partitions of a disk, optical and floppy drives
//! and empty slots are never listed), so a
//! hint is matched against the same serial, WWN and `/dev/disk/by-*` names the control plane
//! shows in `nodes inventory`. Read-only disks (`/sys/block/<name>/ro` is 1) and empty slots
//! (size 0) are refused. Every given hint must match (Ironic's root-device hints); among the
//! disks left, the smallest that holds the image is chosen, so a small boot disk is preferred
//! over the big data disks beside it.

use bc_protocol::commands::deploy::RootDeviceHints;
use bc_protocol::inventory::Disk;
use bcd_probes::hostroot::HostRoot;

/// A whole disk the image could go to.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The inventory's view of it (name, size, serial, WWN, udev names).
    pub disk: Disk,
    /// `/sys/block/<name>/ro` is 1.
    pub read_only: bool,
}

/// The disk chosen, with the reason `image.write` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Kernel name (`vda`, `nvme0n1`).
    pub name: String,
    /// Size, bytes.
    pub size_bytes: u64,
    /// Logical sector size, bytes (512 when sysfs does not say).
    pub sector_bytes: u64,
    /// `serial QM00001 (hint)`, `smallest disk that fits (vda, of 2)`.
    pub because: String,
}

/// Every whole disk of the machine under `root`, with its read-only flag.
pub fn candidates(root: &HostRoot) -> Vec<Candidate> {
    let mut notes = Vec::new();
    bcd_probes::inventory::disks::collect(root, &mut notes)
        .into_iter()
        .map(|disk| Candidate {
            read_only: root
                .read_trimmed(format!("/sys/block/{}/ro", disk.name))
                .is_some_and(|v| v == "1"),
            disk,
        })
        .collect()
}

/// The disk for an image of at least `need_bytes` (0 when its size is unknown before it is
/// streamed), by `hints`; `Err` says, for each disk seen, why it was refused.
pub fn choose(
    candidates: &[Candidate],
    hints: &RootDeviceHints,
    need_bytes: u64,
) -> Result<Choice, String> {
    let need = need_bytes.max(hints.min_size_bytes.unwrap_or(0));
    let mut refused = Vec::new();
    let mut fits: Vec<&Candidate> = Vec::new();
    for c in candidates {
        match refusal(c, hints, need) {
            Some(why) => refused.push(format!("{}: {why}", c.disk.name)),
            None => fits.push(c),
        }
    }
    fits.sort_by(|a, b| (a.disk.size_bytes, &a.disk.name).cmp(&(b.disk.size_bytes, &b.disk.name)));
    let Some(best) = fits.first() else {
        if candidates.is_empty() {
            return Err(
                "no disk in /sys/block (virtual devices, hardware partitions, optical \
                        drives and empty slots are not disks: `bcd inventory` says which it \
                        left out)"
                    .to_owned(),
            );
        }
        return Err(format!(
            "no disk fits {}: {}",
            describe_need(hints, need),
            refused.join("; ")
        ));
    };
    let given = given_hints(hints);
    let because = if given.is_empty() {
        format!(
            "smallest disk that fits ({}, of {})",
            best.disk.name,
            candidates.len()
        )
    } else if fits.len() == 1 {
        format!("{} (hint)", given.join(", "))
    } else {
        format!(
            "{} (hint; the smallest of {} matching)",
            given.join(", "),
            fits.len()
        )
    };
    Ok(Choice {
        name: best.disk.name.clone(),
        size_bytes: best.disk.size_bytes,
        sector_bytes: best.disk.logical_sector_bytes.map_or(512, u64::from),
        because,
    })
}

/// The disk `name` the operator named (`bcd image write --device`), whatever the inventory's
/// rule says of it (a loop device is fine); refused when read-only, empty or smaller than
/// `need_bytes`.
pub fn named(root: &HostRoot, name: &str, need_bytes: u64) -> Result<Choice, String> {
    let base = format!("/sys/block/{name}");
    let size_bytes = root
        .read_parsed::<u64>(format!("{base}/size"))
        .ok_or_else(|| format!("{name}: {base}/size unreadable"))?
        .saturating_mul(512);
    if root.read_trimmed(format!("{base}/ro")).as_deref() == Some("1") {
        return Err(format!("{name}: read-only"));
    }
    if size_bytes == 0 {
        return Err(format!("{name}: empty (size 0)"));
    }
    if size_bytes < need_bytes {
        return Err(format!(
            "{name}: too small ({size_bytes} bytes, {need_bytes} needed)"
        ));
    }
    Ok(Choice {
        name: name.to_owned(),
        size_bytes,
        sector_bytes: root
            .read_parsed(format!("{base}/queue/logical_block_size"))
            .unwrap_or(512),
        because: "named on the command line".to_owned(),
    })
}

/// Why `c` cannot take an image of `need` bytes under `hints`, or `None` when it can.
fn refusal(c: &Candidate, hints: &RootDeviceHints, need: u64) -> Option<String> {
    let d = &c.disk;
    if d.size_bytes == 0 {
        return Some("empty (size 0)".into());
    }
    if c.read_only {
        return Some("read-only".into());
    }
    if let Some(want) = &hints.serial {
        let have = d.serial.as_deref().unwrap_or("");
        if !have.eq_ignore_ascii_case(want.trim()) {
            return Some(format!(
                "serial {} is not {want}",
                shown(d.serial.as_deref())
            ));
        }
    }
    if let Some(want) = &hints.wwn {
        let matches = [d.wwn.as_deref(), d.wwn_vendor_extension.as_deref()]
            .into_iter()
            .flatten()
            .any(|have| bare_wwn(have) == bare_wwn(want));
        if !matches {
            return Some(format!("wwn {} is not {want}", shown(d.wwn.as_deref())));
        }
    }
    if let Some(want) = &hints.name
        && !name_matches(d, want)
    {
        return Some(format!("name {} is not {want}", d.name));
    }
    if d.size_bytes < need {
        return Some(format!(
            "too small ({} bytes, {} needed)",
            d.size_bytes, need
        ));
    }
    None
}

/// `name` is the kernel name (`sda`, `/dev/sda`) or a `/dev/disk/by-path/…` or
/// `/dev/disk/by-id/…` link of the disk.
fn name_matches(d: &Disk, name: &str) -> bool {
    let n = name.trim();
    if let Some(link) = n.strip_prefix("/dev/disk/by-path/") {
        return d.by_path.iter().any(|p| p == link);
    }
    if let Some(link) = n.strip_prefix("/dev/disk/by-id/") {
        return d.by_id.iter().any(|p| p == link);
    }
    n.strip_prefix("/dev/").unwrap_or(n) == d.name
}

/// A WWN without the prefixes its spellings differ by: sysfs's `naa.`/`eui.`, udev's `0x`.
fn bare_wwn(w: &str) -> String {
    let w = w.trim().to_ascii_lowercase();
    ["naa.", "eui.", "t10.", "0x"]
        .iter()
        .find_map(|p| w.strip_prefix(p))
        .map_or_else(|| w.clone(), str::to_owned)
}

fn shown(v: Option<&str>) -> &str {
    v.unwrap_or("(none)")
}

fn given_hints(h: &RootDeviceHints) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(s) = &h.serial {
        out.push(format!("serial {s}"));
    }
    if let Some(w) = &h.wwn {
        out.push(format!("wwn {w}"));
    }
    if let Some(n) = &h.name {
        out.push(format!("name {n}"));
    }
    if let Some(m) = h.min_size_bytes {
        out.push(format!("minSizeBytes {m}"));
    }
    out
}

fn describe_need(h: &RootDeviceHints, need: u64) -> String {
    let given = given_hints(h);
    match (given.is_empty(), need) {
        (true, 0) => "the image".to_owned(),
        (true, n) => format!("an image of {n} bytes"),
        (false, 0) => format!("the hints {}", given.join(", ")),
        (false, n) => format!("the hints {} and {n} bytes", given.join(", ")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn disk(name: &str, size: u64, serial: &str) -> Candidate {
        Candidate {
            disk: Disk {
                name: name.into(),
                size_bytes: size,
                serial: Some(serial.into()),
                wwn: Some(format!("naa.5000c500{serial}")),
                by_id: vec![format!("virtio-{serial}")],
                ..Disk::default()
            },
            read_only: false,
        }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn without_hints_the_smallest_disk_that_fits() {
        let d = [disk("vdb", 64 * MIB, "B"), disk("vda", 32 * MIB, "A")];
        let c = choose(&d, &RootDeviceHints::default(), 16 * MIB).unwrap();
        assert_eq!(c.name, "vda");
        assert_eq!(c.because, "smallest disk that fits (vda, of 2)");
        let c = choose(&d, &RootDeviceHints::default(), 40 * MIB).unwrap();
        assert_eq!(c.name, "vdb");
    }

    #[test]
    fn every_hint_must_match() {
        let d = [disk("vda", 32 * MIB, "A1"), disk("vdb", 64 * MIB, "B2")];
        let h = RootDeviceHints {
            serial: Some("b2".into()),
            ..Default::default()
        };
        let c = choose(&d, &h, 0).unwrap();
        assert_eq!(
            (c.name.as_str(), c.because.as_str()),
            ("vdb", "serial b2 (hint)")
        );
        let h = RootDeviceHints {
            wwn: Some("0x5000C500A1".into()),
            ..Default::default()
        };
        assert_eq!(choose(&d, &h, 0).unwrap().name, "vda");
        let h = RootDeviceHints {
            name: Some("/dev/disk/by-id/virtio-B2".into()),
            ..Default::default()
        };
        assert_eq!(choose(&d, &h, 0).unwrap().name, "vdb");
        let h = RootDeviceHints {
            name: Some("/dev/vda".into()),
            serial: Some("B2".into()),
            ..Default::default()
        };
        let e = choose(&d, &h, 0).unwrap_err();
        assert!(e.contains("vda: serial A1 is not B2"), "{e}");
        assert!(e.contains("vdb: name vdb is not /dev/vda"), "{e}");
    }

    #[test]
    fn read_only_empty_and_small_disks_are_refused_with_reasons() {
        let mut ro = disk("sda", 64 * MIB, "R");
        ro.read_only = true;
        let d = [ro, disk("sdb", 0, "E"), disk("vda", 8 * MIB, "S")];
        let e = choose(&d, &RootDeviceHints::default(), 16 * MIB).unwrap_err();
        assert!(
            e.starts_with("no disk fits an image of 16777216 bytes"),
            "{e}"
        );
        for want in [
            "sda: read-only",
            "sdb: empty",
            "vda: too small (8388608 bytes",
        ] {
            assert!(e.contains(want), "{want} in {e}");
        }
        assert!(choose(&[], &RootDeviceHints::default(), 0).is_err());
    }
}
