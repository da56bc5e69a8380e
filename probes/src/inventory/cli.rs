//! `bcd inventory`: flags and output.

use std::time::Duration;

use crate::hostroot::HostRoot;

/// The longest `--lldp-wait`: a switch sends an LLDPDU every 30 s by default (802.1AB
/// `msgTxInterval`), so ten minutes is well past any schedule.
pub const MAX_LLDP_WAIT_S: u64 = 600;

/// `bcd inventory [--root DIR] [-o table|json] [--lldp-wait SECONDS [--lldp-interface NAME]...]`
#[derive(Debug, clap::Args)]
pub struct InventoryArgs {
    /// Host root prefix to read /sys, /proc and /etc from.
    #[arg(long, default_value = "/")]
    pub root: std::path::PathBuf,
    /// Output format: `table` or `json` (the document the agent sends).
    #[arg(short = 'o', long, default_value = "table", value_parser = ["table", "json"])]
    pub output: String,
    /// Listen for LLDP neighbours for up to this many seconds first (until each link heard
    /// one LLDPDU): on every physical, up Ethernet link, or on those of --lldp-interface. Needs
    /// CAP_NET_RAW; 0 (the default) does not listen.
    #[arg(long, value_name = "SECONDS", default_value_t = 0,
          value_parser = clap::value_parser!(u64).range(0..=MAX_LLDP_WAIT_S))]
    pub lldp_wait: u64,
    /// Listen for LLDP on this interface instead of the default ones (repeatable).
    #[arg(long = "lldp-interface", value_name = "NAME")]
    pub lldp_interfaces: Vec<String>,
}

/// Runs the command and returns what to print.
pub fn run(args: &InventoryArgs) -> Result<String, serde_json::Error> {
    let root = HostRoot::new(&args.root);
    let heard = (args.lldp_wait > 0).then(|| listen(&root, args));
    let mut inv = super::collect(&root);
    if let Some(h) = heard {
        super::lldp::attach(&mut inv, &h.neighbors, &h.problems);
    }
    Ok(if args.output == "json" {
        format!("{}\n", serde_json::to_string_pretty(&inv)?)
    } else {
        super::render_table(&inv)
    })
}

/// `--lldp-wait`: what the links heard; a root prefix other than `/` or no link to listen on is
/// a problem line, not an error.
fn listen(root: &HostRoot, args: &InventoryArgs) -> super::lldp::Heard {
    if !root.is_live() {
        return super::lldp::Heard {
            problems: vec![format!(
                "--lldp-wait listens on this machine's links, not under --root {}",
                args.root.display()
            )],
            ..Default::default()
        };
    }
    let ifaces = if args.lldp_interfaces.is_empty() {
        super::lldp::default_interfaces(root)
    } else {
        args.lldp_interfaces.clone()
    };
    if ifaces.is_empty() {
        tracing::warn!("lldp: no physical, up Ethernet link to listen on");
        return super::lldp::Heard {
            problems: vec!["no physical, up Ethernet link to listen for LLDP on".to_owned()],
            ..Default::default()
        };
    }
    tracing::info!(interfaces = ?ifaces, seconds = args.lldp_wait, "lldp: listening");
    super::lldp::wait(&ifaces, Duration::from_secs(args.lldp_wait))
}
