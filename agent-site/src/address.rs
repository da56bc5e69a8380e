//! BMC addresses as `ManagedBmc.endpoint.address` spells them (`bcd.v1` `BmcEndpoint`):
//! `redfish+https://host[:port][/redfish/v1/Systems/<id>]`, `redfish+http://…` and
//! `ipmi://host[:port]`.
//!
//! An address never carries credentials: one with a user or password in it is refused, and the
//! refusal does not repeat it. [`BmcAddress::display`] is the spelling every log line and error
//! message uses to name a BMC.

use url::Url;

/// The IPMI-over-LAN port when the address names none (RMCP, IPMI 2.0 spec section 13.1.3).
pub const IPMI_PORT: u16 = 623;

/// The path prefix of a Redfish system (DMTF DSP0266, `ComputerSystemCollection` members).
pub const SYSTEMS_PREFIX: &str = "/redfish/v1/Systems/";

/// Why an address is not one the site agent can use. The messages quote the address only
/// without any user information.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not `redfish+https://`, `redfish+http://` or `ipmi://`.
    #[error("BMC address {0:?}: expected redfish+https://, redfish+http:// or ipmi://")]
    Scheme(String),
    /// The URL does not parse, or has no host.
    #[error("BMC address {address:?}: {reason}")]
    Invalid {
        /// The address as given (user information cut off).
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The address carries a user or password; credentials belong in the endpoint's own fields.
    #[error(
        "BMC address for host {host:?} carries credentials; give them as username and password instead"
    )]
    Credentials {
        /// The host the address names.
        host: String,
    },
    /// A Redfish path that is not `/redfish/v1/Systems/<id>`.
    #[error(
        "BMC address {address}: {path:?} is not a Redfish system path (/redfish/v1/Systems/<id>)"
    )]
    NotASystem {
        /// The address without the path.
        address: String,
        /// The path given.
        path: String,
    },
}

/// A parsed BMC address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BmcAddress {
    /// A Redfish service.
    Redfish {
        /// `https://host:port` or `http://host:port`: the service's origin (no path).
        base: Url,
        /// `/redfish/v1/Systems/<id>`; `None`: the service's only system.
        system_path: Option<String>,
    },
    /// An IPMI-over-LAN BMC (RMCP+, `ipmitool -I lanplus`).
    Ipmi {
        /// Host name or IP address (IPv6 without brackets).
        host: String,
        /// UDP port.
        port: u16,
    },
}

/// Cuts the user information (`user:pass@`) out of an address for an error message.
fn without_userinfo(address: &str) -> String {
    let Some((scheme, rest)) = address.split_once("://") else {
        return address.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => address.to_owned(),
    }
}

