//! One session with the gateway: Hello, Welcome, heartbeats at the interval Welcome gives, the
//! inventory, the spec and its status, and Goodbye on shutdown.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::gateway_client::GatewayClient;
use bc_protocol::pb::{
    AgentMessage, Goodbye, GoodbyeReason, Heartbeat, Hello, Inventory, SpecStatus, agent_message,
    gateway_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::Backoff;
use crate::state::Identity;
use bcd_probes::hostroot::HostRoot;

/// What a session needs.
#[derive(Debug)]
pub struct SessionContext {
    pub executor: Arc<super::commands::Executor>,
    pub state_dir: std::path::PathBuf,
    pub identity: Identity,
    pub root: HostRoot,
    pub tls: Arc<rustls::ClientConfig>,
}

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// SIGTERM: Goodbye sent; the agent exits.
    Shutdown,
    /// The identity was revoked or the node deleted: this identity must never be used again.
    Revoked(String),
    /// A renewed certificate and its key: reconnect with them at once.
    Rotate { key_pem: String, cert_pem: String },
    /// Anything else: reconnect after a backoff.
    Retry(String),
}

/// How long to wait for Welcome after opening the stream.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to wait for the gateway to close after our Goodbye.
const GOODBYE_LINGER: Duration = Duration::from_secs(2);

fn msg(epoch: u64, m: agent_message::Msg) -> AgentMessage {
    AgentMessage {
        epoch,
        msg: Some(m),
    }
}

