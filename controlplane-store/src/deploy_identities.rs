//! The identity a deploy issues to the system it wrote (issue 30.1): one row per node in
//! `deploy_identities`, `deploy_<id>.<secret>` with the secret hashed. Each deploy replaces the
//! node's row; the row goes with the node. The store never sees the secret in clear.

use crate::db::{OptionalExt, Row};
use crate::params;

use super::{Reader, StoreError, Tx};

/// A node's deploy identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployIdentity {
    pub node_id: String,
    /// The token's public half (`deploy_<20 [a-z0-9]>`); unique across nodes.
    pub token_id: String,
    /// Lowercase hex SHA-256 of the token's secret half.
    pub secret_sha256: String,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The deployed system's last join with it, ms since the Unix epoch.
    pub last_used_at: Option<i64>,
    /// How many joins it made.
    pub uses: u64,
}

const COLUMNS: &str = "node_id, token_id, secret_sha256, created_at, last_used_at, uses";

fn from_row(r: &Row<'_>) -> Result<DeployIdentity, StoreError> {
    Ok(DeployIdentity {
        node_id: r.get(0)?,
        token_id: r.get(1)?,
        secret_sha256: r.get(2)?,
        created_at: r.get(3)?,
        last_used_at: r.get(4)?,
        uses: u64::try_from(r.get::<i64>(5)?).unwrap_or(0),
    })
}

impl Reader<'_> {
    /// The deploy identity of `node_id`, if a deploy issued one.
    pub fn deploy_identity(&self, node_id: &str) -> Result<Option<DeployIdentity>, StoreError> {
        self.db()
            .query_row(
                &format!("SELECT {COLUMNS} FROM deploy_identities WHERE node_id = ?1"),
                params![node_id],
                from_row,
            )
            .optional()
    }

    /// The deploy identity whose token id is `token_id`.
    pub fn deploy_identity_by_token(
        &self,
        token_id: &str,
    ) -> Result<Option<DeployIdentity>, StoreError> {
        self.db()
            .query_row(
                &format!("SELECT {COLUMNS} FROM deploy_identities WHERE token_id = ?1"),
                params![token_id],
                from_row,
            )
            .optional()
    }
}

impl Tx<'_> {
    /// Inserts or replaces the deploy identity of `d.node_id` (a new deploy replaces the old
    /// one, whose token is then unknown).
    pub fn put_deploy_identity(&self, d: &DeployIdentity) -> Result<(), StoreError> {
        self.db().execute(
            "INSERT INTO deploy_identities (node_id, token_id, secret_sha256, created_at, \
             last_used_at, uses) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (node_id) DO UPDATE SET token_id = excluded.token_id, \
             secret_sha256 = excluded.secret_sha256, created_at = excluded.created_at, \
             last_used_at = excluded.last_used_at, uses = excluded.uses",
            params![
                d.node_id,
                d.token_id,
                d.secret_sha256,
                d.created_at,
                d.last_used_at,
                i64::try_from(d.uses).unwrap_or(i64::MAX)
            ],
        )?;
        Ok(())
    }

    /// Drops the deploy identity of `node_id` (released, retired): its token is unknown then.
    pub fn delete_deploy_identity(&self, node_id: &str) -> Result<(), StoreError> {
        self.db().execute(
            "DELETE FROM deploy_identities WHERE node_id = ?1",
            params![node_id],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::ProvisionState;

    #[test]
    fn a_deploy_identity_is_replaced_found_by_token_and_dropped() -> Result<(), StoreError> {
        let store = crate::Store::open_in_memory()?;
        store.write_blocking(|tx| {
            tx.insert_node_in(
                &crate::testing::new_node("n1"),
                ProvisionState::Deploying,
                1,
            )?;
            let mut d = DeployIdentity {
                node_id: "n1".into(),
                token_id: "deploy_a".into(),
                secret_sha256: "ab".repeat(32),
                created_at: 1,
                last_used_at: None,
                uses: 0,
            };
            tx.put_deploy_identity(&d)?;
            d.token_id = "deploy_b".into();
            d.uses = 2;
            d.last_used_at = Some(5);
            tx.put_deploy_identity(&d)?;
            assert_eq!(tx.deploy_identity_by_token("deploy_a")?, None);
            assert_eq!(tx.deploy_identity_by_token("deploy_b")?, Some(d.clone()));
            assert_eq!(tx.deploy_identity("n1")?, Some(d));
            tx.delete_deploy_identity("n1")?;
            assert_eq!(tx.deploy_identity("n1")?, None);
            Ok(())
        })
    }
}
