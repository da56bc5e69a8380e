//! Redaction of secrets from collected logs, on the byte stream rather than on lines: however a
//! source is cut into reads (or its lines into 64 KiB pieces), no cut hides a secret.
//!
//! # Patterns
//! Every secret this project issues or handles, each matched with its own boundaries (issue
//! 30.6: a token glued to `_`, a letter or a digit, as in `BCD_JOIN_TOKEN_<token>`, is still a
//! token):
//! - join and site tokens `<6 [a-z0-9]>.<16 [a-z0-9]>` (the spec's token format): anything may
//!   come before them; what follows must not be `[a-z0-9]` (a longer run is not this token);
//! - boot tokens `boot_<20>.<40>` (a ramdisk's kernel command line);
//! - deploy identities `deploy_<20>.<40>` (the deployed system's `bcd-join-token`, issue 30.1);
//! - operator API tokens `bcapi_<hex>`;
//! - PEM `PRIVATE KEY` blocks (everything from `-----BEGIN … PRIVATE KEY-----` to the matching
//!   `-----END … PRIVATE KEY-----`, across lines; an unterminated block hides the rest of the
//!   source): the node's, the CA's, OpenSSH keys;
//! - the credential of an `Authorization` header (`Authorization: Basic …`, quoted or not, any
//!   scheme), `Bearer <credential>`, and `Basic <base64>` wherever its base64 decodes to
//!   `user:password`;
//! - the password of a URL (`scheme://user:password@host`; the password may hold `/`);
//! - the value of a key that ends in `password`, `passwd`, `passphrase`, `secret` or `token`
//!   (any case, any prefix: `IPMI_PASSWORD=…`, `bcd.token=…`, `"Password": "…"`,
//!   `--join-token=…`), quoted or not.
//!
//! # Design
//! [`Redactor::push`] takes bytes as they are read and writes out what is decided;
//! [`Redactor::finish`] decides the rest at the end of the source.
//! - Output stops short of the last [`HOLD`] bytes (more than the longest bounded pattern and
//!   the longest prefix that must be seen before a secret is recognised), and short of a
//!   secret's start that could still grow (`Bearer` followed only by blanks so far, a URL whose
//!   user info has no `@` yet), up to [`MAX_PENDING`] bytes. Up to 8 bytes already written are
//!   kept as look-behind.
//! - A candidate the regular expression cannot judge alone (a join token followed by `[a-z0-9]`,
//!   `Basic` followed by base64 that is no `user:password`) is checked in code and, when it is
//!   not a secret, the search goes on one byte further.
//! - A credential whose body runs to the end of what arrived (`Bearer`, `Authorization`,
//!   `bcapi_`, a key's unquoted or unterminated quoted value) is replaced at once and the
//!   redactor skips the rest of the body (its character class) in the next reads: no body is too
//!   long to redact.
//! - Inside a private key, everything is dropped up to the END marker; the last bytes are kept
//!   until the next read so an END marker cut in two is still found.
//!
//! Memory is bounded: [`HOLD`] + [`MAX_PENDING`] + one read.
//!
//! # Limitations
//! A URL whose `user:password` part is longer than [`MAX_PENDING`], or `Bearer` followed by more
//! than that many blank bytes before its credential, is not recognised. A password given as a
//! separate word (`ipmitool -P secret`, `--password secret`) is not recognised: nothing tells it
//! from any other word. A quoted value with an escaped quote (`"pa\"ss"`) whose redaction runs
//! past a read loses what follows the escaped quote. The BMC credentials key and other 64-digit
//! hex keys look like the SHA-256 digests logs are full of and are not redacted.

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
        r#"|(?P<auth>(?P<authhead>(?i:\bauthorization)"?\s*[:=]\s*"?(?:[A-Za-z]+[ \t]+)?)[A-Za-z0-9._~+/=-]+)"#,
        r"|(?P<bearer>(?i:\b(?P<word>bearer))\s+[A-Za-z0-9._~+/=-]+)",
        r"|(?P<basic>(?i:\b(?P<bword>basic))[ \t]+(?P<b64>[A-Za-z0-9+/]{4,}={0,2}))",
        r"|(?P<api>bcapi_[0-9a-fA-F]+)",
        r"|(?P<boot>boot_[a-z0-9]{20}\.[a-z0-9]{40})",
        r"|(?P<deploy>deploy_[a-z0-9]{20}\.[a-z0-9]{40})",
        r"|(?P<url>(?P<urlhead>[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/:@]*:)[^\s@]+@)",
        r"|(?P<join>[a-z0-9]{6}\.[a-z0-9]{16})",
    ))
    .ok()
});
/// A key whose value is a secret, and the value: the weakest pattern, so a secret of another
/// kind that starts inside the value ends it ([`find`]).
static KEY_VALUE: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"(?P<kvhead>(?i:[A-Za-z0-9_.-]*(?:password|passwd|passphrase|secret|token))"?[ \t]*[=:][ \t]*)(?P<kvval>"(?:[^"\\\n]|\\.)*"?|'[^'\n]*'?|[^\s"',;&]+)"#,
    )
    .ok()
});
static KEY_END: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"-----END[^\n]{0,64}?PRIVATE KEY-----").ok());
/// `Bearer` followed only by blanks up to the end: its credential may come in the next read.
static BEARER_OPEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i:\bbearer)\s*\z").ok());
/// A URL whose user info has not reached `@` (or its end) yet.
static URL_OPEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s@]*\z").ok());

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
                    let Some(found) = find(&self.buf, self.start, last) else {
                        self.write(safe, out);
                        return;
                    };
                    let (m_start, m_end) = (found.start - self.start, found.end - self.start);
                    if m_start >= safe {
                        self.write(safe, out);
                        return;
                    }
                    let (replacement, next) = found.replacement(m_end == len && !last);
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

