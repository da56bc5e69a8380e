//! TLS for the agent: a verifier that trusts the control plane only through a CA pin (before the
//! node has a CA bundle), mutual-TLS client configs once it has an identity, and the connector
//! that gives tonic a rustls stream.
//!
//! The pin is kubeadm's discovery hash: `sha256:<hex of the CA's SubjectPublicKeyInfo>`. The
//! gateway sends its chain (leaf, then CA); the CA whose SPKI matches the pin becomes the only
//! root, and the leaf must chain to it and name the host we dialled. Nothing, the join token
//! included, is sent before this check passes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// What went wrong setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The pin is not `sha256:` followed by 64 hex digits.
    #[error("CA pin {0:?} is malformed: expected sha256:<64 hex digits>")]
    BadPin(String),
    /// A PEM file held no certificate or key, or a broken one.
    #[error("{what} is not valid PEM: {reason}")]
    BadPem { what: &'static str, reason: String },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The URL has no host or is not https.
    #[error("control plane URL {0:?} must look like https://host:port")]
    BadUrl(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses `sha256:<hex>` into the 32-byte digest.
pub fn parse_pin(pin: &str) -> Result<[u8; 32], TlsError> {
    let hex_part = pin
        .strip_prefix("sha256:")
        .ok_or_else(|| TlsError::BadPin(pin.to_owned()))?;
    let bytes = hex::decode(hex_part).map_err(|_| TlsError::BadPin(pin.to_owned()))?;
    bytes
        .try_into()
        .map_err(|_| TlsError::BadPin(pin.to_owned()))
}

/// SHA-256 over a certificate's SubjectPublicKeyInfo; `None` when it does not parse.
pub fn spki_sha256(cert_der: &[u8]) -> Option<[u8; 32]> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert_der).ok()?;
    Some(Sha256::digest(cert.tbs_certificate.subject_pki.raw).into())
}

/// Trusts a server only if its chain holds the pinned CA and the leaf chains to it.
#[derive(Debug)]
pub struct PinnedCaVerifier {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
    mismatch: Arc<AtomicBool>,
}

impl PinnedCaVerifier {
    /// A verifier for `pin` (`sha256:<hex>`).
    pub fn new(pin: &str) -> Result<Self, TlsError> {
        Ok(Self {
            pin: parse_pin(pin)?,
            provider: provider(),
            mismatch: Arc::new(AtomicBool::new(false)),
        })
    }

    /// A flag that turns true once a server's chain failed the pin check, so a caller can tell a
    /// pin mismatch (fatal) from a network error (retry) behind tonic's transport error.
    pub fn mismatch_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.mismatch)
    }
}

impl ServerCertVerifier for PinnedCaVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| spki_sha256(c) == Some(self.pin))
            .ok_or_else(|| {
                self.mismatch.store(true, Ordering::SeqCst);
                rustls::Error::General(
                    "no certificate in the control plane's chain matches the CA pin (--ca-pin): refusing to send the join token"
                        .to_owned(),
                )
            })?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let inner = WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&self.provider),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        inner.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
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

fn with_alpn(mut cfg: ClientConfig) -> Arc<ClientConfig> {
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// Client config for Join: server verified through the pin, no client certificate. The flag
/// turns true when the server failed the pin check.
pub fn join_config(pin: &str) -> Result<(Arc<ClientConfig>, Arc<AtomicBool>), TlsError> {
    let verifier = Arc::new(PinnedCaVerifier::new(pin)?);
    let flag = verifier.mismatch_flag();
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok((with_alpn(cfg), flag))
}

fn certs_from_pem(what: &'static str, pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = rustls_pemfile::certs(&mut pem.as_bytes()).collect();
    let certs = certs.map_err(|e| TlsError::BadPem {
        what,
        reason: e.to_string(),
    })?;
    if certs.is_empty() {
        return Err(TlsError::BadPem {
            what,
            reason: "no certificate found".to_owned(),
        });
    }
    Ok(certs)
}

/// Client config for the session: the stored CA bundle as the only root, the node certificate
/// and key for mutual TLS.
pub fn session_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certs_from_pem("CA bundle", ca_pem)? {
        roots.add(c)?;
    }
    let chain = certs_from_pem("node certificate", cert_pem)?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_bytes())
        .map_err(|e| TlsError::BadPem {
            what: "node key",
            reason: e.to_string(),
        })?
        .ok_or_else(|| TlsError::BadPem {
            what: "node key",
            reason: "no private key found".to_owned(),
        })?;
    let cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    Ok(with_alpn(cfg))
}

/// Host and port of an `https://host:port` URL (port 443 when absent).
pub fn host_port(url: &str) -> Result<(String, u16), TlsError> {
    let uri: http::Uri = url.parse().map_err(|_| TlsError::BadUrl(url.to_owned()))?;
    if uri.scheme_str() != Some("https") {
        return Err(TlsError::BadUrl(url.to_owned()));
    }
    let host = uri.host().ok_or_else(|| TlsError::BadUrl(url.to_owned()))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((host, uri.port_u16().unwrap_or(443)))
}

/// A tonic channel to `url` over rustls with `cfg`. tonic sees plain `http://`; TLS is ours, so
/// the verifier above decides.
pub async fn channel(
    url: &str,
    cfg: Arc<ClientConfig>,
) -> Result<tonic::transport::Channel, ChannelError> {
    let (host, port) = host_port(url)?;
    let server_name =
        ServerName::try_from(host.clone()).map_err(|_| TlsError::BadUrl(url.to_owned()))?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|_| TlsError::BadUrl(url.to_owned()))?
        .connect_timeout(std::time::Duration::from_secs(10))
        .http2_keep_alive_interval(std::time::Duration::from_secs(20))
        .keep_alive_timeout(std::time::Duration::from_secs(20))
        .keep_alive_while_idle(true);
    let connector = tower::service_fn(move |_uri: http::Uri| {
        let cfg = Arc::clone(&cfg);
        let server_name = server_name.clone();
        let addr = (host.clone(), port);
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(server_name, tcp)
                .await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
        }
    });
    Ok(endpoint.connect_with_connector(connector).await?)
}

/// Why a channel could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// TCP connect or the TLS handshake failed (this includes a CA pin mismatch).
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_and_urls_are_checked() {
        assert!(parse_pin("sha256:00").is_err());
        assert!(parse_pin(&format!("sha1:{}", "0".repeat(64))).is_err());
        assert!(parse_pin(&format!("sha256:{}", "ab".repeat(32))).is_ok());
        assert_eq!(
            host_port("https://127.0.0.1:7443").ok(),
            Some(("127.0.0.1".to_owned(), 7443))
        );
        assert_eq!(
            host_port("https://[::1]:9").ok(),
            Some(("::1".to_owned(), 9))
        );
        assert!(host_port("http://127.0.0.1:7443").is_err());
    }
}
