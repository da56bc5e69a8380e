//! A fault-injecting HTTP/1.1 proxy in front of a BMC simulator: each proxy is one "BMC" on its
//! own loopback port. It passes requests through, or delays them, answers them with an error
//! status, or drops the connection; it counts the requests in flight through it (the highest
//! count is what a per-BMC concurrency bound is checked against) and records every request's
//! method, path and body (to see what the site agent sent, e.g. `BootSourceOverrideEnabled`,
//! which the emulator does not store).
//!
//! One request per connection: the proxy answers and closes (sushy-emulator closes its
//! connections too). A request is in flight from the moment its head and body are read until
//! all but the last byte of its answer is written, or until the client gives up and closes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does with the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Pass through.
    Pass,
    /// Wait this long (unless the client gives up first), then pass through.
    Delay(Duration),
    /// Answer with this status and a Redfish-style error body.
    Status(u16),
    /// Close the connection without an answer.
    Drop,
}

/// One request that went through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub body: String,
}

#[derive(Debug)]
struct State {
    upstream: SocketAddr,
    fault: Mutex<Fault>,
    now: AtomicUsize,
    max: AtomicUsize,
    total: AtomicUsize,
    seen: Mutex<Vec<Recorded>>,
}

/// A running proxy (stopped on drop).
#[derive(Debug)]
pub struct FaultProxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn handle(mut client: TcpStream, st: Arc<State>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let method = first.next().unwrap_or_default().to_owned();
    let path = first.next().unwrap_or_default().to_owned();
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let n = st.now.fetch_add(1, Ordering::SeqCst) + 1;
    st.max.fetch_max(n, Ordering::SeqCst);
    st.total.fetch_add(1, Ordering::SeqCst);
    let _in_flight = InFlight(Arc::clone(&st));
    st.seen.lock().push(Recorded {
        method,
        path,
        body: String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    });
    let fault = *st.fault.lock();
    match fault {
        Fault::Pass => {}
        Fault::Drop => return,
        Fault::Status(code) => {
            let body = format!(
                "{{\"error\":{{\"code\":\"Base.1.0.GeneralError\",\"message\":\"injected {code}\"}}}}"
            );
            let resp = format!(
                "HTTP/1.1 {code} Injected\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client.write_all(resp.as_bytes()).await;
            let _ = client.shutdown().await;
            return;
        }
        Fault::Delay(d) => {
            let mut probe = [0u8; 1];
            tokio::select! {
                () = tokio::time::sleep(d) => {}
                // The client gave up (closed) while it waited: nothing more to do.
                _ = client.read(&mut probe) => return,
            }
        }
    }
    let Ok(mut upstream) = TcpStream::connect(st.upstream).await else {
        return;
    };
    // Upstream closes after its answer (one request per connection).
    let mut request: String = head
        .split("\r\n")
        .filter(|l| {
            !l.is_empty()
                && !l
                    .split_once(':')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        })
        .map(|l| format!("{l}\r\n"))
        .collect();
    request.push_str("Connection: close\r\n\r\n");
    let mut out = request.into_bytes();
    out.extend_from_slice(&buf[head_end..head_end + length]);
    if upstream.write_all(&out).await.is_err() {
        return;
    }
    // The whole answer first, so the request counts as in flight until the client has it all
    // (a client that got its answer may send the next request before upstream closes).
    let mut answer = Vec::new();
    if upstream.read_to_end(&mut answer).await.is_err() {
        return;
    }
    // The request stops counting before its last byte is sent: once the client has that byte it
    // may start the next request at once, and a count that lagged behind would see both.
    let (most, last) = answer.split_at(answer.len().saturating_sub(1));
    let _ = client.write_all(most).await;
    drop(_in_flight);
    let _ = client.write_all(last).await;
    let _ = client.shutdown().await;
}

impl FaultProxy {
    /// A proxy on a free loopback port in front of `upstream`, passing everything through.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            upstream,
            fault: Mutex::new(Fault::Pass),
            now: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let st = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(handle(sock, Arc::clone(&st)));
            }
        });
        Self { addr, state, task }
    }

    /// What to do with the next requests.
    pub fn set_fault(&self, f: Fault) {
        *self.state.fault.lock() = f;
    }

    /// The most requests that were in flight through this proxy at once.
    pub fn max_in_flight(&self) -> usize {
        self.state.max.load(Ordering::SeqCst)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.state.now.load(Ordering::SeqCst)
    }

    /// Requests received so far.
    pub fn total(&self) -> usize {
        self.state.total.load(Ordering::SeqCst)
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.seen.lock().clone()
    }

    /// `redfish+http://127.0.0.1:<port><path>`: a BMC address through this proxy.
    pub fn address(&self, path: &str) -> String {
        format!("redfish+http://{}{path}", self.addr)
    }
}