impl BmcAddress {
    /// Parses `address`.
    pub fn parse(address: &str) -> Result<Self, AddressError> {
        let address = address.trim();
        let shown = without_userinfo(address);
        let (kind, url_text) = if let Some(rest) = address.strip_prefix("redfish+") {
            ("redfish", rest.to_owned())
        } else if address.starts_with("ipmi://") {
            // `Url` knows no default port for ipmi; it still parses host and port.
            ("ipmi", address.to_owned())
        } else {
            return Err(AddressError::Scheme(shown));
        };
        let url = Url::parse(&url_text).map_err(|e| AddressError::Invalid {
            address: shown.clone(),
            reason: e.to_string(),
        })?;
        let host = match url.host() {
            Some(url::Host::Ipv6(a)) => a.to_string(),
            Some(h) => h.to_string(),
            None => {
                return Err(AddressError::Invalid {
                    address: shown,
                    reason: "no host".to_owned(),
                });
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(AddressError::Credentials { host });
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(AddressError::Invalid {
                address: shown,
                reason: "a query or fragment is not allowed".to_owned(),
            });
        }
        if kind == "ipmi" {
            if !matches!(url.path(), "" | "/") {
                return Err(AddressError::Invalid {
                    address: shown,
                    reason: "an IPMI address has no path".to_owned(),
                });
            }
            return Ok(Self::Ipmi {
                host,
                port: url.port().unwrap_or(IPMI_PORT),
            });
        }
        if !matches!(url.scheme(), "http" | "https") {
            return Err(AddressError::Scheme(shown));
        }
        let path = url.path().trim_end_matches('/').to_owned();
        let mut base = url;
        base.set_path("");
        let system_path = if path.is_empty() {
            None
        } else {
            let id = path.strip_prefix(SYSTEMS_PREFIX).unwrap_or_default();
            if id.is_empty() || id.contains('/') {
                return Err(AddressError::NotASystem {
                    address: base.as_str().trim_end_matches('/').to_owned(),
                    path,
                });
            }
            Some(path)
        };
        Ok(Self::Redfish { base, system_path })
    }

    /// The address as logs and error messages name the BMC: the canonical form, never with
    /// credentials (`redfish+https://10.0.0.5:443/redfish/v1/Systems/1`, `ipmi://10.0.0.6:623`).
    pub fn display(&self) -> String {
        match self {
            Self::Redfish { base, system_path } => format!(
                "redfish+{}{}",
                base.as_str().trim_end_matches('/'),
                system_path.as_deref().unwrap_or_default()
            ),
            Self::Ipmi { host, port } if host.contains(':') => format!("ipmi://[{host}]:{port}"),
            Self::Ipmi { host, port } => format!("ipmi://{host}:{port}"),
        }
    }

    /// Whether the BMC is reached over TLS (Redfish over https).
    pub fn uses_tls(&self) -> bool {
        matches!(self, Self::Redfish { base, .. } if base.scheme() == "https")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redfish(a: &str) -> (String, Option<String>) {
        match BmcAddress::parse(a) {
            Ok(BmcAddress::Redfish { base, system_path }) => (base.to_string(), system_path),
            other => panic!("{a}: {other:?}"),
        }
    }

    #[test]
    fn redfish_addresses_with_and_without_a_system() {
        assert_eq!(
            redfish("redfish+https://10.0.0.5"),
            ("https://10.0.0.5/".to_owned(), None)
        );
        assert_eq!(
            redfish("redfish+http://bmc.example:8000/redfish/v1/Systems/abc-1/"),
            (
                "http://bmc.example:8000/".to_owned(),
                Some("/redfish/v1/Systems/abc-1".to_owned())
            )
        );
        assert_eq!(
            BmcAddress::parse("redfish+https://[fd00::5]:8443/redfish/v1/Systems/1")
                .map(|a| a.display())
                .ok(),
            Some("redfish+https://[fd00::5]:8443/redfish/v1/Systems/1".to_owned())
        );
        assert!(
            BmcAddress::parse("redfish+https://h")
                .map(|a| a.uses_tls())
                .unwrap_or(false)
        );
    }

    #[test]
    fn ipmi_addresses_default_to_port_623() {
        assert_eq!(
            BmcAddress::parse("ipmi://10.0.0.6").ok(),
            Some(BmcAddress::Ipmi {
                host: "10.0.0.6".into(),
                port: 623
            })
        );
        assert_eq!(
            BmcAddress::parse("ipmi://[fd00::6]:1623")
                .map(|a| a.display())
                .ok(),
            Some("ipmi://[fd00::6]:1623".to_owned())
        );
    }

    #[test]
    fn bad_addresses_are_refused_without_echoing_credentials() {
        let e = BmcAddress::parse("redfish+https://admin:hunter2@10.0.0.5/").err();
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("carries credentials"), "{msg}");
        assert!(!msg.contains("hunter2"), "{msg}");
        let e = BmcAddress::parse("ftp://admin:hunter2@10.0.0.5/").err();
        let msg = e.map(|e| e.to_string()).unwrap_or_default();
        assert!(!msg.contains("hunter2"), "{msg}");
        assert!(matches!(
            BmcAddress::parse("redfish+https://h/redfish/v1/Chassis/1"),
            Err(AddressError::NotASystem { .. })
        ));
        assert!(matches!(
            BmcAddress::parse("redfish+https://h/redfish/v1/Systems/"),
            Err(AddressError::NotASystem { .. })
        ));
        assert!(matches!(
            BmcAddress::parse("ipmi://h/x"),
            Err(AddressError::Invalid { .. })
        ));
        assert!(matches!(
            BmcAddress::parse("redfish+ftp://h"),
            Err(AddressError::Scheme(_))
        ));
    }
}
