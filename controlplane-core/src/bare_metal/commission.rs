//! Commissioning (issue 15): after inspection, the machine in the ramdisk is checked against its
//! pool's hardware profile, each step an event with its result, the verdict the `Commissioned`
//! condition; all pass → `ready`, a failure → `failed` (failedFrom `commissioning`, maintenance
//! on) naming the step and the value.
//!
//! # Design
//! The steps the inspection's inventory decides run in the report's transaction (`begin`):
//! - `gpuCount`, `gpuModel`: the profile conditions (`GpuCountMismatch`, `GpuModelMismatch`);
//! - `memory`: installed memory (the DIMMs' total, else `MemTotal` with 5 % allowed) against
//!   `hardwareProfile.minMemoryBytes`;
//! - `cpuModel`, `cpuThreads`: `/proc/cpuinfo`'s model and logical CPUs against
//!   `expectedCpuModel` and `minCpuThreads`;
//! - `nicLinks`: physical NICs whose carrier is up against `minLinkedNics`;
//! - `diskHealth`: every disk's health log (NVMe SMART / Health Information, ATA SMART, SCSI
//!   Informational Exceptions) — a critical warning, a media error, a failed SMART verdict or
//!   an offline uncorrectable sector fails it;
//! - `hardwareKey`: the key is trusted (two independent identifiers).
//!
//! A profile that expects GPUs adds `gpuDiag`: the controller sends `diag.nvml` (with the
//! profile's count and model) to the ramdisk, and its result decides (`finished`).
//! A step the profile does not ask for is skipped, and says so.

use std::time::Duration;

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::diag::{CheckStatus, DiagArgs, DiagReport, ExpectedGpus};
use bc_protocol::{ConditionStatus, ProvisionState};
use cpl_store::{BootRecord, CommandRecord, CommandState, NodeRecord, Pool, Tx};
use serde_json::Value;

use super::boot::OWNER;
use super::workflow::{Deadline, Ramdisk, Turn, Workflow};
use crate::edit::Edit;
use crate::error::OpError;
use crate::ops::nodes::apply_transition;

/// The condition commissioning writes.
pub const COMMISSIONED: &str = "Commissioned";
/// Default of `acceptance.commissioningDeadlineSeconds`.
pub const DEFAULT_COMMISSIONING_DEADLINE: Duration = Duration::from_secs(3600);

/// `commissioning`: the inventory's steps in the report's transaction, then `gpuDiag`
/// (`diag.nvml` in the ramdisk) when the profile expects GPUs.
pub const WORKFLOW: Workflow = Workflow {
    state: ProvisionState::Commissioning,
    condition: COMMISSIONED,
    steps: Some("commissioningStep"),
    deadline: Deadline::Pool {
        seconds: |a| a.commissioning_deadline_seconds,
        default: DEFAULT_COMMISSIONING_DEADLINE,
    },
    ramdisk: Some(Ramdisk {
        // The one import back into `inspect` (which hands its machine to `begin`): a boot that
        // begins in commissioning (`nodes.recover`) is the inspection's boot again, so its
        // failed power-on reports in the inspection's condition.
        power_on_condition: super::inspect::INSPECTED,
        open_ended_after: None,
        on_report,
        next,
        finished,
        overdue: |_, secs| {
            (
                "CommissioningDeadline",
                format!("commissioning did not finish within {secs}s"),
            )
        },
    }),
    abort: super::workflow::boot_commands,
};

/// One step's verdict: `Ok(detail)` passed (or was skipped, saying so), `Err(detail)` failed.
pub type Step = (&'static str, Result<String, String>);

fn condition(edit: &mut Edit, status: ConditionStatus, reason: &str, msg: String) {
    WORKFLOW.condition(edit, status, reason, msg);
}

/// Whether the pool's profile expects GPUs (and so a `gpuDiag` step in the ramdisk).
pub fn needs_gpu_diag(pool: Option<&Pool>) -> bool {
    pool.and_then(|p| p.hardware_profile.expected_gpu_count)
        .is_some_and(|n| n > 0)
}

const SKIPPED: &str = "skipped: the pool's hardware profile sets none";

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30))
}

