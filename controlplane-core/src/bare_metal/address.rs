//! BMC addresses as `nodes.enroll` takes them (and `bcd.v1` `BmcEndpoint.address` carries them):
//! `redfish+https://host[:port][/redfish/v1/Systems/<id>]`, `redfish+http://…`, and
//! `ipmi://host[:port]`. Checked at enrollment so a typo is an `INVALID_ARGUMENT` naming the rule,
//! not a failed verification minutes later. The site agent parses the same forms.

use url::Url;

/// The path prefix of a Redfish system.
pub const SYSTEMS_PREFIX: &str = "/redfish/v1/Systems/";

/// The power driver an address implies (`drivers.power` when the pool's profile names none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerDriver {
    Redfish,
    Ipmi,
}

impl PowerDriver {
    /// `redfish` or `ipmi`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Redfish => "redfish",
            Self::Ipmi => "ipmi",
        }
    }
}

/// Why an address is refused. The message is the rule; it repeats the address only without
/// user information.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error(
        "bmc.address {0:?}: expected redfish+https://host[:port][/redfish/v1/Systems/<id>], redfish+http://… or ipmi://host[:port]"
    )]
    Scheme(String),
    #[error("bmc.address {address:?}: {reason}")]
    Invalid { address: String, reason: String },
    #[error(
        "bmc.address must not carry credentials (user:password@): give them as bmc.username and bmc.password"
    )]
    Credentials,
    #[error(
        "bmc.address {address:?}: the path must be /redfish/v1/Systems/<id> (or none: the BMC's only system)"
    )]
    NotASystem { address: String },
}

/// A checked address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BmcAddress {
    /// The address as stored: trimmed, without a trailing `/`.
    pub normalized: String,
    pub driver: PowerDriver,
    pub host: String,
    /// What the address reaches, one value for every spelling of it ([`Origin`]).
    pub origin: Origin,
}

/// The host of an [`Origin`]: an IP address however it was written, or a DNS name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CanonicalHost {
    /// An IPv4 address, also one written as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`),
    /// in any spelling `inet_aton(3)` takes (`127.1`, `0x7f000001`, `0177.0.0.1`), or
    /// `localhost`.
    V4(std::net::Ipv4Addr),
    /// Any other IPv6 address.
    V6(std::net::Ipv6Addr),
    /// A DNS name, lower case, without a trailing dot. Two names of one BMC are told apart
    /// here; the verification's identifiers catch them (`verify`).
    Name(String),
}

impl std::fmt::Display for CanonicalHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::V4(a) => write!(f, "{a}"),
            Self::V6(a) => write!(f, "[{a}]"),
            Self::Name(n) => f.write_str(n),
        }
    }
}

/// What a BMC address reaches: its scheme, its host parsed, its effective port (443 for
/// `redfish+https`, 80 for `redfish+http`, 623 for `ipmi` when none is written, a written one
/// as a number: `08443` is `8443`) and its system (`/redfish/v1/Systems/<id>`'s id; `None`
/// for an address without a path: the BMC's only system, or IPMI). Two enrollments whose
/// origins are [`Origin::same_bmc`] name one machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    /// `redfish+https`, `redfish+http` or `ipmi`, lower case.
    pub scheme: String,
    pub host: CanonicalHost,
    pub port: u16,
    pub system: Option<String>,
}

impl Origin {
    /// Whether `self` and `other` reach one machine: the same scheme, host and port, and the
    /// same system, or no system on either side (an address without a path is the BMC's only
    /// system, which may be the one the other names).
    pub fn same_bmc(&self, other: &Origin) -> bool {
        (&self.scheme, &self.host, self.port) == (&other.scheme, &other.host, other.port)
            && (self.system.is_none() || other.system.is_none() || self.system == other.system)
    }

    /// The same origin with the system the BMC reported (`BmcFacts.system_path`) when the
    /// address named none.
    pub fn with_system_path(mut self, system_path: &str) -> Origin {
        if self.system.is_none() {
            self.system = system_path
                .trim_end_matches('/')
                .strip_prefix(SYSTEMS_PREFIX)
                .filter(|id| !id.is_empty())
                .map(str::to_owned);
        }
        self
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)?;
        match &self.system {
            Some(id) => write!(f, "{SYSTEMS_PREFIX}{id}"),
            None => Ok(()),
        }
    }
}

/// An IPv4 address in any form `inet_aton(3)` accepts: one to four parts, each decimal,
/// octal (a leading `0`) or hex (`0x`); the last part fills the remaining bytes (`127.1` is
/// `127.0.0.1`, `0x7f000001` too). `None` when `s` is not one.
pub fn inet_aton(s: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))
        {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        // "0x" alone is 0 to inet_aton; an empty part is not a number.
        let n = if digits.is_empty() && radix == 16 {
            0
        } else if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        } else {
            u32::from_str_radix(digits, radix).ok()?
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    if head.iter().any(|&n| n > 0xff) {
        return None;
    }
    let room = 8 * (4 - head.len() as u32);
    if room < 32 && *last >> room != 0 {
        return None;
    }
    let mut v = *last;
    for (i, n) in head.iter().enumerate() {
        v |= n << (24 - 8 * i as u32);
    }
    Some(std::net::Ipv4Addr::from(v))
}

