//! `commands.*`: create (queue and dispatch), get, list, cancel.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use bc_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use super::{ApiError, ApiState};
use crate::model::conditions::rfc3339_ms as rfc3339;
use crate::store::commands::{self, CommandRecord};

/// Longest command timeout accepted, seconds (one day).
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;

/// A command as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandView {
    pub id: String,
    pub node_id: String,
    pub name: String,
    pub args: serde_json::Value,
    /// queued | sent | running | succeeded | failed | cancelled | expired
    pub state: String,
    pub progress: u32,
    pub result: Option<serde_json::Value>,
    pub error: Option<ApiErrorView>,
    pub actor: String,
    pub created_at: String,
    pub sent_at: Option<String>,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub deadline: String,
}

/// A command's error: `{code, message}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiErrorView {
    pub code: String,
    pub message: String,
}

impl From<&CommandRecord> for CommandView {
    fn from(c: &CommandRecord) -> Self {
        Self {
            id: c.id.clone(),
            node_id: c.node_id.clone(),
            name: c.name.clone(),
            args: c.args.clone(),
            state: c.state.as_str().to_owned(),
            progress: c.progress,
            result: c.result.clone(),
            error: c.error_code.as_ref().map(|code| ApiErrorView {
                code: code.clone(),
                message: c.error_message.clone().unwrap_or_default(),
            }),
            actor: c.actor.clone(),
            created_at: rfc3339(c.created_at),
            sent_at: c.sent_at.map(rfc3339),
            started_at: c.started_at.map(rfc3339),
            finished_at: c.finished_at.map(rfc3339),
            deadline: rfc3339(c.deadline_at),
        }
    }
}

fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(v)| v).map_err(|e| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("request body: {}", e.body_text()),
        )
    })
}

/// `commands.create` request.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateRequest {
    pub node_id: String,
    pub name: String,
    #[serde(default)]
    pub args: Option<serde_json::Value>,
    pub timeout_seconds: Option<u64>,
}

pub async fn create(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<CreateRequest>, JsonRejection>,
) -> Result<Json<CommandView>, ApiError> {
    let req = body(req)?;
    let timeout = req
        .timeout_seconds
        .map(Duration::from_secs)
        .unwrap_or(crate::commands::DEFAULT_COMMAND_TIMEOUT);
    if timeout.is_zero() || timeout.as_secs() > MAX_TIMEOUT_SECONDS {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("timeoutSeconds must be between 1 and {MAX_TIMEOUT_SECONDS}"),
        ));
    }
    let args = req.args.unwrap_or_else(|| serde_json::json!({}));
    let rec = st
        .commands
        .create(&req.node_id, &req.name, args, timeout, "operator")
        .await?;
    Ok(Json(CommandView::from(&rec)))
}

/// A request naming one command.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandRef {
    pub command_id: String,
}

pub async fn get(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<CommandRef>, JsonRejection>,
) -> Result<Json<CommandView>, ApiError> {
    let req = body(req)?;
    let rec = st.commands.get(&req.command_id).await?;
    rec.map(|r| Json(CommandView::from(&r))).ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!("command {} not found", req.command_id),
        )
    })
}

/// `commands.list` request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListRequest {
    pub node_id: Option<String>,
    /// Default 100, at most 1000.
    pub limit: Option<u32>,
}

/// `commands.list` response, newest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct ListResponse {
    pub commands: Vec<CommandView>,
}

pub async fn list(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<ListRequest>, JsonRejection>,
) -> Result<Json<ListResponse>, ApiError> {
    let req = body(req)?;
    let limit = req.limit.unwrap_or(100).clamp(1, 1000);
    let recs = st
        .store
        .run(move |c| commands::list(c, req.node_id.as_deref(), limit))
        .await?;
    Ok(Json(ListResponse {
        commands: recs.iter().map(CommandView::from).collect(),
    }))
}

pub async fn cancel(
    State(st): State<Arc<ApiState>>,
    req: Result<Json<CommandRef>, JsonRejection>,
) -> Result<Json<CommandView>, ApiError> {
    let req = body(req)?;
    let rec = st.commands.cancel(&req.command_id).await?;
    Ok(Json(CommandView::from(&rec)))
}
