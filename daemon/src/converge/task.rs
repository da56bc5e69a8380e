//! The converge task: one loop that owns the applied state, applies each new generation,
//! retries a failed apply with backoff, and expires break-glass keys on time, connected or not.
//!
//! # Design
//! - A failed apply (any reason but `InvalidSpec`, which no retry can mend) is applied again
//!   after a wait drawn by [`bcd_core::backoff::Backoff`]: full jitter under a ceiling that
//!   starts at [`super::RETRY_BASE`] and doubles up to [`super::RETRY_MAX`]. A success or a new
//!   generation resets it. Every section is retried (GPU binding, break-glass SSH, writing
//!   `spec.json`), so a GPU that was busy, a home directory that appears or a state dir that had
//!   no space converge without a new spec. Each retry reports its SpecStatus like any apply.
//! - Expired keys are swept from the managed blocks on disk when the task starts (before any
//!   spec, whatever `spec.json` says) and at every expiry or [`super::EXPIRY_RECHECK`].
//! - The task never waits on its status channel: while the session is down nobody reads it,
//!   and a retry loop must not stop the expiry sweeps. A report equal to the last one is not
//!   sent again; when the channel is full the newest report waits in one slot ([`Outbox`]) and
//!   replaces an older one waiting there (the control plane only needs the newest).

use std::time::Duration;

use bc_protocol::pb;
use bcd_core::backoff::Backoff;
use tokio::sync::{mpsc, watch};

use super::{AppliedState, Applier, ApplyOutcome, Desired, EXPIRY_RECHECK, REASON_CONVERGED};

/// Reports on their way to the session, without ever blocking the task.
struct Outbox {
    tx: mpsc::Sender<pb::SpecStatus>,
    /// The last report handed over or waiting: an identical one is not sent again.
    last: Option<pb::SpecStatus>,
    /// The newest report that did not fit in the channel.
    waiting: Option<pb::SpecStatus>,
}

impl Outbox {
    fn new(tx: mpsc::Sender<pb::SpecStatus>) -> Self {
        Self {
            tx,
            last: None,
            waiting: None,
        }
    }

    /// Hands `r` over if there is room, else keeps it (the newest) for [`Outbox::flush`].
    fn send(&mut self, r: pb::SpecStatus) {
        if self.last.as_ref() == Some(&r) {
            return;
        }
        self.last = Some(r.clone());
        self.waiting = None;
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(r)) => self.waiting = Some(r),
            // The agent is shutting down; the state is saved already.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Resolves once the waiting report is in the channel; never while none waits.
    async fn flush(&mut self) {
        if self.waiting.is_none() {
            return std::future::pending().await;
        }
        if let Ok(permit) = self.tx.reserve().await
            && let Some(r) = self.waiting.take()
        {
            permit.send(r);
        } else {
            // Closed: nothing will ever read it.
            self.waiting = None;
        }
    }
}

/// How one apply ended, for the retry decision.
enum Reported {
    /// Converged, or superseded by a newer generation: nothing to retry.
    Done,
    /// Failed; `retry` unless retrying cannot help.
    Failed { retry: bool },
}

