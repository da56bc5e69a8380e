//! Sessions across replicas (issue 17): an operator verb on replica A for a node whose session
//! is on replica B reaches the node at once, through PostgreSQL's LISTEN/NOTIFY.
//!
//! # Design
//! - Every replica announces its sessions' opens and ends on [`CHANNEL`] (`open`/`gone` with
//!   the node, the epoch and its gateway id) and keeps the others' in a map, rebuilt from the
//!   nodes' rows (`connectivity`, `session_epoch`, `gateway_id`) whenever its LISTEN connection
//!   (re)starts, since what was published while it was down is lost; then it ends any session
//!   of its own that another replica superseded meanwhile, and sends what its nodes wait for
//!   (queued commands, a newer spec), for the kicks it may have missed.
//! - [`ClusterSessions`] is the core's [`AgentSessions`]: a node with a session here goes to the
//!   local registry; a node with one on another replica gets a `send` (the message, prost-encoded
//!   in hex), or a `kick` when the message would not fit NOTIFY's 8,000 bytes (that replica then
//!   sends the node's queued commands and current spec from the store), or a `close`, addressed
//!   to that replica. A command sent that way counts as sent; if its replica died before it
//!   could pass it on, the node's next session (on any replica) sends it again, as after any
//!   reconnect (the agent's journal runs a command once).
//! - A session opening on another replica with a higher epoch supersedes this replica's session
//!   of the node (ended with `Goodbye{superseded}`): a node never keeps two live sessions.
//! - On SQLite (one process) nothing is published and the map stays empty: the local registry
//!   alone, as before.
use std::collections::HashMap;
use std::sync::Arc;

use bc_protocol::pb::{GatewayMessage, GoodbyeReason};
use cpl_core::commands::Commands;
use cpl_core::port::{AgentSessions, PortFuture};
use cpl_store::{Notice, Store};
use parking_lot::Mutex;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::gateway::registry::{Registry, SessionEvent};

/// The NOTIFY channel of session announcements and forwarded messages.
pub const CHANNEL: &str = "bc_sessions";

/// NOTIFY's payload limit is 8,000 bytes; leave room for the envelope.
const MAX_PAYLOAD: usize = 7_800;

/// One announcement or forwarded message (JSON, tagged by `t`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "camelCase")]
enum Wire {
    /// Replica `gw` opened the node's session at `epoch`.
    Open {
        gw: String,
        node: String,
        epoch: u64,
    },
    /// Replica `gw`'s session of the node at `epoch` ended.
    Gone {
        gw: String,
        node: String,
        epoch: u64,
    },
    /// For replica `to`: pass `msg` (hex of the prost encoding) to the node's session.
    Send {
        to: String,
        node: String,
        msg: String,
    },
    /// For replica `to`: send the node's queued commands and current spec from the store.
    Kick { to: String, node: String },
    /// For replica `to`: end the node's session with `Goodbye{reason, message}`.
    Close {
        to: String,
        node: String,
        reason: i32,
        message: String,
    },
}

/// The core's view of every replica's sessions.
#[derive(Debug)]
pub struct ClusterSessions {
    local: Arc<Registry>,
    store: Store,
    /// This replica's gateway id (`gw-…`).
    me: String,
    /// Other replicas' sessions: node → (epoch, gateway id).
    remote: Mutex<HashMap<String, (u64, String)>>,
}

impl ClusterSessions {
    /// Over `local`, the sessions of the replica `me`.
    pub fn new(local: Arc<Registry>, store: Store, me: String) -> Arc<Self> {
        Arc::new(Self {
            local,
            store,
            me,
            remote: Mutex::new(HashMap::new()),
        })
    }

    /// The replica holding the node's session, when it is another one: (epoch, gateway id).
    pub fn remote_session(&self, node_id: &str) -> Option<(u64, String)> {
        self.remote.lock().get(node_id).cloned()
    }

    async fn publish(&self, w: &Wire) -> bool {
        let Ok(text) = serde_json::to_string(w) else {
            return false;
        };
        match self.store.notify(CHANNEL, text).await {
            Ok(sent) => sent,
            Err(e) => {
                tracing::warn!(error = %e, "session notice not published");
                false
            }
        }
    }

