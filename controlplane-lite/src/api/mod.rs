//! The operator API: HTTP + JSON, method names as in the spec (`POST /v1/nodes.get`, ...), a bearer
//! token, and errors `{code, message}` with the spec's codes. Every verb goes through the core's
//! one dispatcher ([`cpl_core::verbs::Core::dispatch`]); this adapter authenticates, decodes the
//! body into the verb's typed request, and maps an error code to its HTTP status ([`status`],
//! the one place that does).
//!
//! `GET /v1/openapi.json` serves the OpenAPI 3.1 document generated from the same types. It needs
//! no bearer token: it describes the API and holds no data, and a client reads it before it has
//! credentials. Everything else needs the token.

pub mod bundles;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bc_protocol::ErrorCode;
use cpl_core::error::{ErrorBody, OpError};
use cpl_core::verbs::{Core, Method};
use cpl_store::StoreError;
use serde_json::Value;

use crate::limits::API_MAX_BODY_BYTES;

/// The HTTP status of an error code. Exhaustive on purpose: the one mapping of codes to statuses.
pub fn status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::InvalidState | ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
    }
}

/// An error answer: `{code, message}` with the code's status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ApiError(pub ErrorBody);

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self(ErrorBody::new(code, message))
    }
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> Self {
        if let OpError::Store(s) = &e {
            tracing::error!(error = %s, "store error in API request");
        }
        Self(ErrorBody::from(&e))
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        OpError::Store(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (status(self.0.code), axum::Json(self.0)).into_response()
    }
}

/// What handlers share.
#[derive(Debug)]
pub struct ApiState {
    /// The verbs.
    pub core: Core,
    /// Bearer token operators present.
    pub api_token: String,
    /// Where logs.collect bundles are stored (`<state dir>/bundles`).
    pub bundles_dir: std::path::PathBuf,
}

/// The token of an `Authorization: Bearer <token>` value. The scheme is case-insensitive and
/// followed by one or more spaces (RFC 9110 §11.1, §11.4).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim().split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn require_bearer(State(st): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
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

/// The one answer to a body over [`API_MAX_BODY_BYTES`].
fn too_large() -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("request body is over {API_MAX_BODY_BYTES} bytes"),
    )
}

/// Refuses, on every route and before authentication, a request whose `Content-Length` is over
/// [`API_MAX_BODY_BYTES`]; a body without a length is cut at the same limit where it is read
/// ([`verb`]), with the same answer.
async fn limit_body(req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(n) if n > API_MAX_BODY_BYTES as u64 => too_large().into_response(),
        _ => next.run(req).await,
    }
}

/// `POST /v1/{method}`: every verb of [`Method`].
async fn verb(
    State(st): State<Arc<ApiState>>,
    Path(method): Path<String>,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<cpl_core::verbs::Response>, ApiError> {
    let raw = raw.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::new(
                ErrorCode::InvalidArgument,
                format!("request body unreadable: {}", e.body_text()),
            )
        }
    })?;
    let method = Method::from_name(&method)
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("unknown method {method:?}")))?;
    // No body is no arguments; a body must be a JSON object (`Method::decode`).
    let body: Value = if raw.is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(&raw).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                format!("request body is not JSON: {e}"),
            )
        })?
    };
    let req = method.decode(body)?;
    Ok(axum::Json(st.core.dispatch(req, "operator").await?))
}

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    match serde_json::to_vec(&cpl_core::verbs::openapi::document()) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError::new(ErrorCode::Internal, e.to_string()).into_response(),
    }
}

/// The operator API router.
pub fn router(state: Arc<ApiState>) -> Router {
    let authenticated = Router::new()
        .route("/v1/{method}", post(verb))
        .route("/v1/bundles/{command_id}", get(bundles::download))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_bearer,
        ));
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .merge(authenticated)
        .layer(DefaultBodyLimit::max(API_MAX_BODY_BYTES))
        .layer(middleware::from_fn(limit_body))
        .with_state(state)
}

#[cfg(test)]
mod api_tests;
