//! The managed block of break-glass keys inside `authorized_keys`: its text, where it sits in a
//! file, and the expiry each key carries on disk.
//!
//! # Design
//! A key that expires is written as two lines:
//!
//! ```text
//! # bcd-expires-at 2026-12-01T18:00:00Z
//! expiry-time="20261201180000" ssh-ed25519 AAAA… alice, INC-1234
//! ```
//!
//! - `expiry-time="YYYYMMDDHHMMSS"` is sshd's own option (sshd(8), AUTHORIZED_KEYS FILE FORMAT,
//!   OpenSSH 7.7 and later): sshd refuses the key after that time even if the agent is stopped,
//!   its state is lost, or its clock loop never runs. sshd reads it in the system time zone,
//!   so it is written in local time.
//! - The `# bcd-expires-at` comment before it is what the agent reads (RFC 3339, UTC: no time
//!   zone to guess): the expiry sweep removes a key from what is in the file, with no spec at all
//!   ([`parse_block`]). A marker that does not parse counts as expired: an unreadable expiry
//!   must not keep a break-glass key.
//! - A key without `expiresAt` has neither line. The block's BEGIN and END lines are the same as
//!   before expiries were written, so a block written by an older agent is still found (its keys
//!   have no marker and stay until the spec removes them).

use std::path::Path;

use bc_protocol::spec::SshKey;
use chrono::{DateTime, Local, TimeZone, Utc};

use super::ssh::SshError;

/// First line of the managed block.
pub const BEGIN_MARKER: &str =
    "# BEGIN bcd break-glass keys: managed by bcd, edits inside this block are overwritten";
/// Last line of the managed block.
pub const END_MARKER: &str = "# END bcd break-glass keys";
/// Start of the comment line that carries the next key's expiry (RFC 3339, UTC) for the agent.
pub const EXPIRY_PREFIX: &str = "# bcd-expires-at ";

/// One key of a block as it is (or will be) on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKey {
    /// The `authorized_keys` line, options included, without newline.
    pub line: String,
    /// When it expires, ms since the Unix epoch; `None` = never. `Some(i64::MIN)` for a marker
    /// that did not parse (already expired).
    pub expires_at_ms: Option<i64>,
}

impl BlockKey {
    /// Whether the key has expired at `now_ms` (expired at its `expiresAt` exactly, like
    /// [`SshKey::expired_at`]).
    pub fn expired_at(&self, now_ms: i64) -> bool {
        self.expires_at_ms.is_some_and(|t| t <= now_ms)
    }
}

/// A rendered block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The block's text (BEGIN to END, newline-terminated); empty when no key remains.
    pub text: String,
    /// Keys in it.
    pub installed: usize,
    /// Earliest expiry among them, ms since the Unix epoch.
    pub next_expiry_ms: Option<i64>,
}

/// `expiry-time` value for sshd: `YYYYMMDDHHMMSS` in the system time zone (sshd(8) reads it
/// in local time unless suffixed with `Z`, which only OpenSSH 8.7+ accepts). Rounded down to the
/// second, so sshd never keeps a key longer than the agent does.
pub fn sshd_expiry_time(at_ms: i64) -> String {
    let secs = at_ms.div_euclid(1000);
    match Local.timestamp_opt(secs, 0).single() {
        Some(t) => t.format("%Y%m%d%H%M%S").to_string(),
        // Out of chrono's range: the epoch, i.e. already expired for sshd too.
        None => "19700101000000".to_owned(),
    }
}

fn marker(at_ms: i64) -> String {
    let t = DateTime::<Utc>::from_timestamp_millis(at_ms).unwrap_or_default();
    format!(
        "{EXPIRY_PREFIX}{}",
        t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
    )
}

/// The block entry for `key` (`index` for errors): sshd's `expiry-time` option and the agent's
/// marker when it expires.
pub fn entry(index: usize, key: &SshKey) -> Result<BlockKey, SshError> {
    let line = key.authorized_keys_line().map_err(|e| SshError::BadKey {
        index,
        reason: e.to_string(),
    })?;
    Ok(match key.expires_at {
        None => BlockKey {
            line,
            expires_at_ms: None,
        },
        Some(_) => {
            let at = key.expires_at_ms();
            BlockKey {
                line: format!("expiry-time=\"{}\" {line}", sshd_expiry_time(at)),
                expires_at_ms: Some(at),
            }
        }
    })
}