/// A secret found: where it is and what matched.
struct Found<'a> {
    start: usize,
    end: usize,
    caps: Captures<'a>,
    /// A key's value cut short where a secret of another kind starts inside it.
    cut: bool,
}

/// The first secret in `buf` from `from` on. Candidates the expression cannot judge alone are
/// checked here: a join token must not go on with `[a-z0-9]` (then it is part of a longer run),
/// and `Basic <base64>` must decode to `user:password`; a rejected candidate moves the search
/// one byte on. A key's value ([`KEY_VALUE`]) ends where another kind of secret starts inside
/// it, so `token=-----BEGIN … PRIVATE KEY-----` still drops the whole key block. `last`: the
/// buffer's end is the source's end.
fn find(buf: &[u8], from: usize, last: bool) -> Option<Found<'_>> {
    let strong = find_strong(buf, from, last);
    let kv = KEY_VALUE.as_ref().and_then(|re| re.captures_at(buf, from));
    let Some(kv) = kv else {
        return strong;
    };
    let (Some(whole), Some(value)) = (kv.get(0), kv.name("kvval")) else {
        return strong;
    };
    match strong {
        Some(s) if s.start <= whole.start() => Some(s),
        Some(s) if s.start < value.start() => Some(s),
        Some(s) if s.start < whole.end() => Some(Found {
            start: whole.start(),
            end: s.start,
            caps: kv,
            cut: true,
        }),
        _ => Some(Found {
            start: whole.start(),
            end: whole.end(),
            caps: kv,
            cut: false,
        }),
    }
}

/// The first match of [`SECRETS`] from `from` on that passes the checks in code ([`find`]).
fn find_strong(buf: &[u8], from: usize, last: bool) -> Option<Found<'_>> {
    let re = SECRETS.as_ref()?;
    let mut at = from;
    loop {
        let caps = re.captures_at(buf, at)?;
        let m = caps.get(0)?;
        let accepted = if caps.name("join").is_some() {
            match buf.get(m.end()) {
                Some(b) => !(b.is_ascii_lowercase() || b.is_ascii_digit()),
                // Undecided until the next byte arrives (the hold keeps it from being written).
                None => last,
            }
        } else if let Some(b64) = caps.name("b64") {
            m.end() == buf.len() && !last || is_basic_credential(b64.as_bytes())
        } else {
            true
        };
        if accepted {
            return Some(Found {
                start: m.start(),
                end: m.end(),
                caps,
                cut: false,
            });
        }
        at = m.start() + 1;
    }
}

