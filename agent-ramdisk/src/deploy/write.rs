//! The copy onto the disk, on a blocking thread: the body through its decompressor into a
//! [`WRITE_BUFFER_BYTES`] buffer, each full buffer written sequentially from byte 0; then the
//! hash check, fsync, the config drive and `BLKRRPART`. Any failure after the first write
//! zeroes the disk's first and last [`ERASE_BYTES`] before it is returned.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bc_protocol::commands::deploy::Compression;

use super::source::Body;
use super::{DeployError, ERASE_BYTES, WRITE_BUFFER_BYTES, config_drive, qcow2};

/// How often progress is logged, ms.
const PROGRESS_EVERY_MS: u64 = 5_000;
const MIB: f64 = 1_048_576.0;

/// One image to write.
#[derive(Debug)]
pub struct Job {
    /// The disk's device node (`<root>/dev/vda`).
    pub path: PathBuf,
    /// Its kernel name (`vda`).
    pub device: String,
    /// Its size from sysfs, bytes.
    pub size_bytes: u64,
    pub compression: Compression,
    /// The lowercase hex SHA-256 asked for.
    pub sha256: String,
    pub config_drive: Option<config_drive::Drive>,
}

/// What was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Done {
    /// Bytes read from the server.
    pub image_bytes: u64,
    /// Bytes written onto the disk (decompressed).
    pub written_bytes: u64,
    /// The SHA-256 of the file as served, lowercase hex.
    pub sha256: String,
    /// The config drive's partition (`vda3`).
    pub config_drive_partition: Option<String>,
}

/// What is written: a raw (maybe compressed) image's body, or a qcow2 image `qemu-img` opened.
// One per command, moved once onto the blocking thread: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Input {
    Raw(Body),
    Qcow2(qcow2::Image),
}

/// Writes `input` onto the disk of `job`.
pub fn run(job: Job, input: Input) -> Result<Done, DeployError> {
    let disk_err = |op, source| DeployError::Disk {
        device: job.device.clone(),
        op,
        source,
    };
    // Never create or truncate: the path is a device node (a regular file only in tests).
    // O_EXCL on a block device fails with EBUSY while it is mounted or held by md/dm, so a disk
    // in use is refused instead of overwritten under its users (regular files ignore it).
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_EXCL.bits())
        .open(&job.path)
        .map_err(|e| {
            let op = if e.raw_os_error() == Some(nix::errno::Errno::EBUSY as i32) {
                "open (in use: mounted, or held by md/dm)"
            } else {
                "open"
            };
            disk_err(op, e)
        })?;
    let mut progress = Progress::default();
    let result = match input {
        Input::Raw(mut body) => write_verified(&job, &mut body, &mut file, &mut progress)
            .map(|()| (body.bytes, body.sha256_so_far())),
        Input::Qcow2(image) => qcow2::write(&job, image, &mut progress),
    };
    let result = result.and_then(|(image_bytes, sha256)| {
        file.sync_all().map_err(|e| disk_err("fsync", e))?;
        let partition =
            match &job.config_drive {
                Some(d) => Some(config_drive::write(&mut file, &job.device, d).map_err(
                    |source| DeployError::ConfigDrive {
                        device: job.device.clone(),
                        source,
                    },
                )?),
                None => None,
            };
        Ok(Done {
            image_bytes,
            written_bytes: progress.written,
            sha256,
            config_drive_partition: partition,
        })
    });
    match result {
        Ok(done) => {
            reread_partitions(&file, &job.device);
            Ok(done)
        }
        Err(cause) if !progress.touched => Err(cause),
        Err(cause) => {
            let cause = Box::new(cause);
            tracing::warn!(device = %job.device, error = %cause, "image.write failed: zeroing both ends");
            match zero_ends(&mut file, job.size_bytes) {
                Ok(()) => Err(DeployError::Erased {
                    device: job.device.clone(),
                    cause,
                }),
                Err(erase) => Err(DeployError::EraseFailed {
                    device: job.device.clone(),
                    cause,
                    erase,
                }),
            }
        }
    }
}

