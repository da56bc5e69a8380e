//! `bcd sim`'s fault injection (`--fault-xid`, `--fault-fraction`, `--fault-after`, SIGUSR2):
//! a share of the simulated nodes reports an XID on its first GPU, through the same `xid` Event a
//! real agent's XID watch sends, and from then on answers the commands that look at a GPU as a
//! sick machine would: `diag.nvml` fails that GPU with the catalog's recovery action, a
//! `gpu.reset` heals it only when the catalog says a reset does (XID 48, 62, …) and otherwise
//! fails `RESET_NOT_VERIFIED` with its report, as the agent does. A simulated machine cannot
//! reboot (its boot id never changes), so a reboot-class fault (XID 79) stays, and the control
//! plane's verification of a `node.reboot` waits for a new boot id until its deadline: the
//! remediation stays open, which is what a breaker test wants to see.

use std::sync::atomic::{AtomicBool, Ordering};

use bc_protocol::commands::diag::{Check, CheckStatus, DiagReport, GpuReport};
use bc_protocol::commands::reset::{
    GpuResetResult, GpuSnapshot, ResetArgs, ResetReport, ResetTarget,
};
use bc_protocol::commands::xid::{RecommendedAction, XidClass, XidEvent, XidSource};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use serde_json::Value;

/// Which of a simulator's nodes fault: the first `round(fraction × nodes)` of them (node index
/// order, the hostnames' `-00000` suffix).
pub fn faulted_count(fraction: f64, nodes: usize) -> usize {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let n = (fraction.clamp(0.0, 1.0) * nodes as f64).round() as usize;
    n.min(nodes)
}

/// `--fault-fraction`'s value parser: a number from 0 to 1.
pub fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{f} is not a share of the nodes: give 0 to 1"))
    }
}

/// One simulated GPU: `GPU-…` and `0000:18:00.0`.
#[derive(Debug, Clone)]
pub struct SimGpu {
    pub uuid: String,
    pub pci_bus_id: String,
}

/// A node's injected fault: the XID on its first GPU, whether it was reported yet and whether a
/// reset healed it.
#[derive(Debug)]
pub struct NodeFault {
    /// The XID number.
    pub xid: u64,
    /// Reported on the session (the fault is live from then on).
    reported: AtomicBool,
    /// A `gpu.reset` of the GPU healed it (reset-class XIDs only).
    healed: AtomicBool,
}

impl NodeFault {
    /// A fault with XID `xid`, not reported yet.
    pub fn new(xid: u64) -> Self {
        Self {
            xid,
            reported: AtomicBool::new(false),
            healed: AtomicBool::new(false),
        }
    }

    /// Whether the GPU is sick now: reported and not healed.
    pub fn live(&self) -> bool {
        self.reported.load(Ordering::Relaxed) && !self.healed.load(Ordering::Relaxed)
    }

    /// Whether it was reported already.
    pub fn reported(&self) -> bool {
        self.reported.load(Ordering::Relaxed)
    }

    /// The XID event to send for `gpu` now; marks the fault reported.
    pub fn report(&self, gpu: &SimGpu) -> XidEvent {
        self.reported.store(true, Ordering::Relaxed);
        let class = XidClass::of(self.xid);
        XidEvent {
            xid: self.xid,
            pci_bus_id: Some(gpu.pci_bus_id.clone()),
            uuid: Some(gpu.uuid.clone()),
            class,
            action: class.action(),
            description: None,
            message: Some(format!(
                "NVRM: Xid (PCI:{}): {}, injected by bcd sim",
                gpu.pci_bus_id, self.xid
            )),
            pid: None,
            source: XidSource::Nvml,
            observed_at: chrono::Utc::now(),
            driver_message: false,
        }
    }

    fn action(&self) -> RecommendedAction {
        match XidClass::of(self.xid).action() {
            // An XID the catalog does not act on still made the GPU sick here: a person looks.
            RecommendedAction::None => RecommendedAction::Service,
            a => a,
        }
    }
}

