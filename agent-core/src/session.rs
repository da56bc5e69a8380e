//! One session with the gateway: Hello, Welcome, the inventory, heartbeats at the interval
//! Welcome gives, specs and commands in, reports out, certificate renewal when due, and Goodbye
//! on shutdown. The messages are built here and only here ([`hello`], [`heartbeat`],
//! [`shutdown_goodbye`]), for every mode.

use std::sync::Arc;
use std::time::Duration;

use bc_protocol::pb::gateway_client::GatewayClient;
use bc_protocol::pb::{
    AgentMessage, Goodbye, GoodbyeReason, Heartbeat, Hello, Welcome, agent_message, gateway_message,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use crate::backoff::Backoff;
use crate::executor::{Executor, SessionLink};
use crate::identity::IdentityStore;
use crate::mode::{Machine, Observer, SessionHooks};
use crate::state::Identity;

/// How long to wait for Welcome after opening the stream.
pub const WELCOME_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to wait for the gateway to close after our Goodbye.
pub const GOODBYE_LINGER: Duration = Duration::from_secs(2);
/// Shortest heartbeat interval honoured, whatever Welcome says.
pub const MIN_HEARTBEAT: Duration = Duration::from_millis(50);

/// How a session ended.
#[derive(Debug)]
pub enum SessionEnd {
    /// Stop requested: Goodbye sent.
    Shutdown,
    /// The identity was revoked or the node deleted: this identity must never be used again.
    Revoked(String),
    /// The gateway refuses this identity for good (`PERMISSION_DENIED`, or an
    /// `UNAUTHENTICATED` that is not a revocation): reconnecting cannot help.
    Refused(String),
    /// A renewed certificate and its key: reconnect with them at once.
    Rotate {
        /// The new private key (PEM).
        key_pem: String,
        /// The new certificate (PEM).
        cert_pem: String,
    },
    /// Anything else: reconnect after a backoff.
    Retry(String),
}

/// `Hello` for `node_id` on `machine`, with the results `executor`'s journal still has to
/// report. Every mode's Hello comes from here: a field added here reaches them all.
pub fn hello<M: Machine>(node_id: &str, executor: &Executor<M>) -> Hello {
    let machine = executor.machine();
    Hello {
        node_id: node_id.to_owned(),
        boot_id: machine.boot_id().to_owned(),
        agent_version: bc_protocol::VERSION.to_owned(),
        mode: bc_protocol::pb::AgentMode::from(machine.mode()).into(),
        observed_generation: machine.observed_generation(),
        pending_results: executor
            .journal()
            .pending_results(chrono::Utc::now().timestamp_millis()),
    }
}

/// Heartbeat `seq`.
pub fn heartbeat(seq: u64) -> agent_message::Msg {
    agent_message::Msg::Heartbeat(Heartbeat { seq })
}

/// The Goodbye of an agent that stops.
pub fn shutdown_goodbye() -> agent_message::Msg {
    agent_message::Msg::Goodbye(Goodbye {
        reason: GoodbyeReason::Shutdown.into(),
        message: "agent stopping".to_owned(),
    })
}

/// Resolves once `stop` is true or its sender is gone. The watch guard stays inside, so the
/// future and what follows it stay `Send`.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|v| *v).await;
}

fn msg(epoch: u64, m: agent_message::Msg) -> AgentMessage {
    AgentMessage {
        epoch,
        msg: Some(m),
    }
}

fn is_identity_refusal(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unauthenticated
        && (status.message().contains("revoked") || status.message().contains("no longer exists"))
}

/// A refusal no reconnect can change: the gateway will not take this certificate or this
/// node's Hello (the gateway answers overload and outages with `UNAVAILABLE`).
fn is_permanent_refusal(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
    )
}

fn refused(status: &tonic::Status, what: &str) -> SessionEnd {
    if is_identity_refusal(status) {
        return SessionEnd::Revoked(status.message().to_owned());
    }
    let why = format!("{what}: {}: {}", status.code(), status.message());
    if is_permanent_refusal(status) {
        return SessionEnd::Refused(why);
    }
    SessionEnd::Retry(why)
}

/// A new key and a certificate for it from `Gateway.Renew` (same node id and generation).
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

/// What one session runs with.
#[derive(Debug)]
pub struct SessionParams<'a, M> {
    /// Who we are.
    pub identity: &'a Identity,
    /// The gateway URL to open the session at (one replica of the control plane).
    pub control_plane: &'a str,
    /// Mutual TLS with `identity`'s (or a just-renewed) key and certificate.
    pub tls: Arc<rustls::ClientConfig>,
    /// The node's command executor.
    pub executor: &'a Arc<Executor<M>>,
    /// Outbound messages queued at most (a full queue slows the sender, never drops).
    pub outbound_capacity: usize,
    /// When to renew the certificate.
    pub renew_at: Option<tokio::time::Instant>,
    /// A just-renewed (key, certificate) this session uses: stored in `store` once it opened a
    /// session (the old one keeps working until then).
    pub promote: Option<(&'a dyn IdentityStore, &'a str, &'a str)>,
}

