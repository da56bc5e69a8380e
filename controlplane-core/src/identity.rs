//! What the control plane believes of a machine's identity claims (issue 19.1).
//!
//! An agent sends its hardware key (SHA-256 over the sorted `kind:value` lines of its
//! identifiers), a `trusted` flag (at least two independent identifiers survived its deny lists)
//! and one SHA-256 digest per identifier. The control plane cannot recompute the key from the
//! digests (each line is hashed on its own), nor check that an identifier is not a placeholder (it
//! never sees the values). What it can count, it counts: a key is trusted only when the agent
//! claims it **and** sends at least [`MIN_TRUSTED_IDENTIFIERS`] distinct identifier digests. The
//! claim alone never makes a key trusted, so it never grants a trusted-key match at join or the
//! uniqueness of a key in the inventory. A trusted-key match at join also needs the digests it
//! came with to share at least two with the node's own ([`crate::join`]): knowing the key alone
//! (a SHA-256 anyone who learns every identifier can compute) is not enough.

/// Distinct identifier digests a trusted key needs.
pub const MIN_TRUSTED_IDENTIFIERS: usize = 2;

/// The distinct, non-empty digests of `digests`, sorted.
pub fn distinct_digests(digests: &[String]) -> Vec<String> {
    let mut out: Vec<String> = digests
        .iter()
        .map(|d| d.trim().to_ascii_lowercase())
        .filter(|d| !d.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether the control plane treats `hardware_key` as trusted: the agent says so (`claimed`), the
/// key is present, and at least [`MIN_TRUSTED_IDENTIFIERS`] distinct identifier digests came
/// with it.
pub fn trusted(claimed: bool, hardware_key: &str, digests: &[String]) -> bool {
    claimed
        && !hardware_key.trim().is_empty()
        && distinct_digests(digests).len() >= MIN_TRUSTED_IDENTIFIERS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_claim_alone_never_makes_a_key_trusted() {
        assert!(trusted(true, "k", &d(&["a", "b"])));
        assert!(!trusted(true, "k", &d(&[])), "claim without digests");
        assert!(!trusted(true, "k", &d(&["a"])), "one digest");
        assert!(
            !trusted(true, "k", &d(&["a", "a", "A", " "])),
            "one distinct"
        );
        assert!(!trusted(true, "", &d(&["a", "b"])), "no key");
        assert!(!trusted(false, "k", &d(&["a", "b"])), "the agent's doubt");
    }
}
