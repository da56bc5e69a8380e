//! BMC credentials at rest: sealed with XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`)
//! under the control plane's credentials key (`bmc-credentials.key` in the state dir, 0600; the
//! adapter loads or creates it), a random 24-byte nonce per sealing, and the node id as
//! associated data, so a sealed pair copied onto another node's row does not open.
//!
//! The envelope is `xc20p1:<hex of nonce || ciphertext || tag>`. Nothing here logs; the errors
//! name the node, never a credential, and [`Credentials`]'s `Debug` leaves the password out.

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use serde::{Deserialize, Serialize};

/// Prefix of a sealed envelope: the algorithm and the envelope's version.
const ENVELOPE: &str = "xc20p1:";
/// Nonce length of XChaCha20-Poly1305, bytes.
const NONCE_LEN: usize = 24;

/// What went wrong sealing or opening credentials. Never carries a credential.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The key material is not [`CredentialKey::LEN`] bytes.
    #[error("BMC credentials key: expected {expected} bytes, got {got}")]
    KeyLength { expected: usize, got: usize },
    /// The envelope is not one this version writes.
    #[error("sealed BMC credentials of node {node_id}: not an {ENVELOPE} envelope")]
    Envelope { node_id: String },
    /// The AEAD refused: another key, another node's row, or altered bytes.
    #[error(
        "sealed BMC credentials of node {node_id} do not open with this control plane's key (another key, another node's row, or altered bytes)"
    )]
    Open { node_id: String },
    /// Sealing failed (the AEAD refused the input).
    #[error("sealing BMC credentials of node {node_id} failed")]
    Seal { node_id: String },
}

impl From<CredentialError> for crate::error::OpError {
    fn from(e: CredentialError) -> Self {
        crate::error::OpError::Internal(e.to_string())
    }
}

/// A BMC username and password, in memory only while needed (a `SiteAssignment` being built,
/// a sealing). Its `Debug` shows the username's length, never the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &"<redacted>")
            .field("password", &"<redacted>")
            .finish()
    }
}

/// The key BMC credentials are sealed under (256 bits).
#[derive(Clone)]
pub struct CredentialKey(chacha20poly1305::Key);

impl std::fmt::Debug for CredentialKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialKey(<redacted>)")
    }
}

impl CredentialKey {
    /// Key length, bytes.
    pub const LEN: usize = 32;

    /// A fresh random key (the state dir's `bmc-credentials.key` at initialisation).
    pub fn generate() -> Self {
        Self(XChaCha20Poly1305::generate_key(
            &mut chacha20poly1305::aead::OsRng,
        ))
    }

    /// A key from its bytes. Errors: not [`Self::LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CredentialError> {
        if bytes.len() != Self::LEN {
            return Err(CredentialError::KeyLength {
                expected: Self::LEN,
                got: bytes.len(),
            });
        }
        Ok(Self(*chacha20poly1305::Key::from_slice(bytes)))
    }

    /// The key's bytes, to be written to its 0600 file.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        self.0.into()
    }

    /// Seals `c` for node `node_id`.
    pub fn seal(&self, node_id: &str, c: &Credentials) -> Result<String, CredentialError> {
        let plain = serde_json::to_vec(c).map_err(|_| CredentialError::Seal {
            node_id: node_id.to_owned(),
        })?;
        self.seal_raw(node_id, node_id.as_bytes(), &plain)
    }

    /// Opens what [`Self::seal`] sealed for `node_id`. Errors: not an envelope, or the AEAD
    /// refused (another key, another node, altered bytes).
    pub fn open(&self, node_id: &str, sealed: &str) -> Result<Credentials, CredentialError> {
        let plain = self.open_raw(node_id, node_id.as_bytes(), sealed)?;
        serde_json::from_slice(&plain).map_err(|_| CredentialError::Open {
            node_id: node_id.to_owned(),
        })
    }

    /// Seals a boot token (issue 15) for node `node_id`. Bound to the node and to its use: an
    /// envelope of BMC credentials never opens as a boot token, nor the other way round.
    pub fn seal_boot_token(&self, node_id: &str, token: &str) -> Result<String, CredentialError> {
        self.seal_raw(node_id, boot_aad(node_id).as_bytes(), token.as_bytes())
    }

    /// Opens what [`Self::seal_boot_token`] sealed for `node_id`.
    pub fn open_boot_token(&self, node_id: &str, sealed: &str) -> Result<String, CredentialError> {
        let plain = self.open_raw(node_id, boot_aad(node_id).as_bytes(), sealed)?;
        String::from_utf8(plain).map_err(|_| CredentialError::Open {
            node_id: node_id.to_owned(),
        })
    }

    fn seal_raw(&self, node_id: &str, aad: &[u8], plain: &[u8]) -> Result<String, CredentialError> {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut chacha20poly1305::aead::OsRng);
        let sealed = XChaCha20Poly1305::new(&self.0)
            .encrypt(&nonce, Payload { msg: plain, aad })
            .map_err(|_| CredentialError::Seal {
                node_id: node_id.to_owned(),
            })?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&sealed);
        Ok(format!("{ENVELOPE}{}", hex::encode(out)))
    }

    fn open_raw(
        &self,
        node_id: &str,
        aad: &[u8],
        sealed: &str,
    ) -> Result<Vec<u8>, CredentialError> {
        let bytes = sealed
            .strip_prefix(ENVELOPE)
            .and_then(|h| hex::decode(h).ok())
            .filter(|b| b.len() > NONCE_LEN)
            .ok_or_else(|| CredentialError::Envelope {
                node_id: node_id.to_owned(),
            })?;
        let (nonce, body) = bytes.split_at(NONCE_LEN);
        XChaCha20Poly1305::new(&self.0)
            .decrypt(XNonce::from_slice(nonce), Payload { msg: body, aad })
            .map_err(|_| CredentialError::Open {
                node_id: node_id.to_owned(),
            })
    }
}

