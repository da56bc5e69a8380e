//! `bcd`: the Better Compute node daemon. Thin binary: parses flags, sets up logging, hands over to
//! the library, and is the only place errors become exit codes.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    Agent(Box<bcd::agent::AgentArgs>),
    /// Run the site agent: join as a site appliance, hold a session, and drive the site's BMCs
    /// (power and boot device over Redfish or IPMI, the power sync loop) while holding the lease.
    Site(Box<bcd::site::SiteArgs>),
    /// Run the ramdisk agent: load drivers, get a DHCP lease, join with the boot token from the
    /// kernel command line (bcd.url, bcd.pin, bcd.token), report inventory and serve commands.
    Ramdisk(Box<bcd::ramdisk::RamdiskArgs>),
    /// Print this machine's hardware key and every candidate identifier.
    HardwareKey(bcd_probes::hwkey::HardwareKeyArgs),
    /// Show what the agent of a state dir says about itself (status.json, node.json).
    Status {
        /// The agent's state dir (a site agent's: /var/lib/bcd-site).
        #[arg(long, default_value = "/var/lib/bcd")]
        state_dir: PathBuf,
        /// Output format: `table` or `json`.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// GPU checks through NVML: list, diag, reset, watch XIDs (JSON output).
    Gpu(bcd_probes::nvml::cli::GpuArgs),
    /// Print this machine's inventory.
    Inventory(bcd_probes::inventory::InventoryArgs),
    /// Erase one named disk as the ramdisk's disk.clean does (steps printed; --dry-run).
    Disk(bcd::disk_cli::DiskArgs),
    /// Write an image onto one named disk as the ramdisk's image.write does.
    Image(bcd::disk_cli::ImageArgs),
    /// Simulate N node agents (synthetic hardware, real join and session protocol) for benchmarks.
    Sim(bcd::sim::SimArgs),
    /// Print the shell completion script (`source <(bcd completions bash)`).
    Completions(bc_sys::cli_docs::CompletionsArgs),
    /// Write the man pages, one per command, into a directory (the Debian packages install them).
    Man(bc_sys::cli_docs::ManArgs),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Agent(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(bcd::agent::run(*args))?;
            tracing::info!("agent stopped");
        }
        Command::Sim(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(bcd::sim::run(args))?;
        }
        Command::Site(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(bcd::site::run(*args))?;
            tracing::info!("site agent stopped");
        }
        Command::Ramdisk(args) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(bcd::ramdisk::run(*args))?;
            tracing::info!("ramdisk agent stopped");
        }
        Command::HardwareKey(args) => print!("{}", bcd_probes::hwkey::run(&args)?),
        Command::Inventory(args) => print!("{}", bcd_probes::inventory::run(&args)?),
        Command::Gpu(args) => bcd_probes::nvml::cli::run(args)?,
        Command::Disk(args) => bcd::disk_cli::run_disk(args)?,
        Command::Image(args) => bcd::disk_cli::run_image(args)?,
        Command::Status { state_dir, output } => print_status(&state_dir, &output)?,
        Command::Completions(a) => {
            bc_sys::cli_docs::completions(Cli::command(), a.shell, &mut std::io::stdout())?;
        }
        Command::Man(a) => {
            bc_sys::cli_docs::man_pages(Cli::command(), &a.out_dir)?;
        }
    }
    Ok(())
}

/// `bcd status`: what the agent of `state_dir` says about itself, as a table or JSON.
fn print_status(state_dir: &std::path::Path, output: &str) -> anyhow::Result<()> {
    let st = bcd_core::status::StatusFile::read(state_dir).ok_or_else(|| {
        anyhow::anyhow!(
            "no status in {}: has `bcd agent --state-dir {}` run?",
            state_dir.display(),
            state_dir.display()
        )
    })?;
    let alive = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(st.pid).unwrap_or(0)),
        None,
    )
    .is_ok();
    if output == "json" {
        let mut v = serde_json::to_value(&st)?;
        v["running"] = serde_json::Value::Bool(alive);
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        let d = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".to_owned());
        println!(
            "state:               {}{}",
            st.state,
            if alive { "" } else { " (agent not running)" }
        );
        println!("nodeId:              {}", d(&st.node_id));
        println!(
            "identityGeneration:  {}",
            st.identity_generation
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into())
        );
        println!("controlPlane:        {}", d(&st.control_plane));
        println!(
            "sessionEpoch:        {}",
            st.session_epoch
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into())
        );
        println!("lastHeartbeatAck:    {}", d(&st.last_heartbeat_ack));
        println!("certificateNotAfter: {}", d(&st.certificate_not_after));
        println!(
            "observedGeneration:  {}",
            st.observed_generation
                .map(|g| g.to_string())
                .unwrap_or_else(|| "-".into())
        );
        if let Some(site) = &st.site {
            println!("siteId:              {}", d(&site.site_id));
            println!(
                "siteLease:           {}",
                match (site.lease_held, site.lease_epoch) {
                    (true, Some(e)) => format!("held (epoch {e})"),
                    (false, Some(e)) => format!("not valid (epoch {e})"),
                    _ => "none (standby)".to_owned(),
                }
            );
            println!("leaseValidUntil:     {}", d(&site.lease_valid_until));
            println!(
                "bmcs:                {} ({} not answering)",
                site.bmcs, site.bmcs_unreachable
            );
        }
        if !st.message.is_empty() {
            println!("message:             {}", st.message);
        }
        println!("updatedAt:           {}", st.updated_at);
    }
    Ok(())
}

