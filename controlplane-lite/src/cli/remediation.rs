//! `bcctl remediations list|get`: health remediation as an operator reads it (node, fault, step,
//! since, attempts, next step, why waiting), and the policy argument of
//! `bcctl pools set-remediation`.

use clap::Subcommand;
use cpl_core::text::Id;
use cpl_core::verbs::{RemediationListRequest, RemediationRef, Request};
use cpl_store::RemediationPolicy;
use serde_json::Value;

use super::call::{Call, items, print};
use super::{ClientArgs, render};

/// `bcctl remediations ...`
#[derive(Debug, Clone, Subcommand)]
pub enum RemediationsCommand {
    /// Remediations, newest first.
    List {
        #[arg(long)]
        pool: Option<String>,
        #[arg(long)]
        node: Option<String>,
        /// Only those that have not ended.
        #[arg(long)]
        open: bool,
        /// At most this many (default 100, at most 1000).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// One remediation with every step it took: by id, or a node's newest (`--node`).
    Get {
        /// The remediation (`rem_…`).
        #[arg(required_unless_present = "node")]
        remediation_id: Option<String>,
        #[arg(long, conflicts_with = "remediation_id")]
        node: Option<String>,
    },
}

/// Runs `bcctl remediations ...`.
pub async fn remediations(args: &ClientArgs, cmd: RemediationsCommand) -> anyhow::Result<()> {
    let table: fn(&Value) -> String = match cmd {
        RemediationsCommand::List { .. } => |v| {
            render::list(
                &items(v, "remediations"),
                &[
                    ("ID", "/id"),
                    ("NODE", "/nodeId"),
                    ("FAULT", "/fault/condition"),
                    ("KIND", "/fault/kind"),
                    ("STATE", "/state"),
                    ("STEP", "/step"),
                    ("PHASE", "/phase"),
                    ("SINCE", "/since"),
                    ("ATTEMPTS", "/attempts"),
                    ("NEXT", "/nextStep"),
                    ("WAITING", "/waiting"),
                ],
            )
        },
        RemediationsCommand::Get { .. } => render::object,
    };
    let v = remediations_call(cmd).send(&args.client()?).await?;
    print(args, &v, table)
}

/// What `bcctl remediations <cmd>` sends.
pub(crate) fn remediations_call(cmd: RemediationsCommand) -> Call {
    Call::once(match cmd {
        RemediationsCommand::List {
            pool,
            node,
            open,
            limit,
        } => Request::RemediationsList(RemediationListRequest {
            pool_id: pool.map(Id::unchecked),
            node_id: node.map(Id::unchecked),
            open_only: open,
            limit,
        }),
        RemediationsCommand::Get {
            remediation_id,
            node,
        } => Request::RemediationsGet(RemediationRef {
            remediation_id: remediation_id.map(Id::unchecked),
            node_id: node.map(Id::unchecked),
        }),
    })
}

/// Parses a pool's remediation policy given as JSON on the command line (the server checks its
/// ranges).
pub(crate) fn parse_policy(s: &str) -> Result<RemediationPolicy, String> {
    serde_json::from_str(s).map_err(|e| format!("not a remediation policy: {e}"))
}
