//! `Gateway.Upload`: a logs.collect bundle from the node that owns the command, in order, each
//! chunk at most [`MAX_CHUNK_BYTES`]; the total size and SHA-256 on the last chunk must match what
//! arrived. The bundle is written to a temp file of its own in the bundles dir (a unique name:
//! two uploads never share one) and renamed to `<command id>.tar.gz` only when it checks out, so
//! a reader never sees half a bundle.
//!
//! One upload per command at a time ([`InFlight`]; a second is refused with `ABORTED`). The
//! SHA-256 the gateway computed is written beside the bundle (`<command id>.tar.gz.sha256`,
//! before the bundle takes its name) and is what the download serves, never the digest the node
//! reports in its result. A stored bundle is never replaced: an upload of the same bytes again
//! (an agent that lost the answer) succeeds without writing, other bytes are refused
//! (`ALREADY_EXISTS`).
//!
//! The bundles dir keeps its retention rules ([`crate::bundle_store`]): it is pruned before and
//! after each upload, and a chunk that would take the bundle past the store's byte limit or the
//! disk past its free-space reserve is refused with `RESOURCE_EXHAUSTED` (counted in
//! `bcctl_bundle_uploads_refused_total`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use bc_protocol::pb::{UploadChunk, UploadResult};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tonic::{Status, Streaming};

use cpl_store::CommandRecord;

use crate::bundle_store::BundleStore;
pub use crate::bundle_store::digest_path;

/// Largest `data` in one chunk, bytes (1 MiB).
pub const MAX_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest bundle accepted, bytes (1 GiB).
pub const MAX_BUNDLE_BYTES: u64 = 1024 * 1024 * 1024;

/// Commands whose upload is in progress.
#[derive(Debug, Default)]
pub struct InFlight(parking_lot::Mutex<HashSet<String>>);

/// Holds a command's upload slot; released when dropped (the upload ended, however).
#[derive(Debug)]
struct Slot<'a> {
    set: &'a InFlight,
    command_id: String,
}

impl InFlight {
    /// Takes the slot of `command_id`, or `None` while another upload holds it.
    fn take(&self, command_id: &str) -> Option<Slot<'_>> {
        self.0.lock().insert(command_id.to_owned()).then(|| Slot {
            set: self,
            command_id: command_id.to_owned(),
        })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.set.0.lock().remove(&self.command_id);
    }
}

