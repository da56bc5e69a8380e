//! One agent session: Hello, Welcome and the current Spec, then messages until Goodbye, the end of
//! the stream, or a stop (superseded, revoked, shutdown). The session answers heartbeats itself
//! and bounds a node's reports; every report goes, in arrival order, to the core's one door for
//! them (`cpl_core::verbs::Core::report`).

use bc_protocol::pb::{
    AgentMessage, GatewayMessage, HeartbeatAck, Welcome, agent_message, gateway_message::Msg,
};
use cpl_core::agent_report::AgentReport;
use cpl_core::sessions;
use cpl_store::now_ms;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};
use tracing::Instrument;

use super::GatewayService;
use super::registry::SessionHandle;
use super::report_rate::{self, Admit};
use crate::ca::NodeIdentity;

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
        .core
        .open_session(open)
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
        && let Some(a) = gw.core.bare_metal.assignment(&ident.node_id).await
    {
        let _ = tx.send(Ok(a)).await;
    }
    tracing::info!(boot_id = %hello.boot_id, "session opened");
    // Results that finished while the session was down, then everything not over yet (again).
    let (core, node_id) = (gw.core.clone(), ident.node_id.clone());
    let pending = hello.pending_results;
    tokio::spawn(
        async move {
            for u in pending {
                let r = core
                    .report(&node_id, epoch, AgentReport::CommandUpdate(u))
                    .await;
                if let Err(e) = r {
                    tracing::error!(error = %e, "recording a pending result failed");
                }
            }
            core.commands.dispatch(&node_id, true).await;
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
        let report = match m.msg {
            Some(agent_message::Msg::Heartbeat(hb)) => {
                let now = now_ms();
                gw.heartbeats.note(&node_id, epoch, now);
                gw.metrics.heartbeat();
                // The holder's heartbeat renews its site lease (written with the heartbeats).
                let site_lease_expires_at_ms = gw.core.bare_metal.renew_lease(&node_id, now);
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
            Some(agent_message::Msg::Hello(_)) => {
                tracing::warn!("second Hello on one session ignored");
                continue;
            }
            Some(other) => match AgentReport::from_message(other) {
                Some(r) => r,
                None => continue,
            },
            None => continue,
        };
        if let Some(kind) = report.kind() {
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
        if matches!(report, AgentReport::Goodbye(_)) {
            clean = true;
            let _ = wtx.send(report).await;
            break;
        }
        if wtx.send(report).await.is_err() {
            break;
        }
    }
    // The gateway ended it (superseded, revoked, deleted, shutting down: each records its own
    // end, or none), or the agent said Goodbye; anything else is a broken transport, and the
    // node is `disconnected` now rather than after the silence rule. Checked after the loop too:
    // a stream may end in the same instant the gateway stops it.
    let broken = !clean && !stopped && !*stop.borrow();
    if broken {
        let _ = wtx.send(AgentReport::Broken).await;
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

/// Hands one session's reports to the core in the order they arrived.
async fn write_loop(
    gw: GatewayService,
    node_id: String,
    epoch: u64,
    mut rx: mpsc::Receiver<AgentReport>,
) {
    while let Some(report) = rx.recv().await {
        let inventory = matches!(report, AgentReport::Inventory(_));
        let started = std::time::Instant::now();
        let kind = report.kind().unwrap_or("sessionEnd");
        match gw.core.report(&node_id, epoch, report).await {
            Ok(effects) => tracing::debug!(kind, ?effects, "report applied"),
            Err(e) => tracing::error!(kind, error = %e, "recording a report failed"),
        }
        if inventory {
            gw.metrics.observe_inventory(started.elapsed());
        }
    }
}
