//! `GET /v1/bundles/{commandId}`: the logs.collect bundle (gzip-compressed tar) of a command,
//! streamed from `<state dir>/bundles/<command id>.tar.gz` in 64 KiB reads. Headers:
//! `Content-Length`, `Content-Type: application/gzip`, and `X-Bundle-Sha256` (lowercase hex): the
//! digest the gateway computed over the bytes it received and stored, never the one the node
//! reports in the command's result (a node could claim anything there).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bc_protocol::ErrorCode;
use tokio::io::AsyncReadExt;

use super::{ApiError, ApiState};

/// Bytes per read while streaming.
const READ_BYTES: usize = 64 * 1024;

/// The handler.
pub async fn download(
    State(st): State<Arc<ApiState>>,
    Path(command_id): Path<String>,
) -> Result<Response, ApiError> {
    let path =
        crate::gateway::upload::bundle_path(&st.bundles_dir, &command_id).ok_or_else(|| {
            ApiError::new(
                ErrorCode::InvalidArgument,
                "command id is not a plain token",
            )
        })?;
    let id = command_id.clone();
    let cmd = st
        .core
        .store
        .read(move |r| r.command(&id))
        .await?
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("command {command_id} not found"),
            )
        })?;
    let file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!(
                    "command {command_id} ({}, {}) has no bundle",
                    cmd.name,
                    cmd.state.as_str()
                ),
            ));
        }
        Err(e) => return Err(ApiError::new(ErrorCode::Internal, e.to_string())),
    };
    let len = file
        .metadata()
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
        .len();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tokio::spawn(async move {
        let mut file = file;
        loop {
            let mut buf = vec![0u8; READ_BYTES];
            match file.read(&mut buf).await {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.send(Ok(buf)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
        }
    });
    let sha = crate::gateway::upload::stored_digest(&path)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))?
        .unwrap_or_default();
    let mut resp = (
        [
            (header::CONTENT_TYPE, "application/gzip".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{command_id}.tar.gz\""),
            ),
        ],
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx)),
    )
        .into_response();
    if let Ok(v) = axum::http::HeaderValue::from_str(&sha)
        && !sha.is_empty()
    {
        resp.headers_mut().insert("x-bundle-sha256", v);
    }
    Ok(resp)
}
