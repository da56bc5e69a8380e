//! [`CommandArgs`]: the arguments of every command as one typed value, whose variant names the
//! command. The control plane builds the arguments it sends from these types (a renamed field
//! fails to compile there, not on a machine), and checks an operator's JSON against them
//! ([`CommandArgs::parse`], the contract [`super::check_args`] enforces).

use serde_json::Value;

use super::CommandName;
use super::bmc::{BootDeviceArgs, PowerArgs, VerifyArgs};
use super::check::ArgsError;
use super::clean::CleanArgs;
use super::deploy::ImageWriteArgs;
use super::diag::DiagArgs;
use super::inventory::InventoryRefreshArgs;
use super::logs::CollectArgs;
use super::reboot::RebootArgs;
use super::rescue::RescueArgs;
use super::reset::ResetArgs;

/// A command's arguments, typed. One variant per [`CommandName`]; [`CommandArgs::name`] is the
/// command they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandArgs {
    /// `inventory.refresh {}`.
    InventoryRefresh(InventoryRefreshArgs),
    /// `diag.nvml {expectedGpus?}`.
    DiagNvml(DiagArgs),
    /// `logs.collect {since?, sources?, maxBytes?}`.
    LogsCollect(CollectArgs),
    /// `gpu.reset {gpus}`.
    GpuReset(ResetArgs),
    /// `node.reboot {mode, delaySeconds}`.
    NodeReboot(RebootArgs),
    /// `bmc.verify {nodeId, leaseEpoch, candidate}` (site agent).
    BmcVerify(VerifyArgs),
    /// `bmc.power {nodeId, leaseEpoch, action, bootDevice?}` (site agent).
    BmcPower(PowerArgs),
    /// `bmc.setBootDevice {nodeId, leaseEpoch, device, persistent}` (site agent).
    BmcSetBootDevice(BootDeviceArgs),
    /// `disk.clean {mode}` (ramdisk).
    DiskClean(CleanArgs),
    /// `image.write {image, rootDevice?, configDrive?, instanceId?}` (ramdisk).
    ImageWrite(ImageWriteArgs),
    /// `rescue.start {sshKeys}` (ramdisk).
    RescueStart(RescueArgs),
}

impl CommandArgs {
    /// The command these arguments are for.
    pub fn name(&self) -> CommandName {
        match self {
            Self::InventoryRefresh(_) => CommandName::InventoryRefresh,
            Self::DiagNvml(_) => CommandName::DiagNvml,
            Self::LogsCollect(_) => CommandName::LogsCollect,
            Self::GpuReset(_) => CommandName::GpuReset,
            Self::NodeReboot(_) => CommandName::NodeReboot,
            Self::BmcVerify(_) => CommandName::BmcVerify,
            Self::BmcPower(_) => CommandName::BmcPower,
            Self::BmcSetBootDevice(_) => CommandName::BmcSetBootDevice,
            Self::DiskClean(_) => CommandName::DiskClean,
            Self::ImageWrite(_) => CommandName::ImageWrite,
            Self::RescueStart(_) => CommandName::RescueStart,
        }
    }

    /// The JSON the agent reads (`Command.args_json`), camelCase as each type spells it.
    pub fn to_value(&self) -> Value {
        let v = match self {
            Self::InventoryRefresh(a) => serde_json::to_value(a),
            Self::DiagNvml(a) => serde_json::to_value(a),
            Self::LogsCollect(a) => serde_json::to_value(a),
            Self::GpuReset(a) => serde_json::to_value(a),
            Self::NodeReboot(a) => serde_json::to_value(a),
            Self::BmcVerify(a) => serde_json::to_value(a),
            Self::BmcPower(a) => serde_json::to_value(a),
            Self::BmcSetBootDevice(a) => serde_json::to_value(a),
            Self::DiskClean(a) => serde_json::to_value(a),
            Self::ImageWrite(a) => serde_json::to_value(a),
            Self::RescueStart(a) => serde_json::to_value(a),
        };
        // These types hold strings, numbers, booleans, lists and maps with string keys only:
        // serializing them to a `Value` cannot fail.
        v.unwrap_or(Value::Null)
    }

    /// `args` as the typed arguments of `command`, held to its contract (shape and ranges, as
    /// [`super::check_args`] describes). Errors: [`ArgsError`] naming the key and what is wrong.
    pub fn parse(command: CommandName, args: &Value) -> Result<Self, ArgsError> {
        super::check::parse(command, args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bmc::{BootDevice, PowerAction};
    use serde_json::json;

    #[test]
    fn the_variant_names_the_command_and_parse_gives_it_back() {
        let power = CommandArgs::BmcPower(PowerArgs {
            node_id: "node_a".into(),
            lease_epoch: 3,
            action: PowerAction::On,
            boot_device: Some(BootDevice::Pxe),
            network_boot: None,
        });
        assert_eq!(power.name(), CommandName::BmcPower);
        assert_eq!(
            power.to_value(),
            json!({"nodeId": "node_a", "leaseEpoch": 3, "action": "on", "bootDevice": "pxe"})
        );
        assert_eq!(
            CommandArgs::parse(CommandName::BmcPower, &power.to_value()).ok(),
            Some(power)
        );
        // Every name has its variant: an args value parses to the variant of the name it was
        // parsed for.
        for (name, args) in [
            (CommandName::InventoryRefresh, json!({})),
            (CommandName::DiagNvml, json!({})),
            (CommandName::LogsCollect, json!({})),
            (CommandName::GpuReset, json!({"gpus": "all"})),
            (CommandName::NodeReboot, json!({})),
            (
                CommandName::BmcVerify,
                json!({"nodeId": "n", "leaseEpoch": 1}),
            ),
            (
                CommandName::BmcSetBootDevice,
                json!({"nodeId": "n", "leaseEpoch": 1, "device": "disk"}),
            ),
            (CommandName::DiskClean, json!({"mode": "full"})),
            (
                CommandName::RescueStart,
                json!({"sshKeys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOERN77nva79CxNnrBtUHoVf+5B1uamEYVTUhLRKlKUW op@laptop"]}),
            ),
        ] {
            let parsed = CommandArgs::parse(name, &args).map(|a| a.name());
            assert_eq!(parsed.ok(), Some(name), "{name} {args}");
        }
        assert!(CommandArgs::parse(CommandName::DiskClean, &json!({"mode": "half"})).is_err());
    }
}
