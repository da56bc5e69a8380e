//! A small HTTP/1.1 server for the deploy tests, on the test's runtime: each path serves a
//! body from memory, a generated pattern (so a large image is never held by the test), a body
//! cut short after its `Content-Length` promised more, or an error status.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes of the pattern generated per write, and the unit it is defined in.
pub const PATTERN_CHUNK: usize = 1 << 20;

/// What one path answers.
#[derive(Debug, Clone)]
pub enum Serve {
    /// These bytes, 200, or 206 for a `Range: bytes=a-b` request.
    Bytes(Arc<Vec<u8>>),
    /// Versions of a file: the `n`th request (counted in `requests`) gets `versions[n]`, or the
    /// last; ranges as [`Serve::Bytes`], each counted in `ranges`.
    Versions {
        versions: Arc<Vec<Arc<Vec<u8>>>>,
        requests: Arc<AtomicUsize>,
        ranges: Arc<AtomicUsize>,
    },
    /// `Content-Length` of these bytes, then only the first `after`, then the connection closes.
    Cut { bytes: Arc<Vec<u8>>, after: usize },
    /// `Content-Length` of these bytes, the first `after`, then nothing more, the connection
    /// held open.
    Stall { bytes: Arc<Vec<u8>>, after: usize },
    /// [`pattern_chunk`]s of this many bytes, 200, generated as they are sent.
    Pattern(u64),
    /// This status, an empty body.
    Status(u16),
}

/// Chunk `i` of the pattern: bytes of an LCG seeded by `i`, never a whole zero MiB.
pub fn pattern_chunk(i: u64, buf: &mut [u8]) {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in buf.iter_mut() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *b = (x >> 56) as u8 | 1;
    }
}

/// The pattern's first `len` bytes, hashed chunk by chunk: its lowercase hex SHA-256.
pub fn pattern_sha256(len: u64) -> String {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; PATTERN_CHUNK];
    let mut left = len;
    let mut i = 0;
    while left > 0 {
        pattern_chunk(i, &mut buf);
        let n = usize::try_from(left).map_or(PATTERN_CHUNK, |l| l.min(PATTERN_CHUNK));
        h.update(&buf[..n]);
        left -= n as u64;
        i += 1;
    }
    hex::encode(h.finalize())
}

/// Starts the server; its base URL (`http://127.0.0.1:<port>`).
pub async fn start(routes: HashMap<String, Serve>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr: {e}"));
    let routes = Arc::new(routes);
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let routes = routes.clone();
            tokio::spawn(async move {
                // A client that goes away mid-body is what some tests are about.
                let _ = serve(sock, &routes).await;
            });
        }
    });
    format!("http://{addr}")
}

async fn serve(mut sock: TcpStream, routes: &HashMap<String, Serve>) -> std::io::Result<()> {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        let n = sock.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let range = line.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        let (a, b) = k
            .eq_ignore_ascii_case("range")
            .then(|| v.trim().strip_prefix("bytes="))??
            .split_once('-')?;
        Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?))
    });
    let head = |status: &str, len: u64| {
        format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n")
    };
    match routes.get(&path) {
        None => sock.write_all(head("404 Not Found", 0).as_bytes()).await?,
        Some(Serve::Status(s)) => {
            sock.write_all(head(&format!("{s} Nope"), 0).as_bytes())
                .await?;
        }
        Some(Serve::Bytes(b)) => send(&mut sock, b, range).await?,
        Some(Serve::Versions {
            versions,
            requests,
            ranges,
        }) => {
            let n = requests.fetch_add(1, Ordering::SeqCst);
            if range.is_some() {
                ranges.fetch_add(1, Ordering::SeqCst);
            }
            let last = versions.len().saturating_sub(1);
            send(&mut sock, &versions[n.min(last)], range).await?;
        }
        Some(Serve::Cut { bytes, after }) => {
            sock.write_all(head("200 OK", bytes.len() as u64).as_bytes())
                .await?;
            sock.write_all(&bytes[..*after]).await?;
        }
        Some(Serve::Stall { bytes, after }) => {
            sock.write_all(head("200 OK", bytes.len() as u64).as_bytes())
                .await?;
            sock.write_all(&bytes[..*after]).await?;
            std::future::pending::<()>().await;
        }
        Some(Serve::Pattern(len)) => {
            sock.write_all(head("200 OK", *len).as_bytes()).await?;
            let mut chunk = vec![0u8; PATTERN_CHUNK];
            let (mut left, mut i) = (*len, 0);
            while left > 0 {
                pattern_chunk(i, &mut chunk);
                let n = usize::try_from(left).map_or(PATTERN_CHUNK, |l| l.min(PATTERN_CHUNK));
                sock.write_all(&chunk[..n]).await?;
                left -= n as u64;
                i += 1;
            }
        }
    }
    sock.shutdown().await
}

/// `b` whole (200), or bytes `a..=z` of it (206, `Content-Range`).
async fn send(
    sock: &mut TcpStream,
    b: &[u8],
    range: Option<(usize, usize)>,
) -> std::io::Result<()> {
    let (status, part, extra) = match range {
        Some((a, z)) if a <= z && z < b.len() => (
            "206 Partial Content",
            &b[a..=z],
            format!("Content-Range: bytes {a}-{z}/{}\r\n", b.len()),
        ),
        Some(_) => ("416 Range Not Satisfiable", &b[..0], String::new()),
        None => ("200 OK", b, String::new()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        part.len()
    );
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(part).await
}
