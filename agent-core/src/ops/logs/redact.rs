//! Redaction of secrets from collected logs, on the byte stream rather than on lines: however a
//! source is cut into reads (or its lines into 64 KiB pieces), no cut hides a secret.
//!
//! # Patterns
//! Join tokens `<6 [a-z0-9]>.<16 [a-z0-9]>` (the spec's token format), PEM `PRIVATE KEY` blocks
//! (everything from `-----BEGIN … PRIVATE KEY-----` to the matching `-----END … PRIVATE KEY-----`,
//! across lines; an unterminated block hides the rest of the source), `Bearer <credential>`,
//! operator API tokens `bcapi_<hex>`, and the password of a URL (`scheme://user:password@host`).
//!
//! # Design
//! [`Redactor::push`] takes bytes as they are read and writes out what is decided;
//! [`Redactor::finish`] decides the rest at the end of the source.
//! - Output stops short of the last [`HOLD`] bytes (more than the longest bounded pattern and
//!   the longest prefix that must be seen before a secret is recognised), and short of a
//!   secret's start that could still grow (`Bearer` followed only by blanks so far, a URL whose
//!   user info has no `@` yet), up to [`MAX_PENDING`] bytes. Up to 8 bytes already written are
//!   kept as look-behind, so `\b` sees the byte before the undecided part.
//! - A credential whose body runs to the end of what arrived (`Bearer`, `bcapi_`) is replaced at
//!   once and the redactor skips the rest of the body (its character class) in the next reads:
//!   no body is too long to redact.
//! - Inside a private key, everything is dropped up to the END marker; the last bytes are kept
//!   until the next read so an END marker cut in two is still found.
//!
//! Memory is bounded: [`HOLD`] + [`MAX_PENDING`] + one read.
//!
//! # Limitations
//! A URL whose `user:password` part is longer than [`MAX_PENDING`], or `Bearer` followed by more
//! than that many blank bytes before its credential, is not recognised.

use std::sync::LazyLock;

use regex::bytes::{Captures, Regex};

/// What replaces a private key block.
pub const KEY_PLACEHOLDER: &str = "[REDACTED PRIVATE KEY]";

/// Bytes held back at the end of what arrived: more than any bounded pattern (a join token and
/// the bytes around it; a PEM BEGIN marker of up to 64 bytes of label).
pub const HOLD: usize = 256;

/// Longest undecided secret start held back beyond [`HOLD`] (blanks after `Bearer`, a URL's
/// user info before its `@`).
pub const MAX_PENDING: usize = 64 * 1024;

/// Bytes of written output kept so that `\b` sees the byte before the undecided part.
const LOOK_BEHIND: usize = 8;

/// Bytes kept inside a key block so a cut END marker is found in the next read.
const END_HOLD: usize = 128;

static SECRETS: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(concat!(
        r"(?P<pem>-----BEGIN[^\n]{0,64}?PRIVATE KEY-----)",
        r"|(?P<bearer>(?i:\b(?P<word>bearer))\s+[A-Za-z0-9._~+/=-]+)",
        r"|(?P<api>\bbcapi_[0-9a-fA-F]+)",
        r"|(?P<url>(?P<urlhead>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]*:)[^\s/@]+@)",
        r"|(?P<join>\b[a-z0-9]{6}\.[a-z0-9]{16}\b)",
    ))
    .ok()
});
static KEY_END: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"-----END[^\n]{0,64}?PRIVATE KEY-----").ok());
/// `Bearer` followed only by blanks up to the end: its credential may come in the next read.
static BEARER_OPEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i:\bbearer)\s*\z").ok());
/// A URL whose user info has not reached `@` (or its end) yet.
static URL_OPEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/@]*\z").ok());

fn is_bearer_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._~+/=-".contains(&b)
}

/// What the redactor is in the middle of.
#[derive(Debug, Clone, Copy)]
enum State {
    /// Plain text.
    Text,
    /// Inside a private key block: dropped until its END marker.
    InKey,
    /// A credential was replaced at the end of a read: the rest of its body (bytes for which the
    /// function holds) is dropped.
    Skip(fn(u8) -> bool),
}

/// A streaming redactor; one per source.
#[derive(Debug)]
pub struct Redactor {
    /// `buf[..start]`: look-behind (already written); `buf[start..]`: undecided.
    buf: Vec<u8>,
    start: usize,
    state: State,
    /// Secrets replaced so far.
    pub count: u64,
}

impl Default for Redactor {
    fn default() -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            state: State::Text,
            count: 0,
        }
    }
}

