//! The site agent's [`Machine`]: the appliance itself (hardware key and inventory from
//! `bcd-probes`, `logs.collect`, `inventory.refresh` and `node.reboot` from `bcd-core`) and the
//! BMC commands it runs for its site ([`crate::commands`]).

use std::sync::Arc;

use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb::{HardwareIdentity, Inventory};
use bc_protocol::{CommandName, Mode};
use bcd_core::executor::CommandRun;
use bcd_core::mode::Machine;
use bcd_core::ops::OpsConfig;
use bcd_probes::hostroot::HostRoot;
use serde_json::Value;

use crate::site::Site;

/// The site appliance.
#[derive(Debug)]
pub struct SiteMachine {
    /// Where `/sys`, `/proc`, `/dev`, `/etc` are.
    pub root: HostRoot,
    /// This boot's id, read once at start.
    pub boot_id: String,
    /// node.reboot and logs.collect settings.
    pub ops: OpsConfig,
    /// The site's state (lease, BMCs).
    pub site: Arc<Site>,
}

impl Machine for SiteMachine {
    fn mode(&self) -> Mode {
        Mode::Site
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
        0
    }

    async fn inventory(&self) -> Result<Inventory, String> {
        // The appliance's own inventory: no GPUs through NVML (that is the node agent's).
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || bcd_probes::inventory::message(&root, None, None))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    async fn run_command(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        match run.name {
            CommandName::BmcVerify | CommandName::BmcPower | CommandName::BmcSetBootDevice => {
                crate::commands::run(&self.site, run).await
            }
            CommandName::InventoryRefresh => bcd_core::handlers::inventory_refresh(self, run).await,
            CommandName::LogsCollect => bcd_core::ops::logs::handle(&self.ops, run).await,
            CommandName::NodeReboot => {
                bcd_core::ops::reboot::handle(&self.ops.reboot, &self.boot_id, run).await
            }
            CommandName::DiagNvml
            | CommandName::GpuReset
            | CommandName::DiskClean
            | CommandName::ImageWrite
            | CommandName::RescueStart => Err(CommandFailure::new(
                CommandErrorCode::Unsupported,
                format!(
                    "{} is a node agent's command; this is a site agent",
                    run.name
                ),
            )),
        }
    }
}
