//! What the fake `nvidia-smi -r -i <ids>` does to the fake's state, and what its queries
//! (`-L`, `--query-gpu=... --format=csv`) print.
//!
//! Like the real tool it refuses when any target GPU is held open: by a compute process, by
//! persistence mode (`nvidia-persistenced` keeps the device file open), or by another process with
//! NVML initialized (a monitoring agent). Then it resets every
//! target: volatile ECC counters, queued XIDs and the recovery action are cleared, and pending
//! page retirements and row remaps are applied. Messages follow the real tool's wording. A lost
//! GPU (fell off the bus) gets the real tool's "Unable to determine the device handle for GPU<i>:
//! <bus id>: GPU is lost. Reboot the system to recover this GPU" wherever it is named, and exit
//! status 15.

use crate::config::{FakeConfig, FakeGpu, LostError, parse_bus_id};

/// Exit status the real `nvidia-smi` uses for a failed reset ("other error").
pub const EXIT_RESET_FAILED: i32 = 255;
/// Exit status for a bad `-i` value (`NVML_ERROR_INVALID_ARGUMENT`).
pub const EXIT_INVALID_ARGUMENT: i32 = 2;
/// Exit status when a GPU "has fallen off the bus or has otherwise become inaccessible"
/// (`NVML_ERROR_GPU_IS_LOST`; nvidia-smi(1), RETURN VALUE).
pub const EXIT_GPU_IS_LOST: i32 = 15;

/// Exit status of older drivers' tool for a lost GPU, whose handle fails with
/// `NVML_ERROR_UNKNOWN` ("other error").
pub const EXIT_UNKNOWN: i32 = 255;

/// The line the real tool prints for the lost GPU `g` at `index`: current drivers (handle fails
/// with `GPU_IS_LOST`) name the index and the bus id; older ones (`NVML_ERROR_UNKNOWN`) only the
/// bus id, with "Unknown Error".
pub fn lost_line(index: usize, g: &FakeGpu) -> String {
    let bus = match parse_bus_id(&g.pci_bus_id) {
        Some((d, b, v, f)) => format!("{d:04X}:{b:02X}:{v:02X}.{f:X}"),
        None => g.pci_bus_id.clone(),
    };
    match g.lost_error {
        LostError::GpuIsLost => format!(
            "Unable to determine the device handle for GPU{index}: {bus}: GPU is lost. Reboot the system to recover this GPU\n"
        ),
        LostError::Unknown => {
            format!("Unable to determine the device handle for GPU{bus}: Unknown Error\n")
        }
    }
}

/// The exit status for the lost GPU `g`.
fn lost_exit(g: &FakeGpu) -> i32 {
    match g.lost_error {
        LostError::GpuIsLost => EXIT_GPU_IS_LOST,
        LostError::Unknown => EXIT_UNKNOWN,
    }
}

/// What a query prints and the exit status: one line per GPU in index order (`-L`: `GPU <i>:
/// <name> (UUID: <uuid>)` and its MIG devices; `--query-gpu`: the CSV `fields`), a lost GPU's
/// line in place of its own.
pub fn query(cfg: &FakeConfig, fields: Option<&[String]>, header: bool) -> (String, i32) {
    let mut out = String::new();
    let mut code = 0;
    if let (Some(f), true) = (fields, header) {
        out.push_str(&f.join(", "));
        out.push('\n');
    }
    for (i, g) in cfg.gpus.iter().enumerate() {
        if g.lost {
            out.push_str(&lost_line(i, g));
            code = lost_exit(g);
            continue;
        }
        let Some(fields) = fields else {
            out.push_str(&format!("GPU {i}: {} (UUID: {})\n", g.name, g.uuid));
            if g.mig_mode == Some(true) {
                for (m, d) in g.mig_devices.iter().enumerate() {
                    out.push_str(&format!(
                        "  {}  Device {m:>2}: (UUID: {})\n",
                        d.name, d.uuid
                    ));
                }
            }
            continue;
        };
        let row: Vec<String> = fields
            .iter()
            .map(|f| match f.as_str() {
                "index" => i.to_string(),
                "pci.bus_id" => long_bus_id(&g.pci_bus_id),
                "uuid" => g.uuid.clone(),
                "name" => g.name.clone(),
                "mig.mode.current" => match g.mig_mode {
                    Some(true) => "Enabled".into(),
                    Some(false) => "Disabled".into(),
                    None => "[N/A]".into(),
                },
                _ => "[N/A]".into(),
            })
            .collect();
        out.push_str(&row.join(", "));
        out.push('\n');
    }
    (out, code)
}

/// A failed `nvidia-smi -r`: exit status and the text printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiFailure {
    /// Process exit status.
    pub exit_code: i32,
    /// What the tool prints.
    pub message: String,
}

/// `00000000:1A:00.0`, the long form nvidia-smi prints.
pub fn long_bus_id(bus_id: &str) -> String {
    match parse_bus_id(bus_id) {
        Some((d, b, v, f)) => format!("{d:08X}:{b:02X}:{v:02X}.{f:X}"),
        None => bus_id.to_owned(),
    }
}

