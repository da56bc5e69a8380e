//! `nodes.enroll`'s `bmc.address` as the operator typed it, checked before anything else reads
//! it (issue 30.9).
//!
//! # Background
//! The address used to be checked only for its scheme and system path: 300,016 characters,
//! a newline, a tab and a NUL were accepted and went into events, logs and the site agent's
//! requests; `..%2f` passed the system-path rule; `ipmi://-oProxyCommand=x` gave ipmitool a
//! "host" that reads as an option; and a password holding `/` (`root:s3cr/et@host`) came back
//! in the refusal, because a URL's authority ends at the first `/`.
//!
//! # Design
//! One pass over the raw text, before a URL parser normalizes anything away:
//! [`crate::text::BMC_ADDRESS`] (length, no control or formatting character), no whitespace, no
//! `@` anywhere (credentials go in `bmc.username` and `bmc.password`; refused without repeating
//! the address), no `%` or `\` (nothing percent-encoded, so nothing decodes into a traversal),
//! a host that is an IPv4 address, a bracketed IPv6 address or a DNS name (labels of letters,
//! digits and `-`, never starting with `-`), a port of 1 to 65535, and for Redfish no path or
//! `/redfish/v1/Systems/<id>` with one plain segment. The enrollment then parses the address as
//! before (`bare_metal::address`), which this pass only narrows.
//!
//! # Limitations
//! An IPv6 zone (`fe80::1%eth0`) cannot be given (it needs `%`), nor a system id outside
//! `[A-Za-z0-9._~:-]`. Spellings of one address (`127.1`, an upper-case name) are not made
//! one here: the enrollment compares canonical origins (`bare_metal::address::Origin`).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::text::{BMC_ADDRESS, TextError};

/// The schemes an address may start with.
const SCHEMES: [&str; 3] = ["redfish+https://", "redfish+http://", "ipmi://"];
/// The path prefix of a Redfish system.
const SYSTEMS: &str = "/redfish/v1/Systems/";

/// Why `bmc.address` is refused. No variant carries more of the address than its host, and only
/// once the address is known to hold no `@` (so no credential).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BmcInputError {
    /// Too long, empty, or a control or formatting character.
    #[error(transparent)]
    Text(#[from] TextError),
    /// A space, tab or other whitespace.
    #[error("holds whitespace at character {at}: an address is one word")]
    Whitespace { at: usize },
    /// `user:password@` (or any `@`).
    #[error(
        "must not carry credentials (user:password@): give them as bmc.username and bmc.password"
    )]
    Credentials,
    /// `%` or `\`.
    #[error(
        "must not hold '%' or '\\\\': nothing percent-encoded is accepted (a system id is plain [A-Za-z0-9._~:-])"
    )]
    Encoded,
    /// Not one of the three forms.
    #[error(
        "expected redfish+https://host[:port][/redfish/v1/Systems/<id>], redfish+http://… or ipmi://host[:port]"
    )]
    Scheme,
    /// The host is not an IP address or a DNS name.
    #[error(
        "the host {host:?} is neither an IP address ([v6] in brackets) nor a DNS name (labels of letters, digits and '-', not starting or ending with '-', at most 253 characters)"
    )]
    Host { host: String },
    /// The port is not 1 to 65535.
    #[error("the port must be a number from 1 to 65535")]
    Port,
    /// A path that is not one system, a query or a fragment.
    #[error(
        "the path must be /redfish/v1/Systems/<id> with one id of [A-Za-z0-9._~:-] (not . or ..), or none; an IPMI address has none; no query or fragment"
    )]
    Path,
}

/// Checks `address` as [`BmcInputError`] says. The first rule broken is the one reported.
pub fn check(address: &str) -> Result<(), BmcInputError> {
    BMC_ADDRESS.check(address)?;
    if let Some(at) = address.chars().position(char::is_whitespace) {
        return Err(BmcInputError::Whitespace { at });
    }
    if address.contains('@') {
        return Err(BmcInputError::Credentials);
    }
    if address.contains(['%', '\\']) {
        return Err(BmcInputError::Encoded);
    }
    let (scheme, rest) = SCHEMES
        .iter()
        .find_map(|s| address.strip_prefix(s).map(|r| (*s, r)))
        .ok_or(BmcInputError::Scheme)?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    check_authority(authority)?;
    let ipmi = scheme.starts_with("ipmi");
    check_path(path, ipmi)
}

fn check_authority(authority: &str) -> Result<(), BmcInputError> {
    let bad_host = || BmcInputError::Host {
        host: authority.to_owned(),
    };
    let (host_ok, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (inside, after) = v6.split_once(']').ok_or_else(bad_host)?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(bad_host)?),
        };
        (inside.parse::<Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        (host.parse::<Ipv4Addr>().is_ok() || is_dns_name(host), port)
    };
    if !host_ok {
        return Err(bad_host());
    }
    if let Some(p) = port {
        let ok = !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u16>().is_ok_and(|n| n > 0);
        if !ok {
            return Err(BmcInputError::Port);
        }
    }
    Ok(())
}

/// A DNS name: 1 to 253 characters, labels of 1 to 63 letters, digits and `-`, none starting or
/// ending with `-` (RFC 1123), no empty label.
fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn check_path(path: &str, ipmi: bool) -> Result<(), BmcInputError> {
    if path.is_empty() || path == "/" {
        return Ok(());
    }
    if ipmi {
        return Err(BmcInputError::Path);
    }
    let id = path
        .strip_prefix(SYSTEMS)
        .map(|id| id.strip_suffix('/').unwrap_or(id))
        .ok_or(BmcInputError::Path)?;
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._~:-".contains(&b));
    if ok { Ok(()) } else { Err(BmcInputError::Path) }
}
