//! The gateway's listener: what a connection must do, and how many may be open, before tonic sees
//! it.
//!
//! # Background
//! Connections that finished TLS but never sent the HTTP/2 preface were never closed: 1,000 of
//! them stayed open (no client certificate needed), each holding a file descriptor, while tonic
//! waited for a preface with no deadline. tonic's own TLS has a handshake timeout and nothing
//! after it.
//!
//! # Design
//! The accept loop ([`incoming`]) takes a slot for every connection before anything else
//! ([`Limits::max_connections`] in total, [`Limits::max_per_address`] per source address; `0`
//! turns either off): past a cap the socket is closed at once and counted. The TLS handshake
//! (rustls, the same server configuration tonic would build: the gateway certificate, client
//! certificates optional and checked against the CA, ALPN `h2`) must finish within
//! [`Limits::handshake_timeout`]. After it, the client must send the HTTP/2 preface and the
//! first frame's header ([`FIRST_FRAME_BYTES`]) within [`Limits::preface_timeout`], or the
//! connection is closed ([`GatewayConn`] fails its read). Then tonic serves it as before; a
//! connection's slot is freed when tonic drops it. Every refusal and close is counted
//! (`bcctl_gateway_connections_refused_total{reason}`,
//! `bcctl_gateway_connections_closed_total{reason}`, `bcctl_gateway_connections`).
//!
//! The peer's certificate chain and address travel to the services as [`ConnInfo`] (tonic's
//! `Request::peer_certs` only knows its own TLS stream): [`peer_certs`] and [`remote_addr`].
//!
//! # Limitations
//! An HTTP/2 connection that sent its preface and then opens no stream is kept (HTTP/2 keepalive
//! pings still close a dead one); the caps bound how many such connections one address holds.
//! All simulated agents of `bcctl bench` and `bcctl dev --sim` come from 127.0.0.1, so those
//! paths turn the per-address cap off.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use bc_net::caps::{ConnCaps, ConnSlot, Refused};

use crate::metrics::{ConnClosed, ConnRefused, Metrics};

/// Bytes a client sends first on an HTTP/2 connection: the 24-byte preface and a frame header
/// (9 bytes; its first frame is SETTINGS).
pub const FIRST_FRAME_BYTES: usize = 24 + 9;

/// Connection limits of the gateway (`bcctl serve --gateway-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at most, all addresses together; `0`: no cap. Default 50,000 (the
    /// packaged unit's `LimitNOFILE` is 65,536).
    pub max_connections: usize,
    /// Open connections at most from one source IP address; `0`: no cap. Default 1,024. Nodes
    /// behind one NAT address count together.
    pub max_per_address: usize,
    /// Time from accept to a finished TLS handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// Time from the finished handshake to the HTTP/2 preface and first frame header. Default
    /// 10 s.
    pub preface_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 50_000,
            max_per_address: 1024,
            handshake_timeout: Duration::from_secs(10),
            preface_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// A certificate or key in PEM did not parse.
    #[error("gateway TLS: {what} is not valid PEM: {source}")]
    Pem {
        what: &'static str,
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refused the configuration.
    #[error("gateway TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The client certificate verifier could not be built.
    #[error("gateway TLS client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// The gateway's TLS server configuration: `chain_pem`/`key_pem` as its identity, client
/// certificates optional and verified against `client_ca_pem`, ALPN `h2` (what tonic's
/// `ServerTlsConfig` builds, with `client_auth_optional(true)`).
pub fn tls_config(
    chain_pem: &str,
    key_pem: &str,
    client_ca_pem: &str,
) -> Result<Arc<rustls::ServerConfig>, ListenerError> {
    let pem = |what| move |source| ListenerError::Pem { what, source };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(pem("the server certificate chain"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(pem("the server key"))?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(client_ca_pem.as_bytes()) {
        roots.add(ca.map_err(pem("the CA certificate"))?)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .allow_unauthenticated()
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_client_cert_verifier(verifier)
    .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// The gateway's caps ([`bc_net::caps`], shared with the site agent's boot service), telling
/// `bcctl_gateway_connections` the open count.
fn caps(limits: &Limits, metrics: &Metrics) -> ConnCaps {
    let m = metrics.clone();
    ConnCaps::new(limits.max_connections, limits.max_per_address)
        .observed(Arc::new(move |open| m.gateway_connections(open)))
}

fn refused_label(why: Refused) -> ConnRefused {
    match why {
        Refused::Total => ConnRefused::Total,
        Refused::PerAddress => ConnRefused::PerAddress,
    }
}

/// What the services learn about a connection (a request extension, through tonic's
/// `Connected`).
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's address.
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate chain, leaf first, when the client sent one.
    pub peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
}

/// The client certificate chain of the connection `req` came on.
pub fn peer_certs<T>(req: &tonic::Request<T>) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    req.extensions()
        .get::<ConnInfo>()
        .and_then(|i| i.peer_certs.clone())
        .or_else(|| req.peer_certs())
}

/// The peer address of the connection `req` came on.
pub fn remote_addr<T>(req: &tonic::Request<T>) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnInfo>()
        .and_then(|i| i.remote_addr)
        .or_else(|| req.remote_addr())
}

/// A gateway connection after TLS: until [`FIRST_FRAME_BYTES`] arrived, a read past the preface
/// deadline fails (`TimedOut`) and hyper closes the connection.
#[derive(Debug)]
pub struct GatewayConn {
    tls: TlsStream<TcpStream>,
    preface: Option<Pin<Box<tokio::time::Sleep>>>,
    read: usize,
    info: ConnInfo,
    metrics: Metrics,
    _slot: ConnSlot,
}

impl tonic::transport::server::Connected for GatewayConn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for GatewayConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(deadline) = this.preface.as_mut()
            && deadline.as_mut().poll(cx).is_ready()
        {
            this.preface = None;
            this.metrics.gateway_closed(ConnClosed::PrefaceTimeout);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no HTTP/2 preface within the preface timeout",
            )));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut this.tls).poll_read(cx, buf);
        if this.preface.is_some() {
            this.read += buf.filled().len() - before;
            if this.read >= FIRST_FRAME_BYTES {
                this.preface = None;
            }
        }
        r
    }
}