impl Applier {
    /// Runs the converge task until `desired`'s sender is dropped. Statuses go to `status`.
    pub fn spawn(
        self,
        desired: watch::Receiver<Desired>,
        status: mpsc::Sender<pb::SpecStatus>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(desired, status))
    }

    async fn run(
        self,
        mut desired: watch::Receiver<Desired>,
        status: mpsc::Sender<pb::SpecStatus>,
    ) {
        let mut outbox = Outbox::new(status);
        let state = match AppliedState::load(&self.state_dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "applied spec state unreadable; starting from none");
                AppliedState::default()
            }
        };
        // Keys expire from what is on disk, before and whatever the state says.
        let (mut state, mut disk_next) = self.expire_and_save(state).await;
        // Before the control plane answers, the last spec is the best desired state we have.
        let mut pending: Desired = desired.borrow_and_update().clone().or_else(|| {
            state
                .last_spec
                .as_ref()
                .map(|s| (state.last_generation, pb::NodeSpec::from(s)))
        });
        let mut current: Desired = None;
        let mut backoff = Backoff::new(self.retry_base, self.retry_max);
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            if let Some((generation, spec)) = pending.take() {
                let (s, reported) = self
                    .apply_and_report(state, generation, spec.clone(), &desired, &mut outbox)
                    .await;
                state = s;
                current = Some((generation, spec));
                retry_at = match reported {
                    Reported::Failed { retry: true } => {
                        let wait = backoff.next_delay();
                        tracing::info!(generation, retry_in = ?wait, "spec apply failed; retrying");
                        Some(tokio::time::Instant::now() + wait)
                    }
                    Reported::Failed { retry: false } | Reported::Done => {
                        backoff.reset();
                        None
                    }
                };
            }
            let now = (self.clock)();
            let next_expiry = match (state.next_expiry_ms(now), disk_next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let wait = next_expiry
                .map_or(EXPIRY_RECHECK, |at| {
                    Duration::from_millis(u64::try_from(at - now).unwrap_or(0))
                })
                .min(EXPIRY_RECHECK);
            let retry = async {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = desired.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    pending = desired.borrow_and_update().clone();
                    backoff.reset();
                    retry_at = None;
                }
                () = tokio::time::sleep(wait) => {
                    (state, disk_next) = self.expire_and_save(state).await;
                }
                () = retry => {
                    retry_at = None;
                    pending = current.clone();
                }
                () = outbox.flush() => {}
            }
        }
    }

    async fn apply_and_report(
        &self,
        state: AppliedState,
        generation: u64,
        spec: pb::NodeSpec,
        desired: &watch::Receiver<Desired>,
        outbox: &mut Outbox,
    ) -> (AppliedState, Reported) {
        let this = self.clone();
        let watch = desired.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut state = state;
            let superseded = || {
                watch
                    .borrow()
                    .as_ref()
                    .is_some_and(|(g, _)| *g > generation)
            };
            let outcome = this.apply(&mut state, generation, &spec, &superseded);
            (state, outcome)
        });
        let (mut state, outcome) = match job.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, generation, "spec apply panicked");
                outbox.send(failed(generation, "InternalError", &e.to_string()));
                let state = AppliedState::load(&self.state_dir).unwrap_or_default();
                return (state, Reported::Failed { retry: true });
            }
        };
        let report = match outcome {
            ApplyOutcome::Superseded => {
                tracing::info!(generation, "spec apply superseded by a newer generation");
                None
            }
            ApplyOutcome::Converged { message } => Some(pb::SpecStatus {
                generation,
                converged: true,
                reason: REASON_CONVERGED.to_owned(),
                message,
            }),
            ApplyOutcome::Failed { reason, message } => {
                tracing::warn!(generation, %reason, %message, "spec did not converge");
                Some(failed(generation, &reason, &message))
            }
        };
        let report = match state.save(&self.state_dir) {
            Ok(()) => report,
            Err(e) => {
                // Converged on the host but not remembered: a restart would report an older
                // observedGeneration, so this generation is not claimed either.
                tracing::error!(error = %e, "cannot persist applied spec");
                if report.as_ref().is_some_and(|r| r.converged) {
                    state.observed_generation =
                        AppliedState::load(&self.state_dir).map_or(0, |s| s.observed_generation);
                }
                report.map(|_| failed(generation, "StateWriteFailed", &e.to_string()))
            }
        };
        let reported = match &report {
            Some(r) if !r.converged => Reported::Failed {
                retry: r.reason != "InvalidSpec",
            },
            _ => Reported::Done,
        };
        if let Some(r) = report {
            outbox.send(r);
        }
        (state, reported)
    }

    /// Sweeps expired keys (state and disk) and saves the state when it changed; returns it with
    /// the earliest expiry left on disk.
    async fn expire_and_save(&self, state: AppliedState) -> (AppliedState, Option<i64>) {
        let this = self.clone();
        let job = tokio::task::spawn_blocking(move || {
            let mut state = state;
            let expiry = this.expire_keys(&mut state);
            if expiry.state_changed
                && let Err(e) = state.save(&this.state_dir)
            {
                tracing::error!(error = %e, "cannot persist key expiry");
            }
            (state, expiry.next_expiry_ms)
        });
        match job.await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "key expiry panicked");
                (
                    AppliedState::load(&self.state_dir).unwrap_or_default(),
                    None,
                )
            }
        }
    }
}

fn failed(generation: u64, reason: &str, message: &str) -> pb::SpecStatus {
    pb::SpecStatus {
        generation,
        converged: false,
        reason: reason.to_owned(),
        message: message.to_owned(),
    }
}