fn memory_step(inv: &Value, min: Option<u64>) -> Result<String, String> {
    let Some(min) = min else {
        return Ok(SKIPPED.to_owned());
    };
    let mem = &inv["memory"];
    if let Some(dimms) = mem["dimmTotalBytes"].as_u64() {
        return if dimms >= min {
            Ok(format!(
                "{} installed (DIMMs), at least {}",
                gib(dimms),
                gib(min)
            ))
        } else {
            Err(format!(
                "{} installed (DIMMs), the profile needs at least {}",
                gib(dimms),
                gib(min)
            ))
        };
    }
    let total = mem["totalBytes"].as_u64().unwrap_or(0);
    // MemTotal is what is left after firmware and kernel reservations.
    let floor = min - min / 20;
    if total >= floor {
        Ok(format!(
            "{} usable (MemTotal; no DIMM table), at least 95 % of {}",
            gib(total),
            gib(min)
        ))
    } else {
        Err(format!(
            "{} usable (MemTotal; no DIMM table), the profile needs at least {}",
            gib(total),
            gib(min)
        ))
    }
}

fn cpu_steps(inv: &Value, model: Option<&str>, threads: Option<u32>) -> [Step; 2] {
    let cpu = &inv["cpu"];
    let have_model = cpu["model"].as_str().unwrap_or("");
    let m = match model {
        None => Ok(SKIPPED.to_owned()),
        Some(want) if have_model == want => Ok(have_model.to_owned()),
        Some(want) => Err(format!("{have_model:?}, the profile expects {want:?}")),
    };
    let have = cpu["threads"].as_u64().unwrap_or(0);
    let t = match threads {
        None => Ok(SKIPPED.to_owned()),
        Some(min) if have >= u64::from(min) => Ok(format!("{have} logical CPUs, at least {min}")),
        Some(min) => Err(format!(
            "{have} logical CPUs, the profile needs at least {min}"
        )),
    };
    [("cpuModel", m), ("cpuThreads", t)]
}

fn nic_step(inv: &Value, min: Option<u32>) -> Result<String, String> {
    let Some(min) = min else {
        return Ok(SKIPPED.to_owned());
    };
    let nics = inv["nics"].as_array().cloned().unwrap_or_default();
    let physical: Vec<&Value> = nics.iter().filter(|n| n["physical"] == true).collect();
    let up: Vec<&str> = physical
        .iter()
        .filter(|n| n["link"] == true)
        .filter_map(|n| n["name"].as_str())
        .collect();
    let down: Vec<&str> = physical
        .iter()
        .filter(|n| n["link"] != true)
        .filter_map(|n| n["name"].as_str())
        .collect();
    let detail = format!(
        "link up: {}; down or unknown: {}",
        if up.is_empty() {
            "none".into()
        } else {
            up.join(", ")
        },
        if down.is_empty() {
            "none".into()
        } else {
            down.join(", ")
        }
    );
    if up.len() >= min as usize {
        Ok(detail)
    } else {
        Err(format!("{} of at least {min} NICs up ({detail})", up.len()))
    }
}

