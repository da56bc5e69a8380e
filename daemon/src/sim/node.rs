//! One simulated node: join once (own key and certificate), then sessions until the process ends,
//! reconnecting with the agent's own full-jitter backoff ([`crate::agent::Backoff`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bc_protocol::pb::gateway_client::GatewayClient;
use bc_protocol::pb::join_client::JoinClient;
use bc_protocol::pb::{
    AgentMessage, CommandState, CommandUpdate, HardwareIdentity, Heartbeat, Hello, Inventory,
    JoinRequest, SpecStatus, agent_message, gateway_message,
};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::SimArgs;
use super::stats::Stats;
use crate::agent::Backoff;

/// A simulated machine: its synthetic hardware and, once joined, its identity (in memory only).
#[derive(Debug)]
pub struct SimNode {
    hostname: String,
    boot_id: String,
    hardware: HardwareIdentity,
    inventory_json: Vec<u8>,
    observed_generation: u64,
}

/// What Join gave a simulated node.
struct Joined {
    node_id: String,
    tls: Arc<rustls::ClientConfig>,
}

fn sha_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl SimNode {
    /// Node `i` of simulator run `run_id`: a hardware key no other node has, `gpus` fake H100s.
    pub fn new(run_id: &str, i: usize, gpus: usize) -> Self {
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
        let inv = bc_protocol::inventory::Inventory {
            schema_version: bc_protocol::inventory::SCHEMA_VERSION,
            hostname: Some(hostname.clone()),
            system: Some(bc_protocol::inventory::System {
                vendor: Some("Simulated".to_owned()),
                product: Some("bcd sim".to_owned()),
                serial: Some(serial.clone()),
                ..Default::default()
            }),
            gpus: (0..gpus)
                .map(|g| bc_protocol::inventory::Gpu {
                    uuid: Some(format!("GPU-{}", &sha_hex(&format!("{serial}/{g}"))[..32])),
                    name: Some("NVIDIA H100 80GB HBM3 (simulated)".to_owned()),
                    pci_bus_id: format!("0000:{:02x}:00.0", 0x18 + g * 0x10),
                    memory_bytes: Some(85_520_809_984),
                    driver_version: Some("550.54.15".to_owned()),
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
            observed_generation: 0,
        }
    }

    fn inventory(&self) -> Inventory {
        Inventory {
            hardware: Some(self.hardware.clone()),
            document_json: self.inventory_json.clone(),
            collected_at_ms: chrono::Utc::now().timestamp_millis(),
        }
    }
}

async fn join(node: &SimNode, args: &SimArgs) -> Result<Joined, String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node.hostname.as_str());
    let csr_pem = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| e.to_string())?;
    let (cfg, _) = crate::tls::join_config(&args.ca_pin).map_err(|e| e.to_string())?;
    let channel = crate::tls::channel(&args.control_plane, cfg)
        .await
        .map_err(|e| e.to_string())?;
    let resp = JoinClient::new(channel)
        .join(JoinRequest {
            token: args.join_token.clone(),
            csr_pem,
            hardware: Some(node.hardware.clone()),
            agent_version: bc_protocol::VERSION.to_owned(),
            mode: bc_protocol::pb::AgentMode::Node.into(),
            hostname: node.hostname.clone(),
        })
        .await
        .map_err(|s| format!("join refused: {}: {}", s.code(), s.message()))?
        .into_inner();
    let tls = crate::tls::session_config(&resp.ca_pem, &resp.certificate_pem, &key.serialize_pem())
        .map_err(|e| e.to_string())?;
    Ok(Joined {
        node_id: resp.node_id,
        tls,
    })
}

fn msg(epoch: u64, m: agent_message::Msg) -> AgentMessage {
    AgentMessage {
        epoch,
        msg: Some(m),
    }
}

