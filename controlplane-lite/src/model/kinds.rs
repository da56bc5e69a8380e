//! String enums of sites and pools (spec "Identity, ownership and generations": pool kinds, site
//! kinds, `agent`), spelled as the spec spells them in JSON and in SQL.

use bc_protocol::ParseEnumError;

macro_rules! kind_enum {
    ($(#[$meta:meta])* $name:ident, $kind:literal { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spec's spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = ParseEnumError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(ParseEnumError {
                        kind: $kind,
                        value: s.to_owned(),
                        expected: [$($text),+].join(", "),
                    }),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

kind_enum! {
    /// A pool's kind; decides the `role` of the nodes that join it.
    PoolKind, "pool kind" {
        /// Bare-metal GPU hosts that run the platform's VMs: role `host`.
        MetalHost => "metal-host",
        /// Existing servers running VPS workloads: role `host`.
        VpsHost => "vps-host",
        /// Machines of an outside provider: role `host`.
        Provider => "provider",
        /// Whole machines leased to one tenant: role `dedicated`.
        MetalDedicated => "metal-dedicated",
    }
}

kind_enum! {
    /// What runs on a pool's machines: the daemon (`bcd`), or nothing (reached through the
    /// provider's API, adapter `provider-api/v1`).
    PoolAgent, "pool agent" {
        Bcd => "bcd",
        None => "none",
    }
}

kind_enum! {
    /// A site's kind: the platform's own, or a tenant's `custom` site (its nodes are
    /// `tenant-owned`).
    SiteKind, "site kind" {
        Platform => "platform",
        Custom => "custom",
    }
}
