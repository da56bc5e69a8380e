//! Redaction of secrets from collected logs, as a streaming line filter: memory is one line
//! (bounded by the reader's line cap), whatever the size of the source.
//!
//! Patterns: join tokens `<6 [a-z0-9]>.<16 [a-z0-9]>` (the spec's token format), PEM
//! `PRIVATE KEY` blocks (every line from `-----BEGIN ... PRIVATE KEY-----` to the matching
//! `END`), `Bearer <credential>` and operator API tokens `bcapi_<hex>`.

use std::sync::LazyLock;

use regex::Regex;

static JOIN_TOKEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\b[a-z0-9]{6}\.[a-z0-9]{16}\b").ok());
static BEARER: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+").ok());
static API_TOKEN: LazyLock<Option<Regex>> =
    LazyLock::new(|| Regex::new(r"\bbcapi_[0-9a-fA-F]+").ok());

/// What replaces a private key block.
pub const KEY_PLACEHOLDER: &str = "[REDACTED PRIVATE KEY]";

/// A line filter with state for multi-line PEM blocks.
#[derive(Debug, Default)]
pub struct Redactor {
    in_key: bool,
    /// Secrets replaced so far.
    pub count: u64,
}

fn replace(
    re: &LazyLock<Option<Regex>>,
    line: &str,
    with: &str,
    count: &mut u64,
) -> Option<String> {
    let re = re.as_ref()?;
    let n = re.find_iter(line).count();
    if n == 0 {
        return None;
    }
    *count += n as u64;
    Some(re.replace_all(line, with).into_owned())
}

impl Redactor {
    /// Filters one line (without its newline). `None`: the line is dropped (inside a key block).
    pub fn line(&mut self, line: &str) -> Option<String> {
        if self.in_key {
            if line.contains("-----END") && line.contains("PRIVATE KEY-----") {
                self.in_key = false;
            }
            return None;
        }
        if line.contains("-----BEGIN") && line.contains("PRIVATE KEY-----") {
            self.count += 1;
            // A one-line block (BEGIN and END on one line) ends here.
            self.in_key = !(line.contains("-----END"));
            return Some(KEY_PLACEHOLDER.to_owned());
        }
        let mut out = line.to_owned();
        if let Some(s) = replace(&JOIN_TOKEN, &out, "[REDACTED JOIN TOKEN]", &mut self.count) {
            out = s;
        }
        if let Some(s) = replace(&BEARER, &out, "$1 [REDACTED]", &mut self.count) {
            out = s;
        }
        if let Some(s) = replace(&API_TOKEN, &out, "bcapi_[REDACTED]", &mut self.count) {
            out = s;
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> (String, u64) {
        let mut r = Redactor::default();
        let lines: Vec<String> = text.lines().filter_map(|l| r.line(l)).collect();
        (lines.join("\n"), r.count)
    }

    #[test]
    fn secrets_are_replaced_and_the_rest_kept() {
        let (out, n) = run(concat!(
            "joining with abc123.0123456789abcdef now\n",
            "-----BEGIN EC PRIVATE KEY-----\n",
            "MHcCAQEEIBsecretsecretsecret\n",
            "-----END EC PRIVATE KEY-----\n",
            "Authorization: Bearer eyJhbGciOi.payload.sig\n",
            "token bcapi_00ff11aa and version 1.2.3\n",
            "-----BEGIN CERTIFICATE-----\n",
        ));
        assert!(!out.contains("0123456789abcdef"), "{out}");
        assert!(!out.contains("secretsecret"), "{out}");
        assert!(!out.contains("eyJhbGciOi"), "{out}");
        assert!(!out.contains("00ff11aa"), "{out}");
        assert!(
            out.contains("joining with [REDACTED JOIN TOKEN] now"),
            "{out}"
        );
        assert!(out.contains(KEY_PLACEHOLDER));
        assert!(out.contains("Bearer [REDACTED]"));
        assert!(out.contains("version 1.2.3"), "{out}");
        // Certificates are public: kept.
        assert!(out.contains("BEGIN CERTIFICATE"));
        assert_eq!(n, 4);
    }

    #[test]
    fn an_unterminated_key_block_hides_the_rest() {
        let (out, _) = run("-----BEGIN PRIVATE KEY-----\nAAAA\nBBBB\n");
        assert_eq!(out, KEY_PLACEHOLDER);
    }

    proptest::proptest! {
        #[test]
        fn no_token_survives(id in "[a-z0-9]{6}", secret in "[a-z0-9]{16}", pre in "[ -~]{0,20}") {
            let (out, _) = run(&format!("{pre} {id}.{secret} tail"));
            let token = format!("{id}.{secret}");
            proptest::prop_assert!(!out.contains(&token), "{} kept in {}", token, out);
        }
    }
}
