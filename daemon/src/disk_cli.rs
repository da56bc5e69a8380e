//! `bcd disk clean --device …` and `bcd image write --device …`: the ramdisk's disk cleaning and
//! image writing (`bcd_ramdisk::clean`, `bcd_ramdisk::deploy`, the same code `disk.clean` and
//! `image.write` run in a PXE-booted ramdisk) on one disk an operator or a test names, with
//! every step printed. The disk is refused when mounted, swapped on or held
//! (`bcd_ramdisk::local`); `--dry-run` says what cleaning would do and writes nothing.

use std::path::PathBuf;

use bc_protocol::commands::clean::{CleanMode, CleanResult, DiskOutcome};
use bc_protocol::commands::deploy::{
    Compression, ConfigDrive, ImageFormat, ImageSource, ImageWriteArgs, ImageWriteResult,
};
use bcd_probes::hostroot::HostRoot;
use bcd_ramdisk::clean::{self, Tools};
use bcd_ramdisk::local::{self, LocalError};

/// `bcd disk`.
#[derive(Debug, clap::Args)]
pub struct DiskArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DiskCommand,
}

/// `bcd disk` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum DiskCommand {
    /// Erase one disk as the ramdisk's disk.clean does: its metadata (both ends of the disk
    /// and of each partition), and with --mode full every block (NVMe format with secure erase
    /// falling back 2 → 1 → 0, ATA security erase, secure discard, discard, zeroing).
    Clean(CleanCli),
}

/// `bcd disk clean`.
#[derive(Debug, clap::Args)]
pub struct CleanCli {
    /// The whole disk: /dev/nvme0n1, /dev/disk/by-id/…, /dev/loop3, or a kernel name.
    #[arg(long)]
    pub device: String,
    /// `metadata` or `full`.
    #[arg(long, default_value = "metadata")]
    pub mode: CleanMode,
    /// Say what would be done, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Output: `text` (each step on its line) or `json` (disk.clean's result).
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Host root prefix for /sys, /proc, /dev.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
}

/// `bcd image`.
#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ImageCommand,
}

/// `bcd image` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Stream an image onto one disk as the ramdisk's image.write does: hashed while it is
    /// written, checked against --sha256, decompressed on the way, then an optional NoCloud
    /// config drive; both ends of the disk zeroed when anything fails after the first write.
    Write(WriteCli),
}

/// `bcd image write`.
#[derive(Debug, clap::Args)]
pub struct WriteCli {
    /// The whole disk: /dev/sda, /dev/disk/by-id/…, /dev/loop3, or a kernel name.
    #[arg(long)]
    pub device: String,
    /// http:// or https:// URL of the image.
    #[arg(long)]
    pub url: String,
    /// SHA-256 of the file as served (64 hex digits).
    #[arg(long)]
    pub sha256: String,
    /// `none`, `gzip` or `zstd`.
    #[arg(long, default_value = "none", value_parser = ["none", "gzip", "zstd"])]
    pub compression: String,
    /// `raw` or `qcow2`.
    #[arg(long, default_value = "raw", value_parser = ["raw", "qcow2"])]
    pub format: String,
    /// With a config drive: its `local-hostname`.
    #[arg(long)]
    pub hostname: Option<String>,
    /// With a config drive: an OpenSSH public key (repeatable).
    #[arg(long = "ssh-key", requires = "hostname")]
    pub ssh_keys: Vec<String>,
    /// With a config drive: a file whose text is its `user-data`.
    #[arg(long, requires = "hostname")]
    pub user_data: Option<PathBuf>,
    /// Output: `text` or `json` (image.write's result).
    #[arg(short = 'o', long, default_value = "text", value_parser = ["text", "json"])]
    pub output: String,
    /// Host root prefix for /sys, /proc, /dev.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
}

