//! `bcctl dev --metal N`: bare metal on one machine, for real — the control plane embedded, a
//! real `bcd site` with its boot service, sushy-emulator's Redfish BMCs for N systems, and N QEMU
//! machines (started by the emulator's external notifier when their BMC powers them on with PXE)
//! that boot the ramdisk image over iPXE; the N nodes are enrolled and followed until `ready`.
//!
//! Needs sushy-emulator (PyPI sushy-tools; `BC_SUSHY_EMULATOR` or PATH), `qemu-system-x86_64`
//! with Debian's `ipxe-qemu` ROMs (`BC_QEMU` or PATH), and the ramdisk image
//! (`packaging/ramdisk/build.sh`, `--ramdisk DIR`), and with `--firmware uefi` Debian's `ovmf`:
//! whatever is missing is named, with how to get it, before anything starts.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bc_metal_sim::find_program as program;
use bc_metal_sim::firmware::Firmware;
use bc_metal_sim::machines::{Machine, Machines};
use bc_metal_sim::sushy::{EmulatorConfig, FakeSystem, LAUNCHER, htpasswd_script, venv_python};
use bc_protocol::{PoolAgent, PoolKind, ProvisionState, SiteKind};
use controlplane_lite::client::Client;
use controlplane_lite::server::{self, ServeConfig};
use cpl_core::text::{Id, Name};
use cpl_core::verbs::{BmcInput, EnrollRequest, NodeRef, Request, Secret, TlsMode};
use cpl_store::{NewToken, Pool, Site, now_ms};
use serde_json::Value;
use tokio::process::{Child, Command};

use super::dev::{DevArgs, find_bcd};

/// The emulated BMCs' user and password (loopback only, this run only).
const BMC_USER: &str = "admin";
const BMC_PASSWORD: &str = "dev-metal-bmc";
/// The site and pool the machines go into.
const SITE: &str = "site_metal";
const POOL: &str = "pool_metal";

/// What `--metal` runs with, found before anything starts.
struct Tools {
    sushy: PathBuf,
    qemu: PathBuf,
    kernel: PathBuf,
    initrd: PathBuf,
    bcd: PathBuf,
    /// `--firmware`, with OVMF found for `uefi`.
    firmware: Firmware,
}