/// `host` (as the URL's authority has it, IPv6 in brackets) as a [`CanonicalHost`].
pub fn canonical_host(host: &str) -> CanonicalHost {
    let h = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(v6) = h.strip_prefix('[').and_then(|x| x.strip_suffix(']'))
        && let Ok(a) = v6.parse::<std::net::Ipv6Addr>()
    {
        return match a.to_ipv4_mapped() {
            Some(v4) => CanonicalHost::V4(v4),
            None => CanonicalHost::V6(a),
        };
    }
    if let Ok(a) = h.parse::<std::net::Ipv6Addr>() {
        return match a.to_ipv4_mapped() {
            Some(v4) => CanonicalHost::V4(v4),
            None => CanonicalHost::V6(a),
        };
    }
    if h == "localhost" {
        return CanonicalHost::V4(std::net::Ipv4Addr::LOCALHOST);
    }
    match inet_aton(&h) {
        Some(a) => CanonicalHost::V4(a),
        None => CanonicalHost::Name(h),
    }
}

/// The [`Origin`] of `address` (`scheme://authority[path]`, checked by [`parse`]'s rules):
/// `None` when it has no `://` or its port is not a number.
fn origin_of(address: &str) -> Option<Origin> {
    let (scheme, rest) = address.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match authority.rfind(']') {
        Some(close) => match authority[close + 1..].strip_prefix(':') {
            Some(p) => (&authority[..=close], Some(p)),
            None => (authority, None),
        },
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    let default = match scheme.as_str() {
        "redfish+https" => 443,
        "redfish+http" => 80,
        _ => 623,
    };
    let port = match port.filter(|p| !p.is_empty()) {
        Some(p) => p.parse::<u16>().ok()?,
        None => default,
    };
    let system = path
        .trim_end_matches('/')
        .strip_prefix(SYSTEMS_PREFIX)
        .filter(|id| !id.is_empty())
        .map(str::to_owned);
    Some(Origin {
        scheme,
        host: canonical_host(host),
        port,
        system,
    })
}

/// `address` without `user:pass@`, for messages.
fn shown(address: &str) -> String {
    match address.split_once("://") {
        Some((scheme, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            match rest[..end].rfind('@') {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => address.to_owned(),
            }
        }
        None => address.to_owned(),
    }
}

/// Checks `address`. Errors name the rule broken.
pub fn parse(address: &str) -> Result<BmcAddress, AddressError> {
    let address = address.trim();
    let display = shown(address);
    let (driver, text) = if let Some(rest) = address.strip_prefix("redfish+") {
        if !(rest.starts_with("https://") || rest.starts_with("http://")) {
            return Err(AddressError::Scheme(display));
        }
        (PowerDriver::Redfish, rest)
    } else if address.starts_with("ipmi://") {
        (PowerDriver::Ipmi, address)
    } else {
        return Err(AddressError::Scheme(display));
    };
    let url = Url::parse(text).map_err(|e| AddressError::Invalid {
        address: display.clone(),
        reason: e.to_string(),
    })?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(AddressError::Credentials);
    }
    let host = match url.host() {
        Some(url::Host::Ipv6(a)) => a.to_string(),
        Some(h) => h.to_string(),
        None => {
            return Err(AddressError::Invalid {
                address: display,
                reason: "no host".into(),
            });
        }
    };
    if url.query().is_some() || url.fragment().is_some() {
        return Err(AddressError::Invalid {
            address: display,
            reason: "a query or fragment is not allowed".into(),
        });
    }
    let path = url.path().trim_end_matches('/');
    match driver {
        PowerDriver::Ipmi if !path.is_empty() => {
            return Err(AddressError::Invalid {
                address: display,
                reason: "an IPMI address has no path".into(),
            });
        }
        PowerDriver::Redfish if !path.is_empty() => {
            let id = path.strip_prefix(SYSTEMS_PREFIX).unwrap_or_default();
            if id.is_empty() || id.contains('/') {
                return Err(AddressError::NotASystem { address: display });
            }
        }
        _ => {}
    }
    let origin = origin_of(address).ok_or_else(|| AddressError::Invalid {
        address: display.clone(),
        reason: "the port is not a number from 0 to 65535".into(),
    })?;
    Ok(BmcAddress {
        normalized: address.trim_end_matches('/').to_owned(),
        driver,
        host,
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_forms_and_their_drivers() -> Result<(), AddressError> {
        let a = parse("redfish+https://10.0.0.5:8443/redfish/v1/Systems/1/")?;
        assert_eq!(a.driver, PowerDriver::Redfish);
        assert_eq!(
            a.normalized,
            "redfish+https://10.0.0.5:8443/redfish/v1/Systems/1"
        );
        assert_eq!(a.host, "10.0.0.5");
        assert_eq!(
            parse("redfish+http://bmc.example")?.driver,
            PowerDriver::Redfish
        );
        let i = parse("ipmi://[fd00::5]:6230")?;
        assert_eq!((i.driver, i.host.as_str()), (PowerDriver::Ipmi, "fd00::5"));
        Ok(())
    }

    #[test]
    fn every_spelling_of_one_bmc_has_one_origin() -> Result<(), AddressError> {
        let one = parse("redfish+https://127.0.0.1:8443/redfish/v1/Systems/1")?.origin;
        assert_eq!(
            one.to_string(),
            "redfish+https://127.0.0.1:8443/redfish/v1/Systems/1"
        );
        for other in [
            "redfish+https://localhost:8443/redfish/v1/Systems/1",
            "redfish+https://127.1:8443/redfish/v1/Systems/1",
            "redfish+https://0x7f000001:8443/redfish/v1/Systems/1",
            "redfish+https://0177.0.0.01:8443/redfish/v1/Systems/1",
            "redfish+https://2130706433:8443/redfish/v1/Systems/1",
            "redfish+https://127.0.0.1:08443/redfish/v1/Systems/1/",
            "redfish+https://[::ffff:127.0.0.1]:8443/redfish/v1/Systems/1",
            "redfish+https://[::FFFF:7f00:1]:8443/redfish/v1/Systems/1",
            "redfish+https://LOCALHOST:8443/redfish/v1/Systems/1",
        ] {
            let o = parse(other).map(|a| a.origin);
            assert_eq!(o.as_ref(), Ok(&one), "{other}");
        }
        // The system path left out: the same BMC (its only system may be this one).
        let bare = parse("redfish+https://127.0.0.1:8443")?.origin;
        assert_ne!(bare, one);
        assert!(bare.same_bmc(&one) && one.same_bmc(&bare));
        assert_eq!(bare.clone().with_system_path("/redfish/v1/Systems/1"), one);
        // Another system, port, scheme or host is another BMC.
        for other in [
            "redfish+https://127.0.0.1:8443/redfish/v1/Systems/2",
            "redfish+https://127.0.0.1:8444/redfish/v1/Systems/1",
            "redfish+http://127.0.0.1:8443/redfish/v1/Systems/1",
            "redfish+https://127.0.0.2:8443/redfish/v1/Systems/1",
            "redfish+https://[::1]:8443/redfish/v1/Systems/1",
        ] {
            assert!(!parse(other)?.origin.same_bmc(&one), "{other}");
        }
        // Default ports, DNS names in any case and with a trailing dot.
        assert_eq!(
            parse("redfish+https://BMC-7.Example.NET.")?.origin,
            parse("redfish+https://bmc-7.example.net:443")?.origin
        );
        assert_eq!(parse("redfish+http://10.0.0.9")?.origin.port, 80);
        assert_eq!(
            parse("ipmi://10.0.0.9")?.origin,
            parse("ipmi://10.0.0.9:623")?.origin
        );
        Ok(())
    }

    #[test]
    fn inet_aton_takes_what_the_c_library_takes() {
        use std::net::Ipv4Addr;
        for (s, a) in [
            ("1.2.3.4", Ipv4Addr::new(1, 2, 3, 4)),
            ("1.2.772", Ipv4Addr::new(1, 2, 3, 4)),
            ("1.131844", Ipv4Addr::new(1, 2, 3, 4)),
            ("16909060", Ipv4Addr::new(1, 2, 3, 4)),
            ("0x1.0x2.0x3.0x4", Ipv4Addr::new(1, 2, 3, 4)),
            ("01.02.03.04", Ipv4Addr::new(1, 2, 3, 4)),
            ("0", Ipv4Addr::new(0, 0, 0, 0)),
        ] {
            assert_eq!(inet_aton(s), Some(a), "{s}");
        }
        for bad in [
            "",
            "1.2.3.4.5",
            "256.1.1.1",
            "1.2.65536",
            "08",
            "1..2",
            "a.b.c.d",
            "4294967296",
        ] {
            assert_eq!(inet_aton(bad), None, "{bad}");
        }
    }

    #[test]
    fn refusals_name_the_rule_and_never_the_password() {
        assert!(matches!(
            parse("https://10.0.0.5"),
            Err(AddressError::Scheme(_))
        ));
        assert!(matches!(
            parse("redfish+ftp://10.0.0.5"),
            Err(AddressError::Scheme(_))
        ));
        let e = parse("redfish+https://root:s3cret@10.0.0.5").map(|_| ());
        assert_eq!(e, Err(AddressError::Credentials));
        assert!(!format!("{e:?}").contains("s3cret"));
        assert!(matches!(
            parse("redfish+https://10.0.0.5/redfish/v1/Managers/1"),
            Err(AddressError::NotASystem { .. })
        ));
        assert!(matches!(
            parse("ipmi://10.0.0.5/x"),
            Err(AddressError::Invalid { .. })
        ));
        assert!(matches!(
            parse("ipmi://:623"),
            Err(AddressError::Invalid { .. })
        ));
        assert!(matches!(
            parse("redfish+https://10.0.0.5?x=1"),
            Err(AddressError::Invalid { .. })
        ));
    }
}