/// Why a `bcd disk` or `bcd image` verb failed.
#[derive(Debug, thiserror::Error)]
pub enum DiskCliError {
    /// The named device cannot be used.
    #[error(transparent)]
    Device(#[from] LocalError),
    /// The disk was not cleaned (or was read-only); the steps were printed.
    #[error("{0}")]
    NotCleaned(String),
    /// image.write failed (its code and message).
    #[error("{code}: {message}")]
    Write {
        /// `bc_protocol::commands::CommandErrorCode` as written on the wire.
        code: String,
        /// What went wrong.
        message: String,
    },
    /// The arguments do not make an image.write.
    #[error("{0}")]
    Args(String),
    /// Output, runtime or a file could not be had.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// JSON encoding failed.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// Runs `bcd disk …`.
pub fn run_disk(args: DiskArgs) -> Result<(), DiskCliError> {
    match args.command {
        DiskCommand::Clean(c) => clean_one(&c),
    }
}

fn clean_one(c: &CleanCli) -> Result<(), DiskCliError> {
    let root = HostRoot::new(&c.root);
    let name = local::open_disk(&root, &c.device)?;
    if c.dry_run {
        let plan = clean::plan::plan(&root, c.mode, &name);
        if c.output == "json" {
            println!("{}", serde_json::to_string_pretty(&plan)?);
        } else {
            println!(
                "bcd disk clean --dry-run: {name} ({}), nothing written:",
                c.mode
            );
            for line in plan {
                println!("  {line}");
            }
        }
        return Ok(());
    }
    let r = clean::clean_disks(&root, c.mode, std::slice::from_ref(&name), Tools::default());
    if c.output == "json" {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print_clean(&r);
    }
    match r.disks.first().map(|d| d.outcome) {
        Some(DiskOutcome::Cleaned) => Ok(()),
        _ => Err(DiskCliError::NotCleaned(r.summary())),
    }
}

fn print_clean(r: &CleanResult) {
    for d in &r.disks {
        println!(
            "bcd disk clean: {} (serial {}, {} bytes): {} ({}) in {} ms, {} bytes erased",
            d.name,
            d.serial.as_deref().unwrap_or("-"),
            d.size_bytes,
            d.outcome.as_str(),
            r.mode,
            d.duration_ms,
            d.bytes_erased
        );
        for s in &d.steps {
            println!("  {s}");
        }
        if let Some(e) = &d.error {
            println!("  error: {e}");
        }
    }
}

/// Runs `bcd image …` on a runtime of its own.
pub fn run_image(args: ImageArgs) -> Result<(), DiskCliError> {
    match args.command {
        ImageCommand::Write(w) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(write_one(&w))
        }
    }
}

fn write_args(w: &WriteCli) -> Result<ImageWriteArgs, DiskCliError> {
    let config_drive = match &w.hostname {
        Some(h) => Some(ConfigDrive {
            hostname: h.clone(),
            ssh_keys: w.ssh_keys.clone(),
            user_data: match &w.user_data {
                Some(p) => Some(std::fs::read_to_string(p).map_err(|e| {
                    DiskCliError::Args(format!("--user-data {}: {e}", p.display()))
                })?),
                None => None,
            },
        }),
        None => None,
    };
    let args = ImageWriteArgs {
        image: ImageSource {
            url: w.url.clone(),
            sha256: w.sha256.clone(),
            format: if w.format == "qcow2" {
                ImageFormat::Qcow2
            } else {
                ImageFormat::Raw
            },
            compression: match w.compression.as_str() {
                "gzip" => Compression::Gzip,
                "zstd" => Compression::Zstd,
                _ => Compression::None,
            },
        },
        root_device: None,
        config_drive,
        instance_id: None,
        deploy_token: None,
    };
    // The checks image.write's command applies to its args (URL, digest, config drive limits).
    bc_protocol::commands::check_args(
        bc_protocol::CommandName::ImageWrite,
        &serde_json::to_value(&args)?,
    )
    .map_err(|e| DiskCliError::Args(e.to_string()))?;
    Ok(args)
}

async fn write_one(w: &WriteCli) -> Result<(), DiskCliError> {
    let root = HostRoot::new(&w.root);
    let args = write_args(w)?;
    let name = local::open_disk(&root, &w.device)?;
    if w.output != "json" {
        println!(
            "bcd image write: {} onto {name} ({} {}, sha256 {})",
            args.image.url, w.format, w.compression, args.image.sha256
        );
    }
    match bcd_ramdisk::deploy::image_write_on(&root, args, Some(&name)).await {
        Ok(r) => {
            if w.output == "json" {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print_written(&r);
            }
            Ok(())
        }
        Err(e) => {
            let f = e.to_failure();
            Err(DiskCliError::Write {
                code: f.code.as_str().to_owned(),
                message: f.message,
            })
        }
    }
}

fn print_written(r: &ImageWriteResult) {
    println!(
        "  streamed {} bytes (sha256 {} checked), wrote {} bytes onto {} ({} bytes) in {} ms",
        r.image_bytes, r.sha256, r.written_bytes, r.device, r.device_size_bytes, r.duration_ms
    );
    if let Some(p) = &r.config_drive_partition {
        println!("  config drive: {p} (vfat cidata; the GPT's backup header at the disk's end)");
    }
}