fn check(status: CheckStatus, value: Value, action: RecommendedAction, detail: &str) -> Check {
    Check {
        name: "xid".to_owned(),
        status,
        value,
        threshold: None,
        unit: Some("count".to_owned()),
        detail: (!detail.is_empty()).then(|| detail.to_owned()),
        action,
    }
}

/// `diag.nvml` of a simulated machine with `gpus`: every GPU passes but the first while `fault`
/// is live, which fails with the XID's recovery action.
pub fn diag(gpus: &[SimGpu], name: &str, driver: &str, fault: Option<&NodeFault>) -> DiagReport {
    let sick = fault.filter(|f| f.live());
    let reports: Vec<GpuReport> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (status, action, c) = match sick {
                Some(f) if i == 0 => (
                    CheckStatus::Fail,
                    f.action(),
                    check(
                        CheckStatus::Fail,
                        Value::from(1),
                        f.action(),
                        &format!("Xid {} since the last reset", f.xid),
                    ),
                ),
                _ => (
                    CheckStatus::Pass,
                    RecommendedAction::None,
                    check(
                        CheckStatus::Pass,
                        Value::from(0),
                        RecommendedAction::None,
                        "",
                    ),
                ),
            };
            GpuReport {
                index: u32::try_from(i).unwrap_or(u32::MAX),
                uuid: g.uuid.clone(),
                pci_bus_id: g.pci_bus_id.clone(),
                name: name.to_owned(),
                checks: vec![c],
                verdict: status,
                action,
            }
        })
        .collect();
    let failing = reports
        .iter()
        .filter(|g| g.verdict == CheckStatus::Fail)
        .count();
    let action = reports
        .iter()
        .map(|g| g.action)
        .max()
        .unwrap_or(RecommendedAction::None);
    DiagReport {
        nvml_available: true,
        unavailable_reason: None,
        driver_version: Some(driver.to_owned()),
        nvml_version: Some(format!("12.{driver}")),
        node_checks: Vec::new(),
        verdict: if failing > 0 {
            CheckStatus::Fail
        } else {
            CheckStatus::Pass
        },
        action,
        summary: if failing > 0 {
            format!("{failing} of {} GPUs fail (simulated)", reports.len())
        } else {
            format!(
                "{} of {} GPUs pass (simulated)",
                reports.len(),
                reports.len()
            )
        },
        gpus: reports,
    }
}

fn snapshot(g: &SimGpu, action: &str) -> GpuSnapshot {
    GpuSnapshot {
        uuid: g.uuid.clone(),
        persistence_mode: true,
        volatile_corrected_ecc: Some(0),
        volatile_uncorrected_ecc: Some(0),
        recovery_action: Some(action.to_owned()),
    }
}

