//! qcow2 images: QEMU's own `qemu-img` reads the file over NBD from this process, which streams
//! it from the server and hashes it on the way, and writes the disk's bytes onto the disk.
//!
//! # Why this way
//! qcow2 needs random access: its header points at tables (L1, L2, refcounts) that point at
//! clusters anywhere in the file, so it cannot be converted from a pipe, and the ramdisk's
//! memory is smaller than images, so it cannot be copied first. The converter an operator trusts
//! with qcow2 is QEMU's (`qemu-img convert`, what Ironic, OpenStack and libvirt use), not a
//! parser of our own nor a young crate. Its HTTP driver (`block-curl`, Debian's
//! qemu-block-extra) would fetch the ranges itself, but it pulls in the Ceph, Gluster, iSCSI
//! and NFS client libraries, and the bytes it reads would be beyond our hash. Its NBD client is
//! built into qemu-utils, so this process serves the file to it over NBD (`deploy::nbd`) and
//! sees every byte it reads:
//! - a read at or after the stream's position comes from the one GET, read front to back and
//!   hashed whole (bytes skipped are hashed and dropped); the file's first [`HEAD_BYTES`] are
//!   kept for the header and tables read again. For an image `qemu-img` wrote (its clusters in
//!   guest order) that is every read, so the file is fetched once;
//! - a read behind the stream is fetched with a Range request (`If-Match` its `ETag`), and
//!   its SHA-256 is recorded; after the conversion the file is fetched once more and each such
//!   range is checked against it ([`served::recheck`]), so a file that changed between the two
//!   reads fails (`CHECKSUM_MISMATCH`) instead of being trusted.
//!
//! `qemu-img info` first gives the virtual size, for the disk choice and the size check before
//! anything is written, and refuses images that name a backing file (opened from the ramdisk's
//! filesystem otherwise; the source is also opened with `backing: null`), an external data
//! file, or encryption. Then `qemu-img convert -n -O raw` writes the whole virtual disk from
//! byte 0 (zeros where the image has none: the disk's old bytes do not show through), the
//! stream is drained and its SHA-256 checked. A failure after `convert` started zeroes both ends
//! of the disk ([`super::write`]). A `qemu-img` failure on a file whose hash is wrong is reported
//! as the checksum mismatch it is.
//!
//! Memory: the head, one NBD read (4 MiB at most), a 1 MiB skip buffer, one response
//! chunk; and `qemu-img`'s own (its caches, 2 MiB buffers).
//!
//! # Limitations
//! gzip or zstd around a qcow2 is refused (random access into a compressed stream would mean
//! decompressing it again from the start; qcow2 compresses inside: `qemu-img convert -c`). The
//! server must send `Content-Length` (the NBD export's size), and serve byte ranges if
//! `qemu-img` reads behind the stream. A cancelled command stops at `qemu-img`'s next read.

mod qemu_img;
pub mod served;

pub use served::HEAD_BYTES;

use super::DeployError;
use super::source::Body;
use super::write::{Job, Progress};
use served::Served;

/// A qcow2 image opened by `qemu-img info`, its stream positioned after what that read.
#[derive(Debug)]
pub struct Image {
    served: Served,
    /// The disk it holds, bytes.
    pub virtual_size: u64,
}

/// Reads the image's header through `qemu-img info`: its virtual size, and a refusal of what
/// cannot be deployed. `etag` pins later Range requests. Nothing is written.
pub fn inspect(body: Body, etag: Option<String>, sha256: &str) -> Result<Image, DeployError> {
    let Some(size) = body.expected_len() else {
        return Err(DeployError::Qcow2(
            "the server sent no Content-Length, which a qcow2 image needs".into(),
        ));
    };
    let mut served = Served::new(body, size, etag)?;
    let out = match qemu_img::run(&["info", "--output=json", "{source}"], &mut served) {
        Ok(out) => out,
        Err(e) => return Err(verdict(&mut served, sha256, e)),
    };
    let info: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| DeployError::Qcow2(format!("qemu-img info's output: {e}")))?;
    let refuse = |why: String| Err(DeployError::Qcow2(why));
    let Some(virtual_size) = info.get("virtual-size").and_then(serde_json::Value::as_u64) else {
        return refuse("qemu-img info gave no virtual-size".into());
    };
    if let Some(b) = info.get("backing-filename").and_then(|v| v.as_str()) {
        return refuse(format!(
            "the image has a backing file ({b}): flatten it (qemu-img convert)"
        ));
    }
    let data = info.pointer("/format-specific/data");
    if let Some(f) = data.and_then(|d| d.get("data-file")) {
        return refuse(format!("the image's data is in an external file ({f})"));
    }
    if info.get("encrypted").and_then(serde_json::Value::as_bool) == Some(true) {
        return refuse("the image is encrypted".into());
    }
    Ok(Image {
        served,
        virtual_size,
    })
}

/// Converts `image` onto the disk of `job`, drains and checks the stream, rechecks the ranges
/// fetched behind it; the bytes read from the server and their SHA-256. `progress` says what may
/// have reached the disk.
pub fn write(
    job: &Job,
    mut image: Image,
    progress: &mut Progress,
) -> Result<(u64, String), DeployError> {
    if image.virtual_size > job.size_bytes {
        return Err(DeployError::TooLarge {
            device: job.device.clone(),
            size_bytes: job.size_bytes,
        });
    }
    let target = job.path.to_string_lossy().into_owned();
    progress.touched = true;
    let converted = qemu_img::run(
        &["convert", "-n", "-m", "1", "-O", "raw", "{source}", &target],
        &mut image.served,
    );
    if let Err(e) = converted {
        return Err(verdict(&mut image.served, &job.sha256, e));
    }
    progress.written = image.virtual_size;
    let served = &mut image.served;
    check_hash(served, &job.sha256)?;
    let fetched = std::mem::take(&mut served.fetched);
    let body = served.body();
    if !fetched.is_empty() {
        tracing::info!(
            ranges = fetched.len(),
            "image.write: qemu-img read behind the stream; reading the image again to check them"
        );
        served::recheck(
            body.url(),
            body.handle(),
            body.cancel(),
            &job.sha256,
            &fetched,
        )?;
    }
    Ok((body.bytes, body.sha256_so_far()))
}

/// Drains the stream and compares its SHA-256 with `sha256`.
fn check_hash(served: &mut Served, sha256: &str) -> Result<(), DeployError> {
    served.drain()?;
    let actual = served.body().sha256_so_far();
    if actual != sha256 {
        return Err(DeployError::ChecksumMismatch {
            expected: sha256.to_owned(),
            actual,
        });
    }
    Ok(())
}

/// What to report for `qemu-img`'s failure `e`: the transport's error as it is; else, when the
/// file's hash is wrong, the mismatch (the file is not the one asked for); else `e`.
fn verdict(served: &mut Served, sha256: &str, e: DeployError) -> DeployError {
    if matches!(e, DeployError::Unreachable { .. }) || served.body().failure.is_some() {
        return e;
    }
    match check_hash(served, sha256) {
        Err(mismatch @ DeployError::ChecksumMismatch { .. }) => mismatch,
        _ => e,
    }
}

#[cfg(test)]
mod tests;
