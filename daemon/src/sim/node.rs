//! One simulated node: synthetic hardware ([`SimMachine`]) and in-memory identity and journal,
//! driven by the session core's [`bcd_core::lifecycle::run`] like every other mode — the same
//! Join, Hello, heartbeats, Spec handling and command executor — with the simulator's counters
//! as its [`Observer`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bc_protocol::commands::{CommandErrorCode, CommandFailure};
use bc_protocol::pb::{self, HardwareIdentity, Inventory, SpecStatus, agent_message};
use bc_protocol::{CommandName, Mode};
use bcd_core::executor::{CommandRun, Executor};
use bcd_core::identity::MemoryIdentity;
use bcd_core::journal::Journal;
use bcd_core::lifecycle::{Lifecycle, LifecycleConfig};
use bcd_core::mode::{Machine, Observer, SessionHooks, TokenSource};
use bcd_core::session::SessionEnd;
use bcd_core::state::Identity;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use super::SimArgs;
use super::fault::{self, NodeFault, SimGpu};
use super::stats::Stats;

/// Outbound messages a simulated session queues at most.
const OUTBOUND_CAPACITY: usize = 16;
/// Heartbeats whose acknowledgement is awaited for the latency figure; older ones are dropped.
const IN_FLIGHT: usize = 16;

/// The simulated GPUs' product name.
const GPU_NAME: &str = "NVIDIA H100 80GB HBM3 (simulated)";
/// The simulated driver version.
const DRIVER: &str = "550.54.15";

/// A simulated machine: its synthetic hardware, and the generation it last "converged".
#[derive(Debug)]
pub struct SimMachine {
    hostname: String,
    boot_id: String,
    hardware: HardwareIdentity,
    inventory_json: Vec<u8>,
    gpus: Vec<SimGpu>,
    /// The injected fault of a node among `--fault-fraction` (`None`: a healthy node).
    fault: Option<NodeFault>,
    observed_generation: AtomicU64,
    stats: Arc<Stats>,
}

