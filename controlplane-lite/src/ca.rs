//! The control plane's certificate authority: made on first start (ECDSA P-256, rcgen), the
//! gateway's server certificate, node certificates signed from agents' CSRs, and the CA pin.
//!
//! Node certificates carry the node id and identity generation in a URI SAN,
//! `spiffe://<trust-domain>/node/<node_id>/gen/<n>` (DESIGN.md "Protocol"), live 24 h by default,
//! and have `notBefore` backdated five minutes for clock skew.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

/// Clock-skew allowance: `notBefore` is this far in the past.
pub const NOT_BEFORE_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Default node certificate lifetime.
pub const DEFAULT_NODE_CERT_TTL: Duration = Duration::from_secs(24 * 3600);

/// What went wrong with the CA or a certificate.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// Reading or writing a file of the CA failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// rcgen refused (bad key, bad parameters).
    #[error("certificate generation: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// The agent's CSR is not a valid, self-signed PKCS#10 request.
    #[error("certificate signing request is invalid: {0}")]
    BadCsr(rcgen::Error),
    /// The CSR is not PEM-wrapped DER of a PKCS#10 request.
    #[error("certificate signing request is not a PEM PKCS#10 request: {0}")]
    CsrSyntax(String),
    /// The CSR's key is of a type node certificates are not issued for.
    #[error(
        "certificate signing request has a {key_type} key; node certificates are issued for {ACCEPTED_KEY_TYPE} keys only"
    )]
    UnsupportedKey { key_type: String },
    /// A CA file holds something that is not the CA's key or certificate.
    #[error("{path}: {reason}")]
    Load { path: PathBuf, reason: String },
    /// A certificate could not be parsed.
    #[error("certificate is not valid X.509: {0}")]
    BadCertificate(String),
    /// The certificate has no node identity SAN of this trust domain.
    #[error("certificate carries no spiffe://{trust_domain}/node/<id>/gen/<n> URI SAN")]
    NoNodeIdentity { trust_domain: String },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CaError + '_ {
    move |source| CaError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The one key type node certificates are issued for: what `bcd` makes, and what this CA labels
/// correctly and the gateway verifies end to end. Other types are refused before a join token is
/// spent (issue 19.14: a P-384 key used to get a certificate labelled P-256).
pub const ACCEPTED_KEY_TYPE: &str = "ECDSA P-256";

/// The key type of a CSR, in words: `ECDSA P-256`, `ECDSA P-384`, `ECDSA P-521`,
/// `ECDSA secp256k1`, `RSA-2048`, `Ed25519`, `Ed448`, or the algorithm's OID.
pub fn csr_key_type(csr_pem: &str) -> Result<String, CaError> {
    use x509_parser::certification_request::X509CertificationRequest;
    use x509_parser::oid_registry as oids;
    use x509_parser::prelude::FromDer;
    let (_, pem) = x509_parser::pem::parse_x509_pem(csr_pem.as_bytes())
        .map_err(|e| CaError::CsrSyntax(e.to_string()))?;
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| CaError::CsrSyntax(e.to_string()))?;
    let spki = &csr.certification_request_info.subject_pki;
    let alg = &spki.algorithm.algorithm;
    if *alg == oids::OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| x509_parser::der_parser::oid::Oid::try_from(p).ok())
            .map(|o| o.to_id_string());
        let name = match curve.as_deref() {
            Some("1.2.840.10045.3.1.7") => "P-256".to_owned(),
            Some("1.3.132.0.34") => "P-384".to_owned(),
            Some("1.3.132.0.35") => "P-521".to_owned(),
            Some("1.3.132.0.10") => "secp256k1".to_owned(),
            Some(other) => format!("curve {other}"),
            None => "curve without a name".to_owned(),
        };
        return Ok(format!("ECDSA {name}"));
    }
    if *alg == oids::OID_PKCS1_RSAENCRYPTION {
        let bits = spki.parsed().map(|k| k.key_size()).unwrap_or(0);
        return Ok(format!("RSA-{bits}"));
    }
    if *alg == oids::OID_SIG_ED25519 {
        return Ok("Ed25519".to_owned());
    }
    if alg.to_id_string() == "1.3.101.113" {
        return Ok("Ed448".to_owned());
    }
    Ok(format!("key algorithm {}", alg.to_id_string()))
}

