//! A node's whole life with the control plane, the same for every mode: an identity (the
//! stored one, or a join with a token), then sessions ([`crate::session::run_once`]) until the
//! identity dies or a stop is requested — reconnecting with exponential backoff and full jitter,
//! renewing the certificate when it is due and promoting the new one once it opened a session,
//! retiring a revoked identity and waiting for a new token (never retrying the one in use when
//! the identity died).
//!
//! The control plane may have several gateway URLs (replicas): joins and sessions go to them
//! in one shuffled order, round-robin ([`crate::endpoints::Endpoints`]). A join moves on to the
//! next URL when one cannot be reached and stops at the first answer; a session that fails to
//! open or breaks is followed by an attempt at the next URL. Every attempt waits a jittered
//! backoff first; its ceiling doubles once per round of failures (every URL once) and resets
//! once a session is acknowledged. One session at a time: the next attempt starts only after
//! the last one ended.
//!
//! Each identity in use runs inside a `node` span (`node_id`), each session attempt inside a
//! `session` span (`epoch`, recorded at Welcome).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::endpoints::Endpoints;
use crate::executor::Executor;
use crate::identity::IdentityStore;
use crate::join::{JoinError, JoinParams};
use crate::mode::{Machine, Observer, SessionHooks, TokenSource};
use crate::session::{SessionEnd, SessionParams, SessionState};
use crate::state::{Identity, StateError, cert_validity};
use crate::tls::TlsError;

/// How often a node without identity or token looks for a new token.
pub const TOKEN_RECHECK: Duration = Duration::from_secs(30);

/// Settings of the lifecycle.
#[derive(Debug, Clone)]
pub struct LifecycleConfig {
    /// Gateway URLs (one per control-plane replica) to join and hold sessions with, tried in a
    /// shuffled order. Empty: a stored identity's own (`node.json`), and no join.
    pub control_planes: Vec<String>,
    /// CA pin to join with.
    pub ca_pin: Option<String>,
    /// First reconnect wait ceiling; doubles per failure.
    pub reconnect_base: Duration,
    /// Largest reconnect wait.
    pub reconnect_max: Duration,
    /// Retry even a join the control plane refused (the simulator's nodes never give up); the
    /// node agent stops instead when it never joined, or waits for a new token when it did.
    pub retry_refused_joins: bool,
    /// Outbound messages a session queues at most.
    pub outbound_capacity: usize,
}

/// Why the lifecycle stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The identity store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// No identity, and no control plane URL or CA pin to join with.
    #[error("no identity and no control plane URL and CA pin to join with")]
    NoJoinTarget,
    /// No identity, no join token, and no token file that could bring one.
    #[error("no identity and no join token")]
    NoToken,
    /// The first join was refused or cannot work (pin mismatch, bad token, ...).
    #[error(transparent)]
    Join(#[from] JoinError),
    /// The stored key, certificate or CA bundle is unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// What the lifecycle runs with.
#[derive(Debug)]
pub struct Lifecycle<'a, M, S, T> {
    /// Settings.
    pub config: &'a LifecycleConfig,
    /// The node's executor (and through it, its machine).
    pub executor: &'a Arc<Executor<M>>,
    /// Where the identity lives.
    pub store: &'a S,
    /// Where join tokens come from.
    pub tokens: &'a T,
}

/// Where the lifecycle goes after an identity's sessions ended.
enum Next {
    /// Stop requested.
    Stop,
    /// The identity died: get another.
    Rejoin,
}

/// Mutable state of one run.
struct Run<'a, 'h, M, S, T, H> {
    lc: &'a Lifecycle<'a, M, S, T>,
    hooks: &'h mut H,
    stop: watch::Receiver<bool>,
    backoff: Backoff,
    joined_once: bool,
    /// A token in use when the identity died is never tried again: only a new one re-joins.
    stale_token: Option<String>,
    /// Where joins and sessions go: the configured URLs, else the identity's.
    endpoints: Option<Endpoints>,
}

