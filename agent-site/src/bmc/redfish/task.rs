//! A change the BMC accepted with 202 is not done (issue 31, rule 2): its task monitor
//! (`Location`, or the `Task` the answer names) is polled, honouring `Retry-After` (bounded to
//! [`MIN_WAIT`]..[`MAX_WAIT`], [`DEFAULT_WAIT`] without one), until the task ends. `Completed`
//! (or the operation's own answer) is done; `Exception`, `Killed`, `Cancelled` or a task that
//! outlives the operation's limit is a failure naming the task's messages. The caller holds the
//! driver's gate alone meanwhile, so nothing else reaches the BMC until the task ended; the
//! change is read back afterwards.

use std::time::Duration;

use nv_redfish::core::{AsyncTask, Bmc as _, ModificationResponse, ODataId};
use serde_json::Value;
use tokio::time::Instant;

use super::RedfishBmc;
use super::map::{What, messages};
use crate::bmc::BmcError;

/// Shortest wait between two polls.
const MIN_WAIT: Duration = Duration::from_millis(500);
/// Longest wait between two polls, whatever `Retry-After` says.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Wait between polls when the BMC gives no `Retry-After`.
const DEFAULT_WAIT: Duration = Duration::from_secs(1);
/// Polls at most (with [`MIN_WAIT`], a task of over 10 minutes).
const MAX_POLLS: u32 = 1200;

/// Task states of a task still running (DMTF `Task.TaskState`).
const RUNNING: &[&str] = &[
    "New",
    "Starting",
    "Running",
    "Pending",
    "Stopping",
    "Suspended",
    "Service",
    "Interrupted",
];

impl RedfishBmc {
    /// Follows `task`, begun by a change about `what`, to its end (see the module docs).
    pub(super) async fn follow(&self, task: AsyncTask, what: What) -> Result<(), BmcError> {
        let started = Instant::now();
        let mut location: ODataId = task.location.0;
        let mut wait = task.retry_after;
        let mut errors = 0;
        tracing::info!(bmc = %self.address, task = %location, "{} runs as a task: following it", what.as_str());
        for _ in 0..MAX_POLLS {
            tokio::time::sleep(wait.unwrap_or(DEFAULT_WAIT).clamp(MIN_WAIT, MAX_WAIT)).await;
            if started.elapsed() > self.policy.task_limit {
                return Err(BmcError::Faulty {
                    address: self.address.clone(),
                    detail: format!(
                        "{} ran as task {location}, which did not end within {:?}",
                        what.as_str(),
                        self.policy.task_limit
                    ),
                });
            }
            let compat = self.compat().await?;
            match compat.poll::<Value>(&location).await {
                Ok(ModificationResponse::Task(t)) => {
                    location = t.location.0;
                    wait = t.retry_after;
                }
                Ok(ModificationResponse::Entity(v)) => {
                    match v.get("TaskState").and_then(Value::as_str) {
                        Some(s) if RUNNING.contains(&s) => wait = None,
                        Some("Completed") | None => return Ok(()),
                        Some(s) => {
                            let said = messages(v.get("Messages")).join("; ");
                            return Err(BmcError::Refused {
                                address: self.address.clone(),
                                status: 0,
                                detail: self.secret.scrub(&format!(
                                    "{} ran as task {location} and ended {s}{}{said}",
                                    what.as_str(),
                                    if said.is_empty() { "" } else { ": " }
                                )),
                            });
                        }
                    }
                }
                Ok(_) => return Ok(()),
                Err(e) => {
                    let e = self.classify(e, What::Task);
                    if !e.is_transient() || errors >= self.policy.retries {
                        return Err(e);
                    }
                    self.fault();
                    errors += 1;
                    wait = None;
                }
            }
        }
        Err(BmcError::Faulty {
            address: self.address.clone(),
            detail: format!(
                "{} ran as task {location}, still running after {MAX_POLLS} polls",
                what.as_str()
            ),
        })
    }
}
