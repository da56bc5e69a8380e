//! How the Redfish driver checks a BMC's certificate: one rustls `ServerCertVerifier` per BMC
//! that knows its [`TlsMode`].
//!
//! # Design
//! - `pin`: the SHA-256 of the leaf certificate (DER) must equal the pinned one; nothing else
//!   (name, expiry, issuer) is checked, since BMCs present self-signed certificates for their IP
//!   address and the pin is the identity. With no pin yet (the first contact, `bmc.verify` at
//!   enrollment) any leaf is accepted and its fingerprint recorded, to be returned in
//!   `BmcFacts.certSha256` and pinned by the control plane. The driver refuses every other
//!   operation until a pin exists.
//! - `verify`: rustls' WebPKI verifier over the `webpki-roots` bundle (Mozilla's roots).
//! - `insecure`: any certificate; the driver warns on every operation.
//!
//! In every mode the handshake signature is still verified against the presented certificate
//! (the peer must hold its key), and the fingerprint of the last certificate presented and the
//! reason of the last refusal are kept, so the driver can tell `BMC_TLS_MISMATCH` from an
//! unreachable BMC behind reqwest's transport error.

use std::sync::Arc;

use parking_lot::Mutex;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

use super::TlsMode;

/// The crypto provider of every BMC connection (ring, as the rest of bcd).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// SHA-256 of a DER certificate, lowercase hex (the spelling of `BmcEndpoint.cert_sha256`).
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

enum Check {
    Pin(Option<String>),
    WebPki(Arc<WebPkiServerVerifier>),
    Insecure,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pin(p) => f.debug_tuple("Pin").field(p).finish(),
            Self::WebPki(_) => f.write_str("WebPki"),
            Self::Insecure => f.write_str("Insecure"),
        }
    }
}

/// One BMC's certificate check, with what it last saw.
#[derive(Debug)]
pub struct BmcCertVerifier {
    check: Check,
    provider: Arc<CryptoProvider>,
    presented: Mutex<Option<String>>,
    refused: Mutex<Option<String>>,
}

impl BmcCertVerifier {
    /// A verifier for `mode` with the pinned fingerprint `pin` (lowercase hex) if there is one.
    pub fn new(mode: TlsMode, pin: Option<&str>) -> Result<Self, rustls::Error> {
        let provider = provider();
        let check = match mode {
            TlsMode::Pin => Check::Pin(pin.map(str::to_ascii_lowercase)),
            TlsMode::Insecure => Check::Insecure,
            TlsMode::Verify => {
                let roots = RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                };
                let v = WebPkiServerVerifier::builder_with_provider(
                    Arc::new(roots),
                    Arc::clone(&provider),
                )
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
                Check::WebPki(v)
            }
        };
        Ok(Self {
            check,
            provider,
            presented: Mutex::new(None),
            refused: Mutex::new(None),
        })
    }

    /// The fingerprint of the last leaf certificate the BMC presented.
    pub fn presented(&self) -> Option<String> {
        self.presented.lock().clone()
    }

    /// Why the last refused handshake was refused (taken: the next call says `None` until
    /// another refusal).
    pub fn take_refusal(&self) -> Option<String> {
        self.refused.lock().take()
    }

    /// Whether the check is pin mode without a pin yet (first contact).
    pub fn awaiting_pin(&self) -> bool {
        matches!(self.check, Check::Pin(None))
    }

    fn refuse(&self, why: String) -> rustls::Error {
        *self.refused.lock() = Some(why.clone());
        rustls::Error::General(why)
    }

    /// A rustls client config (TLS 1.2 and 1.3, ring) that checks certificates with `this`.
    pub fn client_config(this: Arc<Self>) -> Result<ClientConfig, rustls::Error> {
        let provider = Arc::clone(&this.provider);
        Ok(ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(this)
            .with_no_client_auth())
    }
}

impl ServerCertVerifier for BmcCertVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = fingerprint(end_entity);
        *self.presented.lock() = Some(fp.clone());
        match &self.check {
            Check::Pin(None) | Check::Insecure => Ok(ServerCertVerified::assertion()),
            Check::Pin(Some(pin)) if *pin == fp => Ok(ServerCertVerified::assertion()),
            Check::Pin(Some(pin)) => Err(self.refuse(format!(
                "presented a certificate with SHA-256 {fp}, pinned is {pin}"
            ))),
            Check::WebPki(v) => v
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
                .map_err(|e| {
                    self.refuse(format!(
                        "certificate with SHA-256 {fp} does not verify against the WebPKI roots: {e}"
                    ))
                }),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert() -> CertificateDer<'static> {
        let c = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]);
        match c {
            Ok(c) => c.cert.der().clone(),
            Err(e) => panic!("{e}"),
        }
    }

    fn check(v: &BmcCertVerifier, c: &CertificateDer<'_>) -> bool {
        let name = ServerName::try_from("127.0.0.1").map(|n| n.to_owned());
        let Ok(name) = name else {
            return false;
        };
        v.verify_server_cert(c, &[], &name, &[], UnixTime::now())
            .is_ok()
    }

    #[test]
    fn pin_records_at_first_contact_then_accepts_only_that_certificate() -> Result<(), rustls::Error>
    {
        let (a, b) = (cert(), cert());
        let first = BmcCertVerifier::new(TlsMode::Pin, None)?;
        assert!(first.awaiting_pin());
        assert!(check(&first, &a));
        let pin = first.presented();
        assert_eq!(pin.as_deref(), Some(fingerprint(&a)).as_deref());
        let pinned = BmcCertVerifier::new(TlsMode::Pin, pin.as_deref())?;
        assert!(!pinned.awaiting_pin());
        assert!(check(&pinned, &a));
        assert!(pinned.take_refusal().is_none());
        assert!(!check(&pinned, &b));
        let why = pinned.take_refusal().unwrap_or_default();
        assert!(why.contains(&fingerprint(&b)), "{why}");
        assert!(pinned.take_refusal().is_none(), "taken");
        Ok(())
    }

    #[test]
    fn verify_refuses_a_self_signed_certificate_and_insecure_takes_it() -> Result<(), rustls::Error>
    {
        let a = cert();
        let v = BmcCertVerifier::new(TlsMode::Verify, None)?;
        assert!(!check(&v, &a));
        assert!(v.take_refusal().is_some());
        let i = BmcCertVerifier::new(TlsMode::Insecure, None)?;
        assert!(check(&i, &a));
        assert!(BmcCertVerifier::client_config(Arc::new(i)).is_ok());
        Ok(())
    }
}
