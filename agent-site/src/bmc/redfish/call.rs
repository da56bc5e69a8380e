//! The request layer of the Redfish driver: every request to the BMC goes through [`RedfishBmc::
//! request`] (reads, polls) or [`RedfishBmc::change`] (a PATCH or an action).
//!
//! - A session is opened first where the BMC offers one, and opened again once when the BMC
//!   answers 401 to it (it expired).
//! - No answer, a 5xx or a 429 is retried up to `retries` times with exponential backoff and
//!   ±50 % jitter. A change is retried only after reading back that it did not take: what the
//!   BMC did is the result, not what it answered (issue 31, rules 1, 8 and 13).
//! - A BMC that says it is busy (503 or 429) is given longer: [`BUSY_BACKOFF`] before the first
//!   retry, doubling, never less (jitter only adds, up to 50 %), at most [`MAX_BACKOFF`] a wait —
//!   with the default 4 retries a request waits out at least 15 s of "busy" before it fails. Its
//!   `Retry-After` is not read: nv-redfish (0.22.1, the newest) hands a failed answer's status and
//!   body but not its headers, and its own retry policy, whose classifier sees them, only exists
//!   on a client it builds itself — one that cannot carry the BMC's certificate verifier
//!   ([`crate::bmc::tls`]). A login answered busy waits the same way ([`super::session`]).
//! - A request that ran into its timeout is not retried at once: the BMC may still be working on
//!   it, and it counts as in flight for one more request timeout ([`crate::bmc::Bmc::
//!   busy_until`]; rule 7).
//! - A change answered 202 is followed to the end of its task, and nothing else is sent to the
//!   BMC meanwhile: each request holds the driver's gate shared, a change and its task hold it
//!   alone (rule 2).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nv_redfish::bmc_http::reqwest::BmcError as HttpError;
use nv_redfish::core::{ModificationResponse, NavProperty, ODataId, Raw, RepairError};
use nv_redfish::quirks::CompatBmc;
use rand::Rng as _;
use serde_json::Value;
use std::time::Duration;

use tokio::time::Instant;

use super::map::{What, bmc_said, chain};
use super::{Compat, CompatErr, RedfishBmc, SYSTEMS};
use crate::bmc::BmcError;

/// One request through nv-redfish, borrowing only the platform layer it is sent through.
pub(super) type Sent<'c, T> = Pin<Box<dyn Future<Output = Result<T, CompatErr>> + Send + 'c>>;
/// A read-back: did the change take?
pub(super) type Check<'a> = Pin<Box<dyn Future<Output = Result<bool, BmcError>> + Send + 'a>>;

/// The first wait before retrying an answer that says the BMC is busy (503, 429); doubled per
/// retry.
pub(super) const BUSY_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait before one retry of a busy answer.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Whether `e` is an answer saying the BMC is busy: 503 Service Unavailable or 429 Too Many
/// Requests.
pub(super) fn busy(e: &CompatErr) -> bool {
    matches!(e, RepairError::Transport(HttpError::InvalidResponse { status, .. }) if matches!(status.as_u16(), 429 | 503))
}

/// The wait before retry `attempt` (0-based) of a busy answer, before jitter: [`BUSY_BACKOFF`]
/// doubled per attempt, at most [`MAX_BACKOFF`].
pub(super) fn busy_wait(attempt: u32) -> Duration {
    BUSY_BACKOFF
        .saturating_mul(2u32.saturating_pow(attempt))
        .min(MAX_BACKOFF)
}

/// Whether `e` is a request that ran into its timeout (the BMC may still be working on it).
pub(super) fn timed_out(e: &CompatErr) -> bool {
    matches!(e, RepairError::Transport(HttpError::ReqwestError(r)) if r.is_timeout())
}

impl RedfishBmc {
    pub(super) fn err(&self, make: fn(String, String) -> BmcError, detail: &str) -> BmcError {
        make(self.address.clone(), self.secret.scrub(detail))
    }

    /// A refusal (`status` 0: no HTTP answer), `detail` scrubbed.
    pub(super) fn refused(&self, status: u16, detail: &str) -> BmcError {
        BmcError::Refused {
            address: self.address.clone(),
            status,
            detail: self.secret.scrub(detail),
        }
    }

