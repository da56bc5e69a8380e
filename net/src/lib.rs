//! Listener hygiene shared by `bcd` and `bcctl`.
//!
//! A listener that accepts whatever arrives and keeps every connection until the peer closes it
//! lets a few hundred idle sockets (a port scanner, a stuck scraper, a slowloris client) use up
//! the process's file descriptors; the agent then cannot reconnect to its control plane and the
//! control plane cannot accept agents. The pieces:
//!
//! - [`BoundedListener`]: an `axum::serve` listener with a cap on open connections (the rest wait
//!   in the kernel's accept queue, costing no descriptor) and an idle timeout on each one (no
//!   byte read or written for that long closes it). For the operator API and `/metrics`.
//! - [`caps`]: caps on open connections in total and per source address (the gateway's listener
//!   and [`http::serve`]).
//! - [`http::serve`]: bind and serve a small endpoint (`/metrics`, the site agent's boot service)
//!   under a total and a per-address cap, a header-read deadline and an idle timeout.
//! - [`report::error_chain`]: how both binaries print a fatal error, each cause once.
//! - [`metrics::register_described`]: a metric family that is listed in `/metrics` (`# HELP`,
//!   `# TYPE`) before its first series exists.
//! - [`accept_loop`]: an accept loop for tonic over plain TCP (the gateway has its own listener,
//!   with TLS and connection caps, and pauses the same way). It sets `TCP_NODELAY`, and when
//!   `accept(2)` fails (`EMFILE`, `ENFILE`, `ENOBUFS`) it logs once and waits before trying again
//!   instead of spinning on the error.
//!
//! Must not depend on any other crate of this workspace (both binaries and their libraries may
//! depend on it); OS plumbing that is not networking (atomic files, logging, sd_notify) is
//! `bc-sys`.
#![forbid(unsafe_code)]

pub mod caps;
pub mod http;
pub mod metrics;
pub mod report;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_io_timeout::TimeoutStream;
use tokio_stream::wrappers::ReceiverStream;

/// How long [`accept_loop`] and [`BoundedListener`] wait after a failed `accept(2)`.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(200);

/// An `axum::serve` listener: at most `max_connections` open at once, each closed after `idle`
/// without a byte read or written.
#[derive(Debug)]
pub struct BoundedListener {
    inner: TcpListener,
    idle: Duration,
    permits: Arc<Semaphore>,
}

impl BoundedListener {
    /// Wraps a bound listener. `max_connections` is clamped to at least 1.
    pub fn new(inner: TcpListener, max_connections: usize, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }
}

/// An accepted connection of a [`BoundedListener`]: the socket with its idle timeout, and the
/// permit that frees a slot when the connection is dropped.
#[derive(Debug)]
pub struct BoundedConnection {
    io: Pin<Box<TimeoutStream<TcpStream>>>,
    _permit: OwnedSemaphorePermit,
}

impl axum::serve::Listener for BoundedListener {
    type Io = BoundedConnection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so acquiring only ever waits for a free slot.
        let Ok(permit) = Arc::clone(&self.permits).acquire_owned().await else {
            return std::future::pending().await;
        };
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let mut io = TimeoutStream::new(stream);
                    io.set_read_timeout(Some(self.idle));
                    io.set_write_timeout(Some(self.idle));
                    let conn = BoundedConnection {
                        io: Box::pin(io),
                        _permit: permit,
                    };
                    return (conn, addr);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; pausing before the next one");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for BoundedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_read(cx, buf)
    }
}

impl AsyncWrite for BoundedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.io.as_mut().poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.as_mut().poll_shutdown(cx)
    }
}

/// Accepts connections on `listener` for tonic's `serve_with_incoming`: returns the stream of
/// accepted sockets (`TCP_NODELAY` set). Failed accepts are logged and retried after
/// [`ACCEPT_ERROR_PAUSE`], never handed to tonic (which would retry at once, in a busy loop,
/// when the process is out of file descriptors). The loop ends when the stream is dropped.
pub fn accept_loop(listener: TcpListener) -> ReceiverStream<io::Result<TcpStream>> {
    let (tx, rx) = mpsc::channel(1024);
    tokio::spawn(async move {
        let mut failing = false;
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = listener.accept() => r,
            };
            match accepted {
                Ok((stream, _)) => {
                    failing = false;
                    // Latency of small messages (heartbeats, acks) matters more than packing.
                    let _ = stream.set_nodelay(true);
                    if tx.send(Ok(stream)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "gateway accept failed; pausing between retries until it works again");
                    }
                    failing = true;
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn echo_server(max: usize, idle: Duration) -> io::Result<SocketAddr> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let mut bounded = BoundedListener::new(listener, max, idle);
        let addr = axum::serve::Listener::local_addr(&bounded)?;
        tokio::spawn(async move {
            loop {
                let (mut conn, _) = axum::serve::Listener::accept(&mut bounded).await;
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 || conn.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Ok(addr)
    }

    #[tokio::test]
    async fn idle_connections_are_closed_and_free_their_slot() -> io::Result<()> {
        let addr = echo_server(1, Duration::from_millis(300)).await?;
        let mut first = TcpStream::connect(addr).await?;
        first.write_all(b"hi").await?;
        let mut buf = [0u8; 2];
        first.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"hi");
        // The only slot is taken: a second client is queued, not served.
        let mut second = TcpStream::connect(addr).await?;
        second.write_all(b"yo").await?;
        let early = tokio::time::timeout(Duration::from_millis(150), second.read(&mut buf)).await;
        assert!(early.is_err(), "served beyond the connection cap");
        // The first goes idle, is closed by the server, and the second gets its slot.
        let n = tokio::time::timeout(Duration::from_secs(5), first.read(&mut buf)).await??;
        assert_eq!(n, 0, "idle connection not closed");
        let served =
            tokio::time::timeout(Duration::from_secs(5), second.read_exact(&mut buf)).await?;
        served?;
        assert_eq!(&buf, b"yo");
        Ok(())
    }

    #[tokio::test]
    async fn accept_loop_hands_over_sockets_with_nodelay() -> io::Result<()> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mut incoming = accept_loop(listener).into_inner();
        let _client = TcpStream::connect(addr).await?;
        let accepted = tokio::time::timeout(Duration::from_secs(5), incoming.recv())
            .await
            .map_err(|_| io::Error::other("nothing accepted"))?
            .ok_or_else(|| io::Error::other("accept loop ended"))??;
        assert!(accepted.nodelay()?);
        Ok(())
    }
}
