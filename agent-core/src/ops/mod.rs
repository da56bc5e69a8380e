//! The commands that act on the machine the agent runs on without probing its hardware, served
//! the same way by every mode: `logs.collect` ([`logs`]) and `node.reboot` ([`reboot`]), and
//! their settings ([`OpsConfig`]). Tools they run and files they read have configurable paths.

pub mod logs;
pub mod reboot;

use std::path::PathBuf;

/// The kernel ring buffer (`/dev/kmsg`, kernel ABI `Documentation/ABI/testing/dev-kmsg`).
pub const KMSG: &str = "/dev/kmsg";

/// Settings of node.reboot and logs.collect.
#[derive(Debug, Clone)]
pub struct OpsConfig {
    /// How node.reboot reboots.
    pub reboot: reboot::RebootConfig,
    /// `journalctl` to run (logs.collect source `journal`).
    pub journalctl: PathBuf,
    /// `nvidia-bug-report.sh` to run (opt-in source `nvidiaBugReport`).
    pub nvidia_bug_report: PathBuf,
    /// The agent's own log file (source `agent`).
    pub log_file: Option<PathBuf>,
    /// The kernel log read by source `kernel`: [`KMSG`] under the host root.
    pub kmsg: PathBuf,
    /// Where logs.collect stages and builds its bundle (a temp dir inside, removed after the
    /// upload); `None`: the system temp dir.
    pub work_dir: Option<PathBuf>,
    /// Where logs.collect uploads its bundle; `None`: the command's session
    /// ([`crate::executor::CommandRun::upload`]), and without one it fails with `UPLOAD_FAILED`.
    pub upload: Option<logs::upload::Uploader>,
}

impl OpsConfig {
    /// With bundles going to `control_plane` over the session's mutual-TLS config.
    pub fn with_upload(
        mut self,
        control_plane: String,
        tls: std::sync::Arc<rustls::ClientConfig>,
    ) -> Self {
        self.upload = Some(logs::upload::Uploader { control_plane, tls });
        self
    }
}

impl Default for OpsConfig {
    fn default() -> Self {
        Self {
            reboot: reboot::RebootConfig::default(),
            journalctl: PathBuf::from("journalctl"),
            nvidia_bug_report: PathBuf::from("nvidia-bug-report.sh"),
            log_file: None,
            kmsg: PathBuf::from(KMSG),
            work_dir: None,
            upload: None,
        }
    }
}
