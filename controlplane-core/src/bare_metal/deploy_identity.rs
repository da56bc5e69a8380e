//! The identity a deploy issues to the system it writes (issue 30.1): how a `deployed`
//! machine's own agent joins, instead of a pool join token that anyone who read a MAC and a
//! serial could present.
//!
//! # Design
//! - Each `image.write` of a deploy carries a fresh `deploy_<id>.<secret>` (160+ bits; [`issue`],
//!   replacing the node's earlier one); the ramdisk writes it onto the config drive as
//!   `bcd-join-token`, where the deployed system's `bcd agent --join-token-file` reads it. The
//!   store keeps its secret hashed only (`cpl_store::DeployIdentity`); the command's stored
//!   arguments lose it once the write is over ([`super::user_data::withhold`]) and no
//!   `commands.*` answer ever shows it.
//! - [`join`]: a node agent presenting it re-joins that node in place (`identityGeneration + 1`)
//!   while the node is `deployed`, its machine shows the identifiers its BMC reported, and no
//!   session of it is live. It is good for many joins while the node stays deployed: the
//!   deployed system must come back after `rescue` ends its identity. Releasing or retiring the
//!   node drops it; the next deploy replaces it.
//! - A node that has one is never re-joined by a pool join token, in any state
//!   ([`join_token_refusal`], which `crate::join` asks before any re-join in place).
//!
//! # Limitations
//! Until the write is over the token is in the queued command's stored arguments in clear (as
//! cloud-init's user data is). A deploy without a config drive has nowhere to put it: the
//! deployed system then has no way to join as the node (a machine enrolled with `--deployed`,
//! which no deploy wrote, re-joins with a pool join token as before).

use bc_protocol::{Mode, ProvisionState};
use cpl_store::{DeployIdentity, NodeRecord, Tx, random_lowercase};
use sha2::{Digest, Sha256};

use crate::edit::Edit;
use crate::error::OpError;
use crate::join::{JoinError, JoinFacts, JoinOutcome, RefusalKind, Refused};

/// Every deploy identity token starts with this.
pub const DEPLOY_TOKEN_PREFIX: &str = "deploy_";
/// The file on the config drive that holds the token.
pub const CONFIG_DRIVE_FILE: &str = "bcd-join-token";

/// Why a deploy identity was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeployRefusal {
    /// Not `deploy_<id>.<secret>`.
    #[error("the deploy identity token is malformed (expected deploy_<id>.<secret>)")]
    Malformed,
    /// No node has this token (never issued, replaced by a newer deploy, or the node was
    /// released or retired).
    #[error(
        "deploy identity {id} is unknown: it was never issued, a newer deploy of its machine replaced it, or the machine was released"
    )]
    Unknown { id: String },
    /// Its node is not `deployed`.
    #[error(
        "deploy identity {id} belongs to node {node_id}, which is {state}; it joins only a deployed machine"
    )]
    NotDeployed {
        id: String,
        node_id: String,
        state: ProvisionState,
    },
    /// The machine does not show what the node's BMC reported.
    #[error(
        "deploy identity {id} belongs to node {node_id}, but this machine does not show the identifiers its BMC reported"
    )]
    OtherMachine { id: String, node_id: String },
    /// Presented by a ramdisk or a site agent.
    #[error(
        "a deploy identity is for the deployed system's node agent (bcd agent); a {0} cannot join with it"
    )]
    WrongMode(Mode),
}

impl From<DeployRefusal> for JoinError {
    fn from(r: DeployRefusal) -> Self {
        JoinError::Deploy(r)
    }
}

