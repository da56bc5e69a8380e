//! `tokens.*`: join tokens bound to a pool or a site (or both, when the pool is on that site).

use cpl_store::{JoinToken, NewToken, Reader, Tx, now_ms};

use crate::error::OpError;
use crate::ownership::placement_for_join;

/// `tokens.create`: checks the binding (pool and site exist and agree), then creates the token.
/// Returns the token and its `<id>.<secret>` string, shown once.
pub fn create(tx: &Tx<'_>, new: &NewToken) -> Result<(JoinToken, String), OpError> {
    if new.ttl_ms <= 0 {
        return Err(OpError::InvalidArgument("ttl must be positive".into()));
    }
    if new.max_uses == Some(0) {
        return Err(OpError::InvalidArgument(
            "maxUses must be at least 1".into(),
        ));
    }
    // The store holds a signed 64-bit integer: what it cannot hold is refused, never clamped.
    if let Some(m) = new.max_uses
        && i64::try_from(m).is_err()
    {
        return Err(OpError::InvalidArgument(format!(
            "maxUses {m} is more than the store holds (at most {})",
            i64::MAX
        )));
    }
    placement_for_join(tx, new.pool_id.as_deref(), new.site_id.as_deref(), false)?;
    Ok(tx.create_token(new, now_ms())?)
}

/// `tokens.list`: every token, without secrets.
pub fn list(conn: &Reader<'_>) -> Result<Vec<JoinToken>, OpError> {
    Ok(conn.tokens()?)
}

/// `tokens.revoke`: the token is refused from now on. `NOT_FOUND` for an unknown id.
pub fn revoke(tx: &Tx<'_>, id: &str) -> Result<(), OpError> {
    if !tx.revoke_token(id)? {
        return Err(OpError::NotFound {
            kind: "token",
            id: id.to_owned(),
        });
    }
    Ok(())
}
