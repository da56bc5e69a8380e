//! The node agent's [`Machine`]: the real host under its [`HostRoot`] — the hardware key and
//! inventory from `bcd-probes`, GPUs from NVML, the converge state's observed generation, and
//! every command the agent serves.

use std::path::PathBuf;
use std::sync::Arc;

use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb::{HardwareIdentity, Inventory};
use bc_protocol::{CommandName, Mode};
use bcd_core::executor::{CommandRun, blocking, to_result};
use bcd_core::mode::Machine;
use bcd_core::ops::OpsConfig;
use bcd_probes::hostroot::HostRoot;
use bcd_probes::nvml::{DiagArgs, NvmlConfig, ResetArgs};
use serde_json::Value;

/// The host the node agent runs on.
#[derive(Debug)]
pub struct NodeMachine {
    /// Where `/sys`, `/proc`, `/dev`, `/etc` are.
    pub root: HostRoot,
    /// The state dir (the converge state in it gives the observed generation).
    pub state_dir: PathBuf,
    /// This boot's id, read once at start.
    pub boot_id: String,
    /// Where NVML and `nvidia-smi` are (diag.nvml, gpu.reset, GPU inventory).
    pub nvml: NvmlConfig,
    /// node.reboot and logs.collect settings.
    pub ops: OpsConfig,
    /// The LLDP listener whose neighbours every inventory carries; `None` with `lldp = false`
    /// or under a root prefix other than `/`.
    pub lldp: Option<Arc<bcd_probes::inventory::lldp::Watcher>>,
}

impl NodeMachine {
    /// The machine's inventory and hardware identity as the `Inventory` message
    /// ([`bcd_probes::inventory::message`]: GPUs through NVML when it is there, the LLDP
    /// neighbours `lldp` holds), timed for the agent's metrics.
    fn collect_inventory(
        root: &HostRoot,
        nvml: &NvmlConfig,
        lldp: Option<&bcd_probes::inventory::lldp::Watcher>,
    ) -> Result<Inventory, String> {
        let started = std::time::Instant::now();
        let inv = bcd_probes::inventory::message(root, Some(nvml), lldp).map_err(|e| e.to_string());
        crate::metrics::global().observe_inventory(started.elapsed());
        inv
    }

    async fn diag(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let a: DiagArgs = run.args()?;
        let (cfg, root) = (self.nvml.clone(), self.root.clone());
        let report = blocking(move || bcd_probes::nvml::diag_args(&cfg, &a, &root)).await?;
        crate::metrics::global().record_diag(&report);
        to_result(&report)
    }

    async fn reset(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let a: ResetArgs = run.args()?;
        let (cfg, root) = (self.nvml.clone(), self.root.clone());
        let report = blocking(move || bcd_probes::nvml::reset(&cfg, &a.gpus, &root))
            .await?
            .map_err(|e| e.to_failure())?;
        to_result(&report)
    }
}

impl Machine for NodeMachine {
    fn mode(&self) -> Mode {
        Mode::Node
    }

    fn boot_id(&self) -> &str {
        &self.boot_id
    }

    fn hostname(&self) -> String {
        self.root
            .read_trimmed("/proc/sys/kernel/hostname")
            .unwrap_or_default()
    }

    async fn hardware(&self) -> Result<HardwareIdentity, String> {
        bcd_probes::hwkey::compute_off_runtime(self.root.clone()).await
    }

    fn observed_generation(&self) -> u64 {
        crate::converge::observed_generation(&self.state_dir)
    }

    async fn inventory(&self) -> Result<Inventory, String> {
        let (root, nvml, lldp) = (self.root.clone(), self.nvml.clone(), self.lldp.clone());
        tokio::task::spawn_blocking(move || Self::collect_inventory(&root, &nvml, lldp.as_deref()))
            .await
            .map_err(|e| e.to_string())?
    }

    async fn run_command(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        match run.name {
            CommandName::InventoryRefresh => bcd_core::handlers::inventory_refresh(self, run).await,
            CommandName::DiagNvml => self.diag(run).await,
            CommandName::GpuReset => self.reset(run).await,
            CommandName::LogsCollect => bcd_core::ops::logs::handle(&self.ops, run).await,
            CommandName::NodeReboot => {
                bcd_core::ops::reboot::handle(&self.ops.reboot, &self.boot_id, run).await
            }
            CommandName::BmcVerify | CommandName::BmcPower | CommandName::BmcSetBootDevice => {
                Err(CommandFailure::new(
                    CommandErrorCode::Unsupported,
                    format!(
                        "{} is a site agent's command; this is a node agent",
                        run.name
                    ),
                ))
            }
            // Erasing every disk of a running OS is never a node agent's business.
            CommandName::DiskClean | CommandName::ImageWrite | CommandName::RescueStart => {
                Err(CommandFailure::new(
                    CommandErrorCode::Unsupported,
                    format!(
                        "{} runs only in the ramdisk (the bare-metal workflows); this is a node agent",
                        run.name
                    ),
                ))
            }
        }
    }
}
