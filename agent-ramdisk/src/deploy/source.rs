//! The image as served: an HTTP(S) GET whose body is read chunk by chunk as a blocking
//! [`Read`], hashed (SHA-256) and counted on the way, so the writer pulls the bytes at the
//! disk's pace and nothing holds more than one chunk of the response.

use std::io::{self, Read};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::DeployError;

/// How long the connection (TCP and TLS) may take, ms.
const CONNECT_TIMEOUT_MS: u64 = 30_000;
/// How long the server may send nothing in the middle of the body, ms: a stalled server fails
/// the write rather than holding the disk until the command's deadline.
const READ_TIMEOUT_MS: u64 = 60_000;

/// A response whose headers arrived with a 2xx status.
#[derive(Debug)]
pub struct Opened {
    /// The response, its body not read yet.
    pub response: reqwest::Response,
    /// `Content-Length`, bytes, when the server sent one.
    pub length: Option<u64>,
    /// The URL asked for.
    pub url: String,
    /// A strong `ETag` the server sent (quotes kept), to pin later range requests to this
    /// version of the file.
    pub etag: Option<String>,
}

/// The HTTP client of every request of an image: its connect and read timeouts.
pub fn client() -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
        .read_timeout(Duration::from_millis(READ_TIMEOUT_MS))
        .build()
        .map_err(|e| error_chain(&e))
}

/// Sends the GET and waits for the status line and headers.
pub async fn open(url: &str) -> Result<Opened, DeployError> {
    let unreachable = |reason: String| DeployError::Unreachable {
        url: url.to_owned(),
        reason,
    };
    let client = client().map_err(unreachable)?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| unreachable(error_chain(&e)))?;
    let status = response.status();
    if !status.is_success() {
        return Err(unreachable(format!("the server answered {status}")));
    }
    let length = response.content_length();
    let etag = response
        .headers()
        .get(reqwest::header::ETAG)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with('"'))
        .map(str::to_owned);
    Ok(Opened {
        response,
        length,
        url: url.to_owned(),
        etag,
    })
}