fn digest(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Issues `node_id` a new deploy identity at `now` (replacing its earlier one); returns the
/// token in clear, for the `image.write` that writes it onto the config drive only.
pub(crate) fn issue(tx: &Tx<'_>, node_id: &str, now: i64) -> Result<String, OpError> {
    let id = format!("{DEPLOY_TOKEN_PREFIX}{}", random_lowercase(20));
    let secret = random_lowercase(40);
    tx.put_deploy_identity(&DeployIdentity {
        node_id: node_id.to_owned(),
        token_id: id.clone(),
        secret_sha256: digest(&secret),
        created_at: now,
        last_used_at: None,
        uses: 0,
    })?;
    Ok(format!("{id}.{secret}"))
}

/// Whether a join presents a deploy identity.
pub fn is_deploy_join(f: &JoinFacts) -> bool {
    f.token.trim().starts_with(DEPLOY_TOKEN_PREFIX)
}

/// The deployed system's join, in the caller's write transaction (see the module docs).
pub(crate) fn join(
    tx: &Tx<'_>,
    f: &JoinFacts,
    connected: &dyn Fn(&str) -> bool,
) -> Result<JoinOutcome, JoinError> {
    if f.mode != Mode::Node {
        return Err(DeployRefusal::WrongMode(f.mode).into());
    }
    let (id, secret) = f
        .token
        .trim()
        .split_once('.')
        .filter(|(id, s)| id.len() > DEPLOY_TOKEN_PREFIX.len() && !s.is_empty())
        .ok_or(DeployRefusal::Malformed)?;
    let unknown = || DeployRefusal::Unknown { id: id.to_owned() };
    let mut d = tx.deploy_identity_by_token(id)?.ok_or_else(unknown)?;
    if d.secret_sha256 != digest(secret) {
        return Err(unknown().into());
    }
    let node = tx
        .node(&d.node_id)?
        .ok_or_else(|| OpError::node_not_found(&d.node_id))?;
    if node.provision_state != ProvisionState::Deployed {
        return Err(DeployRefusal::NotDeployed {
            id: id.to_owned(),
            node_id: node.id,
            state: node.provision_state,
        }
        .into());
    }
    let bmc = tx.bmc(&node.id)?.ok_or_else(|| {
        OpError::Internal(format!("node {} has a deploy identity but no BMC", node.id))
    })?;
    if !super::boot::mismatches(&bmc, &f.identifier_digests).is_empty() {
        return Err(DeployRefusal::OtherMachine {
            id: id.to_owned(),
            node_id: node.id,
        }
        .into());
    }
    if connected(&node.id) {
        return Err(JoinError::Duplicate(node.id));
    }
    let now = cpl_store::now_ms();
    d.uses = d.uses.saturating_add(1);
    d.last_used_at = Some(now);
    tx.put_deploy_identity(&d)?;
    let trusted = crate::identity::trusted(f.trusted, &f.hardware_key, &f.identifier_digests);
    crate::join::rejoin_in_place(
        tx,
        &node.id,
        f,
        trusted,
        id,
        "the deployed system joined with the identity its deploy issued",
    )
    .map(JoinOutcome::Joined)
}

/// Issue 30.1: a node enrolled through a BMC is never re-joined in place by a join token while
/// its sessions come from its ramdisk's boot token, nor once a deploy issued its deployed
/// system an identity of its own ([`crate::bare_metal::deploy_identity`]). Only a `deployed`
/// node that no deploy wrote (enrolled with `--deployed`) still re-joins with one. A node agent
/// that shows the machine's identifiers (they are no secret: a MAC, a serial) must not take its
/// identity, its commands and its logs, nor hold a session that makes the next ramdisk's join
/// fail. The refusal, with the asker's address, is a `joinRefused` event on the node (no version
/// change); no token is spent. `None` when the rule does not apply.
pub(crate) fn join_token_refusal(
    tx: &Tx<'_>,
    node: &NodeRecord,
    f: &JoinFacts,
) -> Result<Option<Refused>, JoinError> {
    if tx.bmc(&node.id)?.is_none() {
        return Ok(None);
    }
    let deploy_issued = tx.deploy_identity(&node.id)?.is_some();
    if node.provision_state == ProvisionState::Deployed && !deploy_issued {
        return Ok(None);
    }
    let state = node.provision_state;
    let only = if deploy_issued {
        "only its ramdisk's boot token or the identity its deploy issued joins it"
    } else {
        "only its ramdisk's boot token joins it"
    };
    let mut edit = Edit::report(tx, &node.id, "JoinService")?;
    edit.event(
        "joinRefused",
        None,
        None,
        format!(
            "a {} agent from {} showed this machine's identifiers with a join token; node {} is enrolled through its BMC and {state}, so {only}",
            f.mode,
            f.peer.as_deref().unwrap_or("an unknown address"),
            node.id
        ),
    );
    edit.save(tx)?;
    Ok(Some(Refused {
        node_id: node.id.clone(),
        message: format!(
            "BARE_METAL_NODE: this machine is node {}, enrolled through its BMC and {state}; a join token cannot re-join it in place (its ramdisk joins with the boot token of its boot; its deployed system's agent with the identity its deploy wrote onto the config drive, {})",
            node.id, CONFIG_DRIVE_FILE
        ),
        kind: RefusalKind::BareMetal,
    }))
}