/// The daemon's library crates, which log under their own targets.
const DAEMON_CRATES: [&str; 5] = [
    "bcd_core",
    "bcd_probes",
    "bcd_site",
    "bcd_ramdisk",
    "bc_sys",
];

/// `filter` with every directive for the `bcd` target repeated for the daemon's library crates,
/// so `info,bcd=debug` (the documented example) still reaches the code that moved out of the
/// `bcd` crate. Span and field filters (`bcd[...]`) and module paths (`bcd::...`) pass unchanged.
fn log_filter(filter: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    for directive in filter.split(',') {
        out.push(directive.to_owned());
        if let Some(level) = directive.trim().strip_prefix("bcd=") {
            out.extend(DAEMON_CRATES.iter().map(|c| format!("{c}={level}")));
        }
    }
    out.join(",")
}

/// Starts logging: `--log`, or for `bcd ramdisk` the kernel command line's `bcd.log`, and its
/// `--log-file` beside stderr.
fn init_logging(cli: &Cli) {
    let Command::Ramdisk(args) = &cli.command else {
        bc_sys::logging::init(&log_filter(&cli.log));
        return;
    };
    let filter = log_filter(&bcd::ramdisk::log_filter(args).unwrap_or_else(|| cli.log.clone()));
    let Some(file) = &args.log_file else {
        bc_sys::logging::init(&filter);
        return;
    };
    if let Err(e) = bc_sys::logging::init_with_file(&filter, file) {
        bc_sys::logging::init(&filter);
        tracing::warn!(file = %file.display(), error = %e, "cannot write the log file; logging to stderr only");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bcd: error: {}", bc_net::report::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `bcd <argv>`.
    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("bcd").chain(argv.iter().copied()))
    }

    /// `bcd agent` and `bcd site` read the one session flag group alike; `bcd ramdisk` its
    /// reconnect flags. Each keeps its reconnect cap: 2 min for a node agent, 30 s for the
    /// site and the ramdisk.
    #[test]
    fn the_modes_share_one_session_flag_group() -> Result<(), clap::Error> {
        let flags = [
            "--control-plane",
            "https://a:7443,https://b:7443",
            "--ca-pin",
            "sha256:00",
            "--join-token-file",
            "/t",
            "--root",
            "/r",
            "--config",
            "/c.toml",
            "--reconnect-base",
            "100ms",
        ];
        let with = |mode: &'static str| [&[mode][..], &flags[..]].concat();
        let Command::Agent(agent) = parse(&with("agent"))?.command else {
            panic!("bcd agent parsed as another mode");
        };
        let Command::Site(site) = parse(&with("site"))?.command else {
            panic!("bcd site parsed as another mode");
        };
        let Command::Ramdisk(ramdisk) = parse(&["ramdisk", "--reconnect-base", "100ms"])?.command
        else {
            panic!("bcd ramdisk parsed as another mode");
        };
        assert_eq!(
            agent.session.control_plane,
            ["https://a:7443", "https://b:7443"]
        );
        assert_eq!(
            agent.session.reconnect.reconnect_base,
            Duration::from_millis(100)
        );
        assert_eq!(
            agent.session.reconnect.reconnect_max,
            Duration::from_secs(120)
        );
        assert_eq!(
            site.session.reconnect.reconnect_max,
            Duration::from_secs(30)
        );
        assert_eq!(ramdisk.reconnect.reconnect_max, Duration::from_secs(30));
        assert_eq!(ramdisk.reconnect.reconnect_base, Duration::from_millis(100));
        let mut same = site.session.clone();
        same.reconnect.reconnect_max = agent.session.reconnect.reconnect_max;
        assert_eq!(same, agent.session);
        // The cap is still a flag of each.
        let Command::Site(site) = parse(&["site", "--reconnect-max", "5s"])?.command else {
            panic!("bcd site parsed as another mode");
        };
        assert_eq!(site.session.reconnect.reconnect_max, Duration::from_secs(5));
        Ok(())
    }

    /// clap's own checks of every subcommand, the modes' flattened groups included.
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn a_bcd_directive_reaches_the_daemon_library_crates() {
        assert_eq!(
            log_filter("info,bcd=debug"),
            "info,bcd=debug,bcd_core=debug,bcd_probes=debug,bcd_site=debug,bcd_ramdisk=debug,bc_sys=debug"
        );
        assert_eq!(log_filter("warn"), "warn");
        assert_eq!(log_filter("info,bcd::agent=trace"), "info,bcd::agent=trace");
        assert_eq!(log_filter(""), "");
    }
}