/// `gpu.reset` of a simulated machine: the GPUs `args` names are "reset"; a live fault on the
/// first GPU is healed when its XID is reset-class, and otherwise survives, failing the command
/// `RESET_NOT_VERIFIED` as the agent does.
pub fn reset(
    gpus: &[SimGpu],
    args: &Value,
    fault: Option<&NodeFault>,
) -> Result<Value, CommandFailure> {
    let args: ResetArgs = serde_json::from_value(args.clone()).map_err(|e| {
        CommandFailure::new(
            CommandErrorCode::InvalidArgument,
            format!("gpu.reset args: {e}"),
        )
    })?;
    let targets: Vec<(usize, &SimGpu)> = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| match &args.gpus {
            ResetTarget::All => true,
            ResetTarget::Gpus(ids) => ids.iter().any(|id| {
                id.eq_ignore_ascii_case(&g.uuid) || id.eq_ignore_ascii_case(&g.pci_bus_id)
            }),
        })
        .collect();
    if targets.is_empty() {
        return Err(CommandFailure::new(
            CommandErrorCode::InvalidArgument,
            format!(
                "gpu.reset: no GPU of this simulated node matches {:?}",
                args.gpus
            ),
        ));
    }
    let sick = fault.filter(|f| f.live());
    let mut results = Vec::new();
    for (i, g) in targets {
        let mut problems = Vec::new();
        let mut before = "none";
        if let Some(f) = sick.filter(|_| i == 0) {
            before = "gpuReset";
            if f.action() == RecommendedAction::ResetGpu {
                f.healed.store(true, Ordering::Relaxed);
            } else {
                problems.push(format!(
                    "Xid {} survives a reset: recovery action {}",
                    f.xid,
                    f.action().as_str()
                ));
            }
        }
        results.push(GpuResetResult {
            pci_bus_id: g.pci_bus_id.clone(),
            requested: true,
            before: snapshot(g, before),
            after: Some(snapshot(
                g,
                if problems.is_empty() { "none" } else { before },
            )),
            persistence_mode_restored: Some(true),
            problems,
        });
    }
    let verified = results.iter().all(|r| r.problems.is_empty());
    let report = ResetReport {
        gpus: results,
        nvidia_smi_output: "simulated reset".to_owned(),
        verified,
    };
    if verified {
        Ok(serde_json::to_value(&report).unwrap_or_default())
    } else {
        Err(CommandFailure::new(
            CommandErrorCode::ResetNotVerified,
            format!(
                "the reset did not clear the fault: {}",
                serde_json::to_string(&report).unwrap_or_default()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn gpus() -> Vec<SimGpu> {
        (0..2)
            .map(|i| SimGpu {
                uuid: format!("GPU-{i}"),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + i * 0x10),
            })
            .collect()
    }

    #[test]
    fn the_faulted_share_is_rounded_and_bounded() {
        assert_eq!(faulted_count(0.3, 100), 30);
        assert_eq!(faulted_count(0.3, 1000), 300);
        assert_eq!(faulted_count(0.0, 10), 0);
        assert_eq!(faulted_count(1.0, 7), 7);
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("x").is_err());
        assert_eq!(parse_fraction("0.25"), Ok(0.25));
    }

    #[test]
    fn a_reset_class_xid_fails_diag_until_a_reset_heals_it() {
        let g = gpus();
        let f = NodeFault::new(48);
        // Not reported yet: the machine is healthy.
        assert_eq!(diag(&g, "H100", "550", Some(&f)).verdict, CheckStatus::Pass);
        let ev = f.report(&g[0]);
        assert_eq!((ev.xid, ev.action), (48, RecommendedAction::ResetGpu));
        let d = diag(&g, "H100", "550", Some(&f));
        assert_eq!(
            (d.verdict, d.action),
            (CheckStatus::Fail, RecommendedAction::ResetGpu)
        );
        assert_eq!(d.gpus[1].verdict, CheckStatus::Pass);
        // A reset of the other GPU changes nothing.
        reset(&g, &json!({"gpus": [g[1].pci_bus_id]}), Some(&f)).unwrap_or_default();
        assert!(f.live());
        let r = reset(&g, &json!({"gpus": [g[0].pci_bus_id]}), Some(&f));
        assert!(r.is_ok(), "{r:?}");
        assert!(!f.live());
        assert_eq!(diag(&g, "H100", "550", Some(&f)).verdict, CheckStatus::Pass);
    }

    #[test]
    fn a_reboot_class_xid_survives_a_reset() {
        let g = gpus();
        let f = NodeFault::new(79);
        f.report(&g[0]);
        let r = reset(&g, &json!({"gpus": "all"}), Some(&f));
        assert_eq!(
            r.err().map(|e| e.code),
            Some(CommandErrorCode::ResetNotVerified)
        );
        let d = diag(&g, "H100", "550", Some(&f));
        assert_eq!(d.action, RecommendedAction::RebootNode);
    }
}