    /// Runs until both inputs end: publishes this replica's session `events`, and applies what
    /// the other replicas publish (`notices`, from [`Store::listen`]). `commands` serves kicks.
    pub async fn run(
        self: Arc<Self>,
        mut notices: mpsc::UnboundedReceiver<Notice>,
        mut events: mpsc::UnboundedReceiver<SessionEvent>,
        commands: Commands,
    ) {
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(SessionEvent::Open { node, epoch }) => {
                        self.publish(&Wire::Open { gw: self.me.clone(), node, epoch }).await;
                    }
                    Some(SessionEvent::Gone { node, epoch }) => {
                        self.publish(&Wire::Gone { gw: self.me.clone(), node, epoch }).await;
                    }
                    None => return,
                },
                n = notices.recv() => match n {
                    Some(Notice::Resync) => self.resync(&commands).await,
                    Some(Notice::Message(text)) => match serde_json::from_str::<Wire>(&text) {
                        Ok(w) => self.apply(w, &commands).await,
                        Err(e) => tracing::warn!(error = %e, "unreadable session notice ignored"),
                    },
                    None => return,
                },
            }
        }
    }

    /// After the LISTEN connection (re)started: the other replicas' sessions, read again from
    /// the nodes' rows; a session here that one of them superseded meanwhile ends; and the nodes
    /// connected here that wait for a queued command or a newer spec get them, since the kicks
    /// and forwarded messages published while this replica was not listening are lost.
    async fn resync(&self, commands: &Commands) {
        let me = self.me.clone();
        let read = self
            .store
            .read(move |r| {
                Ok::<_, cpl_store::StoreError>((r.connected_sessions()?, r.sessions_owed(&me)?))
            })
            .await;
        let (rows, owed) = match read {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "other replicas' sessions not read");
                return;
            }
        };
        let mut superseded = Vec::new();
        {
            let mut map = self.remote.lock();
            map.clear();
            for (node, epoch, gw) in rows {
                if gw == self.me {
                    continue;
                }
                if self.local.live_epoch(&node).is_some_and(|e| e < epoch) {
                    superseded.push((node.clone(), gw.clone()));
                }
                map.insert(node, (epoch, gw));
            }
        }
        for (node, gw) in superseded {
            self.local.close(
                &node,
                GoodbyeReason::Superseded,
                &format!("a newer session of this node opened on replica {gw}"),
            );
        }
        if !owed.is_empty() {
            tracing::info!(
                nodes = owed.len(),
                "resync: sending queued commands and specs the notices may have missed"
            );
        }
        for node in owed {
            if self.local.live_epoch(&node).is_some() {
                commands.dispatch(&node, false).await;
                cpl_core::push::push_spec(&self.store, self.local.as_ref(), &node).await;
            }
        }
    }

    async fn apply(&self, w: Wire, commands: &Commands) {
        match w {
            Wire::Open { gw, node, epoch } if gw != self.me => {
                if self.local.live_epoch(&node).is_some_and(|e| e < epoch) {
                    self.local.close(
                        &node,
                        GoodbyeReason::Superseded,
                        &format!("a newer session of this node opened on replica {gw}"),
                    );
                }
                self.remote.lock().insert(node, (epoch, gw));
            }
            Wire::Gone { gw, node, epoch } if gw != self.me => {
                let mut map = self.remote.lock();
                if map.get(&node) == Some(&(epoch, gw)) {
                    map.remove(&node);
                }
            }
            Wire::Send { to, node, msg } if to == self.me => {
                let decoded = hex::decode(&msg)
                    .ok()
                    .and_then(|b| GatewayMessage::decode(b.as_slice()).ok());
                match decoded {
                    Some(m) => {
                        let _ = self.local.send(&node, m).await;
                    }
                    None => tracing::warn!(node_id = %node, "forwarded message does not decode"),
                }
            }
            Wire::Kick { to, node } if to == self.me => {
                commands.dispatch(&node, false).await;
                cpl_core::push::push_spec(&self.store, self.local.as_ref(), &node).await;
            }
            Wire::Close {
                to,
                node,
                reason,
                message,
            } if to == self.me => {
                let reason = GoodbyeReason::try_from(reason).unwrap_or(GoodbyeReason::Unspecified);
                self.local.close(&node, reason, &message);
            }
            _ => {}
        }
    }
}

impl AgentSessions for ClusterSessions {
    fn live_epoch(&self, node_id: &str) -> Option<u64> {
        self.local
            .live_epoch(node_id)
            .or_else(|| self.remote_session(node_id).map(|(e, _)| e))
    }

    fn send<'a>(&'a self, node_id: &'a str, msg: GatewayMessage) -> PortFuture<'a, bool> {
        Box::pin(async move {
            if self.local.live_epoch(node_id).is_some() {
                return self.local.send(node_id, msg).await;
            }
            let Some((_, to)) = self.remote_session(node_id) else {
                return false;
            };
            let node = node_id.to_owned();
            let hexed = hex::encode(msg.encode_to_vec());
            let w = if hexed.len() <= MAX_PAYLOAD {
                Wire::Send {
                    to,
                    node,
                    msg: hexed,
                }
            } else {
                Wire::Kick { to, node }
            };
            self.publish(&w).await
        })
    }

    fn close(&self, node_id: &str, reason: GoodbyeReason, message: &str) -> Option<u64> {
        if self.local.live_epoch(node_id).is_some() {
            return AgentSessions::close(self.local.as_ref(), node_id, reason, message);
        }
        let (epoch, to) = self.remote_session(node_id)?;
        let w = Wire::Close {
            to,
            node: node_id.to_owned(),
            reason: reason.into(),
            message: message.to_owned(),
        };
        // `close` is synchronous; the notice goes out on its own task.
        let store = self.store.clone();
        if let Ok(text) = serde_json::to_string(&w) {
            tokio::spawn(async move {
                if let Err(e) = store.notify(CHANNEL, text).await {
                    tracing::warn!(error = %e, "session close not published");
                }
            });
        }
        Some(epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_is_tagged_camel_case_json() {
        let w = Wire::Close {
            to: "gw-b".into(),
            node: "node_a".into(),
            reason: 3,
            message: "revoked".into(),
        };
        let text = serde_json::to_string(&w).unwrap_or_default();
        assert_eq!(
            text,
            r#"{"t":"close","to":"gw-b","node":"node_a","reason":3,"message":"revoked"}"#
        );
        assert_eq!(serde_json::from_str::<Wire>(&text).ok(), Some(w));
        assert!(serde_json::from_str::<Wire>(r#"{"t":"other"}"#).is_err());
    }
}
