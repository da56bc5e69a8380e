//! Agent reports: the one door through which what an agent sends over its session enters the
//! core ([`Core::report`]), as the operator verbs enter through [`Core::dispatch`].
//!
//! # Design
//! The gateway keeps the stream: Hello, Welcome, heartbeats and their acknowledgements, the
//! per-node bound on reports, the order of a session's reports. Everything else an agent says is
//! an [`AgentReport`] handed here with the session's epoch; the core chooses its transaction
//! (a node's own write, [`cpl_store::Store::write_node`], for what only touches that node), tries
//! it again while the store is unavailable, parses what travels as JSON (the inventory document,
//! an XID event as [`XidEvent`]) and does what the report means after its commit (a site agent
//! whose `bmc.verify` ended gets its new assignment). It returns the [`Effect`]s, for the
//! session's log and for tests.

use std::time::Duration;

use bc_protocol::commands::EventType;
use bc_protocol::commands::xid::XidEvent;
use bc_protocol::pb::{self, agent_message};
use bc_protocol::{CommandName, ProvisionState};
use cpl_store::StoreError;
use sha2::Digest;

use crate::bare_metal::power::ReportOutcome;
use crate::error::OpError;
use crate::reports::{self, InventoryReport, SpecReport};
use crate::sessions;
use crate::verbs::Core;

/// Largest inventory document accepted, bytes (the agent shrinks a bigger one before sending).
pub const MAX_INVENTORY_BYTES: usize = bc_protocol::MAX_INVENTORY_BYTES;

/// How long a report's write is tried again while the store is unavailable (PostgreSQL down, or
/// its connections all busy past `--store-timeout` in a storm) before it is given up.
const RETRY_UNAVAILABLE_FOR: Duration = Duration::from_secs(120);

/// What an agent reported over its session: every message but the session's own (Hello,
/// Heartbeat), plus the end of a stream that broke.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentReport {
    /// Its inventory document, hardware key and identifiers.
    Inventory(pb::Inventory),
    /// How applying its spec went.
    SpecStatus(pb::SpecStatus),
    /// A command's progress or end.
    CommandUpdate(pb::CommandUpdate),
    /// An event: an XID (`type: xid`, its data an [`XidEvent`]) or one only logged.
    Event(pb::Event),
    /// A site agent's observations of its BMCs' power.
    Power(pb::PowerReport),
    /// The agent ended its session.
    Goodbye(pb::Goodbye),
    /// The stream ended without a Goodbye and without the gateway ending it.
    Broken,
}

impl AgentReport {
    /// The report `msg` carries; `None` for what the session answers itself (Hello, Heartbeat).
    pub fn from_message(msg: agent_message::Msg) -> Option<Self> {
        use agent_message::Msg;
        Some(match msg {
            Msg::Inventory(i) => Self::Inventory(i),
            Msg::SpecStatus(s) => Self::SpecStatus(s),
            Msg::CommandUpdate(u) => Self::CommandUpdate(u),
            Msg::Event(e) => Self::Event(e),
            Msg::PowerReport(p) => Self::Power(p),
            Msg::Goodbye(g) => Self::Goodbye(g),
            Msg::Hello(_) | Msg::Heartbeat(_) => return None,
        })
    }

    /// The `kind` label of a report that costs a store write (the gateway bounds them per node
    /// and counts the dropped ones by it); `None` for the end of a session.
    pub fn kind(&self) -> Option<&'static str> {
        match self {
            Self::Inventory(_) => Some("inventory"),
            Self::SpecStatus(_) => Some("specStatus"),
            Self::CommandUpdate(_) => Some("commandUpdate"),
            Self::Event(_) => Some("event"),
            Self::Power(_) => Some("powerReport"),
            Self::Goodbye(_) | Self::Broken => None,
        }
    }
}

