//! The qcow2 file as served, as an NBD export for `qemu-img`: one GET read front to back and
//! hashed as it goes (the same [`Body`] as a raw image), so a read at most
//! [`FORWARD_SKIP_BYTES`] after the stream's position is served from it (the bytes in between
//! read and hashed, not kept); the file's first [`HEAD_BYTES`] kept, for the header and tables
//! `qemu-img` reads again when it opens the image twice (`info`, then `convert`).
//!
//! Other reads are fetched with Range requests and their SHA-256 recorded. One further ahead
//! (`qemu-img convert` first walks every L2 table, spread through the file, to count what is
//! allocated) is checked when the stream passes it; one behind the stream is checked against a
//! second full read after the conversion ([`recheck`]). Either way every byte `qemu-img` used
//! is one of the file whose SHA-256 was checked. A server that does not serve ranges gets the
//! stream skipped forward instead; a read behind the stream then fails.

use std::io::{self, Read};

use sha2::{Digest, Sha256};

use super::super::nbd::Export;
use super::super::source::{self, Body};
use super::super::{DeployError, source::error_chain};

/// Bytes at the file's start kept in memory once streamed: a qcow2's header, refcount table
/// and L1 table sit in its first clusters (64 KiB each by default).
pub const HEAD_BYTES: usize = 2 << 20;
/// The export's size is the file's rounded up to this, bytes, the tail read as zeros (as QEMU
/// reads a file past its end): QEMU's NBD client, asked to read across an export's end that is
/// not sector-aligned, waits for the bytes past it and hangs.
const EXPORT_ALIGN_BYTES: u64 = 512;
/// How far ahead of the stream a read may be and still be served by reading the stream up to
/// it, bytes; further ahead it is fetched with a Range request.
pub const FORWARD_SKIP_BYTES: u64 = 32 << 20;
/// The scratch buffer that forward skips read through, bytes.
const SKIP_BUFFER_BYTES: usize = 1 << 20;

/// Bytes served from a Range request (behind the stream): where, and their SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub offset: u64,
    pub len: u64,
    pub sha256: [u8; 32],
}

/// The export: the stream, the head, the Range reads made.
#[derive(Debug)]
pub struct Served {
    body: Body,
    size: u64,
    head: Vec<u8>,
    scratch: Vec<u8>,
    client: reqwest::Client,
    etag: Option<String>,
    /// What was served from Range requests behind the stream, in the order asked.
    pub fetched: Vec<Fetched>,
    /// What was served from Range requests ahead of the stream, each with the hash of the
    /// stream's bytes there so far; checked and dropped once the stream has passed it.
    ahead: Vec<(Fetched, Sha256)>,
    /// The server answered a Range request with the whole file.
    no_ranges: bool,
    /// Why the last read failed, as the error to report (the NBD client only hears `EIO`).
    pub failure: Option<DeployError>,
}

impl Served {
    /// The export of the file whose GET is `body`, `size` bytes (its `Content-Length`).
    pub fn new(body: Body, size: u64, etag: Option<String>) -> Result<Self, DeployError> {
        let client = source::client().map_err(|reason| DeployError::Unreachable {
            url: body.url().to_owned(),
            reason,
        })?;
        Ok(Self {
            body,
            size,
            head: Vec::new(),
            scratch: Vec::new(),
            client,
            etag,
            fetched: Vec::new(),
            ahead: Vec::new(),
            no_ranges: false,
            failure: None,
        })
    }

    /// The stream, to drain and hash what is left of it.
    pub fn body_mut(&mut self) -> &mut Body {
        &mut self.body
    }

    /// The stream.
    pub fn body(&self) -> &Body {
        &self.body
    }

    /// Reads `buf.len()` bytes from the stream, keeping those inside the head.
    fn stream(&mut self, buf: &mut [u8]) -> io::Result<()> {
        let at = self.body.bytes;
        if let Err(e) = self.body.read_exact(buf) {
            let reason = self.body.failure.clone().unwrap_or_else(|| e.to_string());
            self.failure = Some(DeployError::Unreachable {
                url: self.body.url().to_owned(),
                reason,
            });
            return Err(e);
        }
        if let Ok(at) = usize::try_from(at)
            && at < HEAD_BYTES
        {
            let keep = buf.len().min(HEAD_BYTES - at);
            self.head.extend_from_slice(&buf[..keep]);
        }
        self.check_ahead(at, buf)
    }

    /// Feeds the stream's bytes `buf` at `at` to the ranges served ahead of it; those it has
    /// passed must hash as they did when served.
    fn check_ahead(&mut self, at: u64, buf: &[u8]) -> io::Result<()> {
        let end = at + buf.len() as u64;
        let mut changed = None;
        self.ahead.retain_mut(|(f, h)| {
            let (lo, hi) = (f.offset.max(at), (f.offset + f.len).min(end));
            if lo < hi {
                h.update(&buf[(lo - at) as usize..(hi - at) as usize]);
            }
            if f.offset + f.len > end {
                return true;
            }
            if <[u8; 32]>::from(h.clone().finalize()) != f.sha256 {
                changed = Some((f.offset, f.len));
            }
            false
        });
        let Some((offset, len)) = changed else {
            return Ok(());
        };
        let why = format!("its {len} bytes at offset {offset} differ between two reads");
        self.failure = Some(DeployError::ChangedWhileRead(why.clone()));
        Err(io::Error::other(why))
    }

    /// Reads the stream to the file's end, checking the ranges served ahead of it.
    pub fn drain(&mut self) -> Result<(), DeployError> {
        let end = self.size;
        if self.skip_to(end).is_err() || self.body.drain().is_err() {
            return Err(self
                .failure
                .take()
                .unwrap_or_else(|| DeployError::Unreachable {
                    url: self.body.url().to_owned(),
                    reason: self
                        .body
                        .failure
                        .clone()
                        .unwrap_or_else(|| "the body failed".into()),
                }));
        }
        Ok(())
    }

