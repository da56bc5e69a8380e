//! The ramdisk's [`Machine`]: the bare-metal server it booted on — its real SMBIOS, hardware key
//! and inventory (the same document the node agent sends), and the commands a ramdisk serves:
//! `inventory.refresh`, `logs.collect` and `node.reboot` (reboot(2): there is no service
//! manager) through `bcd-core`, `diag.nvml` and `gpu.reset` through NVML when it loads,
//! `disk.clean` through [`crate::clean`], `image.write` through [`crate::deploy`] and
//! `rescue.start` through [`crate::rescue`].

use std::sync::Arc;

use bc_protocol::commands::clean::CleanArgs;
use bc_protocol::commands::deploy::ImageWriteArgs;
use bc_protocol::commands::rescue::RescueArgs;
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::inventory::Note;
use bc_protocol::pb::{HardwareIdentity, Inventory};
use bc_protocol::{CommandName, Mode};
use bcd_core::executor::{CommandRun, blocking, to_result};
use bcd_core::mode::Machine;
use bcd_core::ops::OpsConfig;
use bcd_probes::hostroot::HostRoot;
use bcd_probes::inventory::lldp::Watcher;
use bcd_probes::nvml::{DiagArgs, NvmlConfig, ResetArgs};
use serde_json::Value;

use crate::rescue::Rescue;

/// The machine the ramdisk booted on.
#[derive(Debug)]
pub struct RamdiskMachine {
    /// Where `/sys`, `/proc`, `/dev` are.
    pub root: HostRoot,
    /// This boot's id, read once at start.
    pub boot_id: String,
    /// The node id the boot script named (`bcd.node`): the hostname when there is no other.
    pub node_hint: Option<String>,
    /// Where NVML and `nvidia-smi` are (diag.nvml, gpu.reset, GPU inventory).
    pub nvml: NvmlConfig,
    /// node.reboot and logs.collect settings.
    pub ops: OpsConfig,
    /// rescue.start's SSH server: where dropbear is, and the one running.
    pub rescue: Rescue,
    /// The LLDP listener (a live root only) whose neighbours every inventory carries; the boot
    /// waited `bcd.lldp_wait` on it before joining ([`crate::boot`]).
    pub lldp: Option<Arc<Watcher>>,
    /// How this boot got on the network ([`crate::setup::Lease::summary`]: the NIC order, the
    /// lease, why each NIC before it was left); every inventory carries it as a `network` note.
    pub network: Option<String>,
}

impl RamdiskMachine {
    /// `diag.nvml`: the node agent's checks; a ramdisk without a loadable NVML (no NVIDIA
    /// driver in the image) fails the command with `NVML_UNAVAILABLE` instead of reporting a
    /// report whose every check is "unavailable".
    async fn diag(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let a: DiagArgs = run.args()?;
        let (cfg, root) = (self.nvml.clone(), self.root.clone());
        let report = blocking(move || bcd_probes::nvml::diag_args(&cfg, &a, &root)).await?;
        if !report.nvml_available {
            let why = report
                .unavailable_reason
                .unwrap_or_else(|| "NVML unavailable".to_owned());
            return Err(CommandFailure::new(
                CommandErrorCode::NvmlUnavailable,
                format!("{why} (in the ramdisk: is the NVIDIA driver in the image?)"),
            ));
        }
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

impl RamdiskMachine {
    /// `disk.clean`: every disk erased off the runtime (a full erase blocks for hours); each
    /// disk's fate is in the result, and the command fails (`CLEAN_FAILED`) only when the disks
    /// cannot be listed at all.
    async fn clean(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let a: CleanArgs = run.args()?;
        let root = self.root.clone();
        let result = blocking(move || crate::clean::clean(&root, a.mode))
            .await?
            .map_err(|e| CommandFailure::new(CommandErrorCode::CleanFailed, e.to_string()))?;
        tracing::info!(summary = %result.summary(), ms = result.duration_ms, "disk.clean done");
        to_result(&result)
    }

    /// `image.write`: the image streamed onto the root disk, verified, with its config drive
    /// (see [`crate::deploy`]).
    async fn image_write(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        // The control plane checked these at queue time; checked again so that a malformed
        // sha256 or URL is refused before the disk is touched, not after the whole image.
        bc_protocol::commands::check_args(run.name, &run.args)
            .map_err(|e| CommandFailure::new(CommandErrorCode::InvalidArgument, e.to_string()))?;
        let a: ImageWriteArgs = run.args()?;
        let result = crate::deploy::image_write(&self.root, a)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "image.write failed");
                e.to_failure()
            })?;
        tracing::info!(
            device = %result.device,
            because = %result.chosen_because,
            written_bytes = result.written_bytes,
            duration_ms = result.duration_ms,
            "image.write done"
        );
        to_result(&result)
    }

    /// `rescue.start`: root's keys written and dropbear listening ([`crate::rescue`]); any
    /// failure is `RESCUE_FAILED` with what failed.
    async fn rescue(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        let a: RescueArgs = run.args()?;
        let result = self
            .rescue
            .start(&self.root, &a.ssh_keys)
            .await
            .map_err(|e| CommandFailure::new(CommandErrorCode::RescueFailed, e.to_string()))?;
        to_result(&result)
    }
}

