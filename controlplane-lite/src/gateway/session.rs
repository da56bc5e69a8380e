//! One agent session: Hello, Welcome and the current Spec, then messages until Goodbye, the end of
//! the stream, or a stop (superseded, revoked, shutdown).

use bc_protocol::pb::{
    AgentMessage, GatewayMessage, HeartbeatAck, Welcome, agent_message, gateway_message::Msg,
};
use cpl_core::error::OpError;
use cpl_core::reports::{self, InventoryReport, SpecReport};
use cpl_core::sessions;
use cpl_store::{StoreError, now_ms};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};
use tracing::Instrument;

use super::GatewayService;
use super::registry::SessionHandle;
use super::report_rate::{self, Admit};
use crate::ca::NodeIdentity;

/// Largest inventory document accepted, bytes (the agent shrinks a bigger one before sending).
pub const MAX_INVENTORY_BYTES: usize = bc_protocol::MAX_INVENTORY_BYTES;

fn msg(m: Msg) -> Result<GatewayMessage, Status> {
    Ok(GatewayMessage { msg: Some(m) })
}

/// Reads Hello, opens the session in the store, registers it, queues Welcome and the Spec, and
/// spawns the task that serves the rest of the stream, all in a `session` span carrying the node
/// id and (once known) the epoch. Returns the outbound receiver.
pub(super) async fn open(
    gw: GatewayService,
    ident: NodeIdentity,
    inbound: Streaming<AgentMessage>,
) -> Result<mpsc::Receiver<Result<GatewayMessage, Status>>, Status> {
    let span =
        tracing::info_span!("session", node_id = %ident.node_id, epoch = tracing::field::Empty);
    open_in(gw, ident, inbound, span.clone())
        .instrument(span)
        .await
}

