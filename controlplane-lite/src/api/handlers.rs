//! Handlers of the operator API. Every node-model verb goes through one dispatcher
//! ([`crate::model::api::dispatch`]); the gateway-facing effects of a verb (closing a revoked
//! node's session, pushing a new spec) happen here, after its transaction committed.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use bc_protocol::ErrorCode;
use bc_protocol::pb::GoodbyeReason;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, ApiState};
use crate::model::conditions::rfc3339_ms;
use crate::store::tokens::NewToken;

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(v)| v).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("request body: {}", e.body_text()),
        )
    })
}

/// `POST /v1/{method}` for every verb of [`crate::model::api::METHODS`].
pub async fn model_method(
    State(st): State<Arc<ApiState>>,
    Path(method): Path<String>,
    raw: Bytes,
) -> Result<Json<Value>, ApiError> {
    if !crate::model::api::METHODS.contains(&method.as_str()) {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("unknown method {method:?}"),
        ));
    }
    let req: Value = if raw.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&raw).map_err(|e| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                format!("request body is not JSON: {e}"),
            )
        })?
    };
    if method == "nodes.updateSpec" {
        validate_spec(&st, &req).await?;
    }
    let m = method.clone();
    let out = st
        .store
        .run(move |c| Ok(crate::model::api::dispatch(c, &m, req, "operator")))
        .await?
        .map_err(|e| ApiError::from(&e))?;
    after_commit(&st, &method, &out).await;
    Ok(Json(out))
}

/// `nodes.updateSpec`: the spec must parse, name GPUs the node has, carry no past expiry, and give
/// no break-glass keys to a tenant-controlled node (spec::validate).
async fn validate_spec(st: &ApiState, req: &Value) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::new(ErrorCode::InvalidArgument, m);
    let spec_json = req.get("spec").cloned().unwrap_or(Value::Null);
    let spec: bc_protocol::spec::NodeSpec =
        serde_json::from_value(spec_json).map_err(|e| bad(format!("spec: {e}")))?;
    let Some(node_id) = req.get("nodeId").and_then(Value::as_str).map(str::to_owned) else {
        return Ok(()); // the dispatcher reports the missing field
    };
    let node = st
        .store
        .run(move |c| crate::store::nodes::get(c, &node_id))
        .await?;
    let Some(node) = node else { return Ok(()) };
    let known: Option<Vec<bc_protocol::spec::KnownGpu>> = node.inventory()?.as_ref().map(|inv| {
        inv.get("gpus")
            .and_then(Value::as_array)
            .map(|gs| {
                gs.iter()
                    .map(|g| bc_protocol::spec::KnownGpu {
                        uuid: g.get("uuid").and_then(Value::as_str).map(str::to_owned),
                        pci_address: g.get("pciBusId").and_then(Value::as_str).map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default()
    });
    let ctx = bc_protocol::spec::ValidationContext {
        now_ms: chrono::Utc::now().timestamp_millis(),
        trust: node.trust,
        known_gpus: known.as_deref(),
    };
    bc_protocol::spec::validate(&spec, &ctx).map_err(|e| bad(e.to_string()))
}

/// Gateway effects of a committed verb.
async fn after_commit(st: &ApiState, method: &str, out: &Value) {
    let node_id = out.get("id").and_then(Value::as_str).map(str::to_owned);
    let Some(node_id) = node_id else { return };
    match method {
        "nodes.revokeIdentity" => {
            let epoch = st.registry.sender(&node_id).map(|(e, _)| e);
            st.registry
                .close(&node_id, GoodbyeReason::Revoked, "node identity revoked");
            // The control plane ended the session on purpose: disconnected, not unreachable.
            if let Some(epoch) = epoch {
                let id = node_id.clone();
                if let Err(e) = st
                    .store
                    .run(move |c| crate::store::sessions::close_clean(c, &id, epoch, "revoked"))
                    .await
                {
                    tracing::error!(node_id, error = %e, "recording the revoked session's end failed");
                }
            }
        }
        "nodes.delete" => {
            st.registry
                .close(&node_id, GoodbyeReason::Deleted, "node deleted");
        }
        "nodes.updateSpec" | "nodes.startDedicatedRoot" => {
            crate::gateway::push_spec(&st.store, &st.registry, &node_id).await
        }
        _ => {}
    }
}

/// `tokens.create` request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokensCreateRequest {
    pub pool_id: Option<String>,
    pub site_id: Option<String>,
    /// Seconds; default 3600.
    pub ttl_seconds: Option<u64>,
    /// Default: unlimited.
    pub max_uses: Option<u64>,
    pub description: Option<String>,
}

/// `tokens.create` response: the secret is shown here once and never again, with the CA pin and
/// the gateway URL an agent needs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokensCreateResponse {
    pub token: String,
    pub id: String,
    pub ca_pin: String,
    pub control_plane: String,
    pub expires_at: String,
    pub max_uses: Option<u64>,
    pub pool_id: Option<String>,
    pub site_id: Option<String>,
}

/// Longest token lifetime accepted, seconds (30 days).
pub const MAX_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;

pub async fn tokens_create(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<TokensCreateRequest>, JsonRejection>,
) -> Result<Json<TokensCreateResponse>, ApiError> {
    let req = body(req)?;
    let ttl = req.ttl_seconds.unwrap_or(3600);
    if ttl == 0 || ttl > MAX_TOKEN_TTL_SECONDS {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("ttlSeconds must be between 1 and {MAX_TOKEN_TTL_SECONDS}, got {ttl}"),
        ));
    }
    if req.max_uses == Some(0) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            "maxUses must be at least 1",
        ));
    }
    let new = NewToken {
        pool_id: req.pool_id,
        site_id: req.site_id,
        ttl_ms: i64::try_from(ttl.saturating_mul(1000)).unwrap_or(i64::MAX),
        max_uses: req.max_uses,
        description: req.description,
    };
    let (tok, secret) = st
        .store
        .run(move |c| {
            Ok(crate::model::ops::write_tx(c, |tx| {
                crate::model::ops::tokens::create(tx, &new)
            }))
        })
        .await?
        .map_err(|e| ApiError::from(&e))?;
    let ca_pin = st
        .ca
        .pin()
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok(Json(TokensCreateResponse {
        token: secret,
        id: tok.id,
        ca_pin,
        control_plane: st.gateway_url.clone(),
        expires_at: rfc3339_ms(tok.expires_at),
        max_uses: tok.max_uses,
        pool_id: tok.pool_id,
        site_id: tok.site_id,
    }))
}
