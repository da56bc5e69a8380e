//! `bcd inventory`: flags and output.

use crate::hostroot::HostRoot;

/// `bcd inventory [--root DIR] [-o table|json]`
#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// Host root prefix to read /sys, /proc and /etc from.
    #[arg(long, default_value = "/")]
    pub root: std::path::PathBuf,
    /// Output format: `table` or `json` (the document the agent sends).
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
}

/// Runs the command and returns what to print.
pub fn run(args: &InventoryArgs) -> Result<String, serde_json::Error> {
    let inv = super::collect(&HostRoot::new(&args.root));
    Ok(if args.output == "json" {
        format!("{}\n", serde_json::to_string_pretty(&inv)?)
    } else {
        super::render_table(&inv)
    })
}