fn disk_step(inv: &Value) -> Result<String, String> {
    let disks = inv["disks"].as_array().cloned().unwrap_or_default();
    let mut bad = Vec::new();
    let (mut checked, mut without) = (0, Vec::new());
    for d in &disks {
        let name = d["name"].as_str().unwrap_or("?");
        let h = &d["health"];
        if !h.is_object() {
            without.push(name.to_owned());
            continue;
        }
        checked += 1;
        let warn = h["criticalWarning"].as_u64().unwrap_or(0);
        if warn != 0 {
            let names: Vec<&str> = h["criticalWarnings"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            bad.push(format!(
                "{name}: critical warning {warn:#04x} ({})",
                names.join(", ")
            ));
        }
        if let Some(e) = h["mediaErrors"].as_u64().filter(|e| *e > 0) {
            bad.push(format!("{name}: {e} media error(s)"));
        }
        // SATA (ATA SMART RETURN STATUS) and SAS (Informational Exceptions): the drive's verdict.
        if h["smartPassed"].as_bool() == Some(false) {
            bad.push(format!("{name}: SMART health check failed"));
        }
        if let Some(u) = h["uncorrectableSectors"].as_u64().filter(|u| *u > 0) {
            bad.push(format!("{name}: {u} offline uncorrectable sector(s)"));
        }
    }
    if !bad.is_empty() {
        return Err(bad.join("; "));
    }
    Ok(match (checked, without.is_empty()) {
        (0, true) => "no disks".to_owned(),
        (n, true) => format!("{n} disk(s) healthy"),
        (n, false) => format!(
            "{n} disk(s) healthy; no health log from {}",
            without.join(", ")
        ),
    })
}

/// The steps the inventory decides, for `node` (profile conditions refreshed) in `pool`.
pub fn inventory_steps(node: &NodeRecord, pool: Option<&Pool>) -> Vec<Step> {
    let inv: Value = node
        .inventory_json
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or(Value::Null);
    let profile = pool.map(|p| &p.hardware_profile);
    let cond = |t: &str| node.conditions.iter().find(|c| c.type_ == t);
    let mut out: Vec<Step> = Vec::new();
    for (step, type_, expected) in [
        (
            "gpuCount",
            "GpuCountMismatch",
            profile
                .and_then(|p| p.expected_gpu_count)
                .map(|n| n.to_string()),
        ),
        (
            "gpuModel",
            "GpuModelMismatch",
            profile.and_then(|p| p.expected_gpu_model.clone()),
        ),
    ] {
        let Some(expected) = expected else {
            out.push((step, Ok(SKIPPED.to_owned())));
            continue;
        };
        out.push((
            step,
            match cond(type_) {
                Some(c) if c.status != ConditionStatus::False => Err(c.message.clone()),
                _ => Ok(format!("{expected} as the profile expects")),
            },
        ));
    }
    out.push((
        "memory",
        memory_step(&inv, profile.and_then(|p| p.min_memory_bytes)),
    ));
    out.extend(cpu_steps(
        &inv,
        profile.and_then(|p| p.expected_cpu_model.as_deref()),
        profile.and_then(|p| p.min_cpu_threads),
    ));
    out.push((
        "nicLinks",
        nic_step(&inv, profile.and_then(|p| p.min_linked_nics)),
    ));
    out.push(("diskHealth", disk_step(&inv)));
    out.push((
        "hardwareKey",
        if node.hardware_key_trusted {
            Ok("trusted (at least two independent identifiers)".to_owned())
        } else {
            Err(cond("HardwareKeyTrusted")
                .map_or_else(|| "no hardware key".to_owned(), |c| c.message.clone()))
        },
    ));
    out
}

/// Records `results` as `commissioningStep` events; returns the failed ones.
fn record(edit: &mut Edit, results: &[Step]) -> Vec<String> {
    let mut failed = Vec::new();
    for (step, r) in results {
        let (to, msg) = match r {
            Ok(d) => ("passed", format!("{step}: {d}")),
            Err(d) => {
                failed.push(format!("{step}: {d}"));
                ("failed", format!("{step}: {d}"))
            }
        };
        WORKFLOW.step(edit, to, msg);
    }
    failed
}

fn fail(edit: &mut Edit, failed: &[String]) -> Result<(), OpError> {
    let why = format!("commissioning failed: {}", failed.join("; "));
    condition(edit, ConditionStatus::False, "StepFailed", why.clone());
    apply_transition(edit, ProvisionState::Failed, &why)
}

fn pass(edit: &mut Edit, message: String) -> Result<(), OpError> {
    condition(edit, ConditionStatus::True, "AllStepsPassed", message);
    apply_transition(edit, ProvisionState::Ready, "commissioning passed")
}

/// `inspecting -> commissioning` in `edit` (boot `b` moves with it), then the inventory's steps
/// ([`run_steps`]).
pub(crate) fn begin(tx: &Tx<'_>, edit: &mut Edit, b: &mut BootRecord) -> Result<(), OpError> {
    apply_transition(
        edit,
        ProvisionState::Commissioning,
        "inspection done: the machine is the one its BMC described",
    )?;
    b.purpose = ProvisionState::Commissioning;
    b.phase_started_at = edit.now();
    run_steps(tx, edit, b)
}

/// The inventory's steps on a node in `commissioning` (boot `b` records that they ran): `ready`,
/// `failed`, or still `commissioning` waiting for `gpuDiag`.
pub(crate) fn run_steps(tx: &Tx<'_>, edit: &mut Edit, b: &mut BootRecord) -> Result<(), OpError> {
    b.steps_at = Some(edit.now());
    tx.put_boot(b)?;
    let pool = match &edit.node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    };
    let results = inventory_steps(&edit.node, pool.as_ref());
    let failed = record(edit, &results);
    if !failed.is_empty() {
        return fail(edit, &failed);
    }
    if needs_gpu_diag(pool.as_ref()) {
        condition(
            edit,
            ConditionStatus::Unknown,
            "Running",
            format!(
                "{} step(s) passed; gpuDiag (diag.nvml in the ramdisk) runs next",
                results.len()
            ),
        );
        return Ok(());
    }
    pass(edit, format!("{} step(s) passed", results.len()))
}

