//! The small HTTP endpoints both binaries serve (`/metrics`): bind, warn about a non-loopback
//! address, serve through a [`BoundedListener`], and answer a scrape in OpenMetrics text.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::BoundedListener;

/// The content type of the OpenMetrics text exposition (what prometheus-client encodes).
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Limits of one served endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once; more wait in the accept queue.
    pub max_connections: usize,
    /// A connection with no byte in or out for this long is closed.
    pub idle: Duration,
}

/// Binds `addr` (port 0 picks one) and serves `app` in a spawned task until `stop` completes.
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
    let listener = BoundedListener::new(listener, limits.max_connections, limits.idle);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
        {
            tracing::error!(error = %e, what, "HTTP server failed");
        }
    });
    Ok((bound, task))
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
