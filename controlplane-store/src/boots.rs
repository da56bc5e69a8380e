//! Network boots into the ramdisk (issue 15): one row per node in `node_boots`, the node's
//! current boot — its one-time boot token (hashed for the join, sealed for the site agent's boot
//! service), what the boot is for, when it expires, when the ramdisk used it, and when the node
//! entered its current ramdisk state (the state's deadline counts from there).
//!
//! The store never sees the token's secret in clear: `secret_sha256` is a digest and `sealed` is
//! the core's AEAD envelope, which the store cannot open.

use bc_protocol::ProvisionState;

use crate::db::{OptionalExt, Row};
use crate::params;

use super::{Reader, StoreError, Tx, parse_enum};

bc_protocol::string_enum! {
    /// The last finished step of a workflow's work on a boot (`node_boots.work_step`, its only
    /// text): what the controller's next pass sends after it.
    WorkStep, "workStep" {
        /// Deploy: `image.write` succeeded; the BMC's boot device is set next.
        ImageWritten => "imageWritten",
        /// Deploy: the BMC boots the machine from its disk (persistent); it reboots next.
        BootDeviceSet => "bootDeviceSet",
        /// Deploy: the BMC rebooted the machine onto its disk (the node is `deployed`).
        Rebooted => "rebooted",
        /// Rescue: the SSH server listens; the state's deadline no longer applies.
        RescueReady => "rescueReady",
    }
}

/// A node's current ramdisk boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootRecord {
    pub node_id: String,
    /// The token's public half (`boot_<20 [a-z0-9]>`); unique across nodes.
    pub token_id: String,
    /// Lowercase hex SHA-256 of the token's secret half.
    pub secret_sha256: String,
    /// The whole token `<id>.<secret>`, sealed by the control plane's credential key.
    pub sealed: String,
    /// The provision state the boot is for (`inspecting`, `commissioning`, …); its text exists
    /// only in the `purpose` column.
    pub purpose: ProvisionState,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The token is refused after this, ms since the Unix epoch.
    pub expires_at: i64,
    /// When a ramdisk joined with the token (it is spent then); `None`: still pending.
    pub used_at: Option<i64>,
    /// When the node entered its current ramdisk state, ms since the Unix epoch.
    pub phase_started_at: i64,
    /// The `bmc.power` command that powers the machine on into this boot, once issued.
    pub command_id: Option<String>,
    /// When the node left the ramdisk (ready, failed, …) and the boot ended. The row stays, so
    /// a replayed token is refused as used, until the node's next boot replaces it.
    pub ended_at: Option<i64>,
    /// Commissioning's `diag.nvml` in the ramdisk (the `gpuDiag` step), once sent.
    pub diag_command_id: Option<String>,
    /// When commissioning's inventory steps ran on this boot's report (a boot that began in
    /// `commissioning`, after `nodes.recover`, runs them on its first inventory).
    pub steps_at: Option<i64>,
    /// The workflow's command in flight (issue 16): release/retire's `disk.clean`, deploy's
    /// `image.write`, then its `bmc.setBootDevice` and `bmc.power`.
    pub work_command_id: Option<String>,
    /// The workflow's last finished step on this boot.
    pub work_step: Option<WorkStep>,
    /// The `bmc.setBootDevice none` that clears the boot override once the ramdisk joined
    /// (issue 31), once issued.
    pub override_command_id: Option<String>,
    /// Ramdisk joins with this boot's token whose machine did not show the BMC's identifiers
    /// (issue 30.2): evidence counted while the boot stays open.
    pub mismatches: u64,
}

const BOOT_COLUMNS: &str = "node_id, token_id, secret_sha256, sealed, purpose, created_at, \
    expires_at, used_at, phase_started_at, command_id, ended_at, diag_command_id, steps_at, work_command_id, \
    work_step, override_command_id, mismatches";

fn boot_from_row(r: &Row<'_>) -> Result<BootRecord, StoreError> {
    Ok(BootRecord {
        node_id: r.get(0)?,
        token_id: r.get(1)?,
        secret_sha256: r.get(2)?,
        sealed: r.get(3)?,
        purpose: parse_enum("purpose", &r.get::<String>(4)?)?,
        created_at: r.get(5)?,
        expires_at: r.get(6)?,
        used_at: r.get(7)?,
        phase_started_at: r.get(8)?,
        command_id: r.get(9)?,
        ended_at: r.get(10)?,
        diag_command_id: r.get(11)?,
        steps_at: r.get(12)?,
        work_command_id: r.get(13)?,
        work_step: r
            .get::<Option<String>>(14)?
            .map(|s| parse_enum("work_step", &s))
            .transpose()?,
        override_command_id: r.get(15)?,
        mismatches: u64::try_from(r.get::<i64>(16)?).unwrap_or(0),
    })
}