/// Streams, decompresses and writes the image, drains what the decompressor left, and checks
/// the hash. `progress` says what reached the disk, even when this fails.
fn write_verified(
    job: &Job,
    body: &mut Body,
    file: &mut File,
    progress: &mut Progress,
) -> Result<(), DeployError> {
    let copied = copy(job, body, file, progress);
    let read_failed = match copied {
        Ok(()) => None,
        Err(Copy::Write(e)) => return Err(e),
        Err(Copy::Read(e)) => Some(e),
    };
    if let Some(why) = body.failure.clone() {
        return Err(unreachable(body, why));
    }
    // The decoder stopped (at its end, or at bytes it refused): the hash covers the whole file,
    // and a wrong file is reported as such rather than as a bad gzip stream.
    if let Err(e) = body.drain() {
        return Err(unreachable(
            body,
            body.failure.clone().unwrap_or(e.to_string()),
        ));
    }
    let actual = body.sha256_so_far();
    if actual != job.sha256 {
        return Err(DeployError::ChecksumMismatch {
            expected: job.sha256.clone(),
            actual,
        });
    }
    match read_failed {
        None => Ok(()),
        Some(e) => Err(DeployError::Decompress {
            compression: compression_name(job.compression),
            reason: e.to_string(),
        }),
    }
}

fn unreachable(body: &Body, reason: String) -> DeployError {
    DeployError::Unreachable {
        url: body.url().to_owned(),
        reason,
    }
}

/// Why the copy stopped.
enum Copy {
    /// Reading the (decompressed) image failed: the transport or the decompressor.
    Read(io::Error),
    /// The disk refused, or the image does not fit.
    Write(DeployError),
}

/// How far the copy got.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes written onto the disk.
    pub written: u64,
    /// A write was attempted: the disk may differ from what it was, even when `written` is 0
    /// (a first write that failed half-way).
    pub touched: bool,
}

fn copy(job: &Job, body: &mut Body, file: &mut File, p: &mut Progress) -> Result<(), Copy> {
    let mut reader: Box<dyn Read + '_> = match job.compression {
        Compression::None => Box::new(&mut *body),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut *body)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::new(&mut *body).map_err(Copy::Read)?)
        }
    };
    let mut buf = vec![0u8; WRITE_BUFFER_BYTES];
    let started = Instant::now();
    let mut last_log = started;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| Copy::Write(disk(job, "seek", e)))?;
    loop {
        let n = fill(&mut reader, &mut buf).map_err(Copy::Read)?;
        if n == 0 {
            break;
        }
        let end = p.written.saturating_add(n as u64);
        if end > job.size_bytes {
            return Err(Copy::Write(DeployError::TooLarge {
                device: job.device.clone(),
                size_bytes: job.size_bytes,
            }));
        }
        p.touched = true;
        file.write_all(&buf[..n])
            .map_err(|e| Copy::Write(disk(job, "write", e)))?;
        p.written = end;
        if last_log.elapsed() >= Duration::from_millis(PROGRESS_EVERY_MS) {
            last_log = Instant::now();
            log_progress(&job.device, p.written, started);
        }
    }
    log_progress(&job.device, p.written, started);
    Ok(())
}

fn log_progress(device: &str, written: u64, started: Instant) {
    let secs = started.elapsed().as_secs_f64().max(1e-3);
    #[allow(clippy::cast_precision_loss)]
    let mib = written as f64 / MIB;
    tracing::info!(
        device,
        written_mib = format!("{mib:.1}"),
        mib_per_s = format!("{:.1}", mib / secs),
        "image.write: progress"
    );
}

/// Reads until `buf` is full or the reader ends; the count read.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn disk(job: &Job, op: &'static str, source: io::Error) -> DeployError {
    DeployError::Disk {
        device: job.device.clone(),
        op,
        source,
    }
}

pub fn compression_name(c: Compression) -> &'static str {
    match c {
        Compression::None => "raw",
        Compression::Gzip => "gzip",
        Compression::Zstd => "zstd",
    }
}

/// Zeroes bytes `0..1 MiB` and the last MiB of a disk of `size` bytes, then syncs.
pub fn zero_ends(file: &mut File, size: u64) -> io::Result<()> {
    let len = ERASE_BYTES.min(size);
    let zeros = vec![0u8; usize::try_from(len).unwrap_or(0)];
    for at in [0, size - len] {
        file.seek(SeekFrom::Start(at))?;
        file.write_all(&zeros)?;
    }
    file.sync_all()
}

/// `BLKRRPART` on a real disk, so its new partitions appear; a test's regular file has none to
/// re-read. Failing it is logged, not fatal: the table is on the disk and the next boot reads it.
fn reread_partitions(file: &File, device: &str) {
    let is_block = file
        .metadata()
        .is_ok_and(|m| m.file_type().is_block_device());
    if !is_block {
        return;
    }
    if let Err(e) = bcd_probes::erase::block::reread_partitions(file) {
        tracing::warn!(device, error = %e, "image.write: the kernel did not re-read the partitions");
    }
}
