//! The port through which the core reaches live agent sessions: push a spec, send or cancel a
//! command, close a revoked or deleted node's session. The gateway (controlplane-lite) implements
//! it over its session registry; the core never sees a stream, a channel of gRPC statuses or a
//! socket.

use std::future::Future;
use std::pin::Pin;

use bc_protocol::pb::{GatewayMessage, GoodbyeReason};

/// A boxed future of the port's async methods (the trait is used as `dyn`).
pub type PortFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Live agent sessions, as the core needs them.
pub trait AgentSessions: Send + Sync + std::fmt::Debug {
    /// The epoch of `node_id`'s live session on this control plane, if it has one.
    fn live_epoch(&self, node_id: &str) -> Option<u64>;

    /// Queues `msg` on `node_id`'s live session, waiting while its queue is full. False when the
    /// node has no live session or it ended.
    fn send<'a>(&'a self, node_id: &'a str, msg: GatewayMessage) -> PortFuture<'a, bool>;

    /// Ends `node_id`'s live session with `Goodbye{reason}`; returns the epoch of the session
    /// ended, `None` when there was none.
    fn close(&self, node_id: &str, reason: GoodbyeReason, message: &str) -> Option<u64>;
}

/// No sessions at all: for tests and tools that run the core without a gateway.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSessions;

impl AgentSessions for NoSessions {
    fn live_epoch(&self, _node_id: &str) -> Option<u64> {
        None
    }

    fn send<'a>(&'a self, _node_id: &'a str, _msg: GatewayMessage) -> PortFuture<'a, bool> {
        Box::pin(async { false })
    }

    fn close(&self, _node_id: &str, _reason: GoodbyeReason, _message: &str) -> Option<u64> {
        None
    }
}