impl Machine for RamdiskMachine {
    fn mode(&self) -> Mode {
        Mode::Ramdisk
    }

    fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// The kernel's hostname (set by the udhcpc script when DHCP gives one), else the node id
    /// from the command line, else empty (the CSR then says `bcd`).
    fn hostname(&self) -> String {
        let kernel = self
            .root
            .read_trimmed("/proc/sys/kernel/hostname")
            .unwrap_or_default();
        if !crate::setup::NO_HOSTNAME.contains(&kernel.as_str()) {
            return kernel;
        }
        self.node_hint.clone().unwrap_or_default()
    }

    async fn hardware(&self) -> Result<HardwareIdentity, String> {
        bcd_probes::hwkey::compute_off_runtime(self.root.clone()).await
    }

    /// A ramdisk converges no spec (see [`crate::hooks`]).
    fn observed_generation(&self) -> u64 {
        0
    }

    async fn inventory(&self) -> Result<Inventory, String> {
        let (root, nvml, lldp) = (self.root.clone(), self.nvml.clone(), self.lldp.clone());
        let notes: Vec<Note> = self
            .network
            .iter()
            .map(|n| Note {
                source: "network".into(),
                message: n.clone(),
            })
            .collect();
        tokio::task::spawn_blocking(move || {
            bcd_probes::inventory::message_with_notes(&root, Some(&nvml), lldp.as_deref(), notes)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
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
            CommandName::DiskClean => self.clean(run).await,
            CommandName::ImageWrite => self.image_write(run).await,
            CommandName::RescueStart => self.rescue(run).await,
            CommandName::BmcVerify | CommandName::BmcPower | CommandName::BmcSetBootDevice => {
                Err(CommandFailure::new(
                    CommandErrorCode::Unsupported,
                    format!(
                        "{} is a site agent's command; this is a ramdisk agent",
                        run.name
                    ),
                ))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn machine(root: &std::path::Path, hint: Option<&str>) -> RamdiskMachine {
        RamdiskMachine {
            root: HostRoot::new(root),
            boot_id: "b1".into(),
            node_hint: hint.map(str::to_owned),
            nvml: NvmlConfig {
                lib_path: Some(root.join("no-libnvidia-ml.so.1")),
                nvidia_smi: root.join("no-nvidia-smi"),
            },
            ops: OpsConfig::default(),
            rescue: Rescue::new(crate::rescue::RescueConfig {
                dropbear: root.join("no-dropbear"),
                ..Default::default()
            }),
            lldp: None,
            network: None,
        }
    }

    fn set_hostname(root: &std::path::Path, name: &str) {
        let p = root.join("proc/sys/kernel");
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("hostname"), format!("{name}\n")).unwrap();
    }

    #[test]
    fn the_hostname_is_the_kernels_else_the_node_id() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine(dir.path(), Some("node_7"));
        assert_eq!(m.hostname(), "node_7");
        set_hostname(dir.path(), "(none)");
        assert_eq!(m.hostname(), "node_7");
        set_hostname(dir.path(), "rack4-u12");
        assert_eq!(m.hostname(), "rack4-u12");
        set_hostname(dir.path(), "(none)");
        assert_eq!(machine(dir.path(), None).hostname(), "");
        assert_eq!(m.mode(), Mode::Ramdisk);
        assert_eq!(m.observed_generation(), 0);
    }

    fn command(name: CommandName) -> CommandRun {
        let (out, _rx) = tokio::sync::mpsc::channel(4);
        CommandRun {
            id: "cmd_1".into(),
            name,
            args: serde_json::json!({}),
            link: bcd_core::executor::SessionLink { out, epoch: 1 },
            upload: None,
        }
    }

    #[tokio::test]
    async fn without_nvml_gpu_commands_fail_plainly() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine(dir.path(), None);
        let f = m
            .run_command(&command(CommandName::DiagNvml))
            .await
            .unwrap_err();
        assert_eq!(f.code, CommandErrorCode::NvmlUnavailable, "{f:?}");
        assert!(f.message.contains("NVIDIA driver in the image"), "{f:?}");
        let mut reset = command(CommandName::GpuReset);
        reset.args = serde_json::json!({"gpus": "all"});
        let f = m.run_command(&reset).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::NvmlUnavailable, "{f:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn image_write_is_served_with_its_result_or_its_code() {
        use crate::deploy::test_server::{Serve, pattern_sha256};
        use crate::deploy::test_utils::{MIB, SERIAL, args, dev, fake_root, read_at, serve};
        let _one = SERIAL.lock().await;
        let root = fake_root(&[("sda", 8 * MIB, "S1")]);
        let m = machine(root.path(), None);
        let mut run = command(CommandName::ImageWrite);
        run.args = serde_json::json!({"image": {"url": "http://127.0.0.1:1/x"}});
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::InvalidArgument, "{f:?}");
        run.args = serde_json::json!({"image": {"url": "http://127.0.0.1:1/x", "sha256": "abc"}});
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::InvalidArgument, "{f:?}");
        assert!(f.message.contains("sha256"), "{f:?}");