async fn open_in(
    gw: GatewayService,
    ident: NodeIdentity,
    mut inbound: Streaming<AgentMessage>,
    span: tracing::Span,
) -> Result<mpsc::Receiver<Result<GatewayMessage, Status>>, Status> {
    let mut first = tokio::time::timeout(gw.cfg.hello_timeout, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no Hello within the hello timeout"))??
        .ok_or_else(|| Status::cancelled("stream closed before Hello"))?;
    bound(&mut first);
    let Some(agent_message::Msg::Hello(hello)) = first.msg else {
        return Err(Status::failed_precondition(
            "the first message of a session must be Hello",
        ));
    };
    if hello.node_id != ident.node_id {
        return Err(Status::permission_denied(format!(
            "Hello names node {} but the certificate is node {}",
            hello.node_id, ident.node_id
        )));
    }
    let open = sessions::SessionOpen {
        node_id: ident.node_id.clone(),
        gateway_id: gw.cfg.gateway_id.clone(),
        boot_id: hello.boot_id.clone(),
        agent_version: hello.agent_version.clone(),
    };
    let opened = gw
        .store
        .write_node(open.node_id.clone(), move |tx| sessions::open(tx, &open))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?
        .ok_or_else(|| {
            Status::unauthenticated(format!("node {} no longer exists", ident.node_id))
        })?;
    if opened.identity_generation != ident.identity_generation {
        return Err(Status::unauthenticated(
            "node identity was replaced while the session opened",
        ));
    }
    let (tx, rx) = mpsc::channel(64);
    let (stop_tx, stop_rx) = watch::channel(false);
    let epoch = opened.epoch;
    span.record("epoch", epoch);
    gw.registry.insert(
        &ident.node_id,
        SessionHandle {
            epoch,
            tx: tx.clone(),
            stop: stop_tx,
        },
    );
    let welcome = Welcome {
        epoch,
        gateway_id: gw.cfg.gateway_id.clone(),
        heartbeat_interval_ms: u32::try_from(gw.cfg.heartbeat_interval.as_millis())
            .unwrap_or(u32::MAX),
        server_time_ms: now_ms(),
    };
    let spec = cpl_core::push::spec_message(opened.generation, &opened.spec, opened.trust);
    // Capacity is 64 and the receiver is fresh: these cannot block.
    let _ = tx.send(msg(Msg::Welcome(welcome))).await;
    let _ = tx.send(Ok(spec)).await;
    // A site agent learns its lease and BMCs before anything else (its commands need them).
    if hello.mode == bc_protocol::pb::AgentMode::Site as i32
        && let Some(a) = gw.bare_metal.assignment(&ident.node_id).await
    {
        let _ = tx.send(Ok(a)).await;
    }
    tracing::info!(boot_id = %hello.boot_id, "session opened");
    // Results that finished while the session was down, then everything not over yet (again).
    let (cmds, node_id) = (gw.commands.clone(), ident.node_id.clone());
    let pending = hello.pending_results;
    tokio::spawn(
        async move {
            for u in pending {
                cmds.update(&node_id, u).await;
            }
            cmds.dispatch(&node_id, true).await;
        }
        .instrument(span.clone()),
    );
    tokio::spawn(serve(gw, ident.node_id, epoch, inbound, tx, stop_rx).instrument(span));
    Ok(rx)
}

/// Cuts what the agent sent to the limits of `bc_protocol::limits` (counted there, exposed as
/// `bcctl_agent_text_truncated_total`): every message, before anything reads it.
fn bound(m: &mut AgentMessage) {
    let cut = bc_protocol::limits::bound_agent_message(m);
    if !cut.is_empty() {
        tracing::warn!(fields = ?cut, "agent text cut to its limits");
    }
}

/// A message the session hands to its writer: everything that needs the store, in arrival order.
#[derive(Debug)]
enum Write {
    Inventory(bc_protocol::pb::Inventory),
    SpecStatus(bc_protocol::pb::SpecStatus),
    Command(bc_protocol::pb::CommandUpdate),
    Xid(serde_json::Value),
    Power(bc_protocol::pb::PowerReport),
    Goodbye(String),
    /// The stream ended without a Goodbye and without the gateway ending it.
    Broken,
}

/// Store writes one session may have queued before its reader waits for the writer.
const WRITE_QUEUE: usize = 32;

/// Reads the stream. Heartbeats are answered here at once; everything that needs the store goes
/// to the session's writer task in order, so a slow store (a join or restart storm queues every
/// session's writes on one SQLite connection) never delays reading heartbeats: a node is not
/// marked unreachable because its own Inventory write was waiting (docs/benchmarks.md).
async fn serve(
    gw: GatewayService,
    node_id: String,
    epoch: u64,
    mut inbound: Streaming<AgentMessage>,
    tx: mpsc::Sender<Result<GatewayMessage, Status>>,
    mut stop: watch::Receiver<bool>,
) {
    let (wtx, wrx) = mpsc::channel(WRITE_QUEUE);
    let writer = tokio::spawn(
        write_loop(gw.clone(), node_id.clone(), epoch, wrx).instrument(tracing::Span::current()),
    );
    let mut clean = false;
    let mut stopped = false;
    loop {
        let next = tokio::select! {
            _ = stop.changed() => {
                stopped = true;
                break;
            }
            next = inbound.message() => next,
        };
        let mut m = match next {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(status) => {
                // A message over the decode limit or a broken frame ends the stream: say so, or
                // an agent that keeps sending it reconnects forever with nothing in the log.
                if status.code() == tonic::Code::Cancelled {
                    tracing::debug!(%status, "session stream ended");
                } else {
                    tracing::warn!(%status, "session stream error");
                }
                break;
            }
        };
        bound(&mut m);
        if m.epoch != 0 && m.epoch != epoch {
            tracing::debug!(got = m.epoch, "message of a stale epoch dropped");
            continue;
        }
        if let Some(kind) = store_bound(&m.msg) {
            match gw.reports.admit(&node_id) {
                Admit::Yes => {}
                Admit::Dropped { log } => {
                    gw.metrics.report_dropped(kind);
                    if let Some(n) = log {
                        tracing::warn!(
                            dropped = n,
                            per_second = report_rate::REPORTS_PER_SECOND,
                            "agent sends reports faster than its node's bound; dropping the excess"
                        );
                    }
                    continue;
                }
            }
        }
        let write = match m.msg {
            Some(agent_message::Msg::Heartbeat(hb)) => {
                let now = now_ms();
                gw.heartbeats.note(&node_id, epoch, now);
                gw.metrics.heartbeat();
                // The holder's heartbeat renews its site lease (written with the heartbeats).
                let lease_ttl =
                    i64::try_from(gw.bare_metal.cfg.lease_ttl.as_millis()).unwrap_or(i64::MAX);
                let site_lease_expires_at_ms = gw.bare_metal.leases.renew(&node_id, now, lease_ttl);
                if tx
                    .send(msg(Msg::HeartbeatAck(HeartbeatAck {
                        seq: hb.seq,
                        site_lease_expires_at_ms,
                    })))
                    .await
                    .is_err()
                {
                    break;
                }
                continue;
            }
            Some(agent_message::Msg::Inventory(inv)) => Write::Inventory(inv),
            Some(agent_message::Msg::SpecStatus(s)) => Write::SpecStatus(s),
            Some(agent_message::Msg::CommandUpdate(u)) => Write::Command(u),
            Some(agent_message::Msg::Goodbye(g)) => {
                let reason = bc_protocol::pb::GoodbyeReason::try_from(g.reason)
                    .map(|r| {
                        r.as_str_name()
                            .trim_start_matches("GOODBYE_REASON_")
                            .to_ascii_lowercase()
                    })
                    .unwrap_or_else(|_| "unknown".to_owned());
                clean = true;
                let _ = wtx.send(Write::Goodbye(reason)).await;
                break;
            }
            Some(agent_message::Msg::Event(ev))
                if ev.r#type == bc_protocol::commands::EventType::Xid.as_str() =>
            {
                tracing::warn!(message = %ev.message, "XID reported");
                Write::Xid(serde_json::from_slice(&ev.data_json).unwrap_or_default())
            }
            Some(agent_message::Msg::Event(ev)) => {
                tracing::info!(r#type = %ev.r#type, message = %ev.message, "agent event");
                continue;
            }
            Some(agent_message::Msg::Hello(_)) => {
                tracing::warn!("second Hello on one session ignored");
                continue;
            }
            Some(agent_message::Msg::PowerReport(r)) => Write::Power(r),
            None => continue,
        };
        if wtx.send(write).await.is_err() {
            break;
        }
    }
    // The gateway ended it (superseded, revoked, deleted, shutting down: each records its own
    // end, or none), or the agent said Goodbye; anything else is a broken transport, and the
    // node is `disconnected` now rather than after the silence rule. Checked after the loop too:
    // a stream may end in the same instant the gateway stops it.
    let broken = !clean && !stopped && !*stop.borrow();
    if broken {
        let _ = wtx.send(Write::Broken).await;
    }
    drop(wtx);
    gw.registry.remove_if(&node_id, epoch);
    tracing::info!(clean, broken, "session closed");
    // The writer finishes what the session queued (a CommandUpdate sent just before the stream
    // ended still counts) and then ends.
    if let Err(e) = writer.await {
        tracing::error!(error = %e, "session writer failed");
    }
}

/// The `kind` label of a message that costs a store write (bounded per node), `None` for the
/// rest (heartbeats, Hello, Goodbye).
fn store_bound(m: &Option<agent_message::Msg>) -> Option<&'static str> {
    match m {
        Some(agent_message::Msg::Inventory(_)) => Some("inventory"),
        Some(agent_message::Msg::SpecStatus(_)) => Some("specStatus"),
        Some(agent_message::Msg::CommandUpdate(_)) => Some("commandUpdate"),
        Some(agent_message::Msg::Event(_)) => Some("event"),
        Some(agent_message::Msg::PowerReport(_)) => Some("powerReport"),
        _ => None,
    }
}

/// After a site agent's `bmc.verify` is over: its new assignment (a verified BMC is synced,
/// with the certificate pinned at the verification; a rotation's new pair or none).
async fn after_bmc_verify(gw: &GatewayService, node_id: &str, command_id: &str) {
    if let Ok(Some(c)) = gw.commands.get(command_id).await
        && c.state.is_final()
        && c.name == bc_protocol::CommandName::BmcVerify
    {
        gw.bare_metal.push_assignment(node_id).await;
    }
}

/// How long a session's write is tried again while the store is unavailable (PostgreSQL down,
/// or its connections all busy past `--store-timeout` in a storm) before it is given up.
const RETRY_UNAVAILABLE_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `write` until it succeeds, fails for another reason than an unavailable store, or
/// [`RETRY_UNAVAILABLE_FOR`] has passed (100 ms, doubling to 2 s, between tries): what an agent
/// reported (its inventory, a SpecStatus, its Goodbye) is not dropped because the database
/// answered late; the session's later writes wait behind it, in order.
async fn retry_unavailable<T, F, Fut>(what: &str, mut write: F) -> Result<T, OpError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, OpError>>,
{
    let started = std::time::Instant::now();
    let mut wait = std::time::Duration::from_millis(100);
    loop {
        match write().await {
            Err(OpError::Store(e))
                if e.is_unavailable() && started.elapsed() < RETRY_UNAVAILABLE_FOR =>
            {
                tracing::debug!(error = %e, retry_in = ?wait, "{what}: store unavailable; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(std::time::Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

/// Applies one session's store writes in the order they arrived.
async fn write_loop(
    gw: GatewayService,
    node_id: String,
    epoch: u64,
    mut rx: mpsc::Receiver<Write>,
) {
    while let Some(w) = rx.recv().await {
        match w {
            Write::Inventory(inv) => handle_inventory(&gw, &node_id, epoch, inv).await,
            Write::SpecStatus(s) => {
                let r = retry_unavailable("recording SpecStatus", || {
                    let (id, s) = (node_id.clone(), s.clone());
                    gw.store.write_node(id.clone(), move |tx| {
                        let report = SpecReport {
                            generation: s.generation,
                            converged: s.converged,
                            reason: &s.reason,
                            message: &s.message,
                        };
                        reports::record_spec_status(tx, &id, epoch, &report)
                    })
                })
                .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "recording SpecStatus failed");
                }
            }
            Write::Command(u) => {
                let (id, done) = (u.id.clone(), u.progress >= 100);
                gw.commands.update(&node_id, u).await;
                if done {
                    after_bmc_verify(&gw, &node_id, &id).await;
                }
            }
            Write::Xid(data) => cpl_core::health::on_xid(&gw.store, &node_id, &data).await,
            Write::Power(r) => {
                let observations = r.observations.len();
                match gw.bare_metal.power_report(&node_id, r).await {
                    cpl_core::bare_metal::power::ReportOutcome::Applied(changed) => {
                        tracing::debug!(observations, changed, "power report applied")
                    }
                    cpl_core::bare_metal::power::ReportOutcome::Ignored(why) => {
                        tracing::warn!(observations, reason = %why, "power report ignored")
                    }
                }
            }
            Write::Broken => {
                let r = retry_unavailable("recording the broken session", || {
                    let id = node_id.clone();
                    gw.store
                        .write_node(id.clone(), move |tx| sessions::close_broken(tx, &id, epoch))
                })
                .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "recording the broken session failed");
                }
            }
            Write::Goodbye(reason) => {
                let r = retry_unavailable("recording Goodbye", || {
                    let (id, reason) = (node_id.clone(), reason.clone());
                    gw.store.write_node(id.clone(), move |tx| {
                        sessions::close_clean(tx, &id, epoch, &reason)
                    })
                })
                .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "recording Goodbye failed");
                }
            }
        }
    }
}

