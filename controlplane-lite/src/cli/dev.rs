//! `bcctl dev`: the control plane embedded, a real `bcd agent` process on this machine against
//! loopback, and the node followed until it is adopted, connected and has converged its first spec.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use bc_protocol::{PoolAgent, PoolKind, SiteKind};
use controlplane_lite::server::{self, ServeConfig};
use cpl_store::{Acceptance, HardwareProfile, NewToken, Pool, Site, Store, StoreError, now_ms};

/// The site and pool `bcctl dev` puts its node in, so the node is a schedulable `host`.
pub const DEV_SITE: &str = "site_dev";
/// See [`DEV_SITE`].
pub const DEV_POOL: &str = "pool_dev";

/// `bcctl dev` flags.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Keep the control plane's and agent's state here (default: a temporary dir, removed on exit).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// The `bcd` binary (default: next to `bcctl`, then PATH).
    #[arg(long, env = "BCD_BIN")]
    pub bcd: Option<PathBuf>,
    /// Host root the agent reads /sys and /proc from.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
    /// Heartbeat interval.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub heartbeat_interval: Duration,
    /// How long to wait for the node to be adopted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub timeout: Duration,
    /// Exit once the node is adopted instead of running until Ctrl-C.
    #[arg(long)]
    pub once: bool,
    /// Instead of one real agent: a `bcctl serve` process and N simulated agents (`bcd sim`).
    #[arg(long, conflicts_with = "metal")]
    pub sim: Option<usize>,
    /// Instead of one real agent: bare metal — a site agent with its boot service,
    /// sushy-emulator's BMCs and N QEMU machines that PXE-boot the ramdisk, enrolled and followed
    /// until `ready` (needs sushy-emulator, qemu-system-x86_64 and the image of --ramdisk).
    #[arg(long, value_name = "N")]
    pub metal: Option<u32>,
    /// The ramdisk image for --metal: a directory holding `vmlinuz` and `initrd.img`
    /// (`packaging/ramdisk/build.sh --out DIR`).
    #[arg(long, default_value = "target/ramdisk")]
    pub ramdisk: PathBuf,
    /// The --metal machines' firmware: `bios` (SeaBIOS) or `uefi` (OVMF, Debian's `ovmf`
    /// package, or BC_OVMF_CODE and BC_OVMF_VARS); both network-boot with `ipxe-qemu`'s ROMs.
    #[arg(long, default_value = "bios", value_name = "bios|uefi")]
    pub firmware: bc_metal_sim::firmware::FirmwareKind,
}

pub(crate) fn find_bcd(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p);
    }
    let exe = std::env::current_exe().context("locating bcctl")?;
    if let Some(dir) = exe.parent() {
        let candidate = dir.join("bcd");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join("bcd");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "cannot find the `bcd` binary next to bcctl or on PATH: build it (`cargo build --release --bins`) or pass --bcd PATH"
    )
}

pub(crate) fn ensure_dev_pool(store: &Store) -> anyhow::Result<()> {
    let now = now_ms();
    let site = Site {
        id: DEV_SITE.to_owned(),
        name: "dev".to_owned(),
        kind: SiteKind::Platform,
        owner_tenant_id: None,
        version: 1,
        created_at: now,
    };
    let pool = Pool {
        id: DEV_POOL.to_owned(),
        site_id: Some(DEV_SITE.to_owned()),
        name: "dev".to_owned(),
        kind: PoolKind::MetalHost,
        agent: PoolAgent::Bcd,
        owner_tenant_id: None,
        hardware_profile: HardwareProfile::default(),
        // A developer's machine, a VM or a container often has no SMBIOS and so an untrusted
        // hardware key; the dev pool accepts it (`bcctl dev` says so when it starts).
        acceptance: Acceptance {
            require_trusted_key: Some(false),
            ..Acceptance::default()
        },
        remediation: Default::default(),
        conditions: Vec::new(),
        remediation_resumed_at: None,
        remediation_trips: 0,
        version: 1,
        created_at: now,
    };
    store.write_blocking(|tx| -> Result<(), StoreError> {
        tx.insert_site_if_absent(&site)?;
        tx.insert_pool_if_absent(&pool)?;
        Ok(())
    })?;
    Ok(())
}

