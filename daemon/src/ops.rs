//! Flags of the operational commands an agent runs on its own machine (`node.reboot`,
//! `logs.collect`), flattened into `bcd agent` and `bcd site`; the settings themselves are
//! `bcd_core::ops::OpsConfig`.

use std::path::PathBuf;

use bcd_core::ops::OpsConfig;
use bcd_core::ops::reboot::RebootConfig;
use bcd_probes::hostroot::HostRoot;

use crate::config::{Config, ConfigOverrides};

/// `--reboot-command`'s default.
const DEFAULT_REBOOT_COMMAND: &str = "systemctl reboot";
/// `--journalctl`'s default.
const DEFAULT_JOURNALCTL: &str = "journalctl";

/// `bcd agent` and `bcd site` flags for node.reboot and logs.collect.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    /// What node.reboot runs, split on whitespace (`--force` is added for mode force when it is
    /// systemctl; any command sees `BCD_REBOOT_MODE`).
    #[arg(long, env = "BCD_REBOOT_COMMAND", default_value = DEFAULT_REBOOT_COMMAND)]
    pub reboot_command: String,
    /// The `journalctl` binary logs.collect runs.
    #[arg(long, env = "BCD_JOURNALCTL", default_value = DEFAULT_JOURNALCTL)]
    pub journalctl: PathBuf,
    /// `nvidia-bug-report.sh`, run by logs.collect only when asked (`sources` has `nvidiaBugReport`).
    #[arg(
        long,
        env = "BCD_NVIDIA_BUG_REPORT",
        default_value = "nvidia-bug-report.sh"
    )]
    pub nvidia_bug_report: PathBuf,
    /// The agent's own log file, collected by logs.collect (when unset the manifest says so).
    #[arg(long, env = "BCD_LOG_FILE")]
    pub log_file: Option<PathBuf>,
}

impl OpsArgs {
    /// The config keys these flags override (`reboot_command`, `journalctl`): only flags given
    /// other than their defaults, so a flag's default never hides the file's value.
    pub fn overrides(&self) -> ConfigOverrides {
        ConfigOverrides {
            reboot_command: (self.reboot_command != DEFAULT_REBOOT_COMMAND).then(|| {
                self.reboot_command
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            }),
            journalctl: (self.journalctl != std::path::Path::new(DEFAULT_JOURNALCTL))
                .then(|| self.journalctl.clone()),
            ..Default::default()
        }
    }

    /// The settings for the host under `root`: these flags, with the resolved configuration's
    /// reboot command and journalctl (file < environment < flags).
    pub fn resolved(
        &self,
        cfg: &Config,
        state_dir: &std::path::Path,
        root: &HostRoot,
    ) -> OpsConfig {
        let mut ops = self.config(state_dir, root);
        ops.reboot = RebootConfig::from_command_line(&cfg.reboot_command.join(" "));
        ops.journalctl = cfg.journalctl.clone();
        ops
    }

    /// As an [`OpsConfig`] for the host under `root`; log bundles are built under
    /// `<state_dir>/tmp` (not `/tmp`, often a small tmpfs).
    pub fn config(&self, state_dir: &std::path::Path, root: &HostRoot) -> OpsConfig {
        OpsConfig {
            reboot: RebootConfig::from_command_line(&self.reboot_command),
            journalctl: self.journalctl.clone(),
            nvidia_bug_report: self.nvidia_bug_report.clone(),
            log_file: self.log_file.clone(),
            kmsg: root.path(bcd_core::ops::KMSG),
            work_dir: Some(state_dir.join("tmp")),
            upload: None,
        }
    }
}