/// What a session changes in its caller's state.
#[derive(Debug)]
pub struct SessionState<'a> {
    /// Turns true to stop: Goodbye, then [`SessionEnd::Shutdown`].
    pub stop: &'a mut watch::Receiver<bool>,
    /// Reset by every heartbeat acknowledgement.
    pub backoff: &'a mut Backoff,
    /// Set when the gateway said Welcome.
    pub welcomed: &'a mut bool,
}

/// Runs one session until stop or failure. The caller's span names the node; the epoch is
/// recorded on it (`epoch` field) once Welcome gives one.
pub async fn run_once<M, H>(
    p: SessionParams<'_, M>,
    st: SessionState<'_>,
    hooks: &mut H,
) -> SessionEnd
where
    M: Machine,
    H: SessionHooks + Observer,
{
    let node = &p.identity.node;
    hooks.connecting(p.control_plane);
    let channel = match crate::tls::channel(p.control_plane, Arc::clone(&p.tls)).await {
        Ok(c) => c,
        Err(e) => return SessionEnd::Retry(e.to_string()),
    };
    let mut client = GatewayClient::new(channel);
    let (out, out_rx) = mpsc::channel::<AgentMessage>(p.outbound_capacity);
    let first = msg(
        0,
        agent_message::Msg::Hello(hello(&node.node_id, p.executor)),
    );
    if out.send(first).await.is_err() {
        return SessionEnd::Retry("outbound stream closed".to_owned());
    }
    let mut inbound = match client.session(ReceiverStream::new(out_rx)).await {
        Ok(r) => r.into_inner(),
        Err(status) => return refused(&status, "session refused"),
    };
    let welcome = match tokio::time::timeout(WELCOME_TIMEOUT, inbound.message()).await {
        Ok(Ok(Some(bc_protocol::pb::GatewayMessage {
            msg: Some(gateway_message::Msg::Welcome(w)),
        }))) => w,
        Ok(Ok(other)) => return SessionEnd::Retry(format!("expected Welcome, got {other:?}")),
        Ok(Err(status)) => return refused(&status, "session refused"),
        Err(_) => return SessionEnd::Retry("no Welcome in time".to_owned()),
    };
    *st.welcomed = true;
    let link = SessionLink {
        out,
        epoch: welcome.epoch,
    };
    open(&p, &link, &welcome, hooks).await;
    serve(client, inbound, &p, link, &welcome, st, hooks).await
}

/// After Welcome: bookkeeping, the renewed certificate stored, the inventory and the mode's
/// opening report sent.
async fn open<M, H>(p: &SessionParams<'_, M>, link: &SessionLink, welcome: &Welcome, hooks: &mut H)
where
    M: Machine,
    H: SessionHooks + Observer,
{
    tracing::Span::current().record("epoch", welcome.epoch);
    tracing::info!(control_plane = %p.control_plane, gateway = %welcome.gateway_id, heartbeat = ?interval(welcome), "session open");
    hooks.session_open(welcome.epoch, &welcome.gateway_id, p.control_plane);
    p.executor.attach(link.clone());
    if let Some((store, key, cert)) = p.promote
        && let Err(e) = store.replace_certificate(key, cert)
    {
        tracing::error!(error = %e, "storing the renewed certificate failed; it stays in memory only");
    }
    match p.executor.machine().inventory().await {
        Ok(inv) => {
            let _ = link.send(agent_message::Msg::Inventory(inv)).await;
        }
        Err(e) => tracing::warn!(error = %e, "inventory collection failed"),
    }
    if let Some(s) = hooks.on_open() {
        let _ = link.send(agent_message::Msg::SpecStatus(s)).await;
    }
}

fn interval(welcome: &Welcome) -> Duration {
    Duration::from_millis(u64::from(welcome.heartbeat_interval_ms)).max(MIN_HEARTBEAT)
}

/// When the first heartbeat of a session is due: at a random point of its first `period`
/// (`unit` in `[0, 1)`), then one every period. Sessions that opened together (a join storm, every
/// agent reconnecting after a control-plane restart) would otherwise heartbeat in step for as
/// long as they last, and each gateway would answer them in bursts (docs/benchmarks.md: the
/// steady ack p99 after a storm). The gateway marks the node seen at the session's open, and
/// judges silence only after several periods, so the first one may come late.
fn first_heartbeat(
    opened: tokio::time::Instant,
    period: Duration,
    unit: f64,
) -> tokio::time::Instant {
    opened + period.mul_f64(unit.clamp(0.0, 1.0))
}

/// The open session's loop.
async fn serve<M, H>(
    mut client: GatewayClient<tonic::transport::Channel>,
    mut inbound: tonic::Streaming<bc_protocol::pb::GatewayMessage>,
    p: &SessionParams<'_, M>,
    link: SessionLink,
    welcome: &Welcome,
    st: SessionState<'_>,
    hooks: &mut H,
) -> SessionEnd
where
    M: Machine,
    H: SessionHooks + Observer,
{
    let period = interval(welcome);
    let mut tick = tokio::time::interval_at(
        first_heartbeat(tokio::time::Instant::now(), period, rand::random::<f64>()),
        period,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let renew_at = p.renew_at;
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
            () = stopped(st.stop) => {
                let _ = link.send(shutdown_goodbye()).await;
                drop(link);
                // Let the gateway record the Goodbye and close its side.
                let _ = tokio::time::timeout(GOODBYE_LINGER, async {
                    while let Ok(Some(_)) = inbound.message().await {}
                }).await;
                tracing::info!("said Goodbye");
                return SessionEnd::Shutdown;
            }
            _ = &mut renew_sleep => {
                return match renew(&mut client).await {
                    Ok((key_pem, cert_pem)) => SessionEnd::Rotate { key_pem, cert_pem },
                    Err(e) => {
                        tracing::warn!(error = %e, "certificate renewal failed; retrying on the next session");
                        SessionEnd::Retry(format!("renewal failed: {e}"))
                    }
                };
            }
            _ = tick.tick() => {
                seq += 1;
                hooks.heartbeat_sent(seq);
                if link.send(heartbeat(seq)).await.is_err() {
                    return SessionEnd::Retry("outbound stream closed".to_owned());
                }
            }
            report = hooks.next_report() => {
                let _ = link.send(report).await;
            }
            next = inbound.message() => {
                let m = match next {
                    Ok(Some(m)) => m,
                    Ok(None) => return SessionEnd::Retry("gateway closed the stream".to_owned()),
                    Err(status) => return refused(&status, "stream error"),
                };
                if let Some(end) = dispatch(m.msg, p, &link, st.backoff, hooks).await {
                    return end;
                }
            }
        }
    }
}

