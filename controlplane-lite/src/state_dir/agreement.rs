//! Whether the store and the state dir belong together (issue 30.7): the store records the CA
//! pin (PostgreSQL, shared by replicas; SQLite's is in `state-dir.json`) and the SHA-256 of the
//! BMC credentials key (both backends) at the first start, and a start whose state dir holds
//! another CA or key is refused: its certificates or sealed credentials would not agree with the
//! store.

use std::path::Path;

use cpl_core::bare_metal::CredentialKey;
use cpl_store::{Store, StoreError};

use crate::server::ServeError;
use crate::state_dir::STORE_FILE;

/// The `meta` key of the credentials key's digest.
const KEY_META: &str = "bmcCredentialKeySha256";

/// Checks `store` against the state dir `dir`: on PostgreSQL (`postgres`: the store's name for
/// messages, its password left out) the CA pin and the key's digest
/// ([`ServeError::StoreOfAnother`]); on SQLite the key's digest ([`check_sqlite_key`]).
pub(crate) fn check(
    dir: &Path,
    store: &Store,
    postgres: Option<String>,
    pin: &str,
    key: &CredentialKey,
) -> Result<(), ServeError> {
    let key_sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.to_bytes()));
    let Some(store_name) = postgres else {
        return check_sqlite_key(dir, store, key, &key_sha256);
    };
    let (stored_pin, stored_key) = store.write_blocking(|tx| {
        Ok::<_, StoreError>((
            tx.claim_meta("caPin", pin)?,
            tx.claim_meta(KEY_META, &key_sha256)?,
        ))
    })?;
    for (what, stored, ours) in [
        ("CA pin", stored_pin, pin.to_owned()),
        ("BMC credential key sha256", stored_key, key_sha256),
    ] {
        if stored != ours {
            return Err(ServeError::StoreOfAnother {
                store: store_name,
                what,
                stored,
                ours,
            });
        }
    }
    Ok(())
}

/// The SQLite store's record of the BMC credentials key (`bmcCredentialKeySha256` in its
/// `meta` table, as PostgreSQL keeps it) against the state dir's key: recorded on the first
/// start, refused on a mismatch ([`ServeError::KeyOfAnotherStore`], naming the file). A store
/// that sealed credentials before the digest was recorded is checked by opening one of them, so
/// the first start after an upgrade does not record a wrong key's digest.
fn check_sqlite_key(
    dir: &Path,
    store: &Store,
    key: &CredentialKey,
    key_sha256: &str,
) -> Result<(), ServeError> {
    let refused = |evidence: String| ServeError::KeyOfAnotherStore {
        key_file: dir.join(crate::state_dir::BMC_KEY_FILE),
        store: dir.join(STORE_FILE),
        evidence,
    };
    let (recorded, sample) =
        store.read_blocking(|r| Ok::<_, StoreError>((r.meta(KEY_META)?, r.first_sealed_bmc()?)))?;
    if recorded.is_none()
        && let Some((node_id, sealed)) = sample
        && key.open(&node_id, &sealed).is_err()
    {
        return Err(refused(format!(
            "the sealed credentials of node {node_id} do not open with it"
        )));
    }
    let stored = store.write_blocking(|tx| tx.claim_meta(KEY_META, key_sha256))?;
    if stored != key_sha256 {
        return Err(refused(format!(
            "the store records key sha256 {stored}, the file's is {key_sha256}"
        )));
    }
    Ok(())
}