/// The associated data of a sealed boot token: the node, and the use.
fn boot_aad(node_id: &str) -> String {
    format!("boot-token:{node_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> Credentials {
        Credentials {
            username: "admin".into(),
            password: "hunter2-very-secret".into(),
        }
    }

    #[test]
    fn round_trip_with_a_fresh_nonce_each_time() -> Result<(), CredentialError> {
        let k = CredentialKey::generate();
        let a = k.seal("node_a", &creds())?;
        let b = k.seal("node_a", &creds())?;
        assert_ne!(a, b, "a random nonce per sealing");
        assert!(!a.contains("hunter2") && !a.contains("admin"));
        assert_eq!(k.open("node_a", &a)?, creds());
        let again = CredentialKey::from_bytes(&k.to_bytes())?;
        assert_eq!(again.open("node_a", &b)?, creds());
        Ok(())
    }

    #[test]
    fn another_key_another_node_or_altered_bytes_do_not_open() -> Result<(), CredentialError> {
        let k = CredentialKey::generate();
        let sealed = k.seal("node_a", &creds())?;
        assert!(matches!(
            CredentialKey::generate().open("node_a", &sealed),
            Err(CredentialError::Open { .. })
        ));
        assert!(matches!(
            k.open("node_b", &sealed),
            Err(CredentialError::Open { .. })
        ));
        // Flip one bit of the ciphertext.
        let mut bytes = hex::decode(&sealed[ENVELOPE.len()..]).unwrap_or_default();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let tampered = format!("{ENVELOPE}{}", hex::encode(bytes));
        assert!(matches!(
            k.open("node_a", &tampered),
            Err(CredentialError::Open { .. })
        ));
        assert!(matches!(
            k.open("node_a", "plaintext"),
            Err(CredentialError::Envelope { .. })
        ));
        assert!(matches!(
            CredentialKey::from_bytes(&[0u8; 16]),
            Err(CredentialError::KeyLength { got: 16, .. })
        ));
        Ok(())
    }

    #[test]
    fn a_boot_token_opens_only_as_a_boot_token_of_its_node() -> Result<(), CredentialError> {
        let key = CredentialKey::generate();
        let sealed = key.seal_boot_token("n1", "boot_abc.secret")?;
        assert_eq!(key.open_boot_token("n1", &sealed)?, "boot_abc.secret");
        assert!(matches!(
            key.open_boot_token("n2", &sealed),
            Err(CredentialError::Open { .. })
        ));
        assert!(matches!(
            key.open("n1", &sealed),
            Err(CredentialError::Open { .. })
        ));
        let creds = key.seal("n1", &creds())?;
        assert!(matches!(
            key.open_boot_token("n1", &creds),
            Err(CredentialError::Open { .. })
        ));
        Ok(())
    }

    #[test]
    fn debug_never_shows_a_secret() {
        let text = format!("{:?} {:?}", creds(), CredentialKey::generate());
        assert!(
            !text.contains("hunter2") && !text.contains("admin"),
            "{text}"
        );
    }
}
