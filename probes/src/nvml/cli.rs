//! `bcd gpu …`: the NVML entry points from the command line, printing JSON. [`NvmlArgs`] also
//! gives the agent its `--nvml-lib` and `--nvidia-smi` flags (`#[command(flatten)]`).

use std::path::PathBuf;

use crate::hostroot::HostRoot;

use super::{ExpectedGpus, NvmlConfig, NvmlError, ResetError, ResetTarget};

/// Where NVML and `nvidia-smi` are.
#[derive(Debug, Clone, clap::Args)]
pub struct NvmlArgs {
    /// The NVML library (default: `libnvidia-ml.so.1` through the dynamic linker).
    #[arg(long = "nvml-lib", env = "BCD_NVML_LIB", global = true)]
    pub nvml_lib: Option<PathBuf>,
    /// The `nvidia-smi` binary `gpu.reset` runs.
    #[arg(
        long = "nvidia-smi",
        env = "BCD_NVIDIA_SMI",
        default_value = "nvidia-smi",
        global = true
    )]
    pub nvidia_smi: PathBuf,
}

impl NvmlArgs {
    /// As an [`NvmlConfig`].
    pub fn config(&self) -> NvmlConfig {
        NvmlConfig {
            lib_path: self.nvml_lib.clone(),
            nvidia_smi: self.nvidia_smi.clone(),
        }
    }
}

/// `bcd gpu`.
#[derive(Debug, clap::Args)]
pub struct GpuArgs {
    /// Where NVML and `nvidia-smi` are.
    #[command(flatten)]
    pub nvml: NvmlArgs,
    /// Host root prefix (`/dev/kmsg` is read under it).
    #[arg(long, default_value = "/", global = true)]
    pub root: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: GpuCommand,
}

/// `bcd gpu` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum GpuCommand {
    /// List the GPUs NVML sees.
    List,
    /// Run diag.nvml.
    Diag {
        /// GPUs the hardware profile expects.
        #[arg(long)]
        expect_count: Option<u32>,
        /// A substring every GPU name must contain, e.g. `H100`.
        #[arg(long, requires = "expect_count")]
        expect_name: Option<String>,
        /// Active NVLink links each GPU should have (0: none), instead of bcd's table by
        /// product (`expectedNvlinksPerGpu`).
        #[arg(long)]
        expect_nvlinks: Option<u32>,
    },
    /// Reset GPUs (gpu.reset): `all`, or UUIDs / PCI bus ids.
    Reset {
        /// `all` or GPU ids.
        #[arg(required = true)]
        gpus: Vec<String>,
    },
    /// Print XID events as JSON lines until interrupted.
    WatchXids,
}

/// `bcd gpu` failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuCliError {
    /// NVML could not be used.
    #[error(transparent)]
    Nvml(#[from] NvmlError),
    /// The reset failed; `details` is its JSON.
    #[error("{code}: {source}{}", details.as_ref().map(|d| format!("\n{d:#}")).unwrap_or_default())]
    Reset {
        /// `ResetError::code()`.
        code: bc_protocol::commands::CommandErrorCode,
        /// The error.
        source: ResetError,
        /// `ResetError::details()`.
        details: Option<serde_json::Value>,
    },
    /// The XID watch could not start.
    #[error(transparent)]
    Watch(#[from] super::watch::WatchError),
    /// Output or runtime failure.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// JSON encoding failed.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
}

/// Runs a `bcd gpu` verb, printing its result as JSON on stdout.
pub fn run(args: GpuArgs) -> Result<(), GpuCliError> {
    let cfg = args.nvml.config();
    let root = HostRoot::new(&args.root);
    match args.command {
        GpuCommand::List => {
            let gpus = super::inventory_gpus(&cfg)?;
            println!("{}", serde_json::to_string_pretty(&gpus)?);
        }
        GpuCommand::Diag {
            expect_count,
            expect_name,
            expect_nvlinks,
        } => {
            let args = super::DiagArgs {
                expected_gpus: expect_count.map(|count| ExpectedGpus {
                    count,
                    name: expect_name,
                }),
                expected_nvlinks_per_gpu: expect_nvlinks,
            };
            let report = super::diag_args(&cfg, &args, &root);
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        GpuCommand::Reset { gpus } => {
            let target = if gpus.len() == 1 && gpus[0] == "all" {
                ResetTarget::All
            } else {
                ResetTarget::Gpus(gpus)
            };
            match super::reset(&cfg, &target, &root) {
                Ok(report) => println!("{}", serde_json::to_string_pretty(&report)?),
                Err(source) => {
                    return Err(GpuCliError::Reset {
                        code: source.code(),
                        details: source.details(),
                        source,
                    });
                }
            }
        }
        GpuCommand::WatchXids => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let (tx, mut rx) = tokio::sync::mpsc::channel(64);
                let watch = super::spawn_xid_watch(&cfg, &root, tx)?;
                eprintln!("watching XIDs through {:?}", watch.source());
                loop {
                    tokio::select! {
                        ev = rx.recv() => match ev {
                            Some(ev) => println!("{}", serde_json::to_string(&ev)?),
                            None => break,
                        },
                        _ = tokio::signal::ctrl_c() => break,
                    }
                }
                Ok::<(), GpuCliError>(())
            })?;
        }
    }
    Ok(())
}
