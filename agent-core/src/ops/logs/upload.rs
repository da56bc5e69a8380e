//! Uploading a bundle over `Gateway.Upload` (mutual TLS, the node's own certificate): chunks of
//! [`CHUNK_BYTES`] read from the file as they are sent (at most two chunks queued, so memory stays
//! near 3 MiB), the last one carrying the total size and SHA-256 for the gateway to check.

use std::sync::Arc;

use bc_protocol::pb::UploadChunk;
use bc_protocol::pb::gateway_client::GatewayClient;
use tokio::io::AsyncReadExt;

use super::{Bundle, LogsError};

/// Bytes per chunk (1 MiB, the gateway's limit).
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// Where bundles go: the control plane's gateway URL and the session's TLS config.
#[derive(Debug, Clone)]
pub struct Uploader {
    pub control_plane: String,
    pub tls: Arc<rustls::ClientConfig>,
}

/// Sends `bundle` for `command_id`; returns the (bytes, SHA-256) the gateway stored.
pub async fn upload(
    up: &Uploader,
    command_id: &str,
    bundle: &Bundle,
) -> Result<(u64, String), LogsError> {
    let channel = crate::tls::channel(&up.control_plane, Arc::clone(&up.tls))
        .await
        .map_err(|e| LogsError::Upload(e.to_string()))?;
    let mut file = tokio::fs::File::open(&bundle.path)
        .await
        .map_err(|source| LogsError::Io {
            what: "reading",
            path: bundle.path.clone(),
            source,
        })?;
    let (tx, rx) = tokio::sync::mpsc::channel::<UploadChunk>(2);
    let (id, total, sha) = (command_id.to_owned(), bundle.bytes, bundle.sha256.clone());
    let reader = tokio::spawn(async move {
        let mut offset = 0u64;
        loop {
            let mut data = vec![0u8; CHUNK_BYTES];
            let mut filled = 0;
            while filled < CHUNK_BYTES {
                match file.read(&mut data[filled..]).await {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) => return Err(e),
                }
            }
            data.truncate(filled);
            let last = offset + filled as u64 >= total;
            let chunk = UploadChunk {
                command_id: id.clone(),
                offset,
                data,
                last,
                total_bytes: if last { total } else { 0 },
                sha256: if last { sha.clone() } else { String::new() },
            };
            offset += filled as u64;
            if tx.send(chunk).await.is_err() || last {
                return Ok(());
            }
        }
    });
    let resp = GatewayClient::new(channel)
        .upload(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await;
    let read = reader.await;
    let r = resp
        .map_err(|s| LogsError::Upload(format!("{}: {}", s.code(), s.message())))?
        .into_inner();
    match read {
        Ok(Ok(())) => {}
        Ok(Err(source)) => {
            return Err(LogsError::Io {
                what: "reading",
                path: bundle.path.clone(),
                source,
            });
        }
        Err(e) => return Err(LogsError::Upload(e.to_string())),
    }
    Ok((r.bytes, r.sha256))
}