/// Fetches bytes `start..start + buf.len()` of a file of `total` bytes into `buf` with a Range
/// request (`If-Match: etag` when given): `Ok(false)` when the server answered `200` (it does
/// not serve ranges; nothing was read), else the answer must be `206` with exactly that
/// `Content-Range`, so a server whose file changed size or version is refused rather than
/// believed. The reason as text on failure.
pub async fn fetch_range(
    client: &reqwest::Client,
    url: &str,
    start: u64,
    buf: &mut [u8],
    total: u64,
    etag: Option<&str>,
) -> Result<bool, String> {
    let Some(last) = start
        .checked_add(buf.len() as u64)
        .and_then(|e| e.checked_sub(1))
    else {
        return Ok(true);
    };
    let mut req = client
        .get(url)
        .header(reqwest::header::RANGE, format!("bytes={start}-{last}"));
    if let Some(tag) = etag {
        req = req.header(reqwest::header::IF_MATCH, tag);
    }
    let mut response = req.send().await.map_err(|e| error_chain(&e))?;
    let status = response.status();
    if status == reqwest::StatusCode::OK {
        return Ok(false);
    }
    if status != reqwest::StatusCode::PARTIAL_CONTENT {
        return Err(format!(
            "a range request for bytes {start}-{last} was answered {status}, not 206 Partial \
             Content (qcow2 needs a server that serves byte ranges, of an unchanged file)"
        ));
    }
    let want = format!("bytes {start}-{last}/{total}");
    let got = response
        .headers()
        .get(reqwest::header::CONTENT_RANGE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if got != want {
        return Err(format!(
            "a range request got Content-Range {got:?}, not {want:?}"
        ));
    }
    let mut at = 0usize;
    while let Some(chunk) = response.chunk().await.map_err(|e| error_chain(&e))? {
        let end = at.saturating_add(chunk.len());
        let Some(dst) = buf.get_mut(at..end) else {
            return Err(format!(
                "a range request for bytes {start}-{last} got more bytes"
            ));
        };
        dst.copy_from_slice(&chunk);
        at = end;
    }
    if at != buf.len() {
        return Err(format!(
            "a range request for bytes {start}-{last} ended after {at} bytes"
        ));
    }
    Ok(true)
}

/// The body as a blocking reader: each `read` that finds no chunk left waits for the next one
/// on the runtime `handle`. Call it from a blocking thread (`spawn_blocking`), never from a
/// task. What the transport said when it failed is kept in [`Body::failure`], so a caller can
/// tell a cut connection from a decompressor's complaint about the bytes it got.
#[derive(Debug)]
pub struct Body {
    response: reqwest::Response,
    url: String,
    handle: tokio::runtime::Handle,
    chunk: bytes::Bytes,
    hasher: Sha256,
    /// Bytes read from the server so far.
    pub bytes: u64,
    expected: Option<u64>,
    cancel: tokio::sync::watch::Receiver<()>,
    /// Why the body ended early (the transport's error, a short body), once it did.
    pub failure: Option<String>,
}

impl Body {
    /// The body of `opened`, read through `handle`; a read (even one waiting on the server)
    /// fails once the sender of `cancel` is dropped: the command's future was dropped
    /// (deadline, cancel), and the copy must stop rather than write on.
    pub fn new(
        opened: Opened,
        handle: tokio::runtime::Handle,
        cancel: tokio::sync::watch::Receiver<()>,
    ) -> Self {
        Self {
            response: opened.response,
            url: opened.url,
            handle,
            chunk: bytes::Bytes::new(),
            hasher: Sha256::new(),
            bytes: 0,
            expected: opened.length,
            cancel,
            failure: None,
        }
    }

    /// Reads what is left of the body, hashing it, so the digest covers the file as served even
    /// where the decoder stopped before its end.
    pub fn drain(&mut self) -> io::Result<()> {
        io::copy(self, &mut io::sink()).map(drop)
    }

    /// The lowercase hex SHA-256 of the bytes read so far.
    pub fn sha256_so_far(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }

    /// The URL asked for.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The file's length as the server announced it, bytes.
    pub fn expected_len(&self) -> Option<u64> {
        self.expected
    }

    /// The runtime the body is read through.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// A receiver that ends (`changed()` errs) when the command's future is dropped.
    pub fn cancel(&self) -> tokio::sync::watch::Receiver<()> {
        self.cancel.clone()
    }

    fn fail(&mut self, why: String) -> io::Error {
        self.failure = Some(why.clone());
        io::Error::other(why)
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.chunk.is_empty() {
            let (response, cancel) = (&mut self.response, &mut self.cancel);
            let next = self.handle.block_on(async {
                tokio::select! {
                    c = response.chunk() => Some(c),
                    // Nothing is ever sent: this ends only when the sender is dropped.
                    _ = cancel.changed() => None,
                }
            });
            let Some(next) = next else {
                return Err(self.fail("the command was cancelled".into()));
            };
            match next {
                Ok(Some(c)) => self.chunk = c,
                Ok(None) => {
                    return match self.expected {
                        Some(want) if self.bytes < want => Err(self.fail(format!(
                            "the body ended after {} of {want} bytes",
                            self.bytes
                        ))),
                        _ => Ok(0),
                    };
                }
                Err(e) => {
                    let why = format!("after {} bytes: {}", self.bytes, error_chain(&e));
                    return Err(self.fail(why));
                }
            }
        }
        let n = buf.len().min(self.chunk.len());
        let taken = self.chunk.split_to(n);
        buf[..n].copy_from_slice(&taken);
        self.hasher.update(&taken);
        self.bytes = self.bytes.saturating_add(n as u64);
        Ok(n)
    }
}

/// An error with its sources, `a: b: c`: reqwest's own message ("error sending request") says
/// little without what caused it (connection refused, a certificate, end of file).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