/// The block for `entries` (all of them: filter expired ones first).
pub fn render_entries(entries: &[BlockKey]) -> Rendered {
    if entries.is_empty() {
        return Rendered {
            text: String::new(),
            installed: 0,
            next_expiry_ms: None,
        };
    }
    let mut text = format!("{BEGIN_MARKER}\n");
    for e in entries {
        if let Some(at) = e.expires_at_ms {
            text.push_str(&marker(at));
            text.push('\n');
        }
        text.push_str(&e.line);
        text.push('\n');
    }
    text.push_str(END_MARKER);
    text.push('\n');
    Rendered {
        text,
        installed: entries.len(),
        next_expiry_ms: entries.iter().filter_map(|e| e.expires_at_ms).min(),
    }
}

/// The managed block for the `keys` not expired at `now_ms`.
pub fn render_block(keys: &[SshKey], now_ms: i64) -> Result<Rendered, SshError> {
    let entries = keys
        .iter()
        .enumerate()
        .filter(|(_, k)| !k.expired_at(now_ms))
        .map(|(i, k)| entry(i, k))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(render_entries(&entries))
}

/// Byte range of the managed block in `existing` (BEGIN line to END line, newline included);
/// `None` when there is none. A broken block (BEGIN without END, two blocks) is an error.
fn locate(existing: &[u8], path: &Path) -> Result<Option<(usize, usize)>, SshError> {
    let damaged = |what| SshError::DamagedBlock {
        path: path.to_owned(),
        what,
    };
    let mut begin = None;
    let mut end = None;
    let mut offset = 0;
    for line in existing.split_inclusive(|b| *b == b'\n') {
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text == BEGIN_MARKER.as_bytes() {
            if begin.is_some() {
                return Err(damaged("two BEGIN markers"));
            }
            begin = Some(offset);
        } else if text == END_MARKER.as_bytes() {
            if begin.is_none() || end.is_some() {
                return Err(damaged("END marker without BEGIN"));
            }
            end = Some(offset + line.len());
        }
        offset += line.len();
    }
    match (begin, end) {
        (Some(b), Some(e)) => Ok(Some((b, e))),
        (None, None) => Ok(None),
        _ => Err(damaged("BEGIN marker without END")),
    }
}

/// `existing` with its managed block replaced by `block` (removed when `block` is empty, appended
/// when there was none). Bytes outside the block are kept as they are; when appending to a file
/// whose last line has no newline, one is added so the block starts on its own line.
pub fn splice(existing: &[u8], block: &str, path: &Path) -> Result<Vec<u8>, SshError> {
    let (before, after) = match locate(existing, path)? {
        Some((b, e)) => (&existing[..b], &existing[e..]),
        None => (existing, &existing[existing.len()..]),
    };
    let mut out = Vec::with_capacity(before.len() + block.len() + after.len() + 1);
    out.extend_from_slice(before);
    if !block.is_empty() && !before.is_empty() && !before.ends_with(b"\n") {
        out.push(b'\n');
    }
    out.extend_from_slice(block.as_bytes());
    out.extend_from_slice(after);
    Ok(out)
}

/// The keys of the managed block in `existing`, with the expiry each carries on disk; `None`
/// when the file has no block. Comment lines other than expiry markers are dropped; a marker
/// applies to the next key line.
pub fn parse_block(existing: &[u8], path: &Path) -> Result<Option<Vec<BlockKey>>, SshError> {
    let Some((b, e)) = locate(existing, path)? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&existing[b..e]);
    let mut keys = Vec::new();
    let mut pending: Option<i64> = None;
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line == BEGIN_MARKER || line == END_MARKER || line.trim().is_empty() {
            continue;
        }
        if let Some(when) = line.strip_prefix(EXPIRY_PREFIX) {
            pending = Some(
                DateTime::parse_from_rfc3339(when.trim())
                    .map_or(i64::MIN, |t| t.with_timezone(&Utc).timestamp_millis()),
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        keys.push(BlockKey {
            line: line.to_owned(),
            expires_at_ms: pending.take(),
        });
    }
    Ok(Some(keys))
}
