//! The desired spec on its way to a node: the stored spec (camelCase JSON, validated by
//! `nodes.updateSpec`) as the wire's `Spec`, sent when a session opens and after every change.

use bc_protocol::Trust;
use bc_protocol::pb::{GatewayMessage, NodeSpec, Spec, gateway_message::Msg};
use cpl_store::Store;
use tracing::Instrument;

use crate::port::AgentSessions;

/// The stored spec on the wire. A tenant-controlled node never receives break-glass keys.
/// Generation 1 is the empty spec.
pub fn spec_to_wire(spec: &serde_json::Value, trust: Trust) -> NodeSpec {
    let parsed: bc_protocol::spec::NodeSpec = match serde_json::from_value(spec.clone()) {
        Ok(s) => s,
        Err(e) => {
            // Only specs that passed validation are stored; an older or hand-edited row is sent empty.
            tracing::error!(error = %e, "stored spec does not parse; sending an empty spec");
            return NodeSpec::default();
        }
    };
    let parsed = if trust == Trust::TenantControlled {
        parsed.without_break_glass_keys()
    } else {
        parsed
    };
    NodeSpec::from(&parsed)
}

/// The `Spec` message of `generation` and `spec`, for a node of `trust`.
pub fn spec_message(generation: u64, spec: &serde_json::Value, trust: Trust) -> GatewayMessage {
    GatewayMessage {
        msg: Some(Msg::Spec(Spec {
            generation,
            spec: Some(spec_to_wire(spec, trust)),
        })),
    }
}

/// Sends the node's current spec to its live session, if it has one (in a `node` span).
pub async fn push_spec(store: &Store, sessions: &dyn AgentSessions, node_id: &str) {
    let span = tracing::info_span!("node", node_id = %node_id);
    push_spec_in(store, sessions, node_id)
        .instrument(span)
        .await
}

async fn push_spec_in(store: &Store, sessions: &dyn AgentSessions, node_id: &str) {
    if sessions.live_epoch(node_id).is_none() {
        return;
    }
    let id = node_id.to_owned();
    let node = match store.read(move |r| r.node(&id)).await {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(error = %e, "reading the spec to push failed");
            return;
        }
    };
    let msg = spec_message(node.generation, &node.spec, node.trust);
    let _ = sessions.send(node_id, msg).await;
}