impl AsyncWrite for GatewayConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

/// Accepts on `listener` under `limits` and hands tonic connections that finished TLS. Failed
/// accepts (`EMFILE`, ...) are logged once and retried after [`bc_net::ACCEPT_ERROR_PAUSE`]
/// rather than in a busy loop. The loop ends when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    metrics: Metrics,
) -> ReceiverStream<io::Result<GatewayConn>> {
    let (tx, rx) = mpsc::channel(1024);
    let caps = caps(&limits, &metrics);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            let (stream, peer) = match accepted {
                Ok(a) => {
                    failing = false;
                    a
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "gateway accept failed; pausing between retries until it works again");
                    }
                    failing = true;
                    tokio::time::sleep(bc_net::ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            let slot = match caps.take(peer.ip()).map_err(refused_label) {
                Ok(s) => s,
                Err(why) => {
                    // Closed at once: the socket is dropped here, before any TLS work.
                    metrics.gateway_refused(why);
                    tracing::debug!(%peer, reason = why.as_str(), "gateway connection refused at its cap");
                    continue;
                }
            };
            // Latency of small messages (heartbeats, acks) matters more than packing.
            let _ = stream.set_nodelay(true);
            let (tx, acceptor, metrics) = (tx.clone(), acceptor.clone(), metrics.clone());
            tokio::spawn(async move {
                let tls =
                    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream))
                        .await
                    {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            metrics.gateway_closed(ConnClosed::HandshakeFailed);
                            tracing::debug!(%peer, error = %e, "gateway TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            metrics.gateway_closed(ConnClosed::HandshakeTimeout);
                            tracing::debug!(%peer, "gateway TLS handshake timed out");
                            return;
                        }
                    };
                let peer_certs = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| Arc::new(c.iter().map(|d| d.clone().into_owned()).collect()));
                let conn = GatewayConn {
                    tls,
                    preface: Some(Box::pin(tokio::time::sleep(limits.preface_timeout))),
                    read: 0,
                    info: ConnInfo {
                        remote_addr: Some(peer),
                        peer_certs,
                    },
                    metrics,
                    _slot: slot,
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn the_gateway_caps_are_the_limits_and_count_open_connections() {
        let m = Metrics::new();
        let limits = Limits {
            max_connections: 3,
            max_per_address: 2,
            ..Limits::default()
        };
        let caps = caps(&limits, &m);
        let a: IpAddr = [10, 0, 0, 1].into();
        let (a1, a2) = (caps.take(a), caps.take(a));
        assert!(a1.is_ok() && a2.is_ok());
        assert_eq!(
            caps.take(a).map_err(refused_label).err(),
            Some(ConnRefused::PerAddress)
        );
        let b1 = caps.take([10, 0, 0, 2].into());
        assert_eq!(
            caps.take([10, 0, 0, 3].into()).map_err(refused_label).err(),
            Some(ConnRefused::Total)
        );
        assert_eq!(caps.open(), 3);
        drop((a1, a2, b1));
        assert_eq!(caps.open(), 0);
    }
}