    /// Classifies a failed request about `what`.
    pub(super) fn classify(&self, e: CompatErr, what: What) -> BmcError {
        let unreachable = |a, d| BmcError::Unreachable {
            address: a,
            detail: d,
        };
        let auth = |a, d| BmcError::AuthFailed {
            address: a,
            detail: d,
        };
        let faulty = |a, d| BmcError::Faulty {
            address: a,
            detail: d,
        };
        let not_system = |a, d| BmcError::NotASystem {
            address: a,
            detail: d,
        };
        let tls = |a, d| BmcError::TlsMismatch {
            address: a,
            detail: d,
        };
        let w = what.as_str();
        let http = match e {
            RepairError::Decode(d) => return self.err(faulty, &format!("malformed {w}: {d}")),
            RepairError::Transport(h) => h,
        };
        match http {
            HttpError::ReqwestError(r) => {
                if let Some(why) = self.verifier.as_ref().and_then(|v| v.take_refusal()) {
                    return self.err(tls, &why);
                }
                if r.is_timeout() {
                    return self.err(unreachable, &format!("{w}: timed out: {}", chain(&r)));
                }
                if r.is_redirect() || r.is_decode() {
                    return self.err(faulty, &format!("{w}: {}", chain(&r)));
                }
                // Refused, reset, dropped mid-answer: no usable answer came.
                self.err(unreachable, &format!("{w}: {}", chain(&r)))
            }
            HttpError::InvalidResponse { status, text, .. } => {
                let code = status.as_u16();
                // A refusal of the credentials keeps no body at all: it is where a BMC echoes
                // what it was sent. Any other answer is scrubbed whole before what the BMC said
                // is taken from it (a cut must not leave half an encoded password behind).
                let detail = match code {
                    401 | 403 => format!(
                        "{w}: HTTP {status} (its body is not kept: a BMC may echo the credentials there)"
                    ),
                    _ => format!(
                        "{w}: HTTP {status}: {}",
                        bmc_said(&self.secret.scrub(&text))
                    ),
                };
                match code {
                    401 | 403 => self.err(auth, &detail),
                    404 if matches!(what, What::System | What::Systems) => {
                        self.err(not_system, &detail)
                    }
                    429 | 500..=599 => self.err(faulty, &detail),
                    _ => self.refused(code, &detail),
                }
            }
            HttpError::ActionNotSupported => {
                self.refused(0, &format!("the system offers no {w} action"))
            }
            other => self.err(faulty, &format!("{w}: {other}")),
        }
    }

    /// Waits before retry `attempt` (0-based): the backoff doubled per attempt, ±50 % jitter;
    /// after a busy answer ([`busy`]) [`busy_wait`], plus up to 50 %.
    pub(super) async fn pause(&self, attempt: u32, busy: bool) {
        let (base, factor) = if busy {
            (busy_wait(attempt), rand::rng().random_range(1.0..1.5))
        } else {
            (
                self.policy
                    .backoff
                    .saturating_mul(2u32.saturating_pow(attempt)),
                rand::rng().random_range(0.5..1.5),
            )
        };
        tokio::time::sleep(base.mul_f64(factor)).await;
    }

    /// A transient fault was retried.
    pub(super) fn fault(&self) {
        self.faults.fetch_add(1, Ordering::Relaxed);
    }

    /// Transient faults retried so far.
    pub(super) fn faults_so_far(&self) -> u32 {
        self.faults.load(Ordering::Relaxed)
    }

    /// A request was given up at its timeout: the BMC may work on it for one more timeout.
    pub(super) fn abandon(&self) {
        let until = Instant::now() + self.policy.request_timeout;
        let mut a = self.abandoned.lock();
        *a = Some(a.map_or(until, |t| t.max(until)));
    }

    /// The platform layer over the transport (reads the service root once).
    pub(super) async fn compat(&self) -> Result<&Compat, BmcError> {
        self.compat
            .get_or_try_init(|| async {
                let mut attempt = 0;
                loop {
                    match CompatBmc::classify(Arc::clone(&self.http)).await {
                        Ok(c) => return Ok(c),
                        Err(e) => {
                            let (slow, busy) = (timed_out(&e), busy(&e));
                            let e = self.classify(e, What::Root);
                            if slow {
                                self.abandon();
                            }
                            if slow || !e.is_transient() || attempt >= self.policy.retries {
                                return Err(e);
                            }
                            self.fault();
                            self.pause(attempt, busy).await;
                            attempt += 1;
                        }
                    }
                }
            })
            .await
    }