/// Runs the node until `stop` turns true (Ok) or a fatal error.
pub async fn run<M, S, T, H>(
    lc: &Lifecycle<'_, M, S, T>,
    hooks: &mut H,
    stop: watch::Receiver<bool>,
) -> Result<(), LifecycleError>
where
    M: Machine,
    S: IdentityStore,
    T: TokenSource,
    H: SessionHooks + Observer,
{
    let mut run = Run {
        lc,
        backoff: Backoff::new(lc.config.reconnect_base, lc.config.reconnect_max),
        hooks,
        stop,
        joined_once: false,
        stale_token: None,
        endpoints: Endpoints::shuffled(&lc.config.control_planes),
    };
    let outcome = run.all().await;
    run.hooks.stopped();
    outcome
}

impl<M, S, T, H> Run<'_, '_, M, S, T, H>
where
    M: Machine,
    S: IdentityStore,
    T: TokenSource,
    H: SessionHooks + Observer,
{
    async fn all(&mut self) -> Result<(), LifecycleError> {
        loop {
            let Some(identity) = self.identity().await? else {
                return Ok(());
            };
            self.joined_once = true;
            self.backoff.reset();
            if !self.usable(&identity)? {
                continue;
            }
            let span = tracing::info_span!("node", node_id = %identity.node.node_id);
            match self.sessions(identity).instrument(span).await? {
                Next::Stop => return Ok(()),
                Next::Rejoin => continue,
            }
        }
    }

    /// Sleeps `d` unless a stop comes first; `false` when it did.
    async fn sleep(&mut self, d: Duration) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            () = crate::session::stopped(&mut self.stop) => false,
        }
    }

    /// Where the sessions of `id` go: the configured URLs, else (nothing configured) the one it
    /// joined at, kept in `node.json`. The configuration wins because it says where the control
    /// plane is now (it moved, or `bcctl dev --state-dir` restarted it on another port); the
    /// certificate still proves the same identity to the same CA. `node.json` is left as it is.
    fn use_endpoints_for(&mut self, id: &Identity) {
        let joined_at = &id.node.control_plane;
        match &self.endpoints {
            None => self.endpoints = Endpoints::in_order(std::slice::from_ref(joined_at)),
            Some(e) if self.lc.config.control_planes.is_empty() => {
                // The URL of an earlier identity: this one's replaces it.
                if e.urls() != std::slice::from_ref(joined_at) {
                    self.endpoints = Endpoints::in_order(std::slice::from_ref(joined_at));
                }
            }
            Some(e) if !e.urls().contains(joined_at) => tracing::info!(
                joined_at = %joined_at,
                configured = ?e.urls(),
                "the configured control plane differs from the one this node joined at; using the configured one"
            ),
            Some(_) => {}
        }
    }

    /// The stored identity, or a new one from a join; `None` when a stop came first.
    async fn identity(&mut self) -> Result<Option<Arc<Identity>>, LifecycleError> {
        loop {
            match self.lc.store.load_checked() {
                Ok(Some(id)) => {
                    tracing::info!(node_id = %id.node.node_id, identity_generation = id.node.identity_generation, "using stored identity");
                    self.use_endpoints_for(&id);
                    return Ok(Some(id));
                }
                Ok(None) => {}
                Err(e) if e.is_broken() => {
                    if !self.broken_identity(e).await? {
                        return Ok(None);
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            let cfg = self.lc.config;
            let pin = match cfg.ca_pin.as_deref() {
                Some(pin) if !cfg.control_planes.is_empty() => pin,
                _ => return Err(LifecycleError::NoJoinTarget),
            };
            let fresh = self
                .lc
                .tokens
                .token()
                .filter(|t| self.stale_token.as_ref() != Some(t));
            let Some(token) = fresh else {
                if !self.joined_once && self.stale_token.is_none() && !self.lc.tokens.can_wait() {
                    return Err(LifecycleError::NoToken);
                }
                self.hooks.waiting_for_token("waiting for a new join token");
                tracing::error!(
                    "no identity and no new join token: waiting for one (join_token_file is re-read every 30 s)"
                );
                if !self.sleep(TOKEN_RECHECK).await {
                    return Ok(None);
                }
                continue;
            };
            match self.join_round(&token, pin).await {
                Ok(id) => {
                    let id = Arc::new(id);
                    self.lc.store.save(&id)?;
                    tracing::info!(node_id = %id.node.node_id, identity_generation = id.node.identity_generation, control_plane = %id.node.control_plane, "joined");
                    self.hooks.joined(&id);
                    self.use_endpoints_for(&id);
                    return Ok(Some(id));
                }
                Err(e) => {
                    self.hooks.join_failed(&e);
                    if !self.lc.config.retry_refused_joins && e.is_fatal() {
                        if !self.joined_once {
                            return Err(e.into());
                        }
                        // After a revocation: never retry the same token; wait for a new one.
                        tracing::error!(error = %e, "re-join refused; waiting for a new join token (never retrying the same one)");
                        self.hooks
                            .waiting_for_token(&format!("re-join refused: {e}"));
                        self.stale_token = Some(token);
                        continue;
                    }
                    let wait = self.backoff.next_delay();
                    tracing::warn!(error = %e, retry_in = ?wait, "join failed; retrying");
                    if !self.sleep(wait).await {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// One round of join attempts with `token`: the URLs in turn from the current one, moving
    /// on while a replica cannot be reached, stopping at the first answer. A retryable answer
    /// (`UNAVAILABLE`, ...) leaves the next round to begin at the next URL. When no URL answered,
    /// the last failure: a connect error (retried after a backoff) if any URL gave one, else a
    /// pin mismatch (fatal, as with one URL: the pin or the list is wrong).
    async fn join_round(&mut self, token: &str, pin: &str) -> Result<Identity, JoinError> {
        let urls = self.endpoints.as_ref().map_or(0, Endpoints::len);
        let mut last_connect = None;
        let mut tried = 0;
        loop {
            let url = self
                .endpoints
                .as_ref()
                .map(|e| e.current().to_owned())
                .unwrap_or_default();
            self.hooks.joining(&url);
            let params = JoinParams {
                control_plane: &url,
                token,
                ca_pin: pin,
            };
            let e = match crate::join::join(self.lc.executor.machine().as_ref(), &params).await {
                Ok(id) => {
                    if let Some(eps) = self.endpoints.as_mut() {
                        eps.succeeded();
                    }
                    return Ok(id);
                }
                Err(e) => e,
            };
            let moves_on = e.tries_next();
            if (moves_on || (matches!(e, JoinError::Refused(_)) && !e.is_fatal()))
                && let Some(eps) = self.endpoints.as_mut()
            {
                eps.failed();
            }
            tried += 1;
            if !moves_on {
                return Err(e);
            }
            let mismatch = matches!(e, JoinError::PinMismatch { .. });
            if tried >= urls {
                return Err(if mismatch {
                    last_connect.unwrap_or(e)
                } else {
                    e
                });
            }
            if mismatch {
                tracing::error!(control_plane = %url, error = %e, "trying the next control plane URL");
            } else {
                tracing::warn!(control_plane = %url, error = %e, "control plane unreachable; trying the next URL");
                last_connect = Some(e);
            }
        }
    }

    /// A stored identity that cannot be used (`e` names the file). With a new join token at hand
    /// it is retired like a revoked one (moved aside, with a note) and `true` lets the join
    /// follow; without one the lifecycle stops with `e` (it says what to do), or waits for a
    /// token file and returns `false` when a stop came first.
    async fn broken_identity(&mut self, e: StateError) -> Result<bool, LifecycleError> {
        let why = e.to_string();
        let fresh = self
            .lc
            .tokens
            .token()
            .is_some_and(|t| self.stale_token.as_ref() != Some(&t));
        if fresh {
            tracing::error!(error = %why, "the stored node identity is broken: moving it aside and joining again with the join token given");
            self.lc.store.retire(&format!(
                "broken identity moved aside before a new join: {why}"
            ))?;
            self.hooks.identity_broken(&why, true);
            return Ok(true);
        }
        if !self.lc.tokens.can_wait() {
            return Err(e.into());
        }
        self.hooks.identity_broken(&why, false);
        tracing::error!(error = %why, "the stored node identity is broken and there is no join token: waiting for one (join_token_file is re-read every 30 s)");
        Ok(self.sleep(TOKEN_RECHECK).await)
    }

    /// Takes `identity` into use; `false` (and the identity retired) when its certificate expired
    /// while the node was off.
    fn usable(&mut self, identity: &Identity) -> Result<bool, LifecycleError> {
        self.hooks.identity_ready(identity);
        let expired = cert_validity(&identity.cert_pem)
            .is_some_and(|v| v.not_after_ms < chrono::Utc::now().timestamp_millis());
        if expired {
            let why = "the node certificate expired while the agent was off: join again with a new token (see the operator guide)";
            tracing::error!("{why}");
            self.lc.store.retire(why)?;
        }
        Ok(!expired)
    }

    /// Sessions with `current` until it dies or a stop.
    async fn sessions(&mut self, mut current: Arc<Identity>) -> Result<Next, LifecycleError> {
        let tls_for = |id: &Identity, key: &str, cert: &str| {
            crate::tls::session_config(&id.ca_pem, cert, key)
        };
        let mut tls = tls_for(&current, &current.key_pem, &current.cert_pem)?;
        // Drawn once per certificate, not per session: a reconnect storm parses no certificates.
        let mut renew = renew_at(&current.cert_pem);
        let mut pending: Option<(String, String)> = None;
        loop {
            let (end, welcomed) = self.attempt(&current, &tls, renew, pending.as_ref()).await;
            // A renewed certificate that opened a session is now the one; one that did not is
            // dropped and the old one (still valid) is used again.
            if let Some((k, c)) = pending.take() {
                if welcomed {
                    let id = Arc::make_mut(&mut current);
                    id.key_pem = k;
                    id.cert_pem = c;
                    tracing::info!("renewed certificate in use and stored");
                } else {
                    tls = tls_for(&current, &current.key_pem, &current.cert_pem)?;
                    renew = renew_at(&current.cert_pem);
                    tracing::warn!(
                        "the renewed certificate did not open a session; keeping the old one"
                    );
                }
            }
            match end {
                SessionEnd::Shutdown => return Ok(Next::Stop),
                SessionEnd::Revoked(why) => {
                    self.retire_revoked(&why)?;
                    return Ok(Next::Rejoin);
                }
                SessionEnd::Refused(why) => {
                    self.retire_refused(&why)?;
                    return Ok(Next::Rejoin);
                }
                SessionEnd::Rotate { key_pem, cert_pem } => {
                    tracing::info!("certificate renewed; reconnecting with it");
                    tls = tls_for(&current, &key_pem, &cert_pem)?;
                    renew = renew_at(&cert_pem);
                    pending = Some((key_pem, cert_pem));
                }
                SessionEnd::Retry(reason) => {
                    let wait = self.next_wait();
                    self.hooks.disconnected(&reason, wait);
                    tracing::debug!(reason = %reason, retry_in = ?wait, "session ended; reconnecting");
                    if !self.sleep(wait).await {
                        return Ok(Next::Stop);
                    }
                }
            }
        }
    }

    /// After a session attempt that failed or broke: the next attempt goes to the next URL,
    /// after a wait drawn under the backoff's ceiling, which doubles only when this completed a
    /// round (every URL failed once). With one URL every failure does, as without a list.
    fn next_wait(&mut self) -> Duration {
        match self.endpoints.as_mut() {
            Some(e) => e.wait_after_failure(&mut self.backoff),
            None => self.backoff.next_delay(),
        }
    }

    /// One session attempt with `current` (or the just-renewed `pending` key and certificate,
    /// which `tls` carries) at the current URL, renewing at `renew_at`; returns how it ended and
    /// whether it had opened.
    async fn attempt(
        &mut self,
        current: &Identity,
        tls: &Arc<rustls::ClientConfig>,
        renew_at: Option<tokio::time::Instant>,
        pending: Option<&(String, String)>,
    ) -> (SessionEnd, bool) {
        let url = self.endpoints.as_ref().map_or_else(
            || current.node.control_plane.clone(),
            |e| e.current().to_owned(),
        );
        // Commands arrive only on the session that opens here: their uploads go to its replica.
        self.lc.executor.set_upload(url.clone(), Arc::clone(tls));
        let mut welcomed = false;
        let params = SessionParams {
            identity: current,
            control_plane: &url,
            tls: Arc::clone(tls),
            executor: self.lc.executor,
            outbound_capacity: self.lc.config.outbound_capacity,
            renew_at,
            promote: pending
                .map(|(k, c)| (self.lc.store as &dyn IdentityStore, k.as_str(), c.as_str())),
        };
        let state = SessionState {
            stop: &mut self.stop,
            backoff: &mut self.backoff,
            welcomed: &mut welcomed,
        };
        let span = tracing::info_span!("session", epoch = tracing::field::Empty);
        let end = crate::session::run_once(params, state, self.hooks)
            .instrument(span)
            .await;
        if welcomed && let Some(e) = self.endpoints.as_mut() {
            e.succeeded();
        }
        self.hooks.session_closed(&end, welcomed);
        (end, welcomed)
    }

    /// The gateway said this identity is revoked (or the node deleted): it is retired and never
    /// used again, and the token that made it is never tried again.
    fn retire_revoked(&mut self, why: &str) -> Result<(), LifecycleError> {
        // Retire first: once the log says so, the identity files are already gone.
        self.lc.store.retire(why)?;
        self.hooks.revoked(why);
        tracing::error!(reason = %why, "this node's identity was revoked: it is retired and never used again; a new join token is needed");
        self.stale_token = self.lc.tokens.token();
        Ok(())
    }
}

impl<M, S, T, H> Run<'_, '_, M, S, T, H>
where
    M: Machine,
    S: IdentityStore,
    T: TokenSource,
    H: SessionHooks + Observer,
{
    /// The gateway refuses this identity for good (see [`SessionEnd::Refused`]): like a
    /// revocation, it is retired (kept aside for people, with the gateway's words) and only a
    /// new join token brings the node back. No reconnect loop.
    fn retire_refused(&mut self, why: &str) -> Result<(), LifecycleError> {
        let why = format!(
            "the control plane refuses this node identity ({why}); it is moved aside: give the agent a new join token (--join-token, or a token in join_token_file) to join again"
        );
        self.lc.store.retire(&why)?;
        self.hooks.refused(&why);
        tracing::error!(reason = %why, "session refused for good; not reconnecting");
        self.stale_token = self.lc.tokens.token();
        Ok(())
    }
}

/// When to renew: a random point between 70 % and 90 % of the certificate's life, counted from
/// when it was issued (notBefore is backdated 5 minutes for clock skew).
pub fn renew_at(cert_pem: &str) -> Option<tokio::time::Instant> {
    use rand::Rng;
    let v = cert_validity(cert_pem)?;
    let issued = v.not_before_ms + 5 * 60 * 1000;
    let issued = issued.min(v.not_after_ms);
    let life = (v.not_after_ms - issued).max(1);
    let at_ms = issued + (life as f64 * rand::rng().random_range(0.7..0.9)) as i64;
    let wait = at_ms - chrono::Utc::now().timestamp_millis();
    Some(tokio::time::Instant::now() + Duration::from_millis(u64::try_from(wait).unwrap_or(0)))
}

#[cfg(test)]
#[path = "broken_identity_tests.rs"]
mod broken_identity_tests;
#[cfg(test)]
#[path = "replica_tests.rs"]
mod replica_tests;
#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod tests;
