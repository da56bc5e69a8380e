//! CPU facts from `/proc/cpuinfo` (model, threads, flags, clock, microcode), with
//! `/sys/devices/system/cpu/cpu*/topology` when cpuinfo has no topology (arm64) and
//! `cpu*/cpufreq` for the maximum frequency.

use std::collections::BTreeSet;

use bc_protocol::inventory::{Cpu, Note};

use super::note;
use crate::hostroot::HostRoot;

/// Reads the CPU section; `None` (with a note) when `/proc/cpuinfo` is unreadable.
pub fn collect(root: &HostRoot, notes: &mut Vec<Note>) -> Option<Cpu> {
    let text = match root.read_to_string("/proc/cpuinfo") {
        Ok(t) => t,
        Err(e) => {
            note(notes, "cpu", format!("/proc/cpuinfo: {e}"));
            return None;
        }
    };
    let mut cpu = parse_cpuinfo(&text);
    if cpu.sockets.is_none() {
        sysfs_topology(root, &mut cpu);
    }
    cpu.max_frequency_mhz = max_frequency_mhz(root);
    cpu.architecture = root
        .read_trimmed("/proc/sys/kernel/arch")
        .or_else(|| root.is_live().then(|| std::env::consts::ARCH.to_owned()));
    if cpu.architecture.is_none() {
        note(
            notes,
            "cpu",
            "/proc/sys/kernel/arch is not readable: architecture unknown",
        );
    }
    if cpu.model.is_none() {
        note(notes, "cpu", "/proc/cpuinfo names no model");
    }
    Some(cpu)
}

/// Parses cpuinfo: threads (`processor` lines), model, sockets (`physical id`), cores
/// (`physical id` × `core id`), flags of the first CPU.
pub fn parse_cpuinfo(text: &str) -> Cpu {
    let mut threads = 0u32;
    let mut model = None;
    let mut flags = None;
    let mut sockets = BTreeSet::new();
    let mut cores = BTreeSet::new();
    let mut phys: Option<String> = None;
    let mut mhz = None;
    let mut microcode = None;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "processor" => {
                threads += 1;
                phys = None;
            }
            "model name" | "Model" | "cpu model" if model.is_none() && !v.is_empty() => {
                model = Some(v.to_owned());
            }
            "flags" | "Features" if flags.is_none() => {
                flags = Some(v.split_whitespace().map(str::to_owned).collect());
            }
            "physical id" => {
                sockets.insert(v.to_owned());
                phys = Some(v.to_owned());
            }
            "cpu MHz" if mhz.is_none() => {
                mhz = v.parse::<f64>().ok().filter(|f| f.is_finite() && *f > 0.0);
            }
            "microcode" if microcode.is_none() && !v.is_empty() => {
                microcode = Some(v.to_owned());
            }
            "core id" => {
                cores.insert((phys.clone().unwrap_or_default(), v.to_owned()));
            }
            _ => {}
        }
    }
    Cpu {
        model,
        sockets: (!sockets.is_empty()).then_some(sockets.len() as u32),
        cores: (!cores.is_empty()).then_some(cores.len() as u32),
        threads,
        architecture: None,
        flags: flags.unwrap_or_default(),
        max_frequency_mhz: None,
        // Positive and clamped: the cast cannot wrap.
        current_frequency_mhz: mhz.map(|f| f.round().min(f64::from(u32::MAX)) as u32),
        microcode,
    }
}

/// The highest `cpufreq/cpuinfo_max_freq` (the hardware's limit) over the CPUs of
/// `/sys/devices/system/cpu`, else the highest `cpufreq/scaling_max_freq` (the policy's), kHz in
/// the files, MHz here. `None` without cpufreq (many VMs).
fn max_frequency_mhz(root: &HostRoot) -> Option<u32> {
    let cpus: Vec<String> = root
        .list_dir("/sys/devices/system/cpu")
        .unwrap_or_default()
        .into_iter()
        .filter(|n| is_cpu_dir(n))
        .collect();
    let highest = |file: &str| {
        cpus.iter()
            .filter_map(|c| {
                root.read_parsed::<u32>(format!("/sys/devices/system/cpu/{c}/cpufreq/{file}"))
            })
            .filter(|k| *k > 0)
            .max()
    };
    highest("cpuinfo_max_freq")
        .or_else(|| highest("scaling_max_freq"))
        .map(|khz| khz / 1000)
}

/// `cpu0`, `cpu17`: a CPU's directory (not `cpufreq`, `cpuidle`).
fn is_cpu_dir(n: &str) -> bool {
    n.strip_prefix("cpu")
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
}

fn sysfs_topology(root: &HostRoot, cpu: &mut Cpu) {
    let Ok(names) = root.list_dir("/sys/devices/system/cpu") else {
        return;
    };
    let mut sockets = BTreeSet::new();
    let mut cores = BTreeSet::new();
    for n in names.iter().filter(|n| is_cpu_dir(n)) {
        let t = format!("/sys/devices/system/cpu/{n}/topology");
        let (Some(pkg), Some(core)) = (
            root.read_trimmed(format!("{t}/physical_package_id")),
            root.read_trimmed(format!("{t}/core_id")),
        ) else {
            continue;
        };
        sockets.insert(pkg.clone());
        cores.insert((pkg, core));
    }
    if !sockets.is_empty() {
        cpu.sockets = Some(sockets.len() as u32);
        cpu.cores = Some(cores.len() as u32);
    }
}