/// After a clean release (issue 16): the inventory's steps once more on the ramdisk's report →
/// `ready`, or `failed` naming the step. `gpuDiag` is not re-run.
pub(crate) fn recheck(tx: &Tx<'_>, edit: &mut Edit, cleaned: &str) -> Result<(), OpError> {
    let pool = match &edit.node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    };
    let results = inventory_steps(&edit.node, pool.as_ref());
    let failed = record(edit, &results);
    if !failed.is_empty() {
        return fail(edit, &failed);
    }
    condition(
        edit,
        ConditionStatus::True,
        "AllStepsPassed",
        format!(
            "{} step(s) passed again after the release's cleaning",
            results.len()
        ),
    );
    apply_transition(
        edit,
        ProvisionState::Ready,
        &format!("released: {cleaned}; commissioning's checks passed again"),
    )
}

/// A boot that began in `commissioning` (`nodes.recover`): its first report runs the steps.
fn on_report(tx: &Tx<'_>, edit: &mut Edit, b: &mut BootRecord) -> Result<(), OpError> {
    if b.steps_at.is_none() {
        edit.act_as(OWNER);
        run_steps(tx, edit, b)?;
    }
    Ok(())
}

/// The `diag.nvml` arguments of `pool`'s profile.
pub fn diag_args(pool: Option<&Pool>) -> DiagArgs {
    let p = pool.map(|p| &p.hardware_profile);
    DiagArgs {
        expected_gpus: Some(ExpectedGpus {
            count: p.and_then(|p| p.expected_gpu_count).unwrap_or(0),
            name: p.and_then(|p| p.expected_gpu_model.clone()),
        }),
        expected_nvlinks_per_gpu: p.and_then(|p| p.expected_nvlinks_per_gpu),
    }
}

/// `gpuDiag` is due once the inventory's steps ran, when the profile expects GPUs, not sent
/// yet, and the ramdisk's session is live.
fn next(tx: &Tx<'_>, t: &mut Turn<'_>) -> Result<Option<String>, OpError> {
    let due = t.boot.steps_at.is_some()
        && t.boot.diag_command_id.is_none()
        && needs_gpu_diag(t.pool)
        && t.live;
    if !due {
        return Ok(None);
    }
    let id = queue_diag(tx, &t.boot.node_id, t.pool, t.timeout)?;
    t.boot.diag_command_id = Some(id);
    tx.put_boot(t.boot)?;
    Ok(Some(t.boot.node_id.clone()))
}

/// Queues commissioning's `diag.nvml` for the ramdisk of `node_id` (the profile's GPU count
/// and model as its arguments), with a `commissioningStep` event; returns the command's id.
pub(crate) fn queue_diag(
    tx: &Tx<'_>,
    node_id: &str,
    pool: Option<&Pool>,
    timeout_ms: i64,
) -> Result<String, OpError> {
    let now = cpl_store::now_ms();
    let args = CommandArgs::DiagNvml(diag_args(pool));
    let rec = super::workflow::send_to_ramdisk(tx, node_id, args, now, timeout_ms)?;
    let mut edit = Edit::report(tx, node_id, OWNER)?;
    WORKFLOW.step(
        &mut edit,
        "running",
        format!("gpuDiag: diag.nvml ({}) sent to the ramdisk", rec.id),
    );
    edit.save(tx)?;
    Ok(rec.id)
}

