//! "A command is over": the one router from a command that just ended — an agent's result, an
//! operator's cancel, its deadline, a lost site lease — to what that means for its node, in the
//! transaction that ended it. One exhaustive `match` on the command's name: a new command must
//! say here who reads its end.

use bc_protocol::CommandName;
use cpl_store::{CommandRecord, Tx};

use crate::bare_metal::{table, verify};
use crate::error::OpError;
use crate::remediation;

/// Applies what `cmd`, which has just ended, means for its node:
/// - Health's conditions from a succeeded `diag.nvml` or `gpu.reset` (an error there is logged
///   and stops nothing else);
/// - a `bmc.*` command's `bmcCommand` event on its bare-metal node, a verification's or a
///   credential rotation's result, a power state read back ([`verify::on_final`]);
/// - a failed power-on into the ramdisk ([`table::on_power_on_final`]);
/// - the step of the bare-metal workflow whose command in flight it was ([`table::on_final`]);
/// - the step or the verification of the node's open remediation, after Health
///   ([`crate::remediation::on_final`]).
///
/// Errors: the store's, or a workflow's refusal to move (the transaction rolls back).
pub fn on_final(tx: &Tx<'_>, cmd: &CommandRecord) -> Result<(), OpError> {
    if let Err(e) = crate::health::apply_command_result(tx, cmd) {
        tracing::warn!(error = %e, "Health: condition not written");
    }
    match cmd.name {
        CommandName::InventoryRefresh | CommandName::LogsCollect => Ok(()),
        CommandName::NodeReboot | CommandName::GpuReset => remediation::on_final(tx, cmd),
        CommandName::BmcVerify => verify::on_final(tx, cmd),
        CommandName::BmcPower => {
            verify::on_final(tx, cmd)?;
            table::on_power_on_final(tx, cmd)?;
            table::on_final(tx, cmd)?;
            remediation::on_final(tx, cmd)
        }
        CommandName::BmcSetBootDevice => {
            verify::on_final(tx, cmd)?;
            table::on_final(tx, cmd)
        }
        CommandName::DiagNvml => {
            table::on_final(tx, cmd)?;
            remediation::on_final(tx, cmd)
        }
        CommandName::DiskClean | CommandName::ImageWrite | CommandName::RescueStart => {
            table::on_final(tx, cmd)
        }
    }
}
