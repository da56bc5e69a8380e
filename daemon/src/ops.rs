//! Flags and settings of the operational commands the agent runs on its own machine
//! (`node.reboot`, `logs.collect`), flattened into `bcd agent` (see [`crate::agent::AgentArgs`]).

use std::path::PathBuf;

/// `bcd agent` flags for node.reboot and logs.collect.
#[derive(Debug, Clone, clap::Args)]
pub struct OpsArgs {
    /// What node.reboot runs, split on whitespace (`--force` is added for mode force when it is
    /// systemctl; any command sees `BCD_REBOOT_MODE`).
    #[arg(long, env = "BCD_REBOOT_COMMAND", default_value = "systemctl reboot")]
    pub reboot_command: String,
    /// The `journalctl` binary logs.collect runs.
    #[arg(long, env = "BCD_JOURNALCTL", default_value = "journalctl")]
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
    /// As an [`OpsConfig`]; log bundles are built under `<state_dir>/tmp` (not `/tmp`, often a
    /// small tmpfs).
    pub fn config(&self, state_dir: &std::path::Path) -> OpsConfig {
        OpsConfig {
            reboot: crate::reboot::RebootConfig::from_command_line(&self.reboot_command),
            journalctl: self.journalctl.clone(),
            nvidia_bug_report: self.nvidia_bug_report.clone(),
            log_file: self.log_file.clone(),
            work_dir: Some(state_dir.join("tmp")),
            upload: None,
        }
    }
}

/// Settings of node.reboot and logs.collect.
#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// How node.reboot reboots.
    pub reboot: crate::reboot::RebootConfig,
    /// `journalctl` to run (logs.collect source `journal`).
    pub journalctl: PathBuf,
    /// `nvidia-bug-report.sh` to run (opt-in source `nvidiaBugReport`).
    pub nvidia_bug_report: PathBuf,
    /// The agent's own log file (source `agent`).
    pub log_file: Option<PathBuf>,
    /// Where logs.collect stages and builds its bundle (a temp dir inside, removed after the
    /// upload); `None`: the system temp dir.
    pub work_dir: Option<PathBuf>,
    /// Where logs.collect uploads its bundle; `None` fails the command with `UPLOAD_FAILED`.
    pub upload: Option<crate::logs::upload::Uploader>,
}

impl OpsConfig {
    /// With bundles going to `control_plane` over the session's mutual-TLS config.
    pub fn with_upload(
        mut self,
        control_plane: String,
        tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> Self {
        self.upload = Some(crate::logs::upload::Uploader { control_plane, tls });
        self
    }
}

impl Default for OpsConfig {
    fn default() -> Self {
        Self {
            reboot: crate::reboot::RebootConfig::default(),
            journalctl: PathBuf::from("journalctl"),
            nvidia_bug_report: PathBuf::from("nvidia-bug-report.sh"),
            log_file: None,
            work_dir: None,
            upload: None,
        }
    }
}