async fn handle_inventory(
    gw: &GatewayService,
    node_id: &str,
    epoch: u64,
    inv: bc_protocol::pb::Inventory,
) {
    use sha2::Digest;
    if inv.document_json.len() > MAX_INVENTORY_BYTES {
        tracing::warn!(
            bytes = inv.document_json.len(),
            "inventory too large; dropped"
        );
        return;
    }
    let sha256 = hex::encode(sha2::Sha256::digest(&inv.document_json));
    let hw = inv.hardware.unwrap_or_default();
    let doc = std::sync::Arc::new(inv.document_json);
    let started = std::time::Instant::now();
    let r = retry_unavailable("recording inventory", || {
        let (id, doc, hw, sha256) = (
            node_id.to_owned(),
            std::sync::Arc::clone(&doc),
            hw.clone(),
            sha256.clone(),
        );
        gw.store.write_node(id.clone(), move |tx| {
            let report = InventoryReport {
                hardware_key: &hw.hardware_key,
                trusted: hw.trusted,
                digests: &hw.identifier_digests,
                document: &doc,
                sha256: &sha256,
            };
            reports::record_inventory(tx, &id, epoch, &report)
        })
    })
    .await;
    gw.metrics.observe_inventory(started.elapsed());
    match r {
        Ok(Some(state)) => tracing::debug!(provision_state = %state, "inventory recorded"),
        Ok(None) => {}
        Err(OpError::Store(StoreError::Json { source, .. })) => {
            tracing::warn!(error = %source, "inventory is not valid JSON; dropped")
        }
        Err(e) => tracing::error!(error = %e, "recording inventory failed"),
    }
}