/// The boot's `diag.nvml` (`gpuDiag`) is over: its verdict decides (in the transaction that
/// ended it).
fn finished(
    tx: &Tx<'_>,
    cmd: &CommandRecord,
    _: BootRecord,
    mut edit: Edit,
) -> Result<(), OpError> {
    let verdict: Result<String, String> = match (cmd.state, cmd.result.as_ref()) {
        (CommandState::Succeeded, Some(r)) => match serde_json::from_value::<DiagReport>(r.clone())
        {
            Ok(rep) if !rep.nvml_available => Err(format!(
                "NVML unavailable in the ramdisk: {}",
                rep.unavailable_reason.unwrap_or_default()
            )),
            Ok(rep) if rep.verdict == CheckStatus::Fail => Err(rep.summary),
            Ok(rep) => Ok(rep.summary),
            Err(e) => Err(format!("the diag.nvml result does not parse: {e}")),
        },
        (CommandState::Succeeded, None) => Err("diag.nvml returned no report".to_owned()),
        (state, _) => Err(format!(
            "diag.nvml {}: {}: {}",
            state.as_str(),
            cmd.error_code.as_deref().unwrap_or(""),
            cmd.error_message.as_deref().unwrap_or("")
        )),
    };
    let failed = record(&mut edit, &[("gpuDiag", verdict)]);
    if failed.is_empty() {
        pass(
            &mut edit,
            "every step passed, gpuDiag (diag.nvml in the ramdisk) last".to_owned(),
        )?;
    } else {
        fail(&mut edit, &failed)?;
    }
    edit.save(tx)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn memory_prefers_the_dimms_and_allows_five_percent_off_memtotal() {
        let gib = 1u64 << 30;
        let dimms = json!({"memory": {"totalBytes": 60 * gib, "dimmTotalBytes": 64 * gib}});
        assert!(memory_step(&dimms, Some(64 * gib)).is_ok());
        assert!(
            memory_step(&dimms, Some(96 * gib))
                .unwrap_err()
                .contains("DIMMs")
        );
        let kernel = json!({"memory": {"totalBytes": 62 * gib}});
        assert!(memory_step(&kernel, Some(64 * gib)).is_ok());
        assert!(memory_step(&kernel, Some(128 * gib)).is_err());
        assert_eq!(memory_step(&kernel, None), Ok(SKIPPED.to_owned()));
    }

    #[test]
    fn cpu_nic_and_disk_steps_name_what_failed() {
        let inv = json!({
            "cpu": {"model": "QEMU Virtual CPU version 2.5+", "threads": 2},
            "nics": [
                {"name": "eth0", "physical": true, "link": true},
                {"name": "eth1", "physical": true, "link": false},
                {"name": "lo", "physical": false, "link": true}
            ],
            "disks": [
                {"name": "nvme0n1", "health": {"criticalWarning": 0, "mediaErrors": 0}},
                {"name": "nvme1n1", "health": {"criticalWarning": 4, "criticalWarnings": ["reliabilityDegraded"], "mediaErrors": 3}},
                {"name": "vda"}
            ]
        });
        let [m, t] = cpu_steps(&inv, Some("QEMU Virtual CPU version 2.5+"), Some(4));
        assert!(m.1.is_ok());
        assert_eq!(
            t.1,
            Err("2 logical CPUs, the profile needs at least 4".to_owned())
        );
        assert!(nic_step(&inv, Some(1)).is_ok());
        let e = nic_step(&inv, Some(2)).unwrap_err();
        assert!(e.contains("1 of at least 2") && e.contains("eth1"), "{e}");
        let d = disk_step(&inv).unwrap_err();
        assert!(
            d.contains("nvme1n1: critical warning 0x04 (reliabilityDegraded)")
                && d.contains("nvme1n1: 3 media error(s)")
                && !d.contains("nvme0n1"),
            "{d}"
        );
        let sata = json!({"disks": [
            {"name": "sda", "health": {"source": "ata-smart", "smartPassed": false}},
            {"name": "sdb", "health": {"source": "ata-smart", "smartPassed": true, "uncorrectableSectors": 3}},
            {"name": "sdc", "health": {"source": "ata-smart", "smartPassed": true, "uncorrectableSectors": 0}}
        ]});
        let e = disk_step(&sata).err().unwrap_or_default();
        assert!(e.contains("sda: SMART health check failed"), "{e}");
        assert!(e.contains("sdb: 3 offline uncorrectable sector(s)"), "{e}");
        assert!(!e.contains("sdc"), "{e}");
        let healthy = json!({"disks": [{"name": "nvme0n1", "health": {"criticalWarning": 0}}, {"name": "vda"}]});
        assert_eq!(
            disk_step(&healthy),
            Ok("1 disk(s) healthy; no health log from vda".to_owned())
        );
    }
}
