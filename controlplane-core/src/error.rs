//! [`OpError`]: what an operation on the node model refused or failed, and its one mapping to the
//! error codes of the operator API (spec: errors are `{code, message}`). Which HTTP status a code
//! is, is the HTTP adapter's business (controlplane-lite's `api`), not the core's.

use bc_protocol::{ErrorCode, ProvisionState};
use cpl_store::StoreError;

/// Why an operation did not happen. Every variant maps to one [`ErrorCode`] in [`OpError::code`].
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// No object of this kind with this id (`node`, `pool`, `site`, `token`, `allocation`,
    /// `lease`, `command`, `method`).
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    /// The provision state table has no edge `from -> to` (spec "Provision states").
    #[error("invalid provisionState transition from {from} to {to}")]
    InvalidTransition {
        from: ProvisionState,
        to: ProvisionState,
    },
    /// The object is in a state where the operation makes no sense (e.g. `nodes.recover` on a node
    /// that is not `failed`, deleting a node that still holds allocations).
    #[error("{0}")]
    InvalidState(String),
    /// The caller's `version` is stale (spec "Identity, ownership and generations": `version`).
    #[error("{kind} {id} changed: expected version {expected}, found {actual}")]
    Conflict {
        kind: &'static str,
        id: String,
        expected: u64,
        actual: u64,
    },
    /// The request itself is malformed or refers to something inconsistent.
    #[error("{0}")]
    InvalidArgument(String),
    /// The caller may not do this to this object.
    #[error("{0}")]
    PermissionDenied(String),
    /// No schedulable node in the pool has this many free GPUs right now.
    #[error(
        "pool {pool_id}: no schedulable node has {requested} free GPUs (largest free: {largest_free})"
    )]
    InsufficientCapacity {
        pool_id: String,
        requested: u32,
        largest_free: u32,
    },
    /// What the operation needs is not there right now; retrying later may work (e.g. no site
    /// agent holds the site's lease).
    #[error("{0}")]
    Unavailable(String),
    /// The store failed underneath.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Something this process needs failed (e.g. the CA could not give its pin).
    #[error("{0}")]
    Internal(String),
}

impl OpError {
    /// The API error code. Exhaustive on purpose: a new variant must choose its code here.
    pub fn code(&self) -> ErrorCode {
        match self {
            OpError::NotFound { .. } => ErrorCode::NotFound,
            OpError::InvalidTransition { .. } | OpError::InvalidState(_) => ErrorCode::InvalidState,
            OpError::Conflict { .. } => ErrorCode::Conflict,
            OpError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            OpError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            // Capacity comes back as allocations are released: retryable, hence UNAVAILABLE.
            OpError::InsufficientCapacity { .. } | OpError::Unavailable(_) => {
                ErrorCode::Unavailable
            }
            // A database that cannot be reached comes back: retryable, and the client is told.
            OpError::Store(e) if e.is_unavailable() => ErrorCode::Unavailable,
            OpError::Store(_) | OpError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// `NotFound` for a node.
    pub fn node_not_found(id: &str) -> Self {
        OpError::NotFound {
            kind: "node",
            id: id.to_owned(),
        }
    }
}

/// The body of every error answer of the operator API: `{code, message}`.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    thiserror::Error,
    utoipa::ToSchema,
)]
#[error("{code}: {message}")]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ErrorBody {
    /// An error body with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl From<&OpError> for ErrorBody {
    fn from(e: &OpError) -> Self {
        ErrorBody::new(e.code(), e.to_string())
    }
}