fn find_tools(args: &DevArgs) -> anyhow::Result<Tools> {
    let mut missing = Vec::new();
    let sushy = program("BC_SUSHY_EMULATOR", "sushy-emulator");
    if sushy.is_none() {
        missing.push(
            "sushy-emulator (the Redfish BMCs): `python3 -m venv v && v/bin/pip install -r .ci/requirements-bm.txt` (the versions CI tests), then BC_SUSHY_EMULATOR=v/bin/sushy-emulator".to_owned(),
        );
    }
    let qemu = program("BC_QEMU", "qemu-system-x86_64");
    if qemu.is_none() {
        missing.push(
            "qemu-system-x86_64 (the machines): Debian packages qemu-system-x86 and ipxe-qemu"
                .to_owned(),
        );
    }
    let dir = &args.ramdisk;
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initrd.img"));
    if !kernel.is_file() || !initrd.is_file() {
        missing.push(format!(
            "the ramdisk image ({} and {}): packaging/ramdisk/build.sh --kernel-root <unpacked linux-image> --bcd target/release/bcd --out {} (README: \"The ramdisk image\")",
            kernel.display(),
            initrd.display(),
            dir.display()
        ));
    }
    let firmware = Firmware::of(args.firmware);
    if let Err(e) = &firmware {
        missing.push(format!("--firmware {}: {e}", args.firmware));
    }
    let bcd = find_bcd(args.bcd.clone());
    if let Err(e) = &bcd {
        missing.push(format!("{e:#}"));
    }
    match (sushy, qemu, bcd, firmware) {
        (Some(sushy), Some(qemu), Ok(bcd), Ok(firmware)) if missing.is_empty() => Ok(Tools {
            sushy,
            qemu,
            kernel,
            initrd,
            bcd,
            firmware,
        }),
        _ => bail!(
            "bcctl dev --metal needs what is missing here:\n  - {}",
            missing.join("\n  - ")
        ),
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Machine `i` (1-based): its SMBIOS UUID and serial, and a universally administered MAC (a
/// locally administered one is no identifier by the hardware key's rules), booting with
/// `firmware`.
fn machine(i: u32, firmware: &Firmware) -> Machine {
    Machine {
        name: format!("metal-{i}"),
        uuid: format!("5f2e0c4e-1c9a-4a51-9a43-{i:012}"),
        serial: format!("DEV-METAL-{i:04}"),
        mac: format!(
            "00:1b:21:{:02x}:{:02x}:{:02x}",
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        ),
        other_nics: Vec::new(),
        boot_nic: 0,
        firmware: firmware.clone(),
        ignore: false,
        ssh_port: None,
    }
}

/// Starts sushy-emulator for `machines` (plain HTTP on a loopback port, notifying
/// `notify_url`) and waits until it answers; returns the child and its base URL.
async fn start_emulator(
    sushy: &Path,
    machines: &[Machine],
    notify_url: &str,
    dir: &Path,
) -> anyhow::Result<(Child, String)> {
    let python = venv_python(sushy);
    let out = Command::new(&python)
        .args(["-c", htpasswd_script(), BMC_USER, BMC_PASSWORD])
        .output()
        .await
        .with_context(|| format!("running {} for the BMCs' password file", python.display()))?;
    if !out.status.success() {
        bail!(
            "making the BMCs' password file failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, &out.stdout)?;
    let systems: Vec<FakeSystem> = machines
        .iter()
        .map(|m| FakeSystem {
            uuid: m.uuid.clone(),
            name: m.name.clone(),
            on: false,
            macs: vec![m.mac.to_ascii_uppercase()],
            serial: Some(m.serial.clone()),
        })
        .collect();
    let port = free_port()?;
    let state = dir.join("emulator-state");
    let conf = EmulatorConfig {
        port,
        state_dir: &state,
        htpasswd: &htpasswd,
        systems: &systems,
        tls: None,
        notify_url: Some(notify_url),
    };
    let conf_path = dir.join("emulator.conf");
    std::fs::write(&conf_path, conf.text())?;
    let launcher = dir.join("launcher.py");
    std::fs::write(&launcher, LAUNCHER)?;
    let log = std::fs::File::create(dir.join("emulator.log"))?;
    let child = Command::new(&python)
        .arg(&launcher)
        .arg("--config")
        .arg(&conf_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("starting sushy-emulator")?;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = http
            .get(format!("{base}/redfish/v1/Systems"))
            .basic_auth(BMC_USER, Some(BMC_PASSWORD))
            .send()
            .await;
        if r.is_ok_and(|r| r.status().is_success()) {
            return Ok((child, base));
        }
        if Instant::now() > deadline {
            bail!(
                "sushy-emulator did not answer within 60 s; its log: {}",
                dir.join("emulator.log").display()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The metal site, and a metal pool that powers a machine off once it is ready.
fn ensure_site_and_pool(store: &cpl_store::Store) -> anyhow::Result<()> {
    let now = now_ms();
    let site = Site {
        id: SITE.to_owned(),
        name: "dev-metal".to_owned(),
        kind: SiteKind::Platform,
        owner_tenant_id: None,
        version: 1,
        created_at: now,
    };
    let pool = Pool {
        id: POOL.to_owned(),
        site_id: Some(SITE.to_owned()),
        name: "dev-metal".to_owned(),
        kind: PoolKind::MetalHost,
        agent: PoolAgent::Bcd,
        owner_tenant_id: None,
        hardware_profile: Default::default(),
        acceptance: Default::default(),
        remediation: Default::default(),
        conditions: Vec::new(),
        remediation_resumed_at: None,
        remediation_trips: 0,
        version: 1,
        created_at: now,
    };
    store.write_blocking(|tx| -> Result<(), cpl_store::StoreError> {
        tx.insert_site_if_absent(&site)?;
        tx.insert_pool_if_absent(&pool)?;
        Ok(())
    })?;
    Ok(())
}

/// Runs `bcctl dev --metal n`.
pub async fn run(args: &DevArgs, n: u32) -> anyhow::Result<()> {
    if n == 0 || n > 16 {
        bail!("--metal takes 1 to 16 machines (each is a QEMU under software emulation)");
    }
    let tools = find_tools(args)?;
    let temp;
    let base = match &args.state_dir {
        Some(d) => d.clone(),
        None => {
            temp = tempfile::Builder::new()
                .prefix("bcctl-dev-metal-")
                .tempdir()?;
            temp.path().to_owned()
        }
    };
    let base = std::path::absolute(&base).context("resolving the state dir")?;
    std::fs::create_dir_all(&base)?;
    let (gw_port, boot_port) = (free_port()?, free_port()?);
    // The machines reach the host's loopback at 10.0.2.2 (QEMU's user network): the gateway's
    // certificate names it and the ramdisk is told to join there.
    let mut cfg = ServeConfig::new(
        base.join("controlplane"),
        ([127, 0, 0, 1], gw_port).into(),
        "127.0.0.1:0".parse()?,
    );
    cfg.server_names = vec!["10.0.2.2".to_owned()];
    cfg.advertise_url = Some(format!("https://10.0.2.2:{gw_port}"));
    cfg.heartbeat_interval = args.heartbeat_interval;
    cfg.liveness.unreachable_after = args.heartbeat_interval * 4;
    let running = server::start(cfg).await?;
    ensure_site_and_pool(&running.store)?;
    let (_, token) = running.store.write_blocking(|tx| {
        tx.create_token(
            &NewToken {
                site_id: Some(SITE.to_owned()),
                ttl_ms: 3_600_000,
                max_uses: Some(1),
                description: Some("bcctl dev --metal: the site agent".to_owned()),
                ..Default::default()
            },
            now_ms(),
        )
    })?;
    let ep = running.endpoints.clone();
    let api = Client::new(ep.api_url.clone(), running.api_token.clone());
    println!(
        "control plane: gateway https://127.0.0.1:{gw_port} (machines: {})  api {}",
        ep.gateway_url, ep.api_url
    );
    println!("state:         {}", base.display());

    let machines: Vec<Machine> = (1..=n).map(|i| machine(i, &tools.firmware)).collect();
    let harness = Machines::start(
        &tools.qemu,
        machines.clone(),
        &format!("http://10.0.2.2:{boot_port}/boot.ipxe?mac=${{netX/mac}}"),
        &base,
    )?;
    let (mut emulator, bmc_base) =
        start_emulator(&tools.sushy, &machines, &harness.notify_url, &base).await?;
    println!("BMCs:          sushy-emulator {bmc_base} ({n} systems)");

    let site_log = base.join("site.log");
    let log = std::fs::File::create(&site_log)?;
    let mut site = Command::new(&tools.bcd)
        .args([
            "site",
            "--control-plane",
            &format!("https://127.0.0.1:{gw_port}"),
        ])
        .args([
            "--ca-pin",
            &ep.ca_pin,
            "--join-token",
            &token,
            "--config",
            "/dev/null",
        ])
        .arg("--state-dir")
        .arg(base.join("site"))
        .args(["--boot-listen", &format!("127.0.0.1:{boot_port}")])
        .arg("--boot-kernel")
        .arg(&tools.kernel)
        .arg("--boot-initrd")
        .arg(&tools.initrd)
        // QEMU's user network has no LLDP speaker: the ramdisk waits 2 s for one, not 30.
        .args(["--ramdisk-lldp-wait", "2"])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} site", tools.bcd.display()))?;
    println!(
        "site agent:    {} site, boot service 127.0.0.1:{boot_port}, log {}",
        tools.bcd.display(),
        site_log.display()
    );

    let outcome = enroll_and_follow(&api, &running.store, &machines, &bmc_base, args.timeout).await;
    match &outcome {
        Ok(ids) => {
            println!("\n{n} machine(s) ready:");
            for id in ids {
                let v: Value = api.request(&node_get(id)).await?;
                println!(
                    "  {id}  {}  power {}  serial {}",
                    v["provisionState"].as_str().unwrap_or("?"),
                    v["bmc"]["power"].as_str().unwrap_or("?"),
                    v["bmc"]["facts"]["serial"].as_str().unwrap_or("?")
                );
            }
            if !args.once || args.state_dir.is_some() {
                println!(
                    "operator API:  bcctl nodes list --state-dir {}",
                    base.join("controlplane").display()
                );
            }
            if !args.once {
                println!("\nrunning; Ctrl-C stops everything");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        Err(e) => eprintln!(
            "{e:#}\n--- site agent log ({}) ---\n{}",
            site_log.display(),
            super::dev::tail(&site_log, 20)
        ),
    }
    let _ = site.kill().await;
    let _ = emulator.kill().await;
    drop(harness);
    running.shutdown(Duration::from_secs(5)).await;
    println!("stopped");
    outcome.map(|_| ())
}

/// Enrolls every machine (after the site agent holds the lease) and waits until all are `ready`,
/// or one fails, or `timeout` (per machine, counted from the enrollments) passes.
async fn enroll_and_follow(
    api: &Client,
    store: &cpl_store::Store,
    machines: &[Machine],
    bmc_base: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let started = Instant::now();
    loop {
        let holder = store
            .read(|r| r.site_lease(SITE))
            .await?
            .and_then(|l| l.holder_node_id);
        if holder.is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the site agent did not take the site's lease within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut ids = Vec::new();
    for m in machines {
        let enroll = Request::NodesEnroll(EnrollRequest {
            site_id: Id::unchecked(SITE),
            pool_id: Some(Id::unchecked(POOL)),
            name: Some(Name::unchecked(m.name.as_str())),
            bmc: BmcInput {
                address: format!("redfish+{bmc_base}/redfish/v1/Systems/{}", m.uuid),
                username: BMC_USER.to_owned(),
                password: Secret::from(BMC_PASSWORD.to_owned()),
                tls: TlsMode::default(),
            },
            macs: None,
            inspect: true,
            deployed: false,
        });
        let v: Value = api.request(&enroll).await?;
        let id = v["id"]
            .as_str()
            .context("nodes.enroll answered no id")?
            .to_owned();
        println!("enrolled:      {} as {id}", m.name);
        ids.push(id);
    }
    // Every machine boots under software emulation at once: give each its share of the time.
    let limit = timeout.max(Duration::from_secs(120)) * u32::try_from(machines.len()).unwrap_or(1);
    let mut last = String::new();
    loop {
        let mut states = Vec::new();
        for id in &ids {
            let id2 = id.clone();
            let n = store.read(move |r| r.node(&id2)).await?;
            states.push(n.map_or(ProvisionState::Failed, |n| n.provision_state));
        }
        let line = states
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" ");
        if line != last {
            println!("[{:>5.1} s] {line}", started.elapsed().as_secs_f64());
            last.clone_from(&line);
        }
        if let Some(i) = states.iter().position(|s| *s == ProvisionState::Failed) {
            let v: Value = api.request(&node_get(&ids[i])).await?;
            bail!(
                "{} failed: {}",
                ids[i],
                v["maintenanceReason"]
                    .as_str()
                    .unwrap_or("see bcctl nodes events")
            );
        }
        if states.iter().all(|s| *s == ProvisionState::Ready) {
            // The pool powers a ready machine off: wait for the BMCs to say so.
            let off_by = Instant::now() + Duration::from_secs(60);
            loop {
                let mut on = 0;
                for id in &ids {
                    let id2 = id.clone();
                    let n = store.read(move |r| r.node(&id2)).await?;
                    on += usize::from(n.is_some_and(|n| n.power != bc_protocol::Power::Off));
                }
                if on == 0 || Instant::now() > off_by {
                    return Ok(ids);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        if started.elapsed() > limit {
            bail!("not every machine was ready within {limit:?}: {line}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `nodes.get` of `id`.
fn node_get(id: &str) -> Request {
    Request::NodesGet(NodeRef {
        node_id: Id::unchecked(id),
    })
}