/// Resets the GPUs named by `ids` (`-i` values: bus ids, UUIDs or indices) in `cfg`; returns the
/// success text.
pub fn gpu_reset(cfg: &mut FakeConfig, ids: &[String]) -> Result<String, SmiFailure> {
    let mut targets = Vec::new();
    for id in ids {
        match cfg.find_gpu(id) {
            Some(i) => targets.push(i),
            None => {
                return Err(SmiFailure {
                    exit_code: EXIT_INVALID_ARGUMENT,
                    message: format!("No devices were found matching the identifier {id}.\n"),
                });
            }
        }
    }
    let lost: Vec<usize> = targets
        .iter()
        .copied()
        .filter(|i| cfg.gpus[*i].lost)
        .collect();
    if let Some(first) = lost.first() {
        return Err(SmiFailure {
            exit_code: lost_exit(&cfg.gpus[*first]),
            message: lost.iter().map(|i| lost_line(*i, &cfg.gpus[*i])).collect(),
        });
    }
    let mut busy = Vec::new();
    for &i in &targets {
        let g = &cfg.gpus[i];
        if !g.processes.is_empty() || g.persistence_mode || cfg.nvml_clients > 0 {
            busy.push(format!(
                "  GPU {}: In use by another client\n",
                long_bus_id(&g.pci_bus_id)
            ));
        } else if g.reset_fails {
            busy.push(format!(
                "  GPU {}: Unknown Error\n",
                long_bus_id(&g.pci_bus_id)
            ));
        }
    }
    if !busy.is_empty() {
        return Err(SmiFailure {
            exit_code: EXIT_RESET_FAILED,
            message: format!(
                "The following GPUs could not be reset:\n{}\n{} device is currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics application such as an X server, or a monitoring application such as another instance of nvidia-smi). Please first kill all processes using this device and all compute applications running in the system.\n",
                busy.concat(),
                busy.len()
            ),
        });
    }
    let mut out = String::new();
    for &i in &targets {
        let g = &mut cfg.gpus[i];
        g.ecc.volatile_corrected = 0;
        g.ecc.volatile_uncorrected = 0;
        g.xid_events.clear();
        g.recovery_action = 0;
        g.retired_pages.pending = false;
        g.remapped_rows.pending = false;
        g.reset_count += 1;
        out.push_str(&format!(
            "GPU {} was successfully reset.\n",
            long_bus_id(&g.pci_bus_id)
        ));
    }
    out.push_str("All done.\n");
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{FakeGpu, FakeProcess};

    fn node() -> FakeConfig {
        FakeConfig {
            gpus: vec![FakeGpu {
                uuid: "GPU-a".into(),
                pci_bus_id: "0000:1A:00.0".into(),
                persistence_mode: false,
                recovery_action: 1,
                xid_events: vec![crate::config::QueuedXid::Number(95)],
                ..FakeGpu::default()
            }],
            ..FakeConfig::default()
        }
    }

    #[test]
    fn reset_clears_volatile_state() {
        let mut cfg = node();
        cfg.gpus[0].ecc.volatile_uncorrected = 3;
        cfg.gpus[0].ecc.aggregate_uncorrected = 3;
        let out = gpu_reset(&mut cfg, &["0000:1a:00.0".into()]).unwrap();
        assert!(out.contains("GPU 00000000:1A:00.0 was successfully reset."));
        let g = &cfg.gpus[0];
        assert_eq!(
            (g.ecc.volatile_uncorrected, g.recovery_action, g.reset_count),
            (0, 0, 1)
        );
        assert_eq!(g.ecc.aggregate_uncorrected, 3);
        assert!(g.xid_events.is_empty());
    }

    #[test]
    fn busy_or_persistent_gpus_are_refused_unchanged() {
        let mut cfg = node();
        cfg.gpus[0].processes.push(FakeProcess {
            pid: 4242,
            used_memory_bytes: 1,
        });
        let before = cfg.clone();
        let err = gpu_reset(&mut cfg, &["GPU-a".into()]).unwrap_err();
        assert_eq!(err.exit_code, EXIT_RESET_FAILED);
        assert!(err.message.contains("In use by another client"));
        assert_eq!(cfg, before);

        let mut cfg = node();
        cfg.gpus[0].persistence_mode = true;
        assert!(gpu_reset(&mut cfg, &["0".into()]).is_err());
    }

    #[test]
    fn a_lost_gpu_is_named_with_the_real_tools_words() {
        let mut cfg = node();
        cfg.gpus.push(FakeGpu {
            uuid: "GPU-b".into(),
            pci_bus_id: "0000:5D:00.0".into(),
            lost: true,
            ..FakeGpu::default()
        });
        let fields = ["index".to_owned(), "pci.bus_id".to_owned()];
        let (out, code) = query(&cfg, Some(&fields), false);
        assert_eq!(code, EXIT_GPU_IS_LOST);
        assert_eq!(
            out,
            "0, 00000000:1A:00.0\nUnable to determine the device handle for GPU1: 0000:5D:00.0: GPU is lost. Reboot the system to recover this GPU\n"
        );
        let (out, _) = query(&cfg, None, false);
        assert!(
            out.starts_with("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\n"),
            "{out}"
        );
        let err = gpu_reset(&mut cfg, &["GPU-b".into()]).unwrap_err();
        assert_eq!(err.exit_code, EXIT_GPU_IS_LOST);
        assert!(
            err.message
                .contains("Unable to determine the device handle for GPU1")
        );
    }

    #[test]
    fn unknown_ids_are_invalid_arguments() {
        let err = gpu_reset(&mut node(), &["0000:99:00.0".into()]).unwrap_err();
        assert_eq!(err.exit_code, EXIT_INVALID_ARGUMENT);
    }
}
