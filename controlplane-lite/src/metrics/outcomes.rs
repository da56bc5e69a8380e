//! What the labelled counters count: how a join ended, why the gateway refused or closed a
//! connection. Each `as_str` is the label value as `/metrics` spells it.

/// How a join attempt ended; the `outcome` label of `bcctl_join_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinOutcome {
    /// A new node was created (provisionState `adopting`).
    NewNode,
    /// A known machine (trusted hardware key or two identifiers) re-joined in place.
    Rejoined,
    /// Over the per-address join rate limit.
    RefusedRate,
    /// The CSR was too large or did not parse.
    RefusedInvalid,
    /// Unknown, expired, revoked or used-up token.
    RefusedToken,
    /// The token's pool or site cannot take nodes.
    RefusedPlacement,
    /// The machine's record has a live session (a cloned machine).
    RefusedDuplicate,
    /// A re-join in place outside the token's pool or site, or across trust levels.
    RefusedScope,
    /// A re-join in place of a platform node waits for an operator's approval.
    PendingApproval,
    /// A ramdisk's boot token was refused: malformed, unknown, replayed, expired, or its node
    /// is no longer in the state it was issued for.
    RefusedBootToken,
    /// The machine that booted the ramdisk is not the one its BMC described (the node failed
    /// with `HardwareMismatch`).
    RefusedHardwareMismatch,
    /// A join token tried to re-join in place a machine enrolled through a BMC before it is
    /// `deployed` (issue 30.1).
    RefusedBareMetal,
    /// A deployed system's deploy identity was refused: unknown, replaced by a newer deploy,
    /// its node not `deployed`, or shown by another machine (issue 30.1).
    RefusedDeployIdentity,
    /// The store or the CA failed.
    Error,
}

impl JoinOutcome {
    /// Every outcome, in label order.
    pub const ALL: &'static [JoinOutcome] = &[
        JoinOutcome::NewNode,
        JoinOutcome::Rejoined,
        JoinOutcome::RefusedRate,
        JoinOutcome::RefusedInvalid,
        JoinOutcome::RefusedToken,
        JoinOutcome::RefusedPlacement,
        JoinOutcome::RefusedDuplicate,
        JoinOutcome::RefusedScope,
        JoinOutcome::PendingApproval,
        JoinOutcome::RefusedBootToken,
        JoinOutcome::RefusedHardwareMismatch,
        JoinOutcome::RefusedBareMetal,
        JoinOutcome::RefusedDeployIdentity,
        JoinOutcome::Error,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            JoinOutcome::NewNode => "new_node",
            JoinOutcome::Rejoined => "rejoined",
            JoinOutcome::RefusedRate => "refused_rate",
            JoinOutcome::RefusedInvalid => "refused_invalid",
            JoinOutcome::RefusedToken => "refused_token",
            JoinOutcome::RefusedPlacement => "refused_placement",
            JoinOutcome::RefusedDuplicate => "refused_duplicate",
            JoinOutcome::RefusedScope => "refused_scope",
            JoinOutcome::PendingApproval => "pending_approval",
            JoinOutcome::RefusedBootToken => "refused_boot_token",
            JoinOutcome::RefusedHardwareMismatch => "refused_hardware_mismatch",
            JoinOutcome::RefusedBareMetal => "refused_bare_metal",
            JoinOutcome::RefusedDeployIdentity => "refused_deploy_identity",
            JoinOutcome::Error => "error",
        }
    }
}

/// Why the gateway refused a connection at accept (`bcctl_gateway_connections_refused_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnRefused {
    /// `--gateway-max-connections` open already.
    Total,
    /// `--gateway-max-connections-per-address` open from this address already.
    PerAddress,
}

impl ConnRefused {
    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnRefused::Total => "total",
            ConnRefused::PerAddress => "per_address",
        }
    }
}

/// Why the gateway closed a connection before it served it
/// (`bcctl_gateway_connections_closed_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnClosed {
    /// No finished TLS handshake within `--gateway-handshake-timeout`.
    HandshakeTimeout,
    /// The TLS handshake failed.
    HandshakeFailed,
    /// No HTTP/2 preface and first frame within `--gateway-preface-timeout` after TLS.
    PrefaceTimeout,
}

impl ConnClosed {
    /// The `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnClosed::HandshakeTimeout => "handshake_timeout",
            ConnClosed::HandshakeFailed => "handshake_failed",
            ConnClosed::PrefaceTimeout => "preface_timeout",
        }
    }
}