/// The SHA-256 the gateway computed for a stored bundle: its digest file, or for a bundle stored
/// before digest files existed, the bundle's bytes hashed now. `None` when there is no bundle,
/// whatever digest file is left (one written just before a crash, before its bundle was renamed
/// into place, must not make a repeated upload look stored).
pub async fn stored_digest(bundle: &Path) -> std::io::Result<Option<String>> {
    if !tokio::fs::try_exists(bundle).await? {
        return Ok(None);
    }
    match tokio::fs::read_to_string(digest_path(bundle)).await {
        Ok(s) if !s.trim().is_empty() => return Ok(Some(s.trim().to_owned())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = match tokio::fs::File::open(bundle).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::io::AsyncReadExt::read(&mut file, &mut buf).await?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Ok(Some(hex::encode(hash.finalize())))
}

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
    tracing::Span::current().record("command_id", cid.as_str());
    let dir = gw.cfg.bundles_dir.clone();
    let path = bundle_path(&dir, &cid).ok_or_else(|| {
        Status::invalid_argument(format!("command id {cid:?} is not a plain token"))
    })?;
    let lookup = cid.clone();
    let cmd = gw
        .store
        .read(move |r| r.command(&lookup))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?
        .ok_or_else(|| Status::not_found(format!("command {cid} not found")))?;
    check_command(&cmd, node_id)?;
    let _slot = gw.uploads.take(&cid).ok_or_else(|| {
        Status::aborted(format!(
            "another upload for command {cid} is in progress; one upload per command at a time"
        ))
    })?;
    let bundles = BundleStore::new(dir.clone(), gw.cfg.bundle_retention);
    bundles
        .ensure_dir()
        .map_err(|e| internal("creating", &dir, e))?;
    // Old bundles go first, so that the room this upload is measured against is what is left.
    prune(gw, &bundles, None);
    // A name of its own (0600 whatever the umask, random suffix), removed when dropped: a failed
    // or abandoned upload leaves nothing behind, and two uploads never write one file.
    let (std_file, part) = bundles
        .create_temp(&format!(".{cid}."), ".part")
        .map_err(|e| internal("creating a temp file in", &dir, e))?
        .into_parts();
    let mut file = tokio::fs::File::from_std(std_file);
    let outcome = write_chunks(&mut file, &part, &bundles, first, &mut inbound).await;
    drop(file);
    let r = match outcome {
        Ok(r) => r,
        Err(s) => {
            if s.code() == tonic::Code::ResourceExhausted {
                gw.metrics.bundle_refused();
                tracing::warn!(reason = %s.message(), "bundle upload refused");
            }
            return Err(s);
        }
    };
    match stored_digest(&path)
        .await
        .map_err(|e| internal("reading the digest of", &path, e))?
    {
        Some(stored) if stored == r.sha256 => {
            tracing::info!(sha256 = %r.sha256, "bundle uploaded again with the same bytes; kept");
            return Ok(r);
        }
        Some(stored) => {
            return Err(Status::already_exists(format!(
                "command {cid} already has a bundle (sha256 {stored}); a bundle is stored once"
            )));
        }
        None => {}
    }
    let digest = digest_path(&path);
    crate::ca::write_atomic(&digest, format!("{}\n", r.sha256).as_bytes(), 0o600)
        .map_err(|e| Status::internal(e.to_string()))?;
    part.persist(&path)
        .map_err(|e| internal("renaming", &e.path, e.error))?;
    tracing::info!(bytes = r.bytes, sha256 = %r.sha256, "bundle stored");
    // The new bundle counts now; it is never the one deleted.
    prune(gw, &bundles, Some(&path));
    Ok(r)
}

/// Prunes the bundle store by its retention rules, never `keep`; a failure is logged (an upload
/// does not fail because an old bundle could not be deleted).
pub(crate) fn prune(gw: &super::GatewayService, bundles: &BundleStore, keep: Option<&Path>) {
    match bundles.prune(std::time::SystemTime::now(), keep) {
        Ok(p) => {
            gw.metrics.bundles_pruned(p.deleted);
            if p.deleted > 0 {
                tracing::info!(
                    deleted = p.deleted,
                    freed_bytes = p.freed_bytes,
                    kept = p.kept,
                    kept_bytes = p.kept_bytes,
                    "old bundles deleted"
                );
            }
        }
        Err(e) => {
            tracing::warn!(dir = %bundles.dir().display(), error = %e, "pruning bundles failed")
        }
    }
}

/// Whether `node_id` may upload a bundle for `cmd`.
fn check_command(cmd: &CommandRecord, node_id: &str) -> Result<(), Status> {
    let cid = &cmd.id;
    if cmd.node_id != node_id {
        return Err(Status::permission_denied(format!(
            "command {cid} belongs to another node"
        )));
    }
    if cmd.name != bc_protocol::CommandName::LogsCollect {
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
    Ok(())
}

/// The checks on a chunk stream, without I/O: order, chunk size, total size and SHA-256.
#[derive(Debug)]
struct Assembler {
    command_id: String,
    hash: Sha256,
    offset: u64,
}

impl Assembler {
    fn new(command_id: &str) -> Self {
        Self {
            command_id: command_id.to_owned(),
            hash: Sha256::new(),
            offset: 0,
        }
    }

    /// Checks `chunk` and takes its data into the hash; on the last chunk, the verified result.
    fn accept(&mut self, chunk: &UploadChunk) -> Result<Option<UploadResult>, Status> {
        if chunk.command_id != self.command_id {
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
        if chunk.offset != self.offset {
            return Err(Status::invalid_argument(format!(
                "chunk at offset {} where {} was expected",
                chunk.offset, self.offset
            )));
        }
        self.offset += chunk.data.len() as u64;
        if self.offset > MAX_BUNDLE_BYTES {
            return Err(Status::resource_exhausted(format!(
                "bundle is over {MAX_BUNDLE_BYTES} bytes"
            )));
        }
        self.hash.update(&chunk.data);
        if !chunk.last {
            return Ok(None);
        }
        let sha = hex::encode(self.hash.clone().finalize());
        if chunk.total_bytes != self.offset || !chunk.sha256.eq_ignore_ascii_case(&sha) {
            return Err(Status::data_loss(format!(
                "bundle check failed: got {} bytes with SHA-256 {sha}, the agent says {} bytes with {}",
                self.offset, chunk.total_bytes, chunk.sha256
            )));
        }
        Ok(Some(UploadResult {
            bytes: self.offset,
            sha256: sha,
        }))
    }
}

async fn write_chunks(
    file: &mut tokio::fs::File,
    part: &Path,
    bundles: &BundleStore,
    first: UploadChunk,
    inbound: &mut Streaming<UploadChunk>,
) -> Result<UploadResult, Status> {
    let mut asm = Assembler::new(&first.command_id);
    let mut next = Some(first);
    while let Some(chunk) = next.take() {
        // Refused with a clear error before the store or the disk would be over its limit.
        bundles
            .room_for(asm.offset, chunk.data.len() as u64)
            .map_err(|e| Status::resource_exhausted(e.to_string()))?;
        let done = asm.accept(&chunk)?;
        file.write_all(&chunk.data)
            .await
            .map_err(|e| internal("writing", part, e))?;
        if let Some(r) = done {
            file.sync_all()
                .await
                .map_err(|e| internal("syncing", part, e))?;
            return Ok(r);
        }
        next = inbound.message().await?;
    }
    Err(Status::invalid_argument(
        "upload ended without a last chunk (size and SHA-256)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bc_protocol::CommandName;
    use cpl_store::CommandState;

    fn chunk(offset: u64, data: &[u8], last: Option<(u64, String)>) -> UploadChunk {
        UploadChunk {
            command_id: "cmd_a".into(),
            offset,
            data: data.to_vec(),
            last: last.is_some(),
            total_bytes: last.as_ref().map(|l| l.0).unwrap_or(0),
            sha256: last.map(|l| l.1).unwrap_or_default(),
        }
    }

    #[test]
    fn chunks_are_checked_for_order_size_and_digest() {
        let sha = hex::encode(Sha256::digest(b"hello world"));
        let mut a = Assembler::new("cmd_a");
        assert!(matches!(a.accept(&chunk(0, b"hello ", None)), Ok(None)));
        let r = a.accept(&chunk(6, b"world", Some((11, sha.clone()))));
        assert_eq!(
            r.ok().flatten().map(|r| (r.bytes, r.sha256)),
            Some((11, sha.clone()))
        );

        let mut a = Assembler::new("cmd_a");
        let gap = a.accept(&chunk(1, b"x", None));
        assert_eq!(
            gap.err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );

        let mut a = Assembler::new("cmd_a");
        let bad = a.accept(&chunk(0, b"hello world", Some((11, "00".repeat(32)))));
        assert_eq!(bad.err().map(|s| s.code()), Some(tonic::Code::DataLoss));
        let mut a = Assembler::new("cmd_a");
        let short = a.accept(&chunk(0, b"hello", Some((11, sha))));
        assert_eq!(short.err().map(|s| s.code()), Some(tonic::Code::DataLoss));

        let mut a = Assembler::new("cmd_a");
        let big = a.accept(&chunk(0, &vec![0u8; MAX_CHUNK_BYTES + 1], None));
        assert_eq!(
            big.err().map(|s| s.code()),
            Some(tonic::Code::InvalidArgument)
        );
        let mut a = Assembler::new("cmd_b");
        assert!(a.accept(&chunk(0, b"x", None)).is_err());
    }

    fn record(node: &str, name: CommandName, state: CommandState) -> CommandRecord {
        CommandRecord {
            id: "cmd_a".into(),
            node_id: node.into(),
            name,
            args: serde_json::json!({}),
            state,
            progress: 0,
            result: None,
            error_code: None,
            error_message: None,
            actor: "t".into(),
            created_at: 0,
            sent_at: None,
            started_at: None,
            finished_at: None,
            deadline_at: 0,
            subject_node_id: None,
        }
    }

    #[test]
    fn only_the_owning_node_uploads_for_an_open_logs_collect() {
        let ok = record("node_a", CommandName::LogsCollect, CommandState::Running);
        assert!(check_command(&ok, "node_a").is_ok());
        let code = |r: Result<(), Status>| r.err().map(|s| s.code());
        assert_eq!(
            code(check_command(&ok, "node_b")),
            Some(tonic::Code::PermissionDenied)
        );
        let other = record("node_a", CommandName::GpuReset, CommandState::Running);
        assert_eq!(
            code(check_command(&other, "node_a")),
            Some(tonic::Code::InvalidArgument)
        );
        let over = record("node_a", CommandName::LogsCollect, CommandState::Expired);
        assert_eq!(
            code(check_command(&over, "node_a")),
            Some(tonic::Code::FailedPrecondition)
        );
        assert!(bundle_path(Path::new("/b"), "../x").is_none());
        assert_eq!(
            bundle_path(Path::new("/b"), "cmd_a"),
            Some(PathBuf::from("/b/cmd_a.tar.gz"))
        );
    }
}
