//! `bcd`: the Better Compute node daemon. Thin binary: parses flags, sets up logging, hands over to
//! the library, and is the only place errors become exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "bcd", version, about = "Better Compute node daemon")]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info,bcd=debug`.
    #[arg(long, env = "BCD_LOG", default_value = "info", global = true)]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent: join, hold a session, report inventory, run commands, converge.
    Agent(bcd::agent::AgentArgs),
    /// Run the site agent (BMC power/boot control, PXE boot services).
    Site,
    /// Run the ramdisk agent (inspection, burn-in, erase, image write).
    Ramdisk,
    /// Print this machine's hardware key and every candidate identifier.
    HardwareKey {
        /// Host root prefix to read /sys and /proc from.
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Output format: `table` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// GPU checks through NVML: list, diag, reset, watch XIDs (JSON output).
    Gpu(bcd::nvml::cli::GpuArgs),
    /// Print this machine's inventory.
    Inventory {
        /// Host root prefix to read /sys and /proc from.
        #[arg(long, default_value = "/")]
        root: PathBuf,
        /// Output format: `table` or `json`.
        #[arg(short = 'o', long, default_value = "json")]
        output: String,
    },
}

fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Agent(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(bcd::agent::run(args))?;
        }
        Command::Site => anyhow::bail!(bcd_site::NOT_YET),
        Command::Ramdisk => anyhow::bail!(bcd_ramdisk::NOT_YET),
        Command::HardwareKey { root, output } => {
            let id = bcd::hwkey::compute(&bcd::hostroot::HostRoot::new(root));
            if output == "json" {
                println!(
                    "{}",
                    serde_json::json!({
                        "hardwareKey": id.hardware_key,
                        "hardwareKeyTrusted": id.trusted,
                        "identifierDigests": id.identifier_digests,
                    })
                );
            } else {
                println!("hardwareKey:        {}", id.hardware_key);
                println!("hardwareKeyTrusted: {}", id.trusted);
            }
        }
        Command::Gpu(args) => bcd::nvml::cli::run(args)?,
        Command::Inventory { root, output: _ } => {
            let inv = bcd::inventory::collect(&bcd::hostroot::HostRoot::new(root));
            println!("{}", serde_json::to_string_pretty(&inv)?);
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bcd: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