impl Tx<'_> {
    /// Inserts or replaces the boot of `b.node_id` (a new boot replaces the old one, whose token
    /// is then unknown).
    pub fn put_boot(&self, b: &BootRecord) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO node_boots (node_id, token_id, secret_sha256, sealed, purpose, \
             created_at, expires_at, used_at, phase_started_at, command_id, ended_at, diag_command_id, steps_at, \
             work_command_id, work_step, override_command_id, mismatches) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
             ON CONFLICT (node_id) DO UPDATE SET token_id = excluded.token_id, \
             secret_sha256 = excluded.secret_sha256, sealed = excluded.sealed, \
             purpose = excluded.purpose, created_at = excluded.created_at, \
             expires_at = excluded.expires_at, used_at = excluded.used_at, \
             phase_started_at = excluded.phase_started_at, command_id = excluded.command_id, \
             ended_at = excluded.ended_at, diag_command_id = excluded.diag_command_id, \
             steps_at = excluded.steps_at, work_command_id = excluded.work_command_id, \
             work_step = excluded.work_step, override_command_id = excluded.override_command_id, \
             mismatches = excluded.mismatches",
            params![
                b.node_id,
                b.token_id,
                b.secret_sha256,
                b.sealed,
                b.purpose.as_str(),
                b.created_at,
                b.expires_at,
                b.used_at,
                b.phase_started_at,
                b.command_id,
                b.ended_at,
                b.diag_command_id,
                b.steps_at,
                b.work_command_id,
                b.work_step.map(WorkStep::as_str),
                b.override_command_id,
                i64::try_from(b.mismatches).unwrap_or(i64::MAX)
            ],
        )?;
        Ok(())
    }
}

impl Reader<'_> {
    /// The current boot of `node_id`.
    pub fn boot(&self, node_id: &str) -> Result<Option<BootRecord>, StoreError> {
        self.db()
            .query_row(
                &format!("SELECT {BOOT_COLUMNS} FROM node_boots WHERE node_id = ?1"),
                params![node_id],
                boot_from_row,
            )
            .optional()
    }

    /// The boot whose token id is `token_id`.
    pub fn boot_by_token(&self, token_id: &str) -> Result<Option<BootRecord>, StoreError> {
        self.db()
            .query_row(
                &format!("SELECT {BOOT_COLUMNS} FROM node_boots WHERE token_id = ?1"),
                params![token_id],
                boot_from_row,
            )
            .optional()
    }

    /// Every boot that has not ended, by node id (the controller reads them all: a site has
    /// at most a few hundred machines in the ramdisk at once).
    pub fn boots(&self) -> Result<Vec<BootRecord>, StoreError> {
        let mut stmt = self.db().prepare_cached(&format!(
            "SELECT {BOOT_COLUMNS} FROM node_boots WHERE ended_at IS NULL ORDER BY node_id"
        ))?;
        let rows = stmt.query_map(params![], boot_from_row)?;
        rows.collect::<Result<_, _>>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(tx: &Tx<'_>, id: &str) -> Result<(), StoreError> {
        let n = crate::testing::new_node(id);
        tx.insert_node_in(&n, ProvisionState::Inspecting, 1)
    }

    fn boot(node: &str, token: &str) -> BootRecord {
        BootRecord {
            node_id: node.into(),
            token_id: token.into(),
            secret_sha256: "ab".repeat(32),
            sealed: "sealed".into(),
            purpose: ProvisionState::Inspecting,
            created_at: 1,
            expires_at: 2,
            used_at: None,
            phase_started_at: 1,
            command_id: None,
            ended_at: None,
            diag_command_id: None,
            steps_at: None,
            work_command_id: None,
            work_step: None,
            override_command_id: None,
            mismatches: 0,
        }
    }

    #[test]
    fn a_new_boot_replaces_the_old_one_and_its_token() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            node(tx, "n1")?;
            tx.put_boot(&boot("n1", "boot_a"))?;
            tx.put_boot(&boot("n1", "boot_b"))?;
            assert_eq!(tx.boot_by_token("boot_a")?, None);
            assert_eq!(tx.boot("n1")?.map(|b| b.token_id), Some("boot_b".into()));
            assert_eq!(tx.boots()?.len(), 1);
            let mut ended = boot("n1", "boot_b");
            ended.ended_at = Some(3);
            tx.put_boot(&ended)?;
            assert!(tx.boots()?.is_empty(), "an ended boot is no current boot");
            assert_eq!(
                tx.boot_by_token("boot_b")?.and_then(|b| b.ended_at),
                Some(3)
            );
            Ok(())
        })
    }
}
