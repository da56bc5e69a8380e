//! The PCI bus id of a GPU NVML lists but cannot open.
//!
//! `nvmlDeviceGetHandleByIndex` fails for such a GPU (`NVML_ERROR_GPU_IS_LOST`: it fell off
//! the bus), so NVML cannot say which one it is. `nvidia-smi` can: for each GPU it cannot open
//! it prints `Unable to determine the device handle for GPU<index>: <bus id>: GPU is lost.
//! Reboot the system to recover this GPU` (older drivers: `... for GPU<bus id>: Unknown Error`).
//! Without `nvidia-smi`, the driver's own list (`/proc/driver/nvidia/gpus/<bus id>`) and the
//! NVIDIA display controllers on the PCI bus, less the GPUs NVML did open, are the candidates.

use std::process::Command;
use std::time::Duration;

use crate::hostroot::HostRoot;

use super::busid::PciAddr;
use super::tool::run_with_timeout;

/// How long the `nvidia-smi` query may take; a node with a lost GPU can make it slow.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The text `nvidia-smi` prints for a GPU whose handle it cannot get (lowercase).
const NO_HANDLE: &str = "unable to determine the device handle for gpu";

/// A GPU `nvidia-smi` could not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostGpu {
    /// Its NVML index, when the message names one (`GPU3: ...`).
    pub index: Option<u32>,
    /// Its PCI address.
    pub addr: PciAddr,
    /// The line as printed.
    pub line: String,
}

