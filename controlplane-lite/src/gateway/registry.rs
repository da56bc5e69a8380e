//! Live sessions by node id. A newer session of the same node supersedes the older one; the epoch
//! fences whatever the old one still sends. The registry is how the core reaches sessions: it
//! implements [`cpl_core::port::AgentSessions`].

use std::collections::HashMap;

use bc_protocol::pb::{GatewayMessage, Goodbye, GoodbyeReason, gateway_message::Msg};
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tonic::Status;

/// Sender half of a session's outbound stream.
pub type Outbound = mpsc::Sender<Result<GatewayMessage, Status>>;

/// One live session.
#[derive(Debug)]
pub struct SessionHandle {
    pub epoch: u64,
    pub tx: Outbound,
    /// Set to true to make the session task stop reading and end the stream.
    pub stop: watch::Sender<bool>,
}

/// Live sessions.
#[derive(Debug, Default)]
pub struct Registry {
    sessions: Mutex<HashMap<String, SessionHandle>>,
    /// Where opens and ends are announced (the other replicas learn them: [`crate::cluster`]).
    events: Mutex<Option<mpsc::UnboundedSender<SessionEvent>>>,
}

/// A session of this replica opened or ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    Open { node: String, epoch: u64 },
    Gone { node: String, epoch: u64 },
}

/// A Goodbye message.
pub fn goodbye(reason: GoodbyeReason, message: &str) -> GatewayMessage {
    GatewayMessage {
        msg: Some(Msg::Goodbye(Goodbye {
            reason: reason.into(),
            message: message.to_owned(),
        })),
    }
}

fn end(old: SessionHandle, reason: GoodbyeReason, message: &str) {
    // try_send: a peer that is not reading must not block the caller; the stop flag ends it anyway.
    let _ = old.tx.try_send(Ok(goodbye(reason, message)));
    let _ = old.stop.send(true);
}

impl Registry {
    /// From now on, every session opened or ended here is sent to the returned receiver.
    pub fn announce(&self) -> mpsc::UnboundedReceiver<SessionEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        *self.events.lock() = Some(tx);
        rx
    }

    fn tell(&self, ev: SessionEvent) {
        if let Some(tx) = self.events.lock().as_ref() {
            let _ = tx.send(ev);
        }
    }

    fn gone(&self, node_id: &str, epoch: u64) {
        self.tell(SessionEvent::Gone {
            node: node_id.to_owned(),
            epoch,
        });
    }

    /// Registers a session; an older session of the node gets `Goodbye{superseded}` and is ended.
    /// Two sessions of one node opening at once may reach here out of epoch order: the one with
    /// the lower epoch is the one ended, whichever came second.
    pub fn insert(&self, node_id: &str, handle: SessionHandle) {
        let mut map = self.sessions.lock();
        if map.get(node_id).is_some_and(|cur| cur.epoch > handle.epoch) {
            drop(map);
            end(
                handle,
                GoodbyeReason::Superseded,
                "a newer session of this node is open",
            );
            return;
        }
        let epoch = handle.epoch;
        let old = map.insert(node_id.to_owned(), handle);
        drop(map);
        self.tell(SessionEvent::Open {
            node: node_id.to_owned(),
            epoch,
        });
        if let Some(old) = old {
            end(
                old,
                GoodbyeReason::Superseded,
                "a newer session of this node opened",
            );
        }
    }

    /// Removes the node's session if it is still the one at `epoch`.
    pub fn remove_if(&self, node_id: &str, epoch: u64) {
        let mut map = self.sessions.lock();
        if map.get(node_id).is_some_and(|h| h.epoch == epoch) {
            map.remove(node_id);
            drop(map);
            self.gone(node_id, epoch);
        }
    }

    /// Ends the node's session, if any, with `reason`. Returns whether one was open.
    pub fn close(&self, node_id: &str, reason: GoodbyeReason, message: &str) -> bool {
        let old = self.sessions.lock().remove(node_id);
        match old {
            Some(old) => {
                self.gone(node_id, old.epoch);
                end(old, reason, message);
                true
            }
            None => false,
        }
    }

    /// Ends every session (control plane shutdown).
    pub fn close_all(&self, reason: GoodbyeReason, message: &str) {
        let all: Vec<(String, SessionHandle)> = self.sessions.lock().drain().collect();
        for (node, h) in all {
            self.gone(&node, h.epoch);
            end(h, reason, message);
        }
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The outbound sender of a node's live session.
    pub fn sender(&self, node_id: &str) -> Option<(u64, Outbound)> {
        self.sessions
            .lock()
            .get(node_id)
            .map(|h| (h.epoch, h.tx.clone()))
    }
}

impl cpl_core::port::AgentSessions for Registry {
    fn live_epoch(&self, node_id: &str) -> Option<u64> {
        self.sessions.lock().get(node_id).map(|h| h.epoch)
    }

    fn send<'a>(
        &'a self,
        node_id: &'a str,
        msg: GatewayMessage,
    ) -> cpl_core::port::PortFuture<'a, bool> {
        let tx = self.sender(node_id).map(|(_, tx)| tx);
        Box::pin(async move {
            match tx {
                Some(tx) => tx.send(Ok(msg)).await.is_ok(),
                None => false,
            }
        })
    }

    fn close(&self, node_id: &str, reason: GoodbyeReason, message: &str) -> Option<u64> {
        let old = self.sessions.lock().remove(node_id)?;
        let epoch = old.epoch;
        self.gone(node_id, epoch);
        end(old, reason, message);
        Some(epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handle(epoch: u64) -> (SessionHandle, watch::Receiver<bool>) {
        let (tx, _rx) = mpsc::channel(4);
        let (stop, stop_rx) = watch::channel(false);
        (SessionHandle { epoch, tx, stop }, stop_rx)
    }

    #[test]
    fn the_highest_epoch_stays_registered_whatever_the_order() {
        let reg = Registry::default();
        let (newer, newer_stop) = handle(5);
        let (older, older_stop) = handle(4);
        reg.insert("n", newer);
        reg.insert("n", older); // arrives late
        assert_eq!(reg.sender("n").map(|(e, _)| e), Some(5));
        assert!(*older_stop.borrow(), "the older session is told to stop");
        assert!(!*newer_stop.borrow());
        let (newest, _s) = handle(6);
        reg.insert("n", newest);
        assert_eq!(reg.sender("n").map(|(e, _)| e), Some(6));
        assert!(*newer_stop.borrow(), "superseded by epoch 6");
    }
}