/// Refuses a CSR whose key is not [`ACCEPTED_KEY_TYPE`], naming its type; then checks that it
/// is a valid self-signed request. Every path that signs a CSR (join, renewal) goes through it.
pub fn check_csr(csr_pem: &str) -> Result<CertificateSigningRequestParams, CaError> {
    // A CSR that does not even parse here is left to rcgen, whose error says what is wrong.
    if let Ok(key_type) = csr_key_type(csr_pem)
        && key_type != ACCEPTED_KEY_TYPE
    {
        return Err(CaError::UnsupportedKey { key_type });
    }
    CertificateSigningRequestParams::from_pem(csr_pem).map_err(CaError::BadCsr)
}

/// Writes `data` to `path` atomically with `mode`: [`bc_sys::atomic::write`] (temp file, fsync,
/// rename, directory fsync), its error as [`CaError::Io`].
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), CaError> {
    bc_sys::atomic::write(path, data, mode).map_err(|e| CaError::Io {
        path: e.path,
        source: e.source,
    })
}

/// The node identity a certificate carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node_id: String,
    pub identity_generation: u64,
    /// Milliseconds since the Unix epoch.
    pub not_after_ms: i64,
}

/// The CA, loaded from or created in a directory.
#[derive(Debug)]
pub struct CertificateAuthority {
    key: KeyPair,
    cert_pem: String,
    cert_der: Vec<u8>,
    trust_domain: String,
}

impl CertificateAuthority {
    /// Loads `ca.key`/`ca.crt` from `dir`. Never makes a new CA: a missing or broken file is an
    /// error naming it (a new CA would change the pin and cut off every enrolled agent). Errors
    /// also when the key is not the certificate's.
    pub fn load(dir: &Path, trust_domain: &str) -> Result<Self, CaError> {
        let key_path = dir.join("ca.key");
        let cert_path = dir.join("ca.crt");
        let key_pem = fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
        let cert_pem = fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CaError::Load {
            path: key_path.clone(),
            reason: format!("not a private key in PEM: {e}"),
        })?;
        let cert_der = pem_to_der(&cert_pem).map_err(|e| CaError::Load {
            path: cert_path.clone(),
            reason: e.to_string(),
        })?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(&cert_der).map_err(|e| CaError::Load {
                path: cert_path.clone(),
                reason: format!("not an X.509 certificate: {e}"),
            })?;
        if cert
            .tbs_certificate
            .subject_pki
            .subject_public_key
            .data
            .as_ref()
            != key.public_key_raw()
        {
            return Err(CaError::Load {
                path: key_path,
                reason: format!(
                    "this key does not belong to the certificate in {}",
                    cert_path.display()
                ),
            });
        }
        Ok(Self {
            key,
            cert_pem,
            cert_der,
            trust_domain: trust_domain.to_owned(),
        })
    }

    /// Makes a new CA in `dir` (`ca.key` 0600, `ca.crt`): only for a state dir being initialised
    /// (`crate::state_dir`).
    pub fn create(dir: &Path, trust_domain: &str) -> Result<Self, CaError> {
        let key_path = dir.join("ca.key");
        let cert_path = dir.join("ca.crt");
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("controlplane-lite CA ({trust_domain})"),
        );
        dn.push(DnType::OrganizationName, "Better Compute");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - NOT_BEFORE_BACKDATE;
        params.not_after = now + Duration::from_secs(10 * 365 * 24 * 3600);
        let cert = params.self_signed(&key)?;
        write_atomic(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
        write_atomic(&cert_path, cert.pem().as_bytes(), 0o644)?;
        Ok(Self {
            key,
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            trust_domain: trust_domain.to_owned(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The trust domain in node SANs.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// `sha256:<hex of the CA's SubjectPublicKeyInfo>` (kubeadm's discovery hash).
    pub fn pin(&self) -> Result<String, CaError> {
        spki_pin(&self.cert_der)
    }

    fn issuer(&self) -> Result<Issuer<'_, &KeyPair>, CaError> {
        Ok(Issuer::from_ca_cert_pem(&self.cert_pem, &self.key)?)
    }

    /// A server certificate for the gateway, valid for `names` (DNS names or IP addresses), with
    /// its fresh key. Returns (chain PEM: leaf then CA, key PEM).
    pub fn server_cert(&self, names: &[String]) -> Result<(String, String), CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, "controlplane-lite gateway");
        for n in names {
            let san = match n.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(n.clone().try_into()?),
            };
            params.subject_alt_names.push(san);
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - NOT_BEFORE_BACKDATE;
        params.not_after = now + Duration::from_secs(365 * 24 * 3600);
        let cert = params.signed_by(&key, &self.issuer()?)?;
        Ok((
            format!("{}{}", cert.pem(), self.cert_pem),
            key.serialize_pem(),
        ))
    }

    /// Signs an agent's CSR for `node_id` at `identity_generation`. Only the CSR's public key is
    /// used: subject and SANs come from the control plane, never from the request.
    pub fn sign_node_csr(
        &self,
        csr_pem: &str,
        node_id: &str,
        identity_generation: u64,
        ttl: Duration,
    ) -> Result<(String, NodeIdentity), CaError> {
        let csr = check_csr(csr_pem)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, node_id);
        let uri = format!(
            "spiffe://{}/node/{node_id}/gen/{identity_generation}",
            self.trust_domain
        );
        params.subject_alt_names = vec![SanType::URI(uri.try_into()?)];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - NOT_BEFORE_BACKDATE;
        params.not_after = now + ttl;
        let cert = params.signed_by(&csr.public_key, &self.issuer()?)?;
        let not_after_ms =
            i64::try_from(params.not_after.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        Ok((
            cert.pem(),
            NodeIdentity {
                node_id: node_id.to_owned(),
                identity_generation,
                not_after_ms,
            },
        ))
    }

    /// Reads the node identity from a (chain-verified) client certificate, DER.
    pub fn node_identity(&self, cert_der: &[u8]) -> Result<NodeIdentity, CaError> {
        node_identity(cert_der, &self.trust_domain)
    }
}