fn sha_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl SimMachine {
    /// Node `i` of simulator run `run_id`: a hardware key no other node has, `gpus` fake H100s,
    /// and `fault` (an XID number) to report on its first GPU once faults start.
    pub fn new(run_id: &str, i: usize, gpus: usize, fault: Option<u64>, stats: Arc<Stats>) -> Self {
        let hostname = format!("sim-{run_id}-{i:05}");
        let serial = format!("SIM{run_id}{i:06}");
        let ids = [
            format!("smbios.system.uuid={}", sha_hex(&serial)),
            format!("smbios.system.serial={serial}"),
        ];
        let hardware = HardwareIdentity {
            hardware_key: sha_hex(&ids.join("\n")),
            trusted: true,
            identifier_digests: ids.iter().map(|s| sha_hex(s)).collect(),
        };
        let sim_gpus: Vec<SimGpu> = (0..gpus)
            .map(|g| SimGpu {
                uuid: format!("GPU-{}", &sha_hex(&format!("{serial}/{g}"))[..32]),
                pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + g * 0x10),
            })
            .collect();
        let inv = bc_protocol::inventory::Inventory {
            schema_version: bc_protocol::inventory::SCHEMA_VERSION,
            hostname: Some(hostname.clone()),
            system: Some(bc_protocol::inventory::System {
                vendor: Some("Simulated".to_owned()),
                product: Some("bcd sim".to_owned()),
                serial: Some(serial.clone()),
                ..Default::default()
            }),
            gpus: sim_gpus
                .iter()
                .map(|g| bc_protocol::inventory::Gpu {
                    uuid: Some(g.uuid.clone()),
                    name: Some(GPU_NAME.to_owned()),
                    pci_bus_id: g.pci_bus_id.clone(),
                    memory_bytes: Some(85_520_809_984),
                    driver_version: Some(DRIVER.to_owned()),
                    source: "nvml".to_owned(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        Self {
            boot_id: sha_hex(&format!("{serial}/boot"))[..32].to_owned(),
            hostname,
            hardware,
            inventory_json: serde_json::to_vec(&inv).unwrap_or_default(),
            gpus: sim_gpus,
            fault: fault.map(NodeFault::new),
            observed_generation: AtomicU64::new(0),
            stats,
        }
    }
}

impl Machine for SimMachine {
    fn mode(&self) -> Mode {
        Mode::Node
    }

    fn boot_id(&self) -> &str {
        &self.boot_id
    }

    fn hostname(&self) -> String {
        self.hostname.clone()
    }

    async fn hardware(&self) -> Result<HardwareIdentity, String> {
        Ok(self.hardware.clone())
    }

    fn observed_generation(&self) -> u64 {
        self.observed_generation.load(Ordering::Relaxed)
    }

    async fn inventory(&self) -> Result<Inventory, String> {
        Ok(Inventory {
            hardware: Some(self.hardware.clone()),
            document_json: self.inventory_json.clone(),
            collected_at_ms: chrono::Utc::now().timestamp_millis(),
        })
    }

    /// `inventory.refresh` as the agent serves it; `diag.nvml` and `gpu.reset` as a machine
    /// with the node's injected fault (or none) answers them ([`fault`]); `logs.collect` and
    /// `node.reboot` succeed at once with `{}`: there is nothing to collect or reboot on
    /// synthetic hardware (the boot id never changes).
    async fn run_command(&self, run: &CommandRun) -> Result<Value, CommandFailure> {
        self.stats.commands_answered.fetch_add(1, Ordering::Relaxed);
        // Counted by whether the node is one of the faulted share, from the start: a command to
        // a node that was never going to fault is a false one.
        let counter = if self.fault.is_some() {
            &self.stats.commands_to_faulted
        } else {
            &self.stats.commands_to_healthy
        };
        counter.fetch_add(1, Ordering::Relaxed);
        match run.name {
            CommandName::InventoryRefresh => bcd_core::handlers::inventory_refresh(self, run).await,
            CommandName::DiagNvml => Ok(serde_json::to_value(fault::diag(
                &self.gpus,
                GPU_NAME,
                DRIVER,
                self.fault.as_ref(),
            ))
            .unwrap_or_default()),
            CommandName::GpuReset => fault::reset(&self.gpus, &run.args, self.fault.as_ref()),
            CommandName::LogsCollect | CommandName::NodeReboot => Ok(json!({})),
            CommandName::BmcVerify
            | CommandName::BmcPower
            | CommandName::BmcSetBootDevice
            | CommandName::DiskClean
            | CommandName::ImageWrite
            | CommandName::RescueStart => Err(CommandFailure::new(
                CommandErrorCode::Unsupported,
                format!(
                    "{} is not a node agent's command; this is a simulated node",
                    run.name
                ),
            )),
        }
    }
}

/// The simulator's side of a node's sessions: specs converge at once, and the counters.
#[derive(Debug)]
struct SimHooks {
    machine: Arc<SimMachine>,
    stats: Arc<Stats>,
    /// Turns `true` when faults start (`--fault-after`, SIGUSR2).
    faults: watch::Receiver<bool>,
    /// (seq, sent at) of heartbeats not yet acknowledged, oldest first.
    in_flight: VecDeque<(u64, tokio::time::Instant)>,
}

impl SessionHooks for SimHooks {
    fn on_spec(&mut self, generation: u64, _spec: pb::NodeSpec) -> Option<SpecStatus> {
        // Nothing to bind on synthetic hardware: converged at once.
        self.machine
            .observed_generation
            .store(generation, Ordering::Relaxed);
        self.stats.specs_converged.fetch_add(1, Ordering::Relaxed);
        Some(SpecStatus {
            generation,
            converged: true,
            reason: "Converged".to_owned(),
            message: "simulated node".to_owned(),
        })
    }

    /// A faulted node's XID, once, when faults start (or at its next session, if none is open
    /// then), as the agent's XID watch sends one.
    async fn next_report(&mut self) -> agent_message::Msg {
        let pending = self.machine.fault.as_ref().is_none_or(NodeFault::reported)
            || self.machine.gpus.is_empty();
        if pending || self.faults.wait_for(|on| *on).await.is_err() {
            return std::future::pending().await;
        }
        let (Some(f), Some(gpu)) = (self.machine.fault.as_ref(), self.machine.gpus.first()) else {
            return std::future::pending().await;
        };
        self.stats.faults_injected.fetch_add(1, Ordering::Relaxed);
        agent_message::Msg::Event(crate::agent::hooks::xid_event(&f.report(gpu)))
    }
}

impl Observer for SimHooks {
    fn join_failed(&mut self, _error: &bcd_core::join::JoinError) {
        self.stats.join_errors.fetch_add(1, Ordering::Relaxed);
    }

    fn joined(&mut self, _identity: &Identity) {
        self.stats.joined.fetch_add(1, Ordering::Relaxed);
    }

    fn session_open(&mut self, _epoch: u64, _gateway_id: &str, _control_plane: &str) {
        self.in_flight.clear();
        self.stats.connected.fetch_add(1, Ordering::Relaxed);
        self.stats.sessions_opened.fetch_add(1, Ordering::Relaxed);
    }

    fn heartbeat_sent(&mut self, seq: u64) {
        self.in_flight.push_back((seq, tokio::time::Instant::now()));
        if self.in_flight.len() > IN_FLIGHT {
            self.in_flight.pop_front();
        }
    }

    fn heartbeat_acked(&mut self, seq: u64) {
        while let Some(&(s, at)) = self.in_flight.front() {
            if s > seq {
                break;
            }
            self.in_flight.pop_front();
            if s == seq {
                self.stats.latency(at.elapsed());
            }
        }
    }

    fn session_closed(&mut self, end: &SessionEnd, welcomed: bool) {
        if welcomed {
            self.stats.connected.fetch_sub(1, Ordering::Relaxed);
        }
        self.stats.session_errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(reason = ?end, "session ended");
    }
}

/// The run's join token, for every node.
#[derive(Debug)]
struct SimToken(Arc<SimArgs>);

impl TokenSource for SimToken {
    fn token(&self) -> Option<String> {
        Some(self.0.join_token.clone())
    }

    fn can_wait(&self) -> bool {
        true
    }
}

/// Runs node `machine` for the life of the process (or until `stop`).
pub async fn run(
    machine: SimMachine,
    args: Arc<SimArgs>,
    stats: Arc<Stats>,
    faults: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
) {
    let machine = Arc::new(machine);
    let executor = Arc::new(Executor::new(Arc::clone(&machine), Journal::memory()));
    let config = LifecycleConfig {
        control_planes: args.control_plane.clone(),
        ca_pin: Some(args.ca_pin.clone()),
        reconnect_base: args.backoff_base,
        reconnect_max: args.backoff_cap,
        retry_refused_joins: true,
        outbound_capacity: OUTBOUND_CAPACITY,
    };
    let (store, tokens) = (MemoryIdentity::default(), SimToken(args));
    let lifecycle = Lifecycle {
        config: &config,
        executor: &executor,
        store: &store,
        tokens: &tokens,
    };
    let mut hooks = SimHooks {
        machine,
        stats,
        faults,
        in_flight: VecDeque::new(),
    };
    if let Err(e) = bcd_core::lifecycle::run(&lifecycle, &mut hooks, stop).await {
        tracing::warn!(error = %e, "simulated node stopped");
    }
}