        let url = serve("/img", Serve::Pattern(MIB + 5)).await;
        let a = args(url, pattern_sha256(MIB + 5), Default::default());
        run.args = serde_json::to_value(&a).unwrap();
        let v = m.run_command(&run).await.unwrap();
        assert_eq!(v["device"], "sda", "{v}");
        assert_eq!(
            v["chosenBecause"], "smallest disk that fits (sda, of 1)",
            "{v}"
        );
        assert_eq!(v["writtenBytes"], MIB + 5, "{v}");
        assert_eq!(v["sha256"], a.image.sha256.as_str(), "{v}");
        assert!(v.get("configDrivePartition").is_none(), "{v}");
        assert_ne!(read_at(&dev(root.path(), "sda"), 0, 1), [0]);

        run.args["image"]["sha256"] = "00".repeat(32).into();
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::ChecksumMismatch, "{f:?}");
    }

    #[tokio::test]
    async fn bmc_commands_are_unsupported() {
        let dir = tempfile::tempdir().unwrap();
        let f = machine(dir.path(), None)
            .run_command(&command(CommandName::BmcPower))
            .await
            .unwrap_err();
        assert_eq!(f.code, CommandErrorCode::Unsupported);
        assert!(f.message.contains("ramdisk agent"), "{f:?}");
    }

    #[tokio::test]
    async fn disk_clean_reports_each_disk_and_fails_only_without_sys_block() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine(dir.path(), None);
        let f = m
            .run_command(&command(CommandName::DiskClean))
            .await
            .unwrap_err();
        assert_eq!(f.code, CommandErrorCode::CleanFailed, "{f:?}");
        assert!(f.message.contains("sys/block"), "{f:?}");

        let sys = dir.path().join("sys/block/vda");
        std::fs::create_dir_all(&sys).unwrap();
        std::fs::write(sys.join("size"), "4096\n").unwrap();
        std::fs::create_dir_all(dir.path().join("dev")).unwrap();
        std::fs::write(dir.path().join("dev/vda"), vec![0xAB; 4096 * 512]).unwrap();
        // A loop device, as the kernel lists it: virtual, not a disk.
        std::fs::create_dir_all(dir.path().join("sys/devices/virtual/block/loop0")).unwrap();
        std::os::unix::fs::symlink(
            "../devices/virtual/block/loop0",
            dir.path().join("sys/block/loop0"),
        )
        .unwrap();
        let mut run = command(CommandName::DiskClean);
        run.args = serde_json::json!({"mode": "full"});
        let v = m.run_command(&run).await.unwrap();
        assert_eq!(v["mode"], "full", "{v}");
        assert_eq!(v["disks"].as_array().map(Vec::len), Some(1), "{v}");
        assert_eq!(v["disks"][0]["name"], "vda");
        assert_eq!(v["disks"][0]["outcome"], "cleaned", "{v}");
        assert_eq!(v["disks"][0]["bytesErased"], 4096 * 512);
        assert_eq!(v["leftOut"][0]["name"], "loop0", "{v}");
        let disk = std::fs::read(dir.path().join("dev/vda")).unwrap();
        assert!(disk.iter().all(|&b| b == 0));

        run.args = serde_json::json!({"mode": "secure"});
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::InvalidArgument, "{f:?}");
    }

    #[tokio::test]
    async fn rescue_failures_are_rescue_failed() {
        let dir = tempfile::tempdir().unwrap();
        let m = machine(dir.path(), None);
        let mut run = command(CommandName::RescueStart);
        run.args = serde_json::json!({"sshKeys": ["ssh-ed25519 AAAAC3Nza op@laptop"]});
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::RescueFailed, "{f:?}");
        assert!(f.message.contains("sshKeys[0]"), "{f:?}");
        run.args = serde_json::json!({"sshKeys": [
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW a"
        ]});
        let f = m.run_command(&run).await.unwrap_err();
        assert_eq!(f.code, CommandErrorCode::RescueFailed, "{f:?}");
        assert!(f.message.contains("no-dropbear is missing"), "{f:?}");
    }

    #[tokio::test]
    async fn the_inventory_is_the_machines_with_its_hardware_key() {
        let host = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../shared/fixtures/hosts/node-exporter"
        );
        if !std::path::Path::new(host).is_dir() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "fixture {host} missing"
            );
            eprintln!("!!! SKIPPED: fixture {host} missing");
            return;
        }
        let m = machine(std::path::Path::new(host), None);
        let inv = m.inventory().await.unwrap();
        let doc: Value = serde_json::from_slice(&inv.document_json).unwrap();
        assert!(doc["cpu"]["threads"].as_u64().unwrap_or(0) > 0, "{doc}");
        let hw = inv.hardware.unwrap();
        assert_eq!(hw, m.hardware().await.unwrap());
    }

    #[tokio::test]
    async fn the_inventory_says_how_the_boot_got_on_the_network() {
        let dir = tempfile::tempdir().unwrap();
        let mut m = machine(dir.path(), None);
        let story = "DHCP order: ens3f0np0 (BOOTIF), eno1 (no carrier); lease on ens3f0np0";
        m.network = Some(story.to_owned());
        let inv = m.inventory().await.unwrap();
        let doc: Value = serde_json::from_slice(&inv.document_json).unwrap();
        let notes = doc["notes"].as_array().cloned().unwrap_or_default();
        assert!(
            notes
                .iter()
                .any(|n| n["source"] == "network" && n["message"] == story),
            "{notes:?}"
        );
    }
}
