//! Inventory collectors. Each reads through a [`HostRoot`]; a missing or unreadable source leaves
//! its section absent with a [`Note`], never failing the whole inventory.

pub mod ethtool;
pub mod nics;

use bc_protocol::inventory::{self, Cpu, Disk, Inventory, Memory, Nic, Note, Os};

use crate::hostroot::HostRoot;

/// Collects the inventory of the machine under `root`.
pub fn collect(root: &HostRoot) -> Inventory {
    let mut notes = Vec::new();
    let cpu = collect_cpu(root, &mut notes);
    let memory = collect_memory(root, &mut notes);
    Inventory {
        schema_version: inventory::SCHEMA_VERSION,
        hostname: root
            .read_trimmed("/proc/sys/kernel/hostname")
            .or_else(|| root.read_trimmed("/etc/hostname")),
        cpu,
        memory,
        disks: collect_disks(root),
        nics: collect_nics(root),
        os: Some(Os {
            kernel: root.read_trimmed("/proc/sys/kernel/osrelease"),
            boot_id: root.read_trimmed("/proc/sys/kernel/random/boot_id"),
            ..Os::default()
        }),
        notes,
        ..Inventory::default()
    }
}

fn collect_cpu(root: &HostRoot, notes: &mut Vec<Note>) -> Option<Cpu> {
    let text = match root.read_to_string("/proc/cpuinfo") {
        Ok(t) => t,
        Err(e) => {
            notes.push(Note {
                source: "cpu".into(),
                message: format!("/proc/cpuinfo: {e}"),
            });
            return None;
        }
    };
    let mut threads = 0u32;
    let mut model = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        match k.trim() {
            "processor" => threads += 1,
            "model name" if model.is_none() => model = Some(v.trim().to_owned()),
            _ => {}
        }
    }
    Some(Cpu {
        model,
        threads,
        ..Cpu::default()
    })
}

fn collect_memory(root: &HostRoot, notes: &mut Vec<Note>) -> Option<Memory> {
    let text = match root.read_to_string("/proc/meminfo") {
        Ok(t) => t,
        Err(e) => {
            notes.push(Note {
                source: "memory".into(),
                message: format!("/proc/meminfo: {e}"),
            });
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
    })?;
    Some(Memory {
        total_bytes: kib.saturating_mul(1024),
        dimms: vec![],
    })
}

fn list_dir(root: &HostRoot, abs: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(root.path(abs)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn collect_disks(root: &HostRoot) -> Vec<Disk> {
    list_dir(root, "/sys/block")
        .into_iter()
        .filter(|n| !n.starts_with("loop") && !n.starts_with("ram"))
        .map(|name| {
            let base = format!("/sys/block/{name}");
            let sectors: u64 = root
                .read_trimmed(format!("{base}/size"))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            Disk {
                size_bytes: sectors.saturating_mul(512),
                model: root.read_trimmed(format!("{base}/device/model")),
                rotational: root
                    .read_trimmed(format!("{base}/queue/rotational"))
                    .map(|v| v == "1"),
                name,
                ..Disk::default()
            }
        })
        .collect()
}

fn collect_nics(root: &HostRoot) -> Vec<Nic> {
    list_dir(root, "/sys/class/net")
        .into_iter()
        .filter(|n| n != "lo")
        .map(|name| {
            let base = format!("/sys/class/net/{name}");
            Nic {
                mac: root
                    .read_trimmed(format!("{base}/address"))
                    .map(|m| m.to_ascii_lowercase()),
                physical: root.path(format!("{base}/device")).exists(),
                name,
                ..Nic::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_root_gives_notes_not_failure() {
        let inv = collect(&HostRoot::new("/nonexistent-bcd-root"));
        assert!(inv.cpu.is_none());
        assert!(inv.notes.iter().any(|n| n.source == "cpu"));
    }
}