/// What a report did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Applied (written where it changes something).
    Recorded,
    /// An inventory was recorded; the node's provision state after it (acceptance, a ramdisk
    /// workflow's step).
    Inventory(ProvisionState),
    /// A site agent's verification (or credential rotation) is over: its new assignment went to
    /// its session (when live).
    AssignmentSent(String),
    /// Nothing was recorded, and why (a document too large or not JSON, an XID that is not its
    /// contract, a power report of a stale lease, a command of no such node, the node gone).
    Ignored(String),
}

impl Core {
    /// A session opens (the agent's Hello), in the node's own write: a new epoch, `connected`,
    /// the spec to send. `None` when the node no longer exists. Errors: the store's.
    pub async fn open_session(
        &self,
        open: sessions::SessionOpen,
    ) -> Result<Option<sessions::Opened>, OpError> {
        self.store
            .write_node(open.node_id.clone(), move |tx| sessions::open(tx, &open))
            .await
    }

    /// Applies `report` of node `node_id`'s session at `epoch` (a report of an older epoch
    /// changes nothing), then what it means after the commit. Errors: the store's, after the
    /// retries of an unavailable one.
    pub async fn report(
        &self,
        node_id: &str,
        epoch: u64,
        report: AgentReport,
    ) -> Result<Vec<Effect>, OpError> {
        match report {
            AgentReport::Inventory(inv) => self.report_inventory(node_id, epoch, inv).await,
            AgentReport::SpecStatus(s) => {
                retry_unavailable("recording SpecStatus", || {
                    let (id, s) = (node_id.to_owned(), s.clone());
                    self.store.write_node(id.clone(), move |tx| {
                        let report = SpecReport {
                            generation: s.generation,
                            converged: s.converged,
                            reason: &s.reason,
                            message: &s.message,
                        };
                        reports::record_spec_status(tx, &id, epoch, &report)
                    })
                })
                .await?;
                Ok(vec![Effect::Recorded])
            }
            AgentReport::CommandUpdate(u) => {
                // Nothing a BMC echoed reaches the store, whatever the site agent did (30.5).
                let u = self.bare_metal.scrub_update(node_id, u).await;
                let Some(c) = self.commands.update(node_id, u).await else {
                    return Ok(vec![Effect::Ignored(
                        "no command of this node took the update".to_owned(),
                    )]);
                };
                let mut effects = vec![Effect::Recorded];
                // A verified BMC is synced (with the certificate pinned at the verification),
                // a rotation's new pair replaces the old one or is dropped: the site agent
                // learns it at once.
                if c.state.is_final() && c.name == CommandName::BmcVerify {
                    self.bare_metal.push_assignment(node_id).await;
                    effects.push(Effect::AssignmentSent(node_id.to_owned()));
                }
                Ok(effects)
            }
            AgentReport::Event(ev) if ev.r#type == EventType::Xid.as_str() => {
                tracing::warn!(message = %ev.message, "XID reported");
                match serde_json::from_slice::<XidEvent>(&ev.data_json) {
                    Ok(xid) => {
                        crate::health::on_xid(&self.store, node_id, &xid).await;
                        // An application-class XID: the workload's fault, or the node's.
                        crate::remediation::workload::on_xid(&self.store, node_id, &xid).await;
                        Ok(vec![Effect::Recorded])
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "XID event is not its contract; ignored");
                        Ok(vec![Effect::Ignored(format!(
                            "the XID event is not its contract: {e}"
                        ))])
                    }
                }
            }
            AgentReport::Event(ev) => {
                tracing::info!(r#type = %ev.r#type, message = %ev.message, "agent event");
                Ok(Vec::new())
            }
            AgentReport::Power(r) => {
                let r = self.bare_metal.scrub_power(r).await;
                let observations = r.observations.len();
                Ok(vec![match self.bare_metal.power_report(node_id, r).await {
                    ReportOutcome::Applied(changed) => {
                        tracing::debug!(observations, changed, "power report applied");
                        Effect::Recorded
                    }
                    ReportOutcome::Ignored(why) => {
                        tracing::warn!(observations, reason = %why, "power report ignored");
                        Effect::Ignored(why)
                    }
                }])
            }
            AgentReport::Goodbye(g) => {
                let reason = pb::GoodbyeReason::try_from(g.reason)
                    .map(|r| {
                        r.as_str_name()
                            .trim_start_matches("GOODBYE_REASON_")
                            .to_ascii_lowercase()
                    })
                    .unwrap_or_else(|_| "unknown".to_owned());
                retry_unavailable("recording Goodbye", || {
                    let (id, reason) = (node_id.to_owned(), reason.clone());
                    self.store.write_node(id.clone(), move |tx| {
                        sessions::close_clean(tx, &id, epoch, &reason)
                    })
                })
                .await?;
                Ok(vec![Effect::Recorded])
            }
            AgentReport::Broken => {
                retry_unavailable("recording the broken session", || {
                    let id = node_id.to_owned();
                    self.store
                        .write_node(id.clone(), move |tx| sessions::close_broken(tx, &id, epoch))
                })
                .await?;
                Ok(vec![Effect::Recorded])
            }
        }
    }

    /// An inventory: bounded, hashed, recorded with NodeLifecycle acceptance and a ramdisk
    /// workflow's step in one node write ([`reports::record_inventory`]).
    async fn report_inventory(
        &self,
        node_id: &str,
        epoch: u64,
        inv: pb::Inventory,
    ) -> Result<Vec<Effect>, OpError> {
        if inv.document_json.len() > MAX_INVENTORY_BYTES {
            let bytes = inv.document_json.len();
            tracing::warn!(bytes, "inventory too large; dropped");
            return Ok(vec![Effect::Ignored(format!(
                "the inventory document is {bytes} bytes, over {MAX_INVENTORY_BYTES}"
            ))]);
        }
        let sha256 = hex::encode(sha2::Sha256::digest(&inv.document_json));
        let hw = inv.hardware.unwrap_or_default();
        let doc = std::sync::Arc::new(inv.document_json);
        let r = retry_unavailable("recording inventory", || {
            let (id, doc, hw, sha256) = (
                node_id.to_owned(),
                std::sync::Arc::clone(&doc),
                hw.clone(),
                sha256.clone(),
            );
            self.store.write_node(id.clone(), move |tx| {
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
        match r {
            Ok(Some(state)) => {
                tracing::debug!(provision_state = %state, "inventory recorded");
                Ok(vec![Effect::Inventory(state)])
            }
            Ok(None) => Ok(vec![Effect::Ignored("the node is gone".to_owned())]),
            Err(OpError::Store(StoreError::Json { source, .. })) => {
                tracing::warn!(error = %source, "inventory is not valid JSON; dropped");
                Ok(vec![Effect::Ignored(format!(
                    "the inventory is not valid JSON: {source}"
                ))])
            }
            Err(e) => Err(e),
        }
    }
}

/// Runs `write` until it succeeds, fails for another reason than an unavailable store, or
/// [`RETRY_UNAVAILABLE_FOR`] has passed (100 ms, doubling to 2 s, between tries): what an agent
/// reported (its inventory, a SpecStatus, its Goodbye) is not dropped because the database
/// answered late; the session's later reports wait behind it, in order.
async fn retry_unavailable<T, F, Fut>(what: &str, mut write: F) -> Result<T, OpError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, OpError>>,
{
    let started = std::time::Instant::now();
    let mut wait = Duration::from_millis(100);
    loop {
        match write().await {
            Err(OpError::Store(e))
                if e.is_unavailable() && started.elapsed() < RETRY_UNAVAILABLE_FOR =>
            {
                tracing::debug!(error = %e, retry_in = ?wait, "{what}: store unavailable; trying again");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn core() -> Result<Core, StoreError> {
        let store = cpl_store::testing::store()?;
        let sessions: Arc<dyn crate::port::AgentSessions> = Arc::new(crate::port::NoSessions);
        let commands = crate::commands::Commands {
            store: store.clone(),
            sessions: Arc::clone(&sessions),
        };
        let bare_metal = crate::bare_metal::BareMetal::new(
            commands.clone(),
            crate::bare_metal::CredentialKey::generate(),
            Default::default(),
        );
        Ok(Core {
            store,
            commands,
            bare_metal,
            sessions,
            issuer: crate::verbs::TokenIssuer {
                ca_pin: "sha256:00".into(),
                control_plane: "https://127.0.0.1:1".into(),
            },
            replica: crate::status::ReplicaIdentity {
                id: "gw-test".into(),
                gateway_url: "https://127.0.0.1:1".into(),
            },
        })
    }

    #[test]
    fn the_session_keeps_hello_and_heartbeats_and_the_rest_is_a_report() {
        use agent_message::Msg;
        assert_eq!(
            AgentReport::from_message(Msg::Hello(Default::default())),
            None
        );
        assert_eq!(
            AgentReport::from_message(Msg::Heartbeat(Default::default())),
            None
        );
        let inv = AgentReport::from_message(Msg::Inventory(Default::default()));
        assert_eq!(inv.as_ref().and_then(AgentReport::kind), Some("inventory"));
        let bye = AgentReport::from_message(Msg::Goodbye(Default::default()));
        assert!(matches!(bye, Some(AgentReport::Goodbye(_))));
        assert_eq!(
            bye.and_then(|b| b.kind()),
            None,
            "a session's end is not bounded"
        );
    }

    #[tokio::test]
    async fn what_does_not_parse_or_fit_is_ignored_and_says_why()
    -> Result<(), Box<dyn std::error::Error>> {
        let core = core()?;
        core.store
            .write_blocking(|tx| tx.insert_node(&cpl_store::testing::new_node("node_a"), 1))?;
        let before = core.store.read_blocking(|r| r.node("node_a"))?;
        let xid = pb::Event {
            r#type: EventType::Xid.as_str().to_owned(),
            message: "XID 79".into(),
            data_json: br#"{"xid": "seventy-nine"}"#.to_vec(),
            ..Default::default()
        };
        let e = core.report("node_a", 0, AgentReport::Event(xid)).await?;
        assert!(
            matches!(e.as_slice(), [Effect::Ignored(why)] if why.contains("not its contract")),
            "{e:?}"
        );
        let big = pb::Inventory {
            document_json: vec![b' '; MAX_INVENTORY_BYTES + 1],
            ..Default::default()
        };
        let e = core
            .report("node_a", 0, AgentReport::Inventory(big))
            .await?;
        assert!(
            matches!(e.as_slice(), [Effect::Ignored(why)] if why.contains("bytes")),
            "{e:?}"
        );
        let junk = pb::Inventory {
            document_json: b"{not json".to_vec(),
            ..Default::default()
        };
        let e = core
            .report("node_a", 0, AgentReport::Inventory(junk))
            .await?;
        assert!(
            matches!(e.as_slice(), [Effect::Ignored(why)] if why.contains("not valid JSON")),
            "{e:?}"
        );
        assert_eq!(core.store.read_blocking(|r| r.node("node_a"))?, before);
        let doc = pb::Inventory {
            document_json: br#"{"hostname": "a"}"#.to_vec(),
            ..Default::default()
        };
        let e = core
            .report("node_a", 0, AgentReport::Inventory(doc))
            .await?;
        assert_eq!(e, vec![Effect::Inventory(ProvisionState::Adopted)]);
        let gone = core
            .report(
                "node_b",
                0,
                AgentReport::CommandUpdate(pb::CommandUpdate {
                    id: "cmd_x".into(),
                    state: pb::CommandState::Succeeded.into(),
                    ..Default::default()
                }),
            )
            .await?;
        assert!(matches!(gone.as_slice(), [Effect::Ignored(_)]), "{gone:?}");
        Ok(())
    }
}
