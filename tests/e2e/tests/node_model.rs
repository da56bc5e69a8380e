//! Issue 18 items 9 and 11 end to end: acceptance per pool (a metal pool refuses the untrusted
//! key of a machine without SMBIOS, the node fails at the pool's deadline, the operator recovers
//! and adopts it, and retires it), and labels through `bcctl` (set, shown, filtered, removed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bc_e2e::{Agent, ControlPlane, eventually};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn condition<'a>(n: &'a Value, t: &str) -> Option<&'a Value> {
    n["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
}

#[test]
fn a_metal_pool_refuses_an_untrusted_key_until_the_deadline_and_the_operator_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let site = cp.ok("sites.create", json!({"name": "s", "kind": "platform"}));
    // The metal pool's defaults (a trusted key required), with a short deadline.
    let (ok, out, err) = cp.bcctl(&[
        "pools",
        "create",
        "--name",
        "metal",
        "--kind",
        "metal-host",
        "--site",
        site["id"].as_str().unwrap(),
        "--acceptance-deadline",
        "3s",
        "-o",
        "json",
    ]);
    assert!(ok, "{err}");
    let pool: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(pool["acceptance"], json!({"deadlineSeconds": 3}));
    let token = cp.create_token(&["--pool", pool["id"].as_str().unwrap()]);
    // An empty host root: no SMBIOS, no NIC, so no identifier survives and the key is untrusted
    // whatever machine runs the test.
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let agent = Agent::start(
        &cp,
        &tmp.path().join("agent"),
        Some(&token),
        &["--root", root.to_str().unwrap()],
    );
    let id = agent.node_id();
    let n = eventually(WAIT, "Accepted false: untrusted key", || {
        let n = cp.node(&id);
        condition(&n, "Accepted")
            .is_some_and(|c| c["reason"] == "UntrustedKey")
            .then_some(n)
    });
    assert_eq!(n["provisionState"], "adopting", "{n}\n{}", agent.log_text());
    assert_eq!(n["hardwareKeyTrusted"], false);
    assert_eq!(n["schedulable"], false);

    let n = eventually(WAIT, "failed at the deadline", || {
        let n = cp.node(&id);
        (n["provisionState"] == "failed").then_some(n)
    });
    assert_eq!(n["failedFrom"], "adopting", "{n}");
    assert_eq!(n["maintenance"], true);
    let c = condition(&n, "Accepted").unwrap();
    assert_eq!(c["reason"], "DeadlineExceeded", "{c}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("requires a trusted hardware key"),
        "{c}"
    );

    // The operator accepts it by hand, takes it out of maintenance, and later retires it.
    for args in [
        vec!["nodes", "recover", &id],
        vec!["nodes", "adopt", &id],
        vec!["nodes", "set-maintenance", &id, "false"],
    ] {
        let (ok, _, err) = cp.bcctl(&args);
        assert!(ok, "{args:?}: {err}");
    }
    let n = cp.node(&id);
    assert_eq!(n["provisionState"], "adopted", "{n}");
    assert_eq!(
        condition(&n, "Accepted").unwrap()["reason"],
        "AdoptedByOperator"
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "retire", &id]);
    assert!(ok, "{err}");
    let n = cp.node(&id);
    assert_eq!(n["provisionState"], "retired", "{n}");
    assert_eq!(n["schedulable"], false);
}

#[test]
fn labels_are_set_shown_filtered_and_removed_through_bcctl() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let token = cp.create_token(&[]);
    // Empty host roots: two machines with no identifier in common (the test machine's own
    // identifiers would make the second join the same machine as the first).
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let root_arg = ["--root", root.to_str().unwrap()];
    let a = Agent::start(&cp, &tmp.path().join("a"), Some(&token), &root_arg);
    let b = Agent::start(&cp, &tmp.path().join("b"), Some(&token), &root_arg);
    let (ida, idb) = (a.node_id(), b.node_id());
    for (id, labels) in [
        (&ida, vec!["rack=r7", "tier=gold"]),
        (&idb, vec!["rack=r7"]),
    ] {
        let mut args = vec!["nodes", "set-labels", id.as_str()];
        args.extend(labels);
        let (ok, _, err) = cp.bcctl(&args);
        assert!(ok, "{err}");
    }
    let (ok, out, err) = cp.bcctl(&["nodes", "get", &ida]);
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("labels.tier:") && l.ends_with("gold")),
        "{out}"
    );
    let list = |filter: &[&str]| {
        let mut args = vec!["nodes", "list", "-o", "json"];
        args.extend(filter);
        let (ok, out, err) = cp.bcctl(&args);
        assert!(ok, "{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let mut ids: Vec<String> = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    let mut both = vec![ida.clone(), idb.clone()];
    both.sort();
    assert_eq!(list(&["--label", "rack=r7"]), both);
    assert_eq!(
        list(&["--label", "rack=r7", "--label", "tier=gold"]),
        vec![ida.clone()]
    );
    let (ok, _, err) = cp.bcctl(&["nodes", "remove-labels", &ida, "tier"]);
    assert!(ok, "{err}");
    assert!(list(&["--label", "tier=gold"]).is_empty());
    // A bad key is refused by the API with its limits, and nothing changes.
    let (ok, _, err) = cp.bcctl(&["nodes", "set-labels", &ida, "_bad=x"]);
    assert!(!ok);
    assert!(
        err.contains("INVALID_ARGUMENT") && err.contains("labels"),
        "{err}"
    );
    assert_eq!(cp.node(&ida)["labels"], json!({"rack": "r7"}));
}
