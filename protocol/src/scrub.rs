//! What keeps a secret out of everything said about an answer that echoed it ([`scrub`]),
//! shared by the site agent (a BMC's answer, before it leaves the appliance) and the control
//! plane (what a site agent reports, before it reaches a condition, an event, a command's result
//! or the store): issue 30.5.
//!
//! # Background
//! A BMC that echoes what it received (in a 401's body, a 500's message) puts the password in
//! an error, and the error goes to the command's result, the node's conditions and events, the
//! store and the site agent's log. Replacing the plain password was not enough: the echo came
//! back base64-encoded (`Authorization: Basic …`), percent-encoded, and as JSON `\u` escapes.
//!
//! # Design
//! [`scrub`] replaces the plain secret, then looks for it under the encodings HTTP and JSON use:
//! percent-encoding (with and without `+` for a space), JSON string escapes, HTML character
//! references, and base64 (standard and URL-safe, padded or not, at any alignment) and hex of
//! any run of their characters, also under one another (base64 inside a percent-encoded text).
//! If it is there in any form, the whole text is withheld ([`WITHHELD`]): no partial form can be
//! left behind by a cut.
//!
//! # Limitations
//! An encoding not listed (a hash, an encryption, a case change, a secret split across the
//! text) is not recognised. Only the first [`SCAN_LIMIT`] bytes of a text are kept.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

/// What a text that held the secret in an encoded form is replaced with.
pub const WITHHELD: &str =
    "[the BMC's answer is withheld: it held the password in an encoded form]";

/// Bytes of a text scrubbed and kept; the rest is dropped (an excerpt shows less).
pub const SCAN_LIMIT: usize = 64 * 1024;

/// `text` (a BMC's or a tool's answer) with every plain occurrence of `secret` replaced by
/// `[redacted]`; [`WITHHELD`] when the secret is there in an encoded form. Only the first
/// [`SCAN_LIMIT`] bytes are kept. An empty secret changes nothing but the cut.
pub fn scrub(secret: &str, text: &str) -> String {
    let text = match text.char_indices().find(|(i, _)| *i >= SCAN_LIMIT) {
        Some((i, _)) => &text[..i],
        None => text,
    };
    if secret.is_empty() {
        return text.to_owned();
    }
    let plain = text.replace(secret, "[redacted]");
    if encoded_in(secret, &plain) {
        WITHHELD.to_owned()
    } else {
        plain
    }
}

/// [`scrub`] of `text` by each of `secrets` in turn.
pub fn scrub_all<'a>(secrets: impl IntoIterator<Item = &'a str>, text: &str) -> String {
    secrets
        .into_iter()
        .fold(text.to_owned(), |t, s| scrub(s, &t))
}

/// Whether `secret` is in `text` under one of the encodings the module names.
fn encoded_in(secret: &str, text: &str) -> bool {
    let mut views: Vec<Cow<'_, str>> = vec![Cow::Borrowed(text)];
    // Two rounds: a percent-encoded JSON escape, a JSON-escaped percent-encoding.
    for _ in 0..2 {
        let mut next = Vec::new();
        for v in &views {
            for t in text_decodings(v) {
                if t != *v && !views.iter().any(|w| *w == t) && !next.contains(&t) {
                    next.push(t);
                }
            }
        }
        views.extend(next.into_iter().map(Cow::Owned));
    }
    views.iter().any(|v| {
        v.contains(secret)
            || binary_decodings(v).any(|bytes| {
                let decoded = String::from_utf8_lossy(&bytes);
                decoded.contains(secret)
                    || text_decodings(&decoded).iter().any(|t| t.contains(secret))
            })
    })
}

/// `text` percent-decoded (as is, and with `+` as a space), JSON-unescaped and with HTML
/// character references resolved.
fn text_decodings(text: &str) -> Vec<String> {
    let percent = |t: &str| {
        percent_encoding::percent_decode_str(t)
            .decode_utf8_lossy()
            .into_owned()
    };
    vec![
        percent(text),
        percent(&text.replace('+', " ")),
        json_unescape(text),
        html_unescape(text),
    ]
}

