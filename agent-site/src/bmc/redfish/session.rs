//! Redfish sessions (issue 31, rule 6): one per BMC, opened at the driver's first request where
//! the service root links a session collection, used by every request after it (the password
//! goes over the wire once), opened again once when the BMC answers 401 (it expired), and
//! deleted when the driver closes or goes. A BMC without sessions is spoken to with Basic
//! credentials, as before.
//!
//! A login answered 503 or 429 (every slot taken: BMCs keep four or five) is tried again after
//! a busy answer's pause ([`super::call::busy_wait`]: 1 s, doubling, up to 30 s, plus up to 50 %),
//! one not answered or answered another 5xx after the usual backoff, at most `retries` times; a
//! 401 is the credentials' refusal.

use nv_redfish::bmc_http::BmcCredentials;
use nv_redfish::bmc_http::reqwest::BmcError as HttpError;
use nv_redfish::core::{Bmc as _, NavProperty, ODataId, Raw, RepairError};
use serde_json::json;

use super::map::What;
use super::{Http, RedfishBmc};
use crate::bmc::BmcError;

/// Where the driver stands with its BMC's sessions.
#[derive(Debug)]
pub(super) enum State {
    /// Not looked at yet, or the session expired.
    Unknown,
    /// The BMC links no session collection: Basic credentials on every request.
    Basic,
    /// A session is open; its resource (deleted at the end).
    Open { location: ODataId },
}

/// Deletes the session at `location` through `http` (its token still set), logging a failure.
pub(super) async fn delete(http: &Http, location: &ODataId, address: &str) {
    match http.delete::<Raw>(location).await {
        Ok(_) => tracing::debug!(bmc = %address, "BMC session deleted"),
        Err(e) => tracing::info!(bmc = %address, error = %e, "deleting the BMC session failed"),
    }
}

impl RedfishBmc {
    /// Opens a session if the BMC offers them and none is open (see the module docs).
    pub(super) async fn ensure_session(&self) -> Result<(), BmcError> {
        let mut st = self.session.lock().await;
        if !matches!(*st, State::Unknown) {
            return Ok(());
        }
        let compat = self.compat().await?;
        let mut attempt = 0;
        let root = loop {
            match NavProperty::<Raw>::new_reference(ODataId::service_root())
                .get(compat)
                .await
            {
                Ok(r) => break r,
                Err(e) => {
                    let busy = super::call::busy(&e);
                    let e = self.classify(e, What::Root);
                    if !e.is_transient() || attempt >= self.policy.retries {
                        return Err(e);
                    }
                    self.fault();
                    self.pause(attempt, busy).await;
                    attempt += 1;
                }
            }
        };
        let Some(path) = root.value()["Links"]["Sessions"]["@odata.id"]
            .as_str()
            .map(str::to_owned)
        else {
            *st = State::Basic;
            return Ok(());
        };
        let body = json!({"UserName": self.user, "Password": self.secret.expose()});
        let mut attempt = 0;
        loop {
            let r = compat
                .create_session::<serde_json::Value, Raw>(&ODataId::from(path.clone()), &body)
                .await;
            let e = match r {
                Ok(s) => {
                    self.http
                        .set_credentials(BmcCredentials::token(s.auth_token));
                    tracing::debug!(bmc = %self.address, session = %s.location, "BMC session opened");
                    *st = State::Open {
                        location: s.location,
                    };
                    return Ok(());
                }
                Err(RepairError::Transport(HttpError::InvalidResponse { status, .. }))
                    if matches!(status.as_u16(), 404 | 405 | 501) =>
                {
                    // The link is there but sessions are not served after all.
                    *st = State::Basic;
                    return Ok(());
                }
                Err(e) => e,
            };
            let busy = super::call::busy(&e);
            let e = self.classify(e, What::Session);
            if !e.is_transient() || attempt >= self.policy.retries {
                return Err(e);
            }
            self.fault();
            tracing::info!(bmc = %self.address, error = %e, attempt, "no session at the BMC yet: trying again after a pause");
            self.pause(attempt, busy).await;
            attempt += 1;
        }
    }

    /// A 401 came: if it was a session's, it expired — the next request logs in again
    /// (`true`); with Basic credentials it is the password's refusal (`false`).
    pub(super) async fn session_expired(&self) -> bool {
        let mut st = self.session.lock().await;
        if !matches!(*st, State::Open { .. }) {
            return false;
        }
        tracing::info!(bmc = %self.address, "the BMC session expired: logging in again");
        *st = State::Unknown;
        self.http.set_credentials(BmcCredentials::new(
            self.user.clone(),
            self.secret.expose().to_owned(),
        ));
        true
    }

    /// Deletes the open session, if any.
    pub(super) async fn logout(&self) {
        let mut st = self.session.lock().await;
        if let State::Open { location } = std::mem::replace(&mut *st, State::Unknown) {
            delete(&self.http, &location, &self.address).await;
            self.http.set_credentials(BmcCredentials::new(
                self.user.clone(),
                self.secret.expose().to_owned(),
            ));
        }
    }
}
