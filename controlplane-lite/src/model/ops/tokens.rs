//! `tokens.*`: join tokens bound to a pool or a site (or both, when the pool is on that site).

use rusqlite::{Connection, params};

use crate::model::error::OpError;
use crate::model::ownership::placement_for_join;
use crate::store::now_ms;
use crate::store::tokens::{self, JoinToken, NewToken};

/// `tokens.create`: checks the binding (pool and site exist and agree), then creates the token.
/// Returns the token and its `<id>.<secret>` string, shown once.
pub fn create(tx: &Connection, new: &NewToken) -> Result<(JoinToken, String), OpError> {
    if new.ttl_ms <= 0 {
        return Err(OpError::InvalidArgument("ttl must be positive".into()));
    }
    if new.max_uses == Some(0) {
        return Err(OpError::InvalidArgument(
            "maxUses must be at least 1".into(),
        ));
    }
    placement_for_join(tx, new.pool_id.as_deref(), new.site_id.as_deref(), false)?;
    Ok(tokens::create(tx, new, now_ms())?)
}

/// `tokens.list`: every token, without secrets.
pub fn list(conn: &Connection) -> Result<Vec<JoinToken>, OpError> {
    Ok(tokens::list(conn)?)
}

/// `tokens.revoke`: the token is refused from now on. `NOT_FOUND` for an unknown id.
pub fn revoke(tx: &Connection, id: &str) -> Result<(), OpError> {
    let n = tx.execute(
        "UPDATE join_tokens SET revoked = 1 WHERE id = ?1",
        params![id],
    )?;
    if n == 0 {
        return Err(OpError::NotFound {
            kind: "token",
            id: id.to_owned(),
        });
    }
    Ok(())
}