/// A join token for the dev pool, `<id>.<secret>`.
pub(crate) fn dev_token(
    store: &Store,
    ttl_ms: i64,
    max_uses: u64,
    description: &str,
) -> anyhow::Result<String> {
    let new = NewToken {
        pool_id: Some(DEV_POOL.to_owned()),
        ttl_ms,
        max_uses: Some(max_uses),
        description: Some(description.to_owned()),
        ..Default::default()
    };
    let (_, token) = store.write_blocking(|tx| tx.create_token(&new, now_ms()))?;
    Ok(token)
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn stop_agent(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// Runs `bcctl dev`.
pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    if let Some(n) = args.sim {
        return super::bench::dev_sim(&args, n).await;
    }
    if let Some(n) = args.metal {
        return super::dev_metal::run(&args, n).await;
    }
    let bcd = find_bcd(args.bcd.clone())?;
    let temp;
    let base = match &args.state_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new().prefix("bcctl-dev-").tempdir()?;
            temp.path().to_owned()
        }
    };
    // The agent's config wants absolute paths.
    let base = std::path::absolute(&base).context("resolving the state dir")?;
    let root = std::path::absolute(&args.root).context("resolving --root")?;
    let cp_dir = base.join("controlplane");
    let agent_dir = base.join("agent");
    let loopback = "127.0.0.1:0".parse().context("loopback address")?;
    let mut cfg = ServeConfig::new(cp_dir.clone(), loopback, loopback);
    cfg.heartbeat_interval = args.heartbeat_interval;
    cfg.liveness.unreachable_after = args.heartbeat_interval * 4;
    let running = server::start(cfg).await?;
    ensure_dev_pool(&running.store)?;
    let token = dev_token(&running.store, 3_600_000, 1, "bcctl dev")?;
    let ep = running.endpoints.clone();
    println!(
        "control plane: gateway {}  api {}",
        ep.gateway_url, ep.api_url
    );
    println!("state:         {}", base.display());
    println!(
        "pool:          {DEV_POOL} accepts an untrusted hardware key (acceptance.requireTrustedKey: false; metal pools require a trusted one by default)"
    );
    // A temporary state dir goes when --once exits: a hint pointing at it would lead nowhere.
    if !args.once || args.state_dir.is_some() {
        println!(
            "operator API:  bcctl nodes list --state-dir {}",
            cp_dir.display()
        );
    }
    std::fs::create_dir_all(&agent_dir)?;
    let log_path = base.join("agent.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = Command::new(&bcd)
        .arg("agent")
        .arg("--control-plane")
        .arg(&ep.gateway_url)
        .arg("--join-token")
        .arg(&token)
        .arg("--ca-pin")
        .arg(&ep.ca_pin)
        .arg("--state-dir")
        .arg(&agent_dir)
        .arg("--root")
        .arg(&root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", bcd.display()))?;
    println!(
        "agent:         {} (pid {}), log {}",
        bcd.display(),
        child.id().unwrap_or(0),
        log_path.display()
    );

    let node: serde_json::Value = match wait_adopted(&running.store, &mut child, args.timeout).await
    {
        Ok(n) => n,
        Err(e) => {
            stop_agent(&mut child).await;
            running.shutdown(Duration::from_secs(2)).await;
            bail!(
                "{e:#}\n--- agent log ({}) ---\n{}",
                log_path.display(),
                tail(&log_path, 30)
            );
        }
    };
    println!(
        "\nnode {} is adopted, connected and converged (observedGeneration {}):\n",
        crate::cli::render::cell(node.get("id")),
        crate::cli::render::cell(node.get("observedGeneration"))
    );
    print!("{}", crate::cli::render::object(&node));
    if !args.once {
        println!("\nrunning; Ctrl-C stops the agent and the control plane");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            status = child.wait() => println!("agent exited: {status:?}"),
        }
    }
    stop_agent(&mut child).await;
    running.shutdown(Duration::from_secs(5)).await;
    println!("stopped");
    Ok(())
}

async fn wait_adopted(
    store: &Store,
    child: &mut Child,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("the agent exited before its node was adopted: {status}");
        }
        let all = store.read(|r| r.nodes()).await?;
        if let Some(n) = all.iter().find(|n| {
            n.provision_state == bc_protocol::ProvisionState::Adopted
                && n.connectivity == bc_protocol::Connectivity::Connected
                && n.observed_generation >= 1
        }) {
            let id = n.id.clone();
            let detail = store
                .read(move |r| cpl_core::query::get_node(r, &id))
                .await?;
            return Ok(serde_json::to_value(detail)?);
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "the node was not adopted, connected and at observedGeneration 1 within {timeout:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
