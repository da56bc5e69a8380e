//! Checks a stored identity before it is used: each file parses as what it must be, and the
//! files agree (the key is the certificate's, the CA bundle holds its issuer, `node.json` names
//! the node the certificate was issued to). A failure names the file ([`StateError::Broken`])
//! and says what to do, instead of a TLS error that names none ("node certificate is not valid
//! PEM", "KeyMismatch") or a session the control plane refuses forever.
//!
//! # Limitations
//! The issuer check is the certificate's signature against each CA key in `ca.pem`; validity
//! dates and extensions are left to TLS (an expired certificate is handled by the lifecycle).
//! A certificate without a SPIFFE node SAN (test control planes) skips the `node.json`
//! comparison.

use std::path::Path;

use rustls::pki_types::CertificateDer;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::state::{Identity, StateError};

fn broken(dir: &Path, file: &str, problem: impl Into<String>) -> StateError {
    StateError::Broken {
        path: dir.join(file),
        problem: problem.into(),
    }
}

/// The certificates of a PEM file; at least one.
fn pem_certs(
    dir: &Path,
    file: &str,
    pem: &str,
) -> Result<Vec<CertificateDer<'static>>, StateError> {
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut pem.as_bytes()).collect();
    let certs = certs.map_err(|e| broken(dir, file, format!("is not valid PEM ({e})")))?;
    if certs.is_empty() {
        return Err(broken(
            dir,
            file,
            "holds no certificate (no BEGIN CERTIFICATE block)",
        ));
    }
    Ok(certs)
}

fn parse<'a>(
    dir: &Path,
    file: &str,
    der: &'a CertificateDer<'_>,
) -> Result<X509Certificate<'a>, StateError> {
    x509_parser::parse_x509_certificate(der.as_ref())
        .map(|(_, c)| c)
        .map_err(|e| {
            broken(
                dir,
                file,
                format!("holds a certificate that does not parse ({e})"),
            )
        })
}

/// `(node id, identity generation)` from the certificate's
/// `spiffe://<trust-domain>/node/<id>/gen/<n>` SAN, when it has one.
fn spiffe_node(cert: &X509Certificate<'_>) -> Option<(String, u64)> {
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|g| match g {
        GeneralName::URI(uri) => {
            let rest = uri.strip_prefix("spiffe://")?;
            let mut parts = rest.split('/').skip(1);
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some("node"), Some(id), Some("gen"), Some(n)) => {
                    Some((id.to_owned(), n.parse().ok()?))
                }
                _ => None,
            }
        }
        _ => None,
    })
}

/// Checks `id`, stored in `dir`; the first problem found, naming its file.
pub fn check(dir: &Path, id: &Identity) -> Result<(), StateError> {
    let ca = pem_certs(dir, "ca.pem", &id.ca_pem)?;
    let ca = ca
        .iter()
        .map(|der| parse(dir, "ca.pem", der))
        .collect::<Result<Vec<_>, _>>()?;
    let chain = pem_certs(dir, "cert.pem", &id.cert_pem)?;
    let leaf = parse(dir, "cert.pem", &chain[0])?;
    if let Some((node, generation)) = spiffe_node(&leaf)
        && (node != id.node.node_id || generation != id.node.identity_generation)
    {
        return Err(broken(
            dir,
            "node.json",
            format!(
                "names node {} (identity generation {}) but cert.pem is the certificate of node {node} (generation {generation}): node.json or cert.pem belongs to another identity",
                id.node.node_id, id.node.identity_generation
            ),
        ));
    }
    if !ca
        .iter()
        .any(|c| leaf.verify_signature(Some(c.public_key())).is_ok())
    {
        return Err(broken(
            dir,
            "ca.pem",
            "does not hold the CA that issued cert.pem (a CA bundle of another control plane?)",
        ));
    }
    let key = rustls_pemfile::private_key(&mut id.key_pem.as_bytes())
        .map_err(|e| broken(dir, "key.pem", format!("is not valid PEM ({e})")))?
        .ok_or_else(|| {
            broken(
                dir,
                "key.pem",
                "holds no private key (no BEGIN PRIVATE KEY block)",
            )
        })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| broken(dir, "key.pem", format!("is not a usable private key ({e})")))?;
    if let Some(spki) = signer.public_key()
        && spki.as_ref() != leaf.public_key().raw
    {
        return Err(broken(
            dir,
            "key.pem",
            "is not the key of the certificate in cert.pem (key and certificate of different identities)",
        ));
    }
    // Whatever else TLS would refuse, named here rather than at the first connection.
    crate::tls::session_config(&id.ca_pem, &id.cert_pem, &id.key_pem).map_err(|e| {
        broken(
            dir,
            "cert.pem",
            format!("with key.pem and ca.pem, is refused by TLS ({e})"),
        )
    })?;
    Ok(())
}