/// The GPUs named in `nvidia-smi`'s "Unable to determine the device handle" lines, in the order
/// printed (NVML index order).
pub fn parse_smi(output: &str) -> Vec<LostGpu> {
    output
        .lines()
        .filter_map(|line| {
            let lower = line.to_ascii_lowercase();
            let rest = &line[lower.find(NO_HANDLE)? + NO_HANDLE.len()..];
            // `GPU3: 0000:5D:00.0: ...`, `GPU 0000:5D:00.0: ...` or `GPU0000:5D:00.0: ...`.
            let first_addr = |s: &str| {
                s.split(|c: char| c.is_whitespace())
                    .next()
                    .map(|w| w.trim_end_matches(':'))
                    .filter(|w| w.matches(':').count() == 2)
                    .and_then(PciAddr::parse)
            };
            let rest = rest.trim_start();
            let (index, addr) = match first_addr(rest) {
                Some(a) => (None, Some(a)),
                None => match rest.split_once(':') {
                    Some((i, r)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => {
                        (i.parse().ok(), first_addr(r.trim_start()))
                    }
                    _ => (None, None),
                },
            };
            let addr = addr?;
            Some(LostGpu {
                index,
                addr,
                line: line.trim().to_owned(),
            })
        })
        .collect()
}

/// Asks `nvidia-smi` which GPUs it cannot open. Empty when it cannot be run or names none.
pub fn from_nvidia_smi(nvidia_smi: &std::path::Path) -> Vec<LostGpu> {
    let mut cmd = Command::new(nvidia_smi);
    cmd.args(["--query-gpu=index,pci.bus_id", "--format=csv,noheader"]);
    match run_with_timeout(cmd, QUERY_TIMEOUT) {
        Ok(run) => parse_smi(&run.text),
        Err(e) => {
            tracing::debug!(error = %e, "nvidia-smi not run to name a lost GPU");
            Vec::new()
        }
    }
}

/// NVIDIA GPUs the host knows of under `root`: the driver's `/proc/driver/nvidia/gpus/<bus id>`
/// entries, else PCI functions of vendor `10de` and class `03xxxx`, sorted.
pub fn host_gpus(root: &HostRoot) -> Vec<PciAddr> {
    let from_driver: Vec<PciAddr> = root
        .list_dir("/proc/driver/nvidia/gpus")
        .unwrap_or_default()
        .iter()
        .filter_map(|n| PciAddr::parse(n))
        .collect();
    if !from_driver.is_empty() {
        return from_driver;
    }
    let mut out: Vec<PciAddr> = root
        .list_dir("/sys/bus/pci/devices")
        .unwrap_or_default()
        .iter()
        .filter(|a| {
            let base = format!("/sys/bus/pci/devices/{a}");
            root.read_trimmed(format!("{base}/vendor")).as_deref() == Some("0x10de")
                && root
                    .read_trimmed(format!("{base}/class"))
                    .is_some_and(|c| c.starts_with("0x03"))
        })
        .filter_map(|a| PciAddr::parse(a))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Names the GPUs NVML could not open: `unopened` are their NVML indices (ascending), `opened`
/// the addresses of those it did. Returns, per unopened index, its address and how it was found
/// (`None` where nothing says, or the host's list leaves more than one candidate).
pub fn name_unopened(
    unopened: &[u32],
    opened: &[PciAddr],
    nvidia_smi: &std::path::Path,
    root: &HostRoot,
) -> Vec<Option<(PciAddr, String)>> {
    if unopened.is_empty() {
        return Vec::new();
    }
    let smi: Vec<LostGpu> = from_nvidia_smi(nvidia_smi)
        .into_iter()
        .filter(|l| !opened.contains(&l.addr))
        .collect();
    let host: Vec<PciAddr> = host_gpus(root)
        .into_iter()
        .filter(|a| !opened.contains(a) && !smi.iter().any(|l| l.addr == *a))
        .collect();
    let mut smi_left = smi;
    let mut out: Vec<Option<(PciAddr, String)>> = unopened
        .iter()
        .map(|i| {
            // By index where nvidia-smi gave one, else in order.
            let pos = smi_left
                .iter()
                .position(|l| l.index == Some(*i))
                .or_else(|| smi_left.iter().position(|l| l.index.is_none()));
            pos.map(|p| {
                let l = smi_left.remove(p);
                (l.addr, format!("nvidia-smi: {}", l.line))
            })
        })
        .collect();
    // The host's list names the rest only when it is unambiguous: as many candidates as GPUs
    // left unnamed (a GPU bound to vfio-pci is on the PCI bus but not NVML's either).
    let unnamed = out.iter().filter(|o| o.is_none()).count();
    if unnamed > 0 && host.len() == unnamed {
        let mut host = host.into_iter();
        for o in out.iter_mut().filter(|o| o.is_none()) {
            *o = host.next().map(|a| {
                (
                    a,
                    "the NVIDIA GPU the host lists that NVML did not open".to_owned(),
                )
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(bus: u8) -> PciAddr {
        PciAddr {
            domain: 0,
            bus,
            device: 0,
        }
    }

    #[test]
    fn every_form_of_the_message_names_the_gpu() {
        let out = "0, 00000000:18:00.0\n\
            Unable to determine the device handle for GPU3: 0000:5D:00.0: GPU is lost. Reboot the system to recover this GPU\n\
            Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error\n\
            unable to determine the device handle for gpu 0000:01:00.0: Unknown Error\n\
            Unable to determine the device handle for GPU1: Unknown Error\n";
        let lost = parse_smi(out);
        let got: Vec<(Option<u32>, PciAddr)> = lost.iter().map(|l| (l.index, l.addr)).collect();
        assert_eq!(
            got,
            vec![
                (Some(3), addr(0x5d)),
                (None, addr(0xcb)),
                (None, addr(0x01))
            ]
        );
        assert!(lost[0].line.contains("GPU is lost"));
        assert!(parse_smi("GPU 0: NVIDIA H100 (UUID: GPU-1)").is_empty());
    }

    #[test]
    fn without_nvidia_smi_the_host_lists_the_candidates() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        for (a, vendor, class) in [
            ("0000:18:00.0", "0x10de", "0x030200"),
            ("0000:2a:00.0", "0x10de", "0x030200"),
            ("0000:2b:00.0", "0x10de", "0x068000"),
            ("0000:3a:00.0", "0x8086", "0x030000"),
        ] {
            let d = root.path(format!("/sys/bus/pci/devices/{a}"));
            std::fs::create_dir_all(&d)?;
            std::fs::write(d.join("vendor"), format!("{vendor}\n"))?;
            std::fs::write(d.join("class"), format!("{class}\n"))?;
        }
        assert_eq!(host_gpus(&root), vec![addr(0x18), addr(0x2a)]);
        // Two candidates for one unopened GPU: nothing is guessed.
        assert_eq!(
            name_unopened(&[1], &[], &dir.path().join("no-nvidia-smi"), &root),
            vec![None]
        );
        let named = name_unopened(
            &[1],
            &[addr(0x18)],
            &dir.path().join("no-nvidia-smi"),
            &root,
        );
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].as_ref().map(|(a, _)| *a), Some(addr(0x2a)));
        std::fs::create_dir_all(root.path("/proc/driver/nvidia/gpus/0000:9a:00.0"))?;
        assert_eq!(host_gpus(&root), vec![addr(0x9a)]);
        Ok(())
    }
}