/// Whether `b64` is the credential of HTTP Basic authentication: base64 (padded or not) of
/// UTF-8 text holding a `:` (`user:password`, RFC 7617).
fn is_basic_credential(b64: &[u8]) -> bool {
    use base64::Engine as _;
    let engines = [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::STANDARD_NO_PAD,
    ];
    engines.iter().any(|e| {
        e.decode(b64)
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .is_some_and(|t| t.contains(':') && !t.chars().any(char::is_control))
    })
}

fn is_base64_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"+/=".contains(&b)
}

/// The class of an unquoted key value (`IPMI_PASSWORD=<value>`).
fn is_value_byte(b: u8) -> bool {
    !b.is_ascii_whitespace() && !b"\"',;&".contains(&b)
}

impl Found<'_> {
    /// What replaces the match, and the state after it. `open`: the match runs to the end
    /// of what arrived, so a credential's body may go on.
    fn replacement(&self, open: bool) -> (Vec<u8>, State) {
        const REDACTED: &[u8] = b"[REDACTED]";
        let caps = &self.caps;
        let open = open && !self.cut;
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
        let keep = |head: Option<regex::bytes::Match<'_>>, tail: &[u8]| {
            let mut r = head.map(|h| h.as_bytes().to_vec()).unwrap_or_default();
            r.extend_from_slice(tail);
            r
        };
        if caps.name("auth").is_some() {
            let r = keep(caps.name("authhead"), REDACTED);
            return (r, after_body(is_bearer_byte));
        }
        if caps.name("bearer").is_some() {
            let word = caps.name("word").map_or(&b"Bearer"[..], |w| w.as_bytes());
            let mut r = word.to_vec();
            r.extend_from_slice(b" [REDACTED]");
            return (r, after_body(is_bearer_byte));
        }
        if caps.name("basic").is_some() {
            let word = caps.name("bword").map_or(&b"Basic"[..], |w| w.as_bytes());
            let mut r = word.to_vec();
            r.extend_from_slice(b" [REDACTED]");
            return (r, after_body(is_base64_byte));
        }
        if caps.name("api").is_some() {
            return (
                b"bcapi_[REDACTED]".to_vec(),
                after_body(|b: u8| b.is_ascii_hexdigit()),
            );
        }
        if caps.name("boot").is_some() {
            return (b"boot_[REDACTED BOOT TOKEN]".to_vec(), State::Text);
        }
        if caps.name("deploy").is_some() {
            return (b"deploy_[REDACTED DEPLOY IDENTITY]".to_vec(), State::Text);
        }
        if let Some(head) = caps.name("urlhead") {
            return (keep(Some(head), b"[REDACTED]@"), State::Text);
        }
        if let Some(value) = caps.name("kvval") {
            let v = value.as_bytes();
            let (quote, closed) = match v.first() {
                Some(q @ (b'"' | b'\'')) => {
                    (Some(*q), !self.cut && v.len() > 1 && v.last() == Some(q))
                }
                _ => (None, false),
            };
            let mut r = keep(caps.name("kvhead"), b"");
            let next = match quote {
                Some(q) => {
                    r.push(q);
                    r.extend_from_slice(REDACTED);
                    if closed {
                        r.push(q);
                        State::Text
                    } else if q == b'"' {
                        after_body(|b: u8| b != b'"' && b != b'\n')
                    } else {
                        after_body(|b: u8| b != b'\'' && b != b'\n')
                    }
                }
                None => {
                    r.extend_from_slice(REDACTED);
                    after_body(is_value_byte)
                }
            };
            return (r, next);
        }
        (b"[REDACTED JOIN TOKEN]".to_vec(), State::Text)
    }
}

#[cfg(test)]
#[path = "redact_tests.rs"]
mod tests;
