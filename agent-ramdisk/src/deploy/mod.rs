//! `image.write`: the deploy step — stream an OS image over HTTP(S) onto the root disk while
//! hashing it, verify its SHA-256, add a cloud-init NoCloud config drive, and report
//! (`bc_protocol::commands::deploy`).
//!
//! # Background
//! Ironic's deploy users report two failures this is built against: images checked only
//! after a temporary copy filled the ramdisk's memory, and machines that booted a half-written
//! or wrong image after a failed deploy. So the image goes from the socket to the disk through
//! one fixed buffer, hashed on the way, and any failure after the first byte was written leaves
//! the disk's first and last MiB zeroed (both GPT headers, the MBR, most filesystems'
//! superblocks), so nothing on it boots.
//!
//! # Design
//! - [`disks`]: the root disk from `/sys/block` (the inventory's disks), by the root-device
//!   hints, else the smallest that fits; the reason is reported as `chosenBecause`.
//! - [`source`]: the GET, its body read chunk by chunk as a blocking reader, SHA-256 over the
//!   bytes as served.
//! - [`write`]: decompression (gzip through flate2, zstd through libzstd) and the sequential
//!   write onto `/dev/<disk>` through a [`WRITE_BUFFER_BYTES`] buffer, then fsync and
//!   `BLKRRPART` (`bcd_probes::erase::block`); zeroing of both ends on failure.
//! - [`config_drive`]: a GPT partition after the image's last one, the GPT's backup moved to
//!   the disk's real end, a vfat filesystem labelled `cidata` with `meta-data` and `user-data`.
//! - [`qcow2`]: `format: qcow2` through `qemu-img convert`, which reads the file over NBD
//!   (`nbd`) from the same hashed stream (reads behind it by Range request, checked by a
//!   second read), and writes the disk; then the same fsync, config drive and erase on failure.
//!
//! The HTTP request and the disk choice run on the runtime; the copy runs on a blocking thread
//! that pulls each chunk of the body from the runtime as the disk takes it. Memory: the write
//! buffer, one response chunk, the decompressor's window (gzip 32 KiB; zstd what the image was
//! compressed with, at most 128 MiB for `--long=27`, the libzstd default limit).
//!
//! # Limitations
//! Bytes of the disk past the image (and its config drive) are left as they were. https trusts
//! the public web PKI roots only. qcow2: see [`qcow2`]'s Limitations (no gzip/zstd around it).

pub mod config_drive;
pub mod disks;
mod nbd;
pub mod qcow2;
mod region;
pub mod source;
pub mod write;

use std::time::Instant;

use bc_protocol::commands::deploy::{Compression, ImageFormat, ImageWriteArgs, ImageWriteResult};
use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bcd_probes::hostroot::HostRoot;

/// The copy's buffer, bytes: one read of the (decompressed) image, one sequential write.
pub const WRITE_BUFFER_BYTES: usize = 4 << 20;
/// Bytes zeroed at each end of the disk after a failed write.
pub const ERASE_BYTES: u64 = 1 << 20;

/// What went wrong with an `image.write`, and with what.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// The image could not be fetched or its body ended early.
    #[error("image {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The file as served does not have the SHA-256 asked for.
    #[error("the image's sha256 is {actual}, not {expected}")]
    ChecksumMismatch { expected: String, actual: String },
    /// No disk matches the hints and fits.
    #[error("{0}")]
    NoRootDevice(String),
    /// Opening, writing or syncing the disk failed.
    #[error("/dev/{device}: {op}: {source}")]
    Disk {
        device: String,
        op: &'static str,
        source: std::io::Error,
    },
    /// The image (decompressed) is larger than the disk.
    #[error(
        "the image is larger than /dev/{device} ({size_bytes} bytes; a compressed image's size \
         is not known before it is written: give rootDevice.minSizeBytes)"
    )]
    TooLarge { device: String, size_bytes: u64 },
    /// The decompressor refused the bytes (while the file's hash was right).
    #[error("the image does not decompress as {compression}: {reason}")]
    Decompress {
        compression: &'static str,
        reason: String,
    },
    /// `format: qcow2` with `compression` (see [`qcow2`]'s Limitations).
    #[error(
        "a qcow2 image cannot also be {0}-compressed: qcow2 needs random access (serve it \
         uncompressed; qcow2 compresses inside with qemu-img convert -c)"
    )]
    Qcow2Compressed(&'static str),
    /// The qcow2 image cannot be written: `qemu-img` refused it or failed, or is missing.
    #[error("qcow2: {0}")]
    Qcow2(String),
    /// A qcow2 image's bytes read twice (once by the stream, once by a Range request or a second
    /// read) differ: the file changed on the server during the write.
    #[error("the image changed on the server while it was written: {0}")]
    ChangedWhileRead(String),
    /// The config drive could not be written.
    #[error("config drive on /dev/{device}: {source}")]
    ConfigDrive {
        device: String,
        source: config_drive::ConfigDriveError,
    },
    /// `cause` happened after the image's first bytes were written; the disk's first and last
    /// MiB were zeroed.
    #[error("{cause}; the first and last MiB of /dev/{device} were zeroed so it does not boot")]
    Erased {
        device: String,
        cause: Box<DeployError>,
    },
    /// `cause` happened after writing started and zeroing the disk's ends failed too.
    #[error("{cause}; zeroing the ends of /dev/{device} failed too ({erase}): it may boot")]
    EraseFailed {
        device: String,
        cause: Box<DeployError>,
        erase: std::io::Error,
    },
    /// The blocking copy task panicked or was lost.
    #[error("the write task failed: {0}")]
    Task(String),
}

