//! Where a mode keeps its identity: on disk in the state dir (`bcd agent`, `bcd site`), or in
//! memory (`bcd sim`, whose thousands of nodes must not each own a state dir; a ramdisk whose
//! identity dies with the boot). Identities are shared (`Arc`): the memory store and the session
//! loop hold the same one, not two copies of its PEMs per node.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{Identity, StateDir, StateError};

/// Storage of one node identity.
pub trait IdentityStore: Send + Sync + std::fmt::Debug {
    /// The stored identity; `None` when the node has not joined (or its identity was retired).
    fn load(&self) -> Result<Option<Arc<Identity>>, StateError>;
    /// Stores an identity after a join.
    fn save(&self, identity: &Arc<Identity>) -> Result<(), StateError>;
    /// Replaces the key and certificate after a renewal (node id and generation stay).
    fn replace_certificate(&self, key_pem: &str, cert_pem: &str) -> Result<(), StateError>;
    /// Retires a dead identity (revoked, deleted, expired, broken) so it is never used again;
    /// `why` is kept for people where the store can keep it.
    fn retire(&self, why: &str) -> Result<(), StateError>;

    /// Checks a loaded identity before it is used; [`StateError::Broken`] names the file at
    /// fault. Nothing to check by default (an identity held in memory came from a join).
    fn verify(&self, _identity: &Identity) -> Result<(), StateError> {
        Ok(())
    }

    /// [`IdentityStore::load`], then [`IdentityStore::verify`]: what the lifecycle takes into
    /// use.
    fn load_checked(&self) -> Result<Option<Arc<Identity>>, StateError> {
        let id = self.load()?;
        if let Some(i) = &id {
            self.verify(i)?;
        }
        Ok(id)
    }
}

impl IdentityStore for StateDir {
    fn load(&self) -> Result<Option<Arc<Identity>>, StateError> {
        Ok(self.load_identity()?.map(Arc::new))
    }

    fn save(&self, identity: &Arc<Identity>) -> Result<(), StateError> {
        self.save_identity(identity)
    }

    fn replace_certificate(&self, key_pem: &str, cert_pem: &str) -> Result<(), StateError> {
        StateDir::replace_certificate(self, key_pem, cert_pem)
    }

    fn retire(&self, why: &str) -> Result<(), StateError> {
        self.retire_identity(why)
    }

    /// Files on disk can be cut, swapped or mixed up: every one is checked
    /// ([`crate::identity_check::check`]).
    fn verify(&self, identity: &Identity) -> Result<(), StateError> {
        crate::identity_check::check(self.path(), identity)
    }
}

/// An identity held in memory only: lost with the process.
#[derive(Debug, Default)]
pub struct MemoryIdentity {
    slot: Mutex<Option<Arc<Identity>>>,
}

impl IdentityStore for MemoryIdentity {
    fn load(&self) -> Result<Option<Arc<Identity>>, StateError> {
        Ok(self.slot.lock().clone())
    }

    fn save(&self, identity: &Arc<Identity>) -> Result<(), StateError> {
        *self.slot.lock() = Some(Arc::clone(identity));
        Ok(())
    }

    fn replace_certificate(&self, key_pem: &str, cert_pem: &str) -> Result<(), StateError> {
        if let Some(id) = self.slot.lock().as_mut() {
            let id = Arc::make_mut(id);
            key_pem.clone_into(&mut id.key_pem);
            cert_pem.clone_into(&mut id.cert_pem);
        }
        Ok(())
    }

    fn retire(&self, _why: &str) -> Result<(), StateError> {
        *self.slot.lock() = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NodeFile;

    fn identity() -> Identity {
        Identity {
            node: NodeFile {
                node_id: "node_a".into(),
                identity_generation: 1,
                control_plane: "https://127.0.0.1:1".into(),
                trust_domain: "bc.test".into(),
                joined_at: "2026-01-01T00:00:00Z".into(),
            },
            key_pem: "KEY".into(),
            cert_pem: "CERT".into(),
            ca_pem: "CA".into(),
        }
    }

    #[test]
    fn memory_and_disk_stores_behave_alike() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let disk = StateDir::open(&dir.path().join("bcd"))?;
        let stores: [&dyn IdentityStore; 2] = [&MemoryIdentity::default(), &disk];
        for store in stores {
            assert!(store.load()?.is_none());
            store.save(&Arc::new(identity()))?;
            store.replace_certificate("KEY2", "CERT2")?;
            let back = store.load()?.ok_or("identity missing")?;
            assert_eq!(back.node, identity().node);
            assert_eq!(
                (back.key_pem.as_str(), back.cert_pem.as_str()),
                ("KEY2", "CERT2")
            );
            store.retire("revoked in a test")?;
            assert!(store.load()?.is_none());
        }
        Ok(())
    }
}