    /// One request (`f`, a read or a poll) under the driver's policy (see the module docs).
    pub(super) async fn request<T, F>(&self, what: What, mut f: F) -> Result<T, BmcError>
    where
        F: for<'c> FnMut(&'c Compat) -> Sent<'c, T>,
    {
        let mut attempt = 0;
        let mut relogged = false;
        loop {
            self.ensure_session().await?;
            let compat = self.compat().await?;
            let r = {
                let _shared = self.exclusive.read().await;
                f(compat).await
            };
            let e = match r {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let (slow, busy) = (timed_out(&e), busy(&e));
            let e = self.classify(e, what);
            if e.is_auth() && !relogged && self.session_expired().await {
                relogged = true;
                continue;
            }
            if slow {
                self.abandon();
                return Err(e);
            }
            if !e.is_transient() || attempt >= self.policy.retries {
                return Err(e);
            }
            self.fault();
            tracing::debug!(bmc = %self.address, error = %e, attempt, busy, "retrying a request");
            self.pause(attempt, busy).await;
            attempt += 1;
        }
    }

    /// GETs `id` as a raw document (annotations kept, the ETag in `@odata.etag`).
    pub(super) async fn read_raw(&self, id: &ODataId, what: What) -> Result<Arc<Raw>, BmcError> {
        self.request(what, |c| {
            let id = id.clone();
            Box::pin(async move { NavProperty::<Raw>::new_reference(id).get(c).await })
        })
        .await
    }

    /// GETs `id` as a `T`.
    pub(super) async fn read<T>(&self, id: &ODataId, what: What) -> Result<Arc<T>, BmcError>
    where
        T: nv_redfish::core::EntityTypeRef
            + for<'de> serde::Deserialize<'de>
            + 'static
            + Send
            + Sync,
    {
        self.request(what, |c| {
            let id = id.clone();
            Box::pin(async move { NavProperty::<T>::new_reference(id).get(c).await })
        })
        .await
    }

    /// A change (`send`: a PATCH or an action), under the driver's policy: a 202 is followed to
    /// its task's end with the gate held alone; a failure that may pass (no answer, a 5xx) is
    /// read back with `took` before it is called failed, and sent again only when the change
    /// did not take.
    pub(super) async fn change<'a, S, C>(
        &'a self,
        what: What,
        mut send: S,
        mut took: C,
    ) -> Result<(), BmcError>
    where
        S: for<'c> FnMut(&'c Compat) -> Sent<'c, ModificationResponse<Value>>,
        C: FnMut() -> Check<'a>,
    {
        let mut attempt = 0;
        let mut relogged = false;
        loop {
            self.ensure_session().await?;
            let compat = self.compat().await?;
            let e = {
                let _alone = self.exclusive.write().await;
                match send(compat).await {
                    Ok(ModificationResponse::Task(t)) => return self.follow(t, what).await,
                    Ok(_) => return Ok(()),
                    Err(e) => e,
                }
            };
            let (slow, busy) = (timed_out(&e), busy(&e));
            let e = self.classify(e, what);
            if e.is_auth() && !relogged && self.session_expired().await {
                relogged = true;
                continue;
            }
            if !e.is_transient() {
                return Err(e);
            }
            self.fault();
            if slow {
                self.abandon();
            }
            // What the BMC did is the result, not what it answered.
            match took().await {
                Ok(true) => {
                    tracing::info!(bmc = %self.address, error = %e, "{} answered with a fault but took effect", what.as_str());
                    return Ok(());
                }
                Ok(false) => {}
                Err(re) => {
                    tracing::debug!(bmc = %self.address, error = %re, "reading back after a fault failed");
                }
            }
            if slow || attempt >= self.policy.retries {
                return Err(e);
            }
            tracing::info!(bmc = %self.address, error = %e, attempt, "{} did not take: sending it again", what.as_str());
            self.pause(attempt, busy).await;
            attempt += 1;
        }
    }

    /// The system's path: the address's, or the service's only system.
    pub(super) async fn system_id(&self) -> Result<ODataId, BmcError> {
        self.system
            .get_or_try_init(|| async {
                if let Some(p) = &self.system_path {
                    return Ok(ODataId::from(p.clone()));
                }
                let systems: Arc<
                    nv_redfish::schema::computer_system_collection::ComputerSystemCollection,
                > = self
                    .read(&ODataId::from(SYSTEMS.to_owned()), What::Systems)
                    .await?;
                match systems.members.as_slice() {
                    [one] => Ok(one.id().clone()),
                    [] => Err(BmcError::NotASystem {
                        address: self.address.clone(),
                        detail: "the service lists no system".to_owned(),
                    }),
                    many => Err(BmcError::NotASystem {
                        address: self.address.clone(),
                        detail: format!(
                            "the service lists {} systems; name one in the address (…/redfish/v1/Systems/<id>)",
                            many.len()
                        ),
                    }),
                }
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn answered(code: u16) -> CompatErr {
        RepairError::Transport(HttpError::InvalidResponse {
            url: url::Url::parse("http://127.0.0.1/redfish/v1").unwrap(),
            status: reqwest::StatusCode::from_u16(code).unwrap(),
            text: String::new(),
        })
    }

    #[test]
    fn only_503_and_429_say_busy_and_their_waits_double_to_a_cap() {
        assert!(busy(&answered(503)));
        assert!(busy(&answered(429)));
        assert!(!busy(&answered(500)));
        assert!(!busy(&answered(404)));
        let waits: Vec<u64> = (0..7).map(|a| busy_wait(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(busy_wait(u32::MAX), MAX_BACKOFF);
        // The default 4 retries wait out at least 15 s of a busy BMC.
        assert_eq!(
            (0..4).map(busy_wait).sum::<Duration>(),
            Duration::from_secs(15)
        );
    }
}