impl DeployError {
    /// The wire code of this error (`bc_protocol::commands::CommandErrorCode`).
    pub fn code(&self) -> CommandErrorCode {
        match self {
            Self::Unreachable { .. } => CommandErrorCode::ImageUnreachable,
            Self::ChecksumMismatch { .. } => CommandErrorCode::ChecksumMismatch,
            Self::NoRootDevice(_) => CommandErrorCode::NoRootDevice,
            Self::Disk { .. }
            | Self::TooLarge { .. }
            | Self::Decompress { .. }
            | Self::Qcow2Compressed(_)
            | Self::Qcow2(_)
            | Self::ConfigDrive { .. } => CommandErrorCode::ImageWriteFailed,
            Self::ChangedWhileRead(_) => CommandErrorCode::ChecksumMismatch,
            Self::Erased { cause, .. } | Self::EraseFailed { cause, .. } => cause.code(),
            Self::Task(_) => CommandErrorCode::Internal,
        }
    }

    /// The failure `image.write` reports.
    pub fn to_failure(&self) -> CommandFailure {
        CommandFailure::new(self.code(), self.to_string())
    }
}

/// Runs `image.write` on the machine under `root` (its `/sys/block` and `/dev`).
pub async fn image_write(
    root: &HostRoot,
    args: ImageWriteArgs,
) -> Result<ImageWriteResult, DeployError> {
    image_write_on(root, args, None).await
}

/// `image.write` onto the disk `device` (a kernel name; `bcd image write --device`, after
/// [`crate::local::open_disk`]) instead of the one the root-device hints choose; `None`: the
/// hints choose, as [`image_write`].
pub async fn image_write_on(
    root: &HostRoot,
    args: ImageWriteArgs,
    device: Option<&str>,
) -> Result<ImageWriteResult, DeployError> {
    let started = Instant::now();
    let qcow2 = args.image.format == ImageFormat::Qcow2;
    if qcow2 && args.image.compression != Compression::None {
        return Err(DeployError::Qcow2Compressed(write::compression_name(
            args.image.compression,
        )));
    }
    let sha256 = args.image.sha256.trim().to_ascii_lowercase();
    let opened = source::open(&args.image.url).await?;
    let length = opened.length;
    // Dropped with this future (a deadline, a cancel): the copy's next read fails and the disk's
    // ends are zeroed, instead of the blocking thread writing on unobserved.
    let (_cancel_on_drop, cancel) = tokio::sync::watch::channel(());
    let etag = opened.etag.clone();
    let body = source::Body::new(opened, tokio::runtime::Handle::current(), cancel);
    let (need, input) = if qcow2 {
        let want = sha256.clone();
        let image = tokio::task::spawn_blocking(move || qcow2::inspect(body, etag, &want))
            .await
            .map_err(|e| DeployError::Task(e.to_string()))??;
        (image.virtual_size, write::Input::Qcow2(image))
    } else {
        // Only a raw, uncompressed file's length is the size it takes on the disk.
        let need = match (args.image.compression, length) {
            (Compression::None, Some(n)) => n,
            _ => 0,
        };
        (need, write::Input::Raw(body))
    };
    let hints = args.root_device.clone().unwrap_or_default();
    let r = root.clone();
    let named = device.map(str::to_owned);
    let choice = tokio::task::spawn_blocking(move || match named {
        Some(n) => disks::named(&r, &n, need),
        None => disks::choose(&disks::candidates(&r), &hints, need),
    })
    .await
    .map_err(|e| DeployError::Task(e.to_string()))?
    .map_err(DeployError::NoRootDevice)?;
    tracing::info!(
        device = %choice.name,
        because = %choice.because,
        url = %args.image.url,
        length = ?length,
        format = if qcow2 { "qcow2" } else { "raw" },
        "image.write: streaming the image"
    );
    let job = write::Job {
        path: root.path(format!("/dev/{}", choice.name)),
        device: choice.name.clone(),
        size_bytes: choice.size_bytes,
        compression: args.image.compression,
        sha256: sha256.clone(),
        config_drive: args.config_drive.clone().map(|c| config_drive::Drive {
            instance_id: args
                .instance_id
                .clone()
                .unwrap_or_else(|| config_drive::default_instance_id(&c.hostname, &sha256)),
            deploy_token: args.deploy_token.clone(),
            drive: c,
        }),
    };
    let done = tokio::task::spawn_blocking(move || write::run(job, input))
        .await
        .map_err(|e| DeployError::Task(e.to_string()))??;
    Ok(ImageWriteResult {
        device: choice.name,
        chosen_because: choice.because,
        device_size_bytes: choice.size_bytes,
        image_bytes: done.image_bytes,
        written_bytes: done.written_bytes,
        sha256: done.sha256,
        config_drive_partition: done.config_drive_partition,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

#[cfg(test)]
mod config_drive_tests;
#[cfg(test)]
mod failure_tests;
#[cfg(test)]
mod loop_tests;
#[cfg(test)]
pub(crate) mod test_server;
#[cfg(test)]
pub(crate) mod test_utils;
#[cfg(test)]
mod tests;
