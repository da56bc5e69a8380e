//! Join tokens, `<id>.<secret>` (kubeadm's bootstrap-token form: 6 and 16 characters of
//! `[a-z0-9]`). Only the SHA-256 of the secret is stored.

use crate::db::Db;
use crate::db::OptionalExt;
use crate::params;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::{Reader, StoreError, Tx, sql_u64};

/// A stored token, without its secret.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct JoinToken {
    pub id: String,
    pub pool_id: Option<String>,
    pub site_id: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub expires_at: i64,
    /// `None`: unlimited.
    pub max_uses: Option<u64>,
    pub uses: u64,
    pub revoked: bool,
    pub created_at: i64,
}

impl JoinToken {
    /// Why this (authenticated) token cannot be spent at `now`: revoked, expired or used up.
    /// `None`: it can.
    pub fn refusal_at(&self, now: i64) -> Option<TokenRefusal> {
        let id = self.id.clone();
        if self.revoked {
            return Some(TokenRefusal::Revoked { id });
        }
        if self.expires_at <= now {
            return Some(TokenRefusal::Expired { id });
        }
        match self.max_uses {
            Some(max) if self.uses >= max => Some(TokenRefusal::UsedUp { id, max }),
            _ => None,
        }
    }
}

/// Why a token was refused. The message never contains the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Not of the form `<id>.<secret>`.
    #[error("join token is malformed: expected <id>.<secret>")]
    Malformed,
    /// No token with this id, or the secret does not match.
    #[error("join token {id} is not known to this control plane")]
    Unknown { id: String },
    /// Past its expiry.
    #[error("join token {id} expired")]
    Expired { id: String },
    /// All uses spent.
    #[error("join token {id} has no uses left ({max} of {max} used)")]
    UsedUp { id: String, max: u64 },
    /// Revoked by an operator.
    #[error("join token {id} was revoked")]
    Revoked { id: String },
}

/// Options of a new token.
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    pub pool_id: Option<String>,
    pub site_id: Option<String>,
    /// Milliseconds.
    pub ttl_ms: i64,
    pub max_uses: Option<u64>,
    pub description: Option<String>,
}

fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

fn row_to_token(row: &crate::db::Row<'_>) -> Result<JoinToken, StoreError> {
    let max_uses: Option<i64> = row.get(4)?;
    let uses: i64 = row.get(5)?;
    Ok(JoinToken {
        id: row.get(0)?,
        pool_id: row.get(1)?,
        site_id: row.get(2)?,
        expires_at: row.get(3)?,
        max_uses: max_uses.map(|m| u64::try_from(m).unwrap_or(0)),
        uses: u64::try_from(uses).unwrap_or(0),
        revoked: row.get(6)?,
        created_at: row.get(7)?,
    })
}

const TOKEN_COLUMNS: &str = "id, pool_id, site_id, expires_at, max_uses, uses, revoked, created_at";

impl Tx<'_> {
    /// Creates a token; returns it (without secret) and the full `<id>.<secret>` string, which is shown
    /// once and never stored.
    pub fn create_token(
        &self,
        new: &NewToken,
        now: i64,
    ) -> Result<(JoinToken, String), StoreError> {
        let conn = self.db();
        let id = super::random_lowercase(6);
        let secret = super::random_lowercase(16);
        let expires_at = now.saturating_add(new.ttl_ms);
        conn.execute(
        "INSERT INTO join_tokens (id, secret_hash, pool_id, site_id, expires_at, max_uses, description, created_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            id,
            hash_secret(&secret),
            new.pool_id,
            new.site_id,
            expires_at,
            new.max_uses.map(sql_u64),
            new.description,
            now
        ],
    )?;
        let token = JoinToken {
            id: id.clone(),
            pool_id: new.pool_id.clone(),
            site_id: new.site_id.clone(),
            expires_at,
            max_uses: new.max_uses,
            uses: 0,
            revoked: false,
            created_at: now,
        };
        Ok((token, format!("{id}.{secret}")))
    }

    /// Checks `token` and spends one use. Returns the token on success; a refusal leaves the token
    /// unchanged.
    pub fn consume_token(
        &self,
        token: &str,
        now: i64,
    ) -> Result<Result<JoinToken, TokenRefusal>, StoreError> {
        consume(self.db(), token, now)
    }

    /// Spends one use of the token `id` (after [`Reader::authenticate_token`] and
    /// [`JoinToken::refusal_at`] allowed it).
    pub fn spend_token(&self, id: &str) -> Result<(), StoreError> {
        spend(self.db(), id)
    }

    /// `tokens.revoke`: the token is refused from now on. Returns false for an unknown id.
    pub fn revoke_token(&self, id: &str) -> Result<bool, StoreError> {
        let n = self.db().execute(
            "UPDATE join_tokens SET revoked = 1 WHERE id = ?1",
            params![id],
        )?;
        Ok(n > 0)
    }
}

