//! The small HTTP endpoints both binaries serve (`/metrics`, the site agent's boot service):
//! bind, warn about a non-loopback address, and serve under [`Limits`]; and answer a scrape in
//! OpenMetrics text.
//!
//! # Design
//! Each connection, in order: a place under the total cap (waited for: the rest wait in the
//! kernel's accept queue, costing no descriptor), a slot under the per-address cap
//! ([`crate::caps`]; past it the socket is closed at once), then hyper's HTTP/1 server with a
//! header-read deadline: every request head must arrive whole within [`Limits::header_timeout`]
//! of the server starting to read it, however its bytes trickle in (an idle timer alone restarts
//! on every byte), and a keep-alive connection with no next request is closed at the same
//! deadline. A connection with no byte in or out for [`Limits::idle`] is closed as well (a client
//! that stops reading a download). Refusals and closes are counted in [`ListenerStats`]. Every
//! request carries its connection's peer address as axum's `ConnectInfo<SocketAddr>`.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;
use tokio_io_timeout::TimeoutStream;

use crate::caps::{ConnCaps, Refused};

/// The content type of the OpenMetrics text exposition (what prometheus-client encodes).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Limits of one served endpoint.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Connections open at once from one source IP; more are closed at accept. `0`: no cap.
    pub max_per_address: usize,
    /// Time to receive a whole request head, from when the server starts reading it.
    pub header_timeout: Duration,
    /// A connection with no byte in or out for this long is closed.
    pub idle: Duration,
    /// Where refusals and closes are counted.
    pub stats: ListenerStats,
}

impl Limits {
    /// `max_connections` in total, 64 per address, a 10 s header deadline, `idle`, and stats of
    /// their own: what a `/metrics` endpoint needs.
    pub fn small(max_connections: usize, idle: Duration) -> Self {
        Self {
            max_connections,
            max_per_address: 64,
            header_timeout: Duration::from_secs(10),
            idle,
            stats: ListenerStats::default(),
        }
    }
}

/// Counters of one listener, shared with whoever exposes them. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ListenerStats(Arc<StatsInner>);

#[derive(Debug, Default)]
struct StatsInner {
    refused_total: AtomicU64,
    refused_per_address: AtomicU64,
    header_timeouts: AtomicU64,
    open: AtomicU64,
}

impl ListenerStats {
    /// Connections closed at accept, by the cap that was full.
    pub fn refused(&self, why: Refused) -> u64 {
        match why {
            Refused::Total => self.0.refused_total.load(Ordering::Relaxed),
            Refused::PerAddress => self.0.refused_per_address.load(Ordering::Relaxed),
        }
    }

    /// Connections closed because a request head did not arrive in time.
    pub fn header_timeouts(&self) -> u64 {
        self.0.header_timeouts.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn open(&self) -> u64 {
        self.0.open.load(Ordering::Relaxed)
    }

    fn count_refused(&self, why: Refused) {
        let c = match why {
            Refused::Total => &self.0.refused_total,
            Refused::PerAddress => &self.0.refused_per_address,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Binds `addr` (port 0 picks one) and serves `app` under `limits` in a spawned task until `stop`
/// completes (then connections are closed gracefully and the task ends when the last one did).
/// Returns the bound address once listening. `what` names the endpoint in the log; a
/// non-loopback address is allowed but logged as a warning (anyone who reaches it can read it).
/// Errors: the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    app: axum::Router,
    limits: Limits,
    what: &'static str,
    stop: impl Future<Output = ()> + Send + 'static,
) -> io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    if !bound.ip().is_loopback() {
        tracing::warn!(%bound, what, "listening on a non-loopback address: anyone who can reach it can read it");
    }
    let task = tokio::spawn(serve_on(listener, app, limits, what, stop));
    Ok((bound, task))
}

/// [`serve`] on a listener bound already, in the caller's task: returns once `stop` completed
/// and the last connection ended.
pub async fn serve_on(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    what: &'static str,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let stats = limits.stats.clone();
    let open = stats.clone();
    let caps = ConnCaps::new(0, limits.max_per_address).observed(Arc::new(move |n| {
        open.0.open.store(n as u64, Ordering::Relaxed)
    }));
    let (closing, closed) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        // The semaphore is never closed: acquiring only ever waits for a free place.
        let permit = tokio::select! {
            () = &mut stop => break,
            p = Arc::clone(&permits).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, what, "accept failed; pausing before the next one");
                    tokio::time::sleep(crate::ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let slot = match caps.take(peer.ip()) {
            Ok(s) => s,
            Err(why) => {
                stats.count_refused(why);
                tracing::debug!(%peer, what, reason = why.as_str(), "connection refused at its cap");
                continue;
            }
        };
        let mut io = TimeoutStream::new(stream);
        io.set_read_timeout(Some(limits.idle));
        io.set_write_timeout(Some(limits.idle));
        let io = TokioIo::new(Box::pin(io));
        // Handlers may ask who is connected (`ConnectInfo<SocketAddr>`, e.g. a per-source limit).
        let service = TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer))),
        );
        let (header_timeout, stats, mut closed) =
            (limits.header_timeout, stats.clone(), closed.clone());
        tokio::spawn(async move {
            let _held = (permit, slot);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = builder.serve_connection(io, service);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = closed.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                if e.is_timeout() {
                    stats.0.header_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, what, "request head not received in time: closed");
                } else {
                    tracing::trace!(%peer, what, error = %e, "connection ended with an error");
                }
            }
        });
    }
    drop(closed);
    let _ = closing.send(true);
    // Every connection holds a receiver: this returns once the last one ended.
    closing.closed().await;
}

/// `http://HOST:PORT{path}` for a bound address; an unspecified IP (`0.0.0.0`, `::`) reads as
/// loopback, which is where a local client reaches it.
pub fn url(bound: SocketAddr, path: &str) -> String {
    let mut a = bound;
    if a.ip().is_unspecified() {
        a.set_ip(if a.is_ipv6() {
            std::net::Ipv6Addr::LOCALHOST.into()
        } else {
            std::net::Ipv4Addr::LOCALHOST.into()
        });
    }
    format!("http://{a}{path}")
}

/// The answer to a scrape: the text with [`OPENMETRICS_CONTENT_TYPE`], or 500 with the error
/// (also logged), never a panic.
pub fn metrics_response<E: Display>(encoded: Result<String, E>) -> Response {
    match encoded {
        Ok(text) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "metrics scrape failed");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_addresses_read_as_loopback() {
        let v4: SocketAddr = "0.0.0.0:9464".parse().unwrap_or(([0, 0, 0, 0], 0).into());
        assert_eq!(url(v4, "/metrics"), "http://127.0.0.1:9464/metrics");
        let v6: SocketAddr = "[::]:9464".parse().unwrap_or(([0, 0, 0, 0], 0).into());
        assert_eq!(url(v6, "/metrics"), "http://[::1]:9464/metrics");
        let lo: SocketAddr = "127.0.0.2:80".parse().unwrap_or(([0, 0, 0, 0], 0).into());
        assert_eq!(url(lo, ""), "http://127.0.0.2:80");
    }

    #[test]
    fn a_failed_encode_is_a_500_not_a_panic() {
        assert_eq!(
            metrics_response::<String>(Err("store down".into())).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let ok = metrics_response::<String>(Ok("# EOF\n".into()));
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some(OPENMETRICS_CONTENT_TYPE)
        );
    }
}