/// JSON string escapes resolved wherever they are (`\uXXXX` with surrogate pairs, `\/`, `\"`,
/// `\\`, `\n`, ...); anything else is kept as it is.
fn json_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let hex4 = |it: &mut std::iter::Peekable<std::str::Chars<'_>>| -> Option<u32> {
        let s: String = (0..4).filter_map(|_| it.next()).collect();
        (s.len() == 4)
            .then(|| u32::from_str_radix(&s, 16).ok())
            .flatten()
    };
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('u') => {
                let Some(hi) = hex4(&mut chars) else { continue };
                let code = if (0xD800..0xDC00).contains(&hi) {
                    let mut look = chars.clone();
                    match (look.next(), look.next(), hex4(&mut look)) {
                        (Some('\\'), Some('u'), Some(lo)) if (0xDC00..0xE000).contains(&lo) => {
                            chars = look;
                            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                        }
                        _ => hi,
                    }
                } else {
                    hi
                };
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// HTML character references resolved: `&#NNN;`, `&#xHH;` and the five named XML ones.
fn html_unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('&') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        // An entity is short: its `;` is within the next dozen bytes, cut on a character's
        // boundary (a BMC's answer may hold any text after an `&`).
        let mut window = rest.len().min(12);
        while !rest.is_char_boundary(window) {
            window -= 1;
        }
        let Some(end) = rest[..window].find(';') else {
            out.push('&');
            rest = &rest[1..];
            continue;
        };
        let entity = &rest[1..end];
        let c = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            e => e
                .strip_prefix("#x")
                .or_else(|| e.strip_prefix("#X"))
                .and_then(|h| u32::from_str_radix(h, 16).ok())
                .or_else(|| e.strip_prefix('#').and_then(|d| d.parse().ok()))
                .and_then(char::from_u32),
        };
        match c {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Base64 decoders: standard and URL-safe alphabets, padding optional, trailing bits allowed.
fn engines() -> [GeneralPurpose; 2] {
    let config = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    [
        GeneralPurpose::new(&base64::alphabet::STANDARD, config),
        GeneralPurpose::new(&base64::alphabet::URL_SAFE, config),
    ]
}

/// The bytes every run of base64 or hex characters of `text` decodes to, at every alignment
/// (an echo glued to other letters starts anywhere).
fn binary_decodings(text: &str) -> impl Iterator<Item = Vec<u8>> + '_ {
    let is_b64 = |c: char| c.is_ascii_alphanumeric() || "+/-_=".contains(c);
    let engines = engines();
    text.split(move |c: char| !is_b64(c))
        .filter(|run| run.len() >= 4)
        .flat_map(move |run| {
            let run = run.trim_end_matches('=');
            let mut out = Vec::new();
            for skip in 0..4.min(run.len()) {
                let part = &run[skip..];
                // One character past a whole group decodes to nothing: drop it.
                let part = if part.len() % 4 == 1 {
                    &part[..part.len() - 1]
                } else {
                    part
                };
                for e in &engines {
                    if let Ok(b) = e.decode(part) {
                        out.push(b);
                    }
                }
            }
            for skip in 0..2.min(run.len()) {
                let hex: String = run[skip..]
                    .chars()
                    .take_while(char::is_ascii_hexdigit)
                    .collect();
                let even = &hex[..hex.len() - hex.len() % 2];
                if let Ok(b) = hex::decode(even) {
                    out.push(b);
                }
            }
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PW: &str = "Ech0/ed+Pa:ss-é9";

    fn forms() -> Vec<(&'static str, String)> {
        use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
        let pair = format!("admin:{PW}");
        let percent_all: String = PW.bytes().map(|b| format!("%{b:02X}")).collect();
        let form = percent_encoding::utf8_percent_encode(PW, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
        let json_u: String = PW.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
        let html: String = PW
            .chars()
            .map(|c| format!("&#x{:x};", u32::from(c)))
            .collect();
        vec![
            ("plain", PW.to_owned()),
            (
                "basic header",
                format!("Authorization: Basic {}", STANDARD.encode(&pair)),
            ),
            (
                "basic glued",
                format!("xyz{}abc", STANDARD_NO_PAD.encode(&pair)),
            ),
            ("base64 url", URL_SAFE_NO_PAD.encode(PW)),
            ("percent all", percent_all.clone()),
            ("percent lower", percent_all.to_lowercase()),
            ("percent form", form.replace("%20", "+")),
            (
                "json \\u",
                format!(r#"{{"error": {{"message": "bad password {json_u}"}}}}"#),
            ),
            ("json \\/", PW.replace('/', "\\/")),
            ("html", format!("<p>{html}</p>")),
            ("hex", hex::encode(PW)),
            ("hex upper", hex::encode_upper(PW)),
            (
                "percent-encoded base64",
                percent_encoding::utf8_percent_encode(
                    &STANDARD.encode(&pair),
                    percent_encoding::NON_ALPHANUMERIC,
                )
                .to_string(),
            ),
            (
                "base64 in json",
                format!(r#"{{"auth":"Basic {}"}}"#, STANDARD.encode(&pair)),
            ),
        ]
    }

    #[test]
    fn no_form_of_the_password_survives_a_scrub() {
        for (what, form) in forms() {
            let text = format!("HTTP 401 Unauthorized: login failed for {form} (try again)");
            let out = scrub(PW, &text);
            assert!(!out.contains(&form), "{what}: {out}");
            assert!(!out.contains(PW), "{what}: {out}");
            if what != "plain" {
                assert_eq!(out, WITHHELD, "{what}");
            }
        }
    }

    #[test]
    fn scrub_all_applies_each_secret() {
        let out = scrub_all(["one-pw", PW], &format!("a one-pw b {PW} c"));
        assert_eq!(out, "a [redacted] b [redacted] c");
        let b64 = hex::encode(PW);
        assert_eq!(scrub_all(["x1y2z3", PW], &b64), WITHHELD);
    }

    #[test]
    fn an_answer_without_the_password_is_kept_as_it_is() {
        for text in [
            "HTTP 500: {\"error\":{\"code\":\"Base.1.0.GeneralError\",\"message\":\"A general error has occurred\"}}",
            "service root: HTTP 503: try again in 30 s",
            "ipmitool chassis power on: Unable to establish IPMI v2 / RMCP+ session",
            "dGhpcyBpcyBub3QgdGhlIHBhc3N3b3Jk 0xdeadbeef &amp; \\u0041",
            // An ampersand with multi-byte characters after it (an excerpt's ellipsis): no
            // entity, and nothing cut inside a character.
            "HTTP 400: a & b … «quoted» &é; end",
            "&ééééééé;",
        ] {
            assert_eq!(scrub(PW, text), text);
        }
        assert_eq!(scrub("", "abc"), "abc");
        assert_eq!(scrub(PW, &format!("pw={PW}!")), "pw=[redacted]!");
        let long = "x".repeat(SCAN_LIMIT + 10);
        assert_eq!(scrub(PW, &long).len(), SCAN_LIMIT);
    }
}
