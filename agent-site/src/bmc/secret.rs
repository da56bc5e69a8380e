//! A BMC password in memory ([`Secret`]), and what keeps it out of everything the site agent
//! says about a BMC's answer ([`Secret::scrub`]: `bc_protocol::scrub`, which the control plane
//! applies again to what site agents report, issue 30.5). The drivers scrub a BMC's answer
//! before they cut it to an excerpt, and keep no body of a 401 or 403 at all.

use std::fmt;

pub use bc_protocol::scrub::{SCAN_LIMIT, WITHHELD};

/// A password held in memory only: zeroed when dropped, never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(zeroize::Zeroizing<String>);

impl Secret {
    /// Wraps `s`.
    pub fn new(s: String) -> Self {
        Self(zeroize::Zeroizing::new(s))
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `text` (a BMC's or a tool's answer) scrubbed of the secret ([`bc_protocol::scrub::scrub`]):
    /// plain occurrences replaced by `[redacted]`, [`WITHHELD`] when it is there in an encoded
    /// form. Only the first [`SCAN_LIMIT`] bytes are kept.
    pub fn scrub(&self, text: &str) -> String {
        bc_protocol::scrub::scrub(&self.0, text)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_scrubs_its_encoded_forms_and_never_shows_in_debug() {
        let s = Secret::new("Ech0/ed+Pa:ss".to_owned());
        assert_eq!(s.scrub("pw=Ech0/ed+Pa:ss!"), "pw=[redacted]!");
        assert_eq!(s.scrub(&hex::encode("Ech0/ed+Pa:ss")), WITHHELD);
        assert_eq!(format!("{s:?}"), "Secret([redacted])");
    }
}
