//! `bcd hardware-key`: flags and output.

use std::path::PathBuf;

use crate::hostroot::HostRoot;
use crate::smbios::{self, SmbiosError};

/// `bcd hardware-key [--root DIR | --smbios FILE [--smbios-version X.Y]] [-o json] [--show-values]`
#[derive(Debug, clap::Args)]
pub struct HardwareKeyArgs {
    /// Host root prefix to read /sys from (SMBIOS tables, DMI ids, NICs).
    #[arg(long, default_value = "/", conflicts_with = "smbios")]
    pub root: PathBuf,
    /// Read SMBIOS from this file instead: a `dmidecode --dump-bin` image or a raw table. No NICs.
    #[arg(long)]
    pub smbios: Option<PathBuf>,
    /// Version of a raw table given with --smbios (MAJOR.MINOR); default: from the entry point,
    /// else 3.0.
    #[arg(long, requires = "smbios")]
    pub smbios_version: Option<String>,
    /// Output format: `table` or `json`.
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    /// Print serials and UUIDs as read (hidden by default).
    #[arg(long)]
    pub show_values: bool,
}

/// Runs the command and returns what to print.
pub fn run(args: &HardwareKeyArgs) -> Result<String, SmbiosError> {
    let report = match &args.smbios {
        Some(file) => {
            let version = args
                .smbios_version
                .as_deref()
                .map(smbios::parse_version)
                .transpose()?;
            let table = smbios::load_file(file, version)?;
            super::report_from_table(&table, &file.display().to_string())
        }
        None => super::report(&HostRoot::new(&args.root)),
    };
    Ok(if args.output == "json" {
        format!("{:#}\n", super::render_json(&report, args.show_values))
    } else {
        super::render_table(&report, args.show_values)
    })
}
