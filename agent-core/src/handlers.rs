//! Command handlers every mode can serve as they are, built only on [`Machine`]. The ones that
//! do operating-system work (`logs.collect`, `node.reboot`) are in [`crate::ops`]; the hardware
//! ones (`diag.nvml`, `gpu.reset`) are glue over `bcd-probes` in the modes.

use bc_protocol::commands::inventory::InventoryRefreshResult;
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb::agent_message;
use serde_json::Value;

use crate::executor::{CommandRun, to_result};
use crate::mode::Machine;

/// `inventory.refresh`: collects the machine's inventory ([`Machine::inventory`], the same the
/// session sends at open), sends it as an `Inventory` message on the command's session, and
/// returns the summary of what was sent.
pub async fn inventory_refresh(
    machine: &impl Machine,
    run: &CommandRun,
) -> Result<Value, CommandFailure> {
    let inv = machine
        .inventory()
        .await
        .map_err(|e| CommandFailure::new(CommandErrorCode::InventoryFailed, e))?;
    let (trusted, identifiers) = inv
        .hardware
        .as_ref()
        .map_or((false, 0), |h| (h.trusted, h.identifier_digests.len()));
    let summary = InventoryRefreshResult::summarize(&inv.document_json, trusted, identifiers);
    run.link
        .send(agent_message::Msg::Inventory(inv))
        .await
        .map_err(|_| {
            CommandFailure::new(
                CommandErrorCode::SessionClosed,
                "the session closed before the inventory was sent",
            )
        })?;
    to_result(&summary)
}