impl Redactor {
    /// Takes the next bytes of the source; appends to `out` what is decided.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.buf.extend_from_slice(input);
        self.drain(out, false);
    }

    /// The source ended: appends the rest to `out`.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.drain(out, true);
        self.buf.clear();
        self.start = 0;
        self.state = State::Text;
    }

    /// Redacts a whole text at once (tests, small inputs).
    pub fn redact_all(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len());
        self.push(input, &mut out);
        self.finish(&mut out);
        out
    }

    /// Drops `buf[start..start + n]` unwritten.
    fn drop_undecided(&mut self, n: usize) {
        self.buf.drain(self.start..self.start + n);
    }

    /// Writes `buf[start..start + n]` to `out` and makes it look-behind.
    fn write(&mut self, n: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        let excess = self.start.saturating_sub(LOOK_BEHIND);
        self.buf.drain(..excess);
        self.start -= excess;
    }

    /// The undecided part that may start a secret still growing: where to stop writing.
    fn open_secret_start(&self) -> Option<usize> {
        let undecided = &self.buf[self.start..];
        let from = undecided.len().saturating_sub(MAX_PENDING);
        let tail = &self.buf[self.start + from..];
        [&BEARER_OPEN, &URL_OPEN]
            .into_iter()
            .filter_map(|re| re.as_ref()?.find(tail))
            .map(|m| from + m.start())
            .min()
    }

    fn drain(&mut self, out: &mut Vec<u8>, last: bool) {
        // Bytes at the end held back, counted from the end: only the front of the buffer is
        // consumed below, so this stays right for the whole call.
        let mut hold: Option<usize> = None;
        loop {
            let len = self.buf.len() - self.start;
            match self.state {
                State::InKey => {
                    let found = KEY_END
                        .as_ref()
                        .and_then(|re| re.find(&self.buf[self.start..]));
                    if let Some(m) = found {
                        self.drop_undecided(m.end());
                        self.state = State::Text;
                        continue;
                    }
                    let keep = if last { 0 } else { END_HOLD.min(len) };
                    self.drop_undecided(len - keep);
                    return;
                }
                State::Skip(in_body) => {
                    let n = self.buf[self.start..]
                        .iter()
                        .take_while(|b| in_body(**b))
                        .count();
                    self.drop_undecided(n);
                    if n == len {
                        return;
                    }
                    self.state = State::Text;
                }
                State::Text => {
                    let held = if last {
                        0
                    } else {
                        *hold.get_or_insert_with(|| {
                            let open = self.open_secret_start().map_or(0, |at| len - at);
                            open.max(HOLD)
                        })
                    };
                    let safe = len.saturating_sub(held);
                    let Some(re) = SECRETS.as_ref() else {
                        self.write(safe, out);
                        return;
                    };
                    let Some(caps) = re.captures_at(&self.buf, self.start) else {
                        self.write(safe, out);
                        return;
                    };
                    let Some(m) = caps.get(0) else {
                        self.write(safe, out);
                        return;
                    };
                    let (m_start, m_end) = (m.start() - self.start, m.end() - self.start);
                    if m_start >= safe {
                        self.write(safe, out);
                        return;
                    }
                    let (replacement, next) = replacement(&caps, m_end == len && !last);
                    self.write(m_start, out);
                    out.extend_from_slice(&replacement);
                    self.count += 1;
                    self.drop_undecided(m_end - m_start);
                    self.state = next;
                }
            }
        }
    }
}

/// What replaces the match in `caps`, and the state after it. `open`: the match runs to the end
/// of what arrived, so a credential's body may go on.
fn replacement(caps: &Captures<'_>, open: bool) -> (Vec<u8>, State) {
    if caps.name("pem").is_some() {
        return (KEY_PLACEHOLDER.as_bytes().to_vec(), State::InKey);
    }
    let after_body = |class: fn(u8) -> bool| {
        if open {
            State::Skip(class)
        } else {
            State::Text
        }
    };
    if caps.name("bearer").is_some() {
        let word = caps.name("word").map_or(&b"Bearer"[..], |w| w.as_bytes());
        let mut r = word.to_vec();
        r.extend_from_slice(b" [REDACTED]");
        return (r, after_body(is_bearer_byte));
    }
    if caps.name("api").is_some() {
        return (
            b"bcapi_[REDACTED]".to_vec(),
            after_body(|b: u8| b.is_ascii_hexdigit()),
        );
    }
    if let Some(head) = caps.name("urlhead") {
        let mut r = head.as_bytes().to_vec();
        r.extend_from_slice(b"[REDACTED]@");
        return (r, State::Text);
    }
    (b"[REDACTED JOIN TOKEN]".to_vec(), State::Text)
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
