//! Handlers of the operator API. Each is thin: decode, one store call, encode.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use bc_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use super::detail::NodeDetail;
use super::{ApiError, ApiState};
use crate::store::tokens::{self, JoinToken, NewToken};
use crate::store::{events, nodes, now_ms};

type ApiResult<T> = Result<Json<T>, ApiError>;

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(v)| v).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("request body: {}", e.body_text()),
        )
    })
}

/// `nodes.list` request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodesListRequest {
    pub pool_id: Option<String>,
    pub provision_state: Option<bc_protocol::ProvisionState>,
    pub connectivity: Option<bc_protocol::Connectivity>,
}

/// `nodes.list` response.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodesListResponse {
    pub nodes: Vec<NodeDetail>,
}

pub async fn nodes_list(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<NodesListRequest>, JsonRejection>,
) -> ApiResult<NodesListResponse> {
    let req = body(req)?;
    let all = st.store.run(|c| nodes::list(c)).await?;
    let nodes = all
        .iter()
        .filter(|n| {
            req.pool_id
                .as_ref()
                .is_none_or(|p| n.pool_id.as_ref() == Some(p))
        })
        .filter(|n| req.provision_state.is_none_or(|s| n.provision_state == s))
        .filter(|n| req.connectivity.is_none_or(|s| n.connectivity == s))
        .map(NodeDetail::from)
        .collect();
    Ok(Json(NodesListResponse { nodes }))
}

/// A request naming one node.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeRef {
    pub node_id: String,
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("node {id} not found"))
}

pub async fn nodes_get(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<NodeRef>, JsonRejection>,
) -> ApiResult<NodeDetail> {
    let req = body(req)?;
    let id = req.node_id.clone();
    let node = st.store.run(move |c| nodes::get(c, &id)).await?;
    node.map(|n| Json(NodeDetail::from(&n)))
        .ok_or_else(|| not_found(&req.node_id))
}

/// `nodes.events` response.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventsResponse {
    pub events: Vec<EventView>,
}

/// One event with its time rendered.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventView {
    pub at: String,
    pub kind: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub actor: String,
    pub message: String,
}

pub async fn nodes_events(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<NodeRef>, JsonRejection>,
) -> ApiResult<EventsResponse> {
    let req = body(req)?;
    let id = req.node_id.clone();
    let (exists, evs) = st
        .store
        .run(move |c| Ok((nodes::exists(c, &id)?, events::list(c, &id)?)))
        .await?;
    if !exists {
        return Err(not_found(&req.node_id));
    }
    let events = evs
        .into_iter()
        .map(|e| EventView {
            at: super::detail::rfc3339(e.at),
            kind: e.kind,
            from: e.from,
            to: e.to,
            actor: e.actor,
            message: e.message,
        })
        .collect();
    Ok(Json(EventsResponse { events }))
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

/// `tokens.create` response: the secret is shown here once and never again.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokensCreateResponse {
    pub token: String,
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
) -> ApiResult<TokensCreateResponse> {
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
    let check = new.clone();
    let created = st
        .store
        .run(move |c| {
            if let Some(p) = &check.pool_id
                && !exists(c, "pools", p)?
            {
                return Ok(Err(format!("pool {p} not found")));
            }
            if let Some(s) = &check.site_id
                && !exists(c, "sites", s)?
            {
                return Ok(Err(format!("site {s} not found")));
            }
            Ok(Ok(tokens::create(c, &check, now_ms())?))
        })
        .await?;
    let (tok, secret): (JoinToken, String) =
        created.map_err(|m| ApiError::new(ErrorCode::NotFound, m))?;
    let ca_pin = st
        .ca
        .pin()
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?;
    Ok(Json(TokensCreateResponse {
        token: secret,
        ca_pin,
        control_plane: st.gateway_url.clone(),
        expires_at: super::detail::rfc3339(tok.expires_at),
        max_uses: tok.max_uses,
        pool_id: tok.pool_id,
        site_id: tok.site_id,
    }))
}

fn exists(
    c: &rusqlite::Connection,
    table: &str,
    id: &str,
) -> Result<bool, crate::store::StoreError> {
    use rusqlite::OptionalExtension;
    Ok(c.query_row(
        &format!("SELECT 1 FROM {table} WHERE id = ?1"),
        [id],
        |_| Ok(()),
    )
    .optional()?
    .is_some())
}

/// `tokens.list` response.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokensListResponse {
    pub tokens: Vec<serde_json::Value>,
}

pub async fn tokens_list(State(st): State<Arc<ApiState>>) -> ApiResult<TokensListResponse> {
    let toks = st.store.run(|c| tokens::list(c)).await?;
    let tokens = toks
        .into_iter()
        .map(|t| {
            serde_json::json!({
                "id": t.id,
                "poolId": t.pool_id,
                "siteId": t.site_id,
                "expiresAt": super::detail::rfc3339(t.expires_at),
                "maxUses": t.max_uses,
                "uses": t.uses,
                "revoked": t.revoked,
                "createdAt": super::detail::rfc3339(t.created_at),
            })
        })
        .collect();
    Ok(Json(TokensListResponse { tokens }))
}