    /// Reads and drops (hashing) the stream's bytes up to `offset`.
    fn skip_to(&mut self, offset: u64) -> io::Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(SKIP_BUFFER_BYTES, 0);
        let mut result = Ok(());
        while self.body.bytes < offset {
            let n = usize::try_from(offset - self.body.bytes)
                .map_or(scratch.len(), |l| l.min(scratch.len()));
            result = self.stream(&mut scratch[..n]);
            if result.is_err() {
                break;
            }
        }
        self.scratch = scratch;
        result
    }

    /// Fetches `buf` at `offset` with a Range request, and records it; `Ok(false)` when the
    /// server does not serve ranges.
    fn fetch(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<bool> {
        let (client, url, etag) = (&self.client, self.body.url(), self.etag.as_deref());
        let mut cancel = self.body.cancel();
        let got = self.body.handle().block_on(async {
            tokio::select! {
                r = source::fetch_range(client, url, offset, buf, self.size, etag) => r,
                _ = cancel.changed() => Err("the command was cancelled".to_owned()),
            }
        });
        match got {
            Ok(true) => {}
            Ok(false) => {
                self.no_ranges = true;
                return Ok(false);
            }
            Err(reason) => {
                self.failure = Some(DeployError::Unreachable {
                    url: url.to_owned(),
                    reason: reason.clone(),
                });
                return Err(io::Error::other(reason));
            }
        }
        let f = Fetched {
            offset,
            len: buf.len() as u64,
            sha256: Sha256::digest(&*buf).into(),
        };
        if offset >= self.body.bytes {
            self.ahead.push((f, Sha256::new()));
        } else {
            self.fetched.push(f);
        }
        Ok(true)
    }
}

impl Export for Served {
    fn size(&self) -> u64 {
        self.size.div_ceil(EXPORT_ALIGN_BYTES) * EXPORT_ALIGN_BYTES
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let end = offset.saturating_add(buf.len() as u64);
        if end > self.size {
            let keep = usize::try_from(self.size.saturating_sub(offset))
                .map_or(buf.len(), |k| k.min(buf.len()));
            buf[keep..].fill(0);
            return if keep == 0 {
                Ok(())
            } else {
                self.read_at(offset, &mut buf[..keep])
            };
        }
        let pos = self.body.bytes;
        let head = self.head.len() as u64;
        if offset >= pos {
            if offset - pos > FORWARD_SKIP_BYTES && !self.no_ranges && self.fetch(offset, buf)? {
                return Ok(());
            }
            self.skip_to(offset)?;
            return self.stream(buf);
        }
        // Behind the stream: the head holds it, or holds its start up to where the stream is.
        if offset < head && (end <= head || head == pos) {
            let from = usize::try_from(offset).unwrap_or(usize::MAX);
            let n = usize::try_from(head.min(end) - offset).unwrap_or(0);
            buf[..n].copy_from_slice(&self.head[from..from + n]);
            return if n < buf.len() {
                self.stream(&mut buf[n..])
            } else {
                Ok(())
            };
        }
        tracing::debug!(
            offset,
            len = buf.len(),
            pos,
            "qcow2: a read behind the stream"
        );
        if self.no_ranges || !self.fetch(offset, buf)? {
            let why = format!(
                "qemu-img read {} bytes at {offset}, behind the stream (at {pos}), and the \
                 server does not serve byte ranges",
                buf.len()
            );
            self.failure = Some(DeployError::Qcow2(why.clone()));
            return Err(io::Error::other(why));
        }
        Ok(())
    }
}

/// Reads the file again with a GET, front to back, and checks that its SHA-256 is `sha256` and
/// that each of `fetched` is what the file holds there: the bytes served from Range requests
/// were the checked file's. Memory: one response chunk and a hasher per range.
pub fn recheck(
    url: &str,
    handle: &tokio::runtime::Handle,
    cancel: tokio::sync::watch::Receiver<()>,
    sha256: &str,
    fetched: &[Fetched],
) -> Result<(), DeployError> {
    let opened = handle.block_on(source::open(url))?;
    let mut body = Body::new(opened, handle.clone(), cancel);
    let mut ranges: Vec<(&Fetched, Sha256)> = fetched.iter().map(|f| (f, Sha256::new())).collect();
    ranges.sort_by_key(|(f, _)| f.offset);
    let mut buf = vec![0u8; SKIP_BUFFER_BYTES];
    loop {
        let at = body.bytes;
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(DeployError::Unreachable {
                    url: url.to_owned(),
                    reason: body.failure.clone().unwrap_or_else(|| error_chain(&e)),
                });
            }
        };
        let chunk_end = at + n as u64;
        for (f, h) in ranges.iter_mut().take_while(|(f, _)| f.offset < chunk_end) {
            let (lo, hi) = (f.offset.max(at), (f.offset + f.len).min(chunk_end));
            if lo < hi {
                let (a, b) = ((lo - at) as usize, (hi - at) as usize);
                h.update(&buf[a..b]);
            }
        }
    }
    let actual = body.sha256_so_far();
    if actual != sha256 {
        return Err(DeployError::ChangedWhileRead(format!(
            "the second read of the image has sha256 {actual}, not {sha256}"
        )));
    }
    for (f, h) in ranges {
        if <[u8; 32]>::from(h.finalize()) != f.sha256 {
            return Err(DeployError::ChangedWhileRead(format!(
                "its {} bytes at offset {} differ between two reads",
                f.len, f.offset
            )));
        }
    }
    Ok(())
}
