//! `Gateway.Upload`: a logs.collect bundle from the node that owns the command, in order, each
//! chunk at most [`MAX_CHUNK_BYTES`]; the total size and SHA-256 on the last chunk must match what
//! arrived. The bundle is written to `<bundles dir>/<command id>.tar.gz.part` and renamed into
//! place only when it checks out, so a reader never sees half a bundle.

use std::path::{Path, PathBuf};

use bc_protocol::pb::{UploadChunk, UploadResult};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tonic::{Status, Streaming};

use crate::store::commands;

/// Largest `data` in one chunk, bytes (1 MiB).
pub const MAX_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest bundle accepted, bytes (1 GiB).
pub const MAX_BUNDLE_BYTES: u64 = 1024 * 1024 * 1024;

/// Where the bundle of `command_id` lives; `None` unless the id is a plain token.
pub fn bundle_path(dir: &Path, command_id: &str) -> Option<PathBuf> {
    let plain = !command_id.is_empty()
        && command_id.len() <= 64
        && command_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    plain.then(|| dir.join(format!("{command_id}.tar.gz")))
}

fn internal(what: &str, path: &Path, e: std::io::Error) -> Status {
    tracing::error!(path = %path.display(), error = %e, "{what} failed");
    Status::internal(format!("{what} {}: {e}", path.display()))
}

/// Receives one upload from `node_id`.
pub async fn receive(
    gw: &super::GatewayService,
    node_id: &str,
    mut inbound: Streaming<UploadChunk>,
) -> Result<UploadResult, Status> {
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| Status::invalid_argument("empty upload: no chunks"))?;
    let cid = first.command_id.clone();
    let dir = gw.cfg.bundles_dir.clone();
    let path = bundle_path(&dir, &cid).ok_or_else(|| {
        Status::invalid_argument(format!("command id {cid:?} is not a plain token"))
    })?;
    let lookup = cid.clone();
    let cmd = gw
        .store
        .run(move |c| commands::get(c, &lookup))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?
        .ok_or_else(|| Status::not_found(format!("command {cid} not found")))?;
    if cmd.node_id != node_id {
        return Err(Status::permission_denied(format!(
            "command {cid} belongs to another node"
        )));
    }
    if cmd.name != bc_protocol::CommandName::LogsCollect.as_str() {
        return Err(Status::invalid_argument(format!(
            "command {cid} is {}, not logs.collect",
            cmd.name
        )));
    }
    if cmd.state.is_final() {
        return Err(Status::failed_precondition(format!(
            "command {cid} is already {}",
            cmd.state.as_str()
        )));
    }
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| internal("creating", &dir, e))?;
    let part = path.with_extension("gz.part");
    let mut file = tokio::fs::File::create(&part)
        .await
        .map_err(|e| internal("creating", &part, e))?;
    let outcome = write_chunks(&mut file, &part, &cid, first, &mut inbound).await;
    drop(file);
    match outcome {
        Ok(r) => {
            tokio::fs::rename(&part, &path)
                .await
                .map_err(|e| internal("renaming", &part, e))?;
            tracing::info!(command = %cid, node_id, bytes = r.bytes, sha256 = %r.sha256, "bundle stored");
            Ok(r)
        }
        Err(s) => {
            let _ = tokio::fs::remove_file(&part).await;
            Err(s)
        }
    }
}

async fn write_chunks(
    file: &mut tokio::fs::File,
    part: &Path,
    cid: &str,
    first: UploadChunk,
    inbound: &mut Streaming<UploadChunk>,
) -> Result<UploadResult, Status> {
    let mut hash = Sha256::new();
    let mut offset = 0u64;
    let mut next = Some(first);
    while let Some(chunk) = next.take() {
        if chunk.command_id != cid {
            return Err(Status::invalid_argument(
                "command_id changed within one upload",
            ));
        }
        if chunk.data.len() > MAX_CHUNK_BYTES {
            return Err(Status::invalid_argument(format!(
                "chunk of {} bytes is over {MAX_CHUNK_BYTES}",
                chunk.data.len()
            )));
        }
        if chunk.offset != offset {
            return Err(Status::invalid_argument(format!(
                "chunk at offset {} where {offset} was expected",
                chunk.offset
            )));
        }
        offset += chunk.data.len() as u64;
        if offset > MAX_BUNDLE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "bundle is over {MAX_BUNDLE_BYTES} bytes"
            )));
        }
        hash.update(&chunk.data);
        file.write_all(&chunk.data)
            .await
            .map_err(|e| internal("writing", part, e))?;
        if chunk.last {
            let sha = hex::encode(hash.finalize());
            if chunk.total_bytes != offset || !chunk.sha256.eq_ignore_ascii_case(&sha) {
                return Err(Status::data_loss(format!(
                    "bundle check failed: got {offset} bytes with SHA-256 {sha}, the agent says {} bytes with {}",
                    chunk.total_bytes, chunk.sha256
                )));
            }
            file.sync_all()
                .await
                .map_err(|e| internal("syncing", part, e))?;
            return Ok(UploadResult {
                bytes: offset,
                sha256: sha,
            });
        }
        next = inbound.message().await?;
    }
    Err(Status::invalid_argument(
        "upload ended without a last chunk (size and SHA-256)",
    ))
}
