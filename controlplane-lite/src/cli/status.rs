//! `bcctl status`: the control plane as `controlPlane.status` answers it — the replica asked,
//! who runs the controllers (the controller lease), the store, and sessions per replica.

use serde_json::Value;

use cpl_core::verbs::{NoArgs, Request};

use super::ClientArgs;
use super::call::{items, print};
use super::render;

/// What the table shows: one line per fact, then the sessions per replica.
fn table(v: &Value) -> String {
    let s = |p: &str| render::cell(v.pointer(p));
    let me = s("/replicaId");
    let leads = v.get("leads").and_then(Value::as_bool).unwrap_or(false);
    let controllers = match v.get("controllers") {
        Some(c) if c.is_object() => {
            let live = c.get("live").and_then(Value::as_bool).unwrap_or(false);
            format!(
                "{}{} (epoch {}, since {}, lease until {}{})",
                render::cell(c.get("holder")),
                if render::cell(c.get("holder")) == me {
                    " (this replica)"
                } else {
                    ""
                },
                render::cell(c.get("epoch")),
                render::cell(c.get("since")),
                render::cell(c.get("expiresAt")),
                if live { "" } else { ", lapsed: nobody leads" },
            )
        }
        _ => "nobody yet (no replica has taken the controller lease)".to_owned(),
    };
    let mut out = format!(
        "replica:      {me}{} {}\nstore:        {}\nversion:      {}\ncontrollers:  {controllers}\nnodes:        {} ({} connected)\n",
        if leads { " (leads)" } else { "" },
        s("/gatewayUrl"),
        s("/store"),
        s("/version"),
        s("/nodes"),
        s("/connected"),
    );
    let replicas = items(v, "replicas");
    if !replicas.is_empty() {
        out.push_str("\nsessions per replica:\n");
        out.push_str(&render::list(
            &replicas,
            &[("REPLICA", "/replicaId"), ("CONNECTED", "/connected")],
        ));
    }
    out
}

/// Runs `bcctl status`.
pub async fn status(args: &ClientArgs) -> anyhow::Result<()> {
    let c = args.client()?;
    let v: Value = c.request(&request()).await?;
    print(args, &v, table)
}

/// What `bcctl status` sends.
pub(crate) fn request() -> Request {
    Request::ControlPlaneStatus(NoArgs {})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_names_the_leader_and_each_replicas_sessions() {
        let v = json!({
            "replicaId": "gw-a", "gatewayUrl": "https://10.0.0.1:7443", "leads": false,
            "store": "postgres", "version": "0.1.0", "nodes": 3, "connected": 3,
            "controllers": {"holder": "gw-b", "epoch": 2, "since": "2026-12-02T08:00:00.000Z",
                            "expiresAt": "2026-12-02T08:00:10.000Z", "live": true},
            "replicas": [{"replicaId": "gw-b", "connected": 2}, {"replicaId": "gw-a", "connected": 1}]
        });
        let t = table(&v);
        assert!(
            t.contains("replica:      gw-a https://10.0.0.1:7443"),
            "{t}"
        );
        assert!(t.contains("controllers:  gw-b (epoch 2"), "{t}");
        assert!(!t.contains("(leads)"), "{t}");
        assert!(
            t.contains("gw-b") && t.lines().any(|l| l.starts_with("gw-a") && l.ends_with('1')),
            "{t}"
        );
        let lapsed = json!({"replicaId": "gw-a", "leads": false,
            "controllers": {"holder": "gw-a", "epoch": 1, "live": false}});
        let t = table(&lapsed);
        assert!(
            t.contains("gw-a (this replica)") && t.contains("lapsed: nobody leads"),
            "{t}"
        );
        assert!(table(&json!({"replicaId": "gw-a"})).contains("nobody yet"));
    }
}
