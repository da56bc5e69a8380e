//! The operator API: HTTP + JSON, method names as in the spec (`POST /v1/nodes.get`, ...), a bearer
//! token, and errors `{code, message}` with the spec's codes.

pub mod bundles;
pub mod commands;
pub mod handlers;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bc_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::ca::CertificateAuthority;
use crate::store::{Store, StoreError};

/// The body of every error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The HTTP status for this error's code (one exhaustive mapping).
    pub fn status(&self) -> StatusCode {
        match self.code {
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::InvalidState | ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
            ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!(error = %e, "store error in API request");
        ApiError::new(ErrorCode::Internal, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self)).into_response()
    }
}

/// What handlers share.
#[derive(Debug)]
pub struct ApiState {
    pub store: Store,
    pub ca: Arc<CertificateAuthority>,
    /// Bearer token operators present.
    pub api_token: String,
    /// The gateway URL agents use, for `tokens.create`'s printout.
    pub gateway_url: String,
    pub commands: crate::commands::Commands,
    /// Live sessions, to close a revoked or deleted node's stream and push new specs.
    pub registry: Arc<crate::gateway::registry::Registry>,
    /// Where logs.collect bundles are stored (`<state dir>/bundles`).
    pub bundles_dir: std::path::PathBuf,
}

async fn require_bearer(State(st): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match presented {
        Some(t) if constant_time_eq(t.as_bytes(), st.api_token.as_bytes()) => next.run(req).await,
        Some(_) => ApiError::new(ErrorCode::Unauthenticated, "bearer token is not valid").into_response(),
        None => ApiError::new(
            ErrorCode::Unauthenticated,
            "missing bearer token: send `Authorization: Bearer <token>` (bcctl reads it from --token, BCCTL_TOKEN or the state dir)",
        )
        .into_response(),
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The operator API router.
pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/v1/tokens.create", post(handlers::tokens_create))
        .route("/v1/{method}", post(handlers::model_method))
        .route("/v1/commands.create", post(commands::create))
        .route("/v1/commands.get", post(commands::get))
        .route("/v1/commands.list", post(commands::list))
        .route("/v1/commands.cancel", post(commands::cancel))
        .route("/v1/bundles/{command_id}", get(bundles::download))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_bearer,
        ))
        .with_state(state)
}
