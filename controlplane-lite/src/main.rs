//! `bcctl`: runs controlplane-lite (`serve`, `dev`) and drives it (`nodes`, `tokens`). Thin: the
//! only place errors become exit codes.

mod cli;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bc_sys::notify::{Notifier, NotifyState};
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "bcctl",
    version,
    about = "controlplane-lite: the Better Compute control plane, small",
    // A flag given twice takes its last value (a unit file's defaults, then the operator's).
    args_override_self = true
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "BCCTL_LOG", default_value = "info", global = true)]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane.
    Serve(cli::ServeArgs),
    /// Control plane embedded plus a real local agent; waits until the node is adopted.
    Dev(cli::dev::DevArgs),
    /// Measure the control plane with N simulated agents (`bcd sim`): join-storm, steady, fanout,
    /// rollout, restart; `chart` draws saved restart results.
    Bench(cli::bench::BenchArgs),
    /// Nodes: list, get, events, cordon, drain, taint, run, ...
    Nodes {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::nodes::NodesCommand,
    },
    /// Pools: create, list, get, capacity, delete.
    Pools {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::ops::PoolsCommand,
    },
    /// Sites: create, list, get, delete.
    Sites {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::ops::SitesCommand,
    },
    /// Join tokens: create, list, revoke.
    Tokens {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::ops::TokensCommand,
    },
    /// Allocations: create, list, get, release.
    Allocations {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::ops::AllocationsCommand,
    },
    /// Health remediations: list, get (set a pool's policy with `bcctl pools set-remediation`).
    Remediations {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::remediation::RemediationsCommand,
    },
    /// Commands: get, list, cancel (create with `bcctl nodes run`).
    Commands {
        #[command(flatten)]
        client: cli::ClientArgs,
        #[command(subcommand)]
        cmd: cli::ops::CommandsCommand,
    },
    /// The control plane: the replica asked, which replica runs the controllers, the store,
    /// connected nodes per replica.
    Status {
        #[command(flatten)]
        client: cli::ClientArgs,
    },
    /// Print the shell completion script (`source <(bcctl completions bash)`).
    Completions(bc_sys::cli_docs::CompletionsArgs),
    /// Write the man pages, one per command, into a directory (the Debian packages install them).
    Man(bc_sys::cli_docs::ManArgs),
}

/// Tells systemd (`Type=notify`) how `bcctl serve` is doing; nothing when NOTIFY_SOCKET is unset.
fn sd_notify(notifier: &Notifier, states: &[NotifyState<'_>]) {
    if let Err(e) = notifier.notify(states) {
        tracing::warn!(error = %e, "sd_notify failed");
    }
}

async fn serve(args: cli::ServeArgs) -> anyhow::Result<()> {
    // One socket per agent session: take the whole hard limit (the unit sets LimitNOFILE).
    cli::bench::raise_nofile_limit(0);
    let running =
        controlplane_lite::server::start(args.config().map_err(anyhow::Error::msg)?).await?;
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "NOTIFY_SOCKET unusable; not talking to systemd");
        Notifier::disabled()
    }));
    if let Some(every) = bc_sys::notify::watchdog_interval_from_env() {
        // Ping at half the watchdog period, from the runtime that serves requests.
        bc_sys::notify::spawn_watchdog(Arc::clone(&notifier), every);
    }
    let status = format!(
        "gateway {} api {}",
        running.endpoints.gateway_url, running.endpoints.api_url
    );
    sd_notify(
        &notifier,
        &[NotifyState::Ready, NotifyState::Status(&status)],
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    sd_notify(&notifier, &[NotifyState::Stopping]);
    running.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Dev(args) => cli::dev::run(args).await,
        Command::Bench(args) => cli::bench::run(args).await,
        Command::Nodes { client, cmd } => cli::nodes::nodes(&client, cmd).await,
        Command::Pools { client, cmd } => cli::ops::pools(&client, cmd).await,
        Command::Sites { client, cmd } => cli::ops::sites(&client, cmd).await,
        Command::Tokens { client, cmd } => cli::ops::tokens(&client, cmd).await,
        Command::Allocations { client, cmd } => cli::ops::allocations(&client, cmd).await,
        Command::Commands { client, cmd } => cli::ops::commands(&client, cmd).await,
        Command::Remediations { client, cmd } => cli::remediation::remediations(&client, cmd).await,
        Command::Status { client } => cli::status::status(&client).await,
        Command::Completions(a) => Ok(bc_sys::cli_docs::completions(
            Cli::command(),
            a.shell,
            &mut std::io::stdout(),
        )?),
        Command::Man(a) => {
            bc_sys::cli_docs::man_pages(Cli::command(), &a.out_dir)?;
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let is_dev = matches!(cli.command, Command::Dev(_));
    bc_sys::logging::init(if is_dev && std::env::var_os("BCCTL_LOG").is_none() {
        "warn"
    } else {
        &cli.log
    });
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bcctl: error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bcctl: error: {}", bc_net::report::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// clap's own checks of every subcommand (a positional `bool` without a value made
    /// `bcctl nodes set-maintenance` panic at start in debug builds).
    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
