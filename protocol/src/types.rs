//! String enums of the node model (spec "State is several axes, not one status", "Identity,
//! ownership and generations"). Each value renders exactly as the spec spells it.

/// A value that is not one of an enum's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: expected one of {expected}")]
pub struct ParseEnumError {
    /// Which enum was parsed, e.g. `provisionState`.
    pub kind: &'static str,
    /// The rejected input.
    pub value: String,
    /// The accepted spellings, comma-separated.
    pub expected: String,
}

/// Declares a string enum spelled exactly as given: `ALL`, `as_str`, `Display`, `FromStr` (with a
/// [`ParseEnumError`] naming `kind` and the accepted spellings) and serde as that string. Used for
/// every spec enum here (`types`, `kinds`).
#[macro_export]
macro_rules! string_enum {
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

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::ParseEnumError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::ParseEnumError {
                        kind: $kind,
                        value: s.to_owned(),
                        expected: [$($text),+].join(", "),
                    }),
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(<D::Error as ::serde::de::Error>::custom)
            }
        }
    };
}

string_enum! {
    /// `provisionState` (spec "Provision states").
    ProvisionState, "provisionState" {
        Adopting => "adopting",
        Adopted => "adopted",
        Enrolling => "enrolling",
        Inspecting => "inspecting",
        Commissioning => "commissioning",
        Ready => "ready",
        Deploying => "deploying",
        Deployed => "deployed",
        Releasing => "releasing",
        Rescue => "rescue",
        Failed => "failed",
        Retiring => "retiring",
        Retired => "retired",
    }
}

string_enum! {
    /// `connectivity`, owned by the gateway (session open and close) and the Liveness controller.
    Connectivity, "connectivity" {
        Connected => "connected",
        Disconnected => "disconnected",
        Unreachable => "unreachable",
        Lost => "lost",
    }
}

string_enum! {
    /// `power`, owned by bare-metal power control through the BMC. Not part of NodeDetail.
    Power, "power" {
        On => "on",
        Off => "off",
        Unknown => "unknown",
    }
}

string_enum! {
    /// `role`: derived from the pool kind the node joined (spec "Identity, ownership and generations").
    NodeRole, "role" {
        Host => "host",
        Dedicated => "dedicated",
        Site => "site",
        Unassigned => "unassigned",
    }
}

string_enum! {
    /// `trust`: what the node's hardware may be used for.
    Trust, "trust" {
        Platform => "platform",
        TenantOwned => "tenant-owned",
        TenantControlled => "tenant-controlled",
    }
}

string_enum! {
    /// `adapter`: how the control plane reaches the node.
    Adapter, "adapter" {
        BcdV1 => "bcd/v1",
        ProviderApiV1 => "provider-api/v1",
    }
}

string_enum! {
    /// A condition's status.
    ConditionStatus, "condition status" {
        True => "true",
        False => "false",
        Unknown => "unknown",
    }
}

string_enum! {
    /// Error codes of the operator API and of commands (`{code, message}`).
    ErrorCode, "error code" {
        NotFound => "NOT_FOUND",
        InvalidState => "INVALID_STATE",
        Conflict => "CONFLICT",
        InvalidArgument => "INVALID_ARGUMENT",
        Unauthenticated => "UNAUTHENTICATED",
        PermissionDenied => "PERMISSION_DENIED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        /// The request body is over the operator API's size limit.
        PayloadTooLarge => "PAYLOAD_TOO_LARGE",
    }
}

string_enum! {
    /// The mode a daemon runs in.
    Mode, "mode" {
        Node => "node",
        Site => "site",
        Ramdisk => "ramdisk",
    }
}

string_enum! {
    /// Commands the node agent runs (spec "The daemon today").
    CommandName, "command" {
        InventoryRefresh => "inventory.refresh",
        DiagNvml => "diag.nvml",
        LogsCollect => "logs.collect",
        GpuReset => "gpu.reset",
        NodeReboot => "node.reboot",
        BmcVerify => "bmc.verify",
        BmcPower => "bmc.power",
        BmcSetBootDevice => "bmc.setBootDevice",
        /// The ramdisk's cleaning of every disk (release and retire workflows only).
        DiskClean => "disk.clean",
        /// The ramdisk's deploy: stream an image onto the root disk (deploy workflow only).
        ImageWrite => "image.write",
    }
}

impl From<Mode> for crate::pb::AgentMode {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Node => crate::pb::AgentMode::Node,
            Mode::Site => crate::pb::AgentMode::Site,
            Mode::Ramdisk => crate::pb::AgentMode::Ramdisk,
        }
    }
}

/// A typed node condition (spec "State is several axes": conditions owned by Inventory, Health,
/// Liveness, NodeLifecycle).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// e.g. `HardwareKeyTrusted`, `GpuCountMismatch`, `SpecConverged`.
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// CamelCase machine-readable reason.
    #[serde(default)]
    pub reason: String,
    /// Human-readable explanation.
    #[serde(default)]
    pub message: String,
    /// RFC 3339 time the status last changed.
    pub last_transition_time: String,
    /// The controller that owns this condition (`Inventory`, `Health`, `Liveness`, `NodeLifecycle`).
    #[serde(default)]
    pub owner: String,
    /// The GPUs (PCI bus ids, `0000:1a:00.0`) a GPU condition is about, e.g. the GPUs an
    /// `XidCritical` came from; fixing one of them clears only its entry. Empty (and absent in
    /// JSON) for a condition of the whole node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_enum_round_trips_through_its_spelling() {
        for s in ProvisionState::ALL {
            assert_eq!(s.as_str().parse::<ProvisionState>(), Ok(*s));
        }
        for t in Trust::ALL {
            let json = serde_json::to_string(t).unwrap_or_default();
            assert_eq!(serde_json::from_str::<Trust>(&json).ok(), Some(*t));
        }
        assert_eq!(Trust::TenantOwned.as_str(), "tenant-owned");
        assert_eq!(Adapter::BcdV1.to_string(), "bcd/v1");
    }

    #[test]
    fn unknown_spelling_is_a_clear_error() {
        let err = "adoptd".parse::<ProvisionState>().err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("provisionState"), "{msg}");
        assert!(msg.contains("\"adoptd\""), "{msg}");
        assert!(msg.contains("adopting"), "{msg}");
    }
}
