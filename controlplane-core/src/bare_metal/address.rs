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
    Ok(BmcAddress {
        normalized: address.trim_end_matches('/').to_owned(),
        driver,
        host,
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