fn pem_to_der(pem: &str) -> Result<Vec<u8>, CaError> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    Ok(p.contents)
}

/// `sha256:<hex>` over a certificate's SubjectPublicKeyInfo (DER).
pub fn spki_pin(cert_der: &[u8]) -> Result<String, CaError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(Sha256::digest(cert.tbs_certificate.subject_pki.raw))
    ))
}

/// Reads `spiffe://<trust_domain>/node/<id>/gen/<n>` from a certificate's URI SANs.
pub fn node_identity(cert_der: &[u8], trust_domain: &str) -> Result<NodeIdentity, CaError> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der)
        .map_err(|e| CaError::BadCertificate(e.to_string()))?;
    let no_identity = || CaError::NoNodeIdentity {
        trust_domain: trust_domain.to_owned(),
    };
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CaError::BadCertificate(e.to_string()))?
        .ok_or_else(no_identity)?;
    let prefix = format!("spiffe://{trust_domain}/node/");
    for name in &san.value.general_names {
        if let x509_parser::extensions::GeneralName::URI(uri) = name {
            let Some(rest) = uri.strip_prefix(&prefix) else {
                continue;
            };
            let Some((node_id, gen_part)) = rest.split_once("/gen/") else {
                continue;
            };
            let Ok(identity_generation) = gen_part.parse::<u64>() else {
                continue;
            };
            return Ok(NodeIdentity {
                node_id: node_id.to_owned(),
                identity_generation,
                not_after_ms: cert.validity().not_after.timestamp().saturating_mul(1000),
            });
        }
    }
    Err(no_identity())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn ca_persists_signs_csrs_and_pins() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ca = CertificateAuthority::create(dir.path(), "bc.test")?;
        let pin = ca.pin()?;
        assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");
        let mode = fs::metadata(dir.path().join("ca.key"))?
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        // A reload gives the same CA.
        let again = CertificateAuthority::load(dir.path(), "bc.test")?;
        assert_eq!(again.pin()?, pin);

        let agent_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let mut req = CertificateParams::new(vec!["spoofed.example".to_owned()])?;
        req.distinguished_name.push(DnType::CommonName, "node_evil");
        let csr = req.serialize_request(&agent_key)?.pem()?;
        let (cert_pem, id) = ca.sign_node_csr(&csr, "node_abc", 3, DEFAULT_NODE_CERT_TTL)?;
        assert_eq!(id.identity_generation, 3);
        let der = pem_to_der(&cert_pem)?;
        let parsed = ca.node_identity(&der)?;
        assert_eq!(parsed.node_id, "node_abc");
        assert_eq!(parsed.identity_generation, 3);
        // The CSR's own SAN is never copied.
        let text = String::from_utf8_lossy(&der).to_string();
        assert!(!text.contains("spoofed.example"));
        // Another trust domain does not match.
        assert!(node_identity(&der, "other.test").is_err());
        Ok(())
    }

    #[test]
    fn junk_csr_is_a_clear_error() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ca = CertificateAuthority::create(dir.path(), "bc.test")?;
        let err = ca.sign_node_csr(
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "n",
            1,
            DEFAULT_NODE_CERT_TTL,
        );
        assert!(matches!(err, Err(CaError::BadCsr(_))));
        Ok(())
    }
}