pub(crate) async fn inventory_message(
    root: &HostRoot,
    nvml: &bcd_probes::nvml::NvmlConfig,
) -> Result<Inventory, String> {
    let root = root.clone();
    let nvml = nvml.clone();
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        // GPUs through NVML when it is there; the PCI list otherwise.
        let gpus = bcd_probes::nvml::inventory_gpus(&nvml)
            .ok()
            .filter(|g| !g.is_empty())
            .map(|gs| {
                gs.into_iter()
                    .map(|g| bc_protocol::inventory::Gpu {
                        uuid: Some(g.uuid),
                        name: Some(g.name),
                        pci_bus_id: g.pci_bus_id,
                        memory_bytes: Some(g.memory_bytes),
                        driver_version: None,
                        source: "nvml".to_owned(),
                    })
                    .collect()
            });
        let inv = bcd_probes::inventory::collect_with_gpus(&root, gpus);
        let hw = bcd_probes::hwkey::compute(&root);
        crate::metrics::global().observe_inventory(started.elapsed());
        // The gateway stores at most MAX_INVENTORY_BYTES; a bigger document is shrunk here (with
        // notes saying what was left out) rather than refused there.
        let doc = inv
            .to_json_within(bc_protocol::MAX_INVENTORY_BYTES)
            .ok_or_else(|| {
                format!(
                    "inventory does not fit in {} bytes even without PCI, disks and NICs",
                    bc_protocol::MAX_INVENTORY_BYTES
                )
            })?;
        Ok(Inventory {
            hardware: Some(hw),
            document_json: doc,
            collected_at_ms: chrono::Utc::now().timestamp_millis(),
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

/// What the session loop shares with the agent across sessions.
#[derive(Debug)]
pub struct Shared<'a> {
    pub stop: &'a mut watch::Receiver<bool>,
    pub backoff: &'a mut Backoff,
    /// The converge task's input.
    pub desired: &'a watch::Sender<crate::converge::Desired>,
    /// The converge task's output.
    pub statuses: &'a mut mpsc::Receiver<SpecStatus>,
    /// The newest SpecStatus, re-sent after a reconnect.
    pub last_status: &'a mut Option<SpecStatus>,
    pub status: &'a super::status::StatusFile,
    /// XID events from the watch, forwarded as they happen.
    pub xids: &'a mut mpsc::Receiver<bcd_probes::nvml::XidEvent>,
    /// When to renew the certificate.
    pub renew_at: Option<tokio::time::Instant>,
    /// A just-renewed (key, certificate) this session uses: stored once it opened a session (the
    /// old one keeps working until then).
    pub promote: Option<(&'a crate::state::StateDir, &'a str, &'a str)>,
    /// Set when the gateway said Welcome.
    pub welcomed: &'a mut bool,
}

fn is_identity_refusal(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unauthenticated
        && (status.message().contains("revoked") || status.message().contains("no longer exists"))
}

async fn renew(
    client: &mut GatewayClient<tonic::transport::Channel>,
) -> Result<(String, String), String> {
    let key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| e.to_string())?;
    let resp = client
        .renew(bc_protocol::pb::RenewRequest { csr_pem: csr })
        .await
        .map_err(|s| format!("{}: {}", s.code(), s.message()))?
        .into_inner();
    Ok((key.serialize_pem(), resp.certificate_pem))
}

/// Runs one session until shutdown or failure.
pub async fn run_once(ctx: &SessionContext, sh: Shared<'_>) -> SessionEnd {
    let node = &ctx.identity.node;
    let channel = match crate::tls::channel(&node.control_plane, Arc::clone(&ctx.tls)).await {
        Ok(c) => c,
        Err(e) => return SessionEnd::Retry(e.to_string()),
    };
    let mut client = GatewayClient::new(channel);
    let (out, out_rx) = mpsc::channel::<AgentMessage>(64);
    let hello = Hello {
        node_id: node.node_id.clone(),
        boot_id: ctx
            .root
            .read_trimmed("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default(),
        agent_version: bc_protocol::VERSION.to_owned(),
        mode: bc_protocol::pb::AgentMode::Node.into(),
        observed_generation: crate::converge::observed_generation(&ctx.state_dir),
        pending_results: ctx
            .executor
            .journal
            .pending_results(chrono::Utc::now().timestamp_millis()),
    };
    if out
        .send(msg(0, agent_message::Msg::Hello(hello)))
        .await
        .is_err()
    {
        return SessionEnd::Retry("outbound stream closed".to_owned());
    }
    let mut inbound = match client.session(ReceiverStream::new(out_rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) if is_identity_refusal(&status) => {
            return SessionEnd::Revoked(status.message().to_owned());
        }
        Err(status) => {
            return SessionEnd::Retry(format!(
                "session refused: {}: {}",
                status.code(),
                status.message()
            ));
        }
    };
    let welcome = match tokio::time::timeout(WELCOME_TIMEOUT, inbound.message()).await {
        Ok(Ok(Some(bc_protocol::pb::GatewayMessage {
            msg: Some(gateway_message::Msg::Welcome(w)),
        }))) => w,
        Ok(Ok(other)) => return SessionEnd::Retry(format!("expected Welcome, got {other:?}")),
        Ok(Err(status)) if is_identity_refusal(&status) => {
            return SessionEnd::Revoked(status.message().to_owned());
        }
        Ok(Err(status)) => {
            return SessionEnd::Retry(format!(
                "session refused: {}: {}",
                status.code(),
                status.message()
            ));
        }
        Err(_) => return SessionEnd::Retry("no Welcome in time".to_owned()),
    };
    let epoch = welcome.epoch;
    let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(50)));
    tracing::info!(node_id = %node.node_id, epoch, gateway = %welcome.gateway_id, heartbeat = ?interval, "session open");
    sh.status.connected(epoch, &welcome.gateway_id);
    crate::metrics::global().set_connected(true);
    *sh.welcomed = true;
    ctx.executor.attach(out.clone(), epoch);
    if let Some((state, key, cert)) = sh.promote
        && let Err(e) = state.replace_certificate(key, cert)
    {
        tracing::error!(error = %e, "storing the renewed certificate failed; it stays in memory only");
    }

    match inventory_message(&ctx.root, &ctx.executor.nvml).await {
        Ok(inv) => {
            let _ = out
                .send(msg(epoch, agent_message::Msg::Inventory(inv)))
                .await;
        }
        Err(e) => tracing::warn!(error = %e, "inventory collection failed"),
    }
    if let Some(s) = sh.last_status.clone() {
        let _ = out
            .send(msg(epoch, agent_message::Msg::SpecStatus(s)))
            .await;
    }

    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let renew_at = sh.renew_at;
    let renew_sleep = async move {
        match renew_at {
            Some(t) => tokio::time::sleep_until(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(renew_sleep);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            _ = sh.stop.wait_for(|v| *v) => {
                let bye = Goodbye { reason: GoodbyeReason::Shutdown.into(), message: "agent stopping".to_owned() };
                let _ = out.send(msg(epoch, agent_message::Msg::Goodbye(bye))).await;
                drop(out);
                // Let the gateway record the Goodbye and close its side.
                let _ = tokio::time::timeout(GOODBYE_LINGER, async {
                    while let Ok(Some(_)) = inbound.message().await {}
                }).await;
                tracing::info!("said Goodbye");
                return SessionEnd::Shutdown;
            }
            _ = &mut renew_sleep => {
                match renew(&mut client).await {
                    Ok((key_pem, cert_pem)) => return SessionEnd::Rotate { key_pem, cert_pem },
                    Err(e) => {
                        tracing::warn!(error = %e, "certificate renewal failed; retrying on the next session");
                        return SessionEnd::Retry(format!("renewal failed: {e}"));
                    }
                }
            }
            _ = tick.tick() => {
                seq += 1;
                if out.send(msg(epoch, agent_message::Msg::Heartbeat(Heartbeat { seq }))).await.is_err() {
                    return SessionEnd::Retry("outbound stream closed".to_owned());
                }
                crate::metrics::global().heartbeat_sent();
            }
            Some(x) = sh.xids.recv() => {
                tracing::warn!(xid = x.xid, gpu = ?x.pci_bus_id, class = ?x.class, "XID");
                let ev = bc_protocol::pb::Event {
                    r#type: bc_protocol::commands::EventType::Xid.as_str().to_owned(),
                    message: format!("Xid {} on {}", x.xid, x.pci_bus_id.as_deref().unwrap_or("an unknown GPU")),
                    data_json: serde_json::to_vec(&x).unwrap_or_default(),
                    at_ms: x.observed_at.timestamp_millis(),
                };
                let _ = out.send(msg(epoch, agent_message::Msg::Event(ev))).await;
            }
            Some(s) = sh.statuses.recv() => {
                tracing::info!(generation = s.generation, converged = s.converged, reason = %s.reason, "spec status");
                *sh.last_status = Some(s.clone());
                let _ = out.send(msg(epoch, agent_message::Msg::SpecStatus(s))).await;
            }
            next = inbound.message() => {
                let m = match next {
                    Ok(Some(m)) => m,
                    Ok(None) => return SessionEnd::Retry("gateway closed the stream".to_owned()),
                    Err(status) if is_identity_refusal(&status) => return SessionEnd::Revoked(status.message().to_owned()),
                    Err(status) => return SessionEnd::Retry(format!("stream error: {}: {}", status.code(), status.message())),
                };
                match m.msg {
                    Some(gateway_message::Msg::HeartbeatAck(a)) => {
                        sh.backoff.reset();
                        sh.status.heartbeat_acked(a.seq);
                        crate::metrics::global().heartbeat_acked();
                    }
                    Some(gateway_message::Msg::Spec(spec)) => {
                        tracing::info!(generation = spec.generation, "spec received");
                        let _ = sh.desired.send(Some((spec.generation, spec.spec.unwrap_or_default())));
                    }
                    Some(gateway_message::Msg::Goodbye(g)) => {
                        let reason = GoodbyeReason::try_from(g.reason).unwrap_or(GoodbyeReason::Unspecified);
                        if matches!(reason, GoodbyeReason::Revoked | GoodbyeReason::Deleted) {
                            return SessionEnd::Revoked(format!("gateway said Goodbye ({}): {}", reason.as_str_name(), g.message));
                        }
                        return SessionEnd::Retry(format!("gateway said Goodbye ({}): {}", reason.as_str_name(), g.message));
                    }
                    Some(gateway_message::Msg::Command(c)) => {
                        tracing::info!(command = %c.name, id = %c.id, "command received");
                        ctx.executor.on_command(c, out.clone(), epoch);
                    }
                    Some(gateway_message::Msg::Cancel(c)) => ctx.executor.on_cancel(&c.id, &out, epoch),
                    Some(gateway_message::Msg::Welcome(_)) | None => {}
                }
            }
        }
    }
}