/// Handles one gateway message; `Some` ends the session.
async fn dispatch<M, H>(
    m: Option<gateway_message::Msg>,
    p: &SessionParams<'_, M>,
    link: &SessionLink,
    backoff: &mut Backoff,
    hooks: &mut H,
) -> Option<SessionEnd>
where
    M: Machine,
    H: SessionHooks + Observer,
{
    match m {
        Some(gateway_message::Msg::HeartbeatAck(a)) => {
            backoff.reset();
            hooks.heartbeat_acked(a.seq);
            hooks.on_heartbeat_ack(&a);
        }
        Some(gateway_message::Msg::SiteAssignment(a)) => {
            tracing::info!(
                site_id = %a.site_id,
                lease_held = a.lease_held,
                lease_epoch = a.lease_epoch,
                bmcs = a.bmcs.len(),
                "site assignment received"
            );
            hooks.on_site_assignment(a);
        }
        Some(gateway_message::Msg::Spec(spec)) => {
            tracing::info!(generation = spec.generation, "spec received");
            if let Some(s) = hooks.on_spec(spec.generation, spec.spec.unwrap_or_default()) {
                let _ = link.send(agent_message::Msg::SpecStatus(s)).await;
            }
        }
        Some(gateway_message::Msg::Goodbye(g)) => {
            let reason = GoodbyeReason::try_from(g.reason).unwrap_or(GoodbyeReason::Unspecified);
            let why = format!(
                "gateway said Goodbye ({}): {}",
                reason.as_str_name(),
                g.message
            );
            if matches!(reason, GoodbyeReason::Revoked | GoodbyeReason::Deleted) {
                return Some(SessionEnd::Revoked(why));
            }
            return Some(SessionEnd::Retry(why));
        }
        Some(gateway_message::Msg::Command(c)) => {
            tracing::info!(command_id = %c.id, name = %c.name, "command received");
            p.executor.on_command(c, link.clone());
        }
        Some(gateway_message::Msg::Cancel(c)) => p.executor.on_cancel(&c.id, link),
        Some(gateway_message::Msg::Welcome(_)) | None => {}
    }
    None
}

#[cfg(test)]
mod heartbeat_phase_tests {
    use super::*;

    /// Sessions opened at the same instant spread their first heartbeats over the whole first
    /// period, never past it.
    #[test]
    fn sessions_opened_together_heartbeat_out_of_step() {
        let opened = tokio::time::Instant::now();
        let period = Duration::from_secs(10);
        let firsts: Vec<Duration> = (0..1_000)
            .map(|_| first_heartbeat(opened, period, rand::random::<f64>()) - opened)
            .collect();
        assert!(firsts.iter().all(|d| *d <= period), "one past the period");
        // Ten buckets of one second: every one holds some of the 1,000 (each is empty with
        // probability 0.9^1000).
        let mut buckets = [0u32; 10];
        for d in &firsts {
            let i = usize::try_from(d.as_secs()).unwrap_or(9).min(9);
            buckets[i] += 1;
        }
        assert!(buckets.iter().all(|&n| n > 0), "{buckets:?}");
        assert_eq!(first_heartbeat(opened, period, 0.0), opened);
        assert_eq!(first_heartbeat(opened, period, 7.0), opened + period);
    }
}