/// Runs node `node` for the life of the process.
pub async fn run(mut node: SimNode, args: Arc<SimArgs>, stats: Arc<Stats>) {
    let mut backoff = Backoff::new(args.backoff_base, args.backoff_cap);
    let joined = loop {
        match join(&node, &args).await {
            Ok(j) => break j,
            Err(e) => {
                stats.join_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(host = %node.hostname, error = %e, "join failed");
                tokio::time::sleep(backoff.next_delay()).await;
            }
        }
    };
    stats.joined.fetch_add(1, Ordering::Relaxed);
    backoff.reset();
    loop {
        let mut welcomed = false;
        let end = session(
            &args.control_plane,
            &mut node,
            &joined,
            &stats,
            &mut backoff,
            &mut welcomed,
        )
        .await;
        if welcomed {
            stats.connected.fetch_sub(1, Ordering::Relaxed);
        }
        stats.session_errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(node_id = %joined.node_id, reason = %end, "session ended");
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// One session; returns why it ended.
async fn session(
    url: &str,
    node: &mut SimNode,
    joined: &Joined,
    stats: &Stats,
    backoff: &mut Backoff,
    welcomed: &mut bool,
) -> String {
    let channel = match crate::tls::channel(url, Arc::clone(&joined.tls)).await {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let mut client = GatewayClient::new(channel);
    let (out, out_rx) = mpsc::channel::<AgentMessage>(16);
    let hello = Hello {
        node_id: joined.node_id.clone(),
        boot_id: node.boot_id.clone(),
        agent_version: bc_protocol::VERSION.to_owned(),
        mode: bc_protocol::pb::AgentMode::Node.into(),
        observed_generation: node.observed_generation,
        pending_results: Vec::new(),
    };
    if out
        .send(msg(0, agent_message::Msg::Hello(hello)))
        .await
        .is_err()
    {
        return "outbound stream closed".to_owned();
    }
    let mut inbound = match client.session(ReceiverStream::new(out_rx)).await {
        Ok(r) => r.into_inner(),
        Err(s) => return format!("session refused: {}: {}", s.code(), s.message()),
    };
    let welcome = match tokio::time::timeout(Duration::from_secs(15), inbound.message()).await {
        Ok(Ok(Some(bc_protocol::pb::GatewayMessage {
            msg: Some(gateway_message::Msg::Welcome(w)),
        }))) => w,
        Ok(Ok(other)) => return format!("expected Welcome, got {other:?}"),
        Ok(Err(s)) => return format!("session refused: {}: {}", s.code(), s.message()),
        Err(_) => return "no Welcome in time".to_owned(),
    };
    *welcomed = true;
    stats.connected.fetch_add(1, Ordering::Relaxed);
    stats.sessions_opened.fetch_add(1, Ordering::Relaxed);
    let epoch = welcome.epoch;
    let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(50)));
    let _ = out
        .send(msg(epoch, agent_message::Msg::Inventory(node.inventory())))
        .await;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seq = 0u64;
    // (seq, sent at) of heartbeats not yet acknowledged; the oldest are dropped past 16.
    let mut in_flight: VecDeque<(u64, tokio::time::Instant)> = VecDeque::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                seq += 1;
                in_flight.push_back((seq, tokio::time::Instant::now()));
                if in_flight.len() > 16 {
                    in_flight.pop_front();
                }
                if out.send(msg(epoch, agent_message::Msg::Heartbeat(Heartbeat { seq }))).await.is_err() {
                    return "outbound stream closed".to_owned();
                }
            }
            next = inbound.message() => {
                let m = match next {
                    Ok(Some(m)) => m,
                    Ok(None) => return "gateway closed the stream".to_owned(),
                    Err(s) => return format!("stream error: {}: {}", s.code(), s.message()),
                };
                match m.msg {
                    Some(gateway_message::Msg::HeartbeatAck(a)) => {
                        backoff.reset();
                        while let Some(&(s, at)) = in_flight.front() {
                            if s > a.seq {
                                break;
                            }
                            in_flight.pop_front();
                            if s == a.seq {
                                stats.latency(at.elapsed());
                            }
                        }
                    }
                    Some(gateway_message::Msg::Spec(spec)) => {
                        // Nothing to bind on synthetic hardware: converged at once.
                        node.observed_generation = spec.generation;
                        stats.specs_converged.fetch_add(1, Ordering::Relaxed);
                        let st = SpecStatus {
                            generation: spec.generation,
                            converged: true,
                            reason: "Converged".to_owned(),
                            message: "simulated node".to_owned(),
                        };
                        let _ = out.send(msg(epoch, agent_message::Msg::SpecStatus(st))).await;
                    }
                    Some(gateway_message::Msg::Command(c)) => {
                        let result = if c.name == "inventory.refresh" {
                            node.inventory_json.clone()
                        } else {
                            b"{}".to_vec()
                        };
                        if c.name == "inventory.refresh" {
                            let _ = out.send(msg(epoch, agent_message::Msg::Inventory(node.inventory()))).await;
                        }
                        let up = CommandUpdate {
                            id: c.id,
                            state: CommandState::Succeeded.into(),
                            progress: 100,
                            result_json: result,
                            error: None,
                        };
                        stats.commands_answered.fetch_add(1, Ordering::Relaxed);
                        let _ = out.send(msg(epoch, agent_message::Msg::CommandUpdate(up))).await;
                    }
                    Some(gateway_message::Msg::Goodbye(g)) => {
                        return format!("gateway said Goodbye: {}", g.message);
                    }
                    Some(gateway_message::Msg::Cancel(_) | gateway_message::Msg::Welcome(_)) | None => {}
                }
            }
        }
    }
}