impl Reader<'_> {
    /// The token `<id>.<secret>` names, if the secret is right: `Malformed` or `Unknown`
    /// otherwise. Says nothing about revocation, expiry or uses ([`JoinToken::refusal_at`]) and
    /// spends nothing.
    pub fn authenticate_token(
        &self,
        token: &str,
    ) -> Result<Result<JoinToken, TokenRefusal>, StoreError> {
        authenticate(self.db(), token)
    }

    /// Every token, newest first.
    pub fn tokens(&self) -> Result<Vec<JoinToken>, StoreError> {
        let mut stmt = self.db().prepare(&format!(
            "SELECT {TOKEN_COLUMNS} FROM join_tokens ORDER BY created_at DESC, id"
        ))?;
        let rows = stmt.query_map(params![], row_to_token)?;
        rows.collect::<Result<_, _>>()
    }
}

fn authenticate(conn: Db<'_>, token: &str) -> Result<Result<JoinToken, TokenRefusal>, StoreError> {
    let Some((id, secret)) = token.trim().split_once('.') else {
        return Ok(Err(TokenRefusal::Malformed));
    };
    if id.is_empty() || secret.is_empty() {
        return Ok(Err(TokenRefusal::Malformed));
    }
    let found: Option<(JoinToken, String)> = conn
        .query_row(
            &format!("SELECT {TOKEN_COLUMNS}, secret_hash FROM join_tokens WHERE id = ?1"),
            params![id],
            |row| Ok((row_to_token(row)?, row.get::<String>(8)?)),
        )
        .optional()?;
    let Some((tok, hash)) = found else {
        return Ok(Err(TokenRefusal::Unknown { id: id.to_owned() }));
    };
    // Constant-time enough for a hex digest comparison: both sides are digests, not the secret.
    if hash != hash_secret(secret) {
        return Ok(Err(TokenRefusal::Unknown { id: id.to_owned() }));
    }
    Ok(Ok(tok))
}

fn spend(conn: Db<'_>, id: &str) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE join_tokens SET uses = uses + 1 WHERE id = ?1",
        params![id],
    )?;
    Ok(())
}

fn consume(
    conn: Db<'_>,
    token: &str,
    now: i64,
) -> Result<Result<JoinToken, TokenRefusal>, StoreError> {
    let tok = match authenticate(conn, token)? {
        Ok(t) => t,
        Err(r) => return Ok(Err(r)),
    };
    if let Some(r) = tok.refusal_at(now) {
        return Ok(Err(r));
    }
    spend(conn, &tok.id)?;
    Ok(Ok(JoinToken {
        uses: tok.uses + 1,
        ..tok
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_lifecycle_refusals() -> Result<(), StoreError> {
        let store = crate::testing::store()?;
        store.write_blocking(|tx| {
            let c = tx.db();
            let (_, t) = tx.create_token(
                &NewToken {
                    ttl_ms: 1000,
                    max_uses: Some(1),
                    ..Default::default()
                },
                0,
            )?;
            assert!(consume(c, "nodot", 0)?.is_err());
            let wrong = format!("{}.wrongsecret", t.split('.').next().unwrap_or_default());
            assert!(matches!(
                consume(c, &wrong, 0)?,
                Err(TokenRefusal::Unknown { .. })
            ));
            assert!(matches!(
                consume(c, &t, 1000)?,
                Err(TokenRefusal::Expired { .. })
            ));
            assert!(consume(c, &t, 10)?.is_ok());
            assert!(matches!(
                consume(c, &t, 10)?,
                Err(TokenRefusal::UsedUp { max: 1, .. })
            ));
            let stored: String = c.query_row(
                "SELECT secret_hash FROM join_tokens",
                crate::params![],
                |r| r.get(0),
            )?;
            assert!(!t.ends_with(&stored), "secret must be stored hashed");
            Ok(())
        })
    }
}
