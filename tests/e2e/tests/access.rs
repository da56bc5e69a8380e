//! Issue 19, access and integrity, against a real `bcctl serve`: nobody takes over a node's
//! record (19.1), an agent's report flood never locks operators out (19.2), a damaged or shared
//! state dir refuses to start (19.5, 19.6), one upload per command with the server's digest
//! (19.7). The agent side is `bc_e2e::fake_agent`: it sends what a real agent never would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bc_e2e::fake_agent::{FakeAgent, upload};
use bc_e2e::{ControlPlane, bins, eventually};
use bc_protocol::pb::{AgentMessage, CommandUpdate, SpecStatus, UploadChunk, agent_message::Msg};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const WAIT: Duration = Duration::from_secs(30);

fn id(v: &Value) -> String {
    v["id"].as_str().unwrap().to_owned()
}

/// A pool on a tenant's custom site; returns its id.
fn tenant_pool(cp: &ControlPlane) -> String {
    let site = cp.ok(
        "sites.create",
        json!({"name": "tenant", "kind": "custom", "ownerTenantId": "tenant1"}),
    );
    id(&cp.ok(
        "pools.create",
        json!({"name": "tp", "kind": "metal-host", "siteId": site["id"]}),
    ))
}

#[test]
fn a_tenant_token_and_two_digests_take_no_platform_node_and_an_approval_lets_a_machine_back() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let platform = cp.metal_host_pool();
    let tenant = tenant_pool(&cp);
    let tok_p = cp.create_token(&["--pool", &platform]);
    let tok_t = cp.create_token(&["--pool", &tenant]);
    let fa = FakeAgent::new(&cp);

    // The victim: a platform node with a trusted key, offline now.
    let victim = fa
        .join(&tok_p, "key-victim", true, &["d1", "d2", "d3"])
        .unwrap();
    // The repro: a tenant's token, two of the victim's digests (a neighbour can learn MACs),
    // the victim's key and a claim of `trusted`.
    let err = fa
        .join(&tok_t, "key-victim", true, &["d1", "d2"])
        .expect_err("a takeover must be refused");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(&victim.node_id) && err.message().contains(&platform),
        "{}",
        err.message()
    );
    let n = cp.node(&victim.node_id);
    assert_eq!(n["identityGeneration"], 1, "{n}");
    assert_eq!(n["poolId"], platform.as_str());
    assert_eq!(cp.nodes().len(), 1, "and no node was made for it either");

    // Within the pool, identifiers alone are not enough for a platform node: the machine waits
    // for an operator, and says so; its retries change nothing.
    let waiting = fa
        .join(&tok_p, "other-key", false, &["d1", "d2"])
        .unwrap_err();
    assert_eq!(waiting.code(), tonic::Code::Unavailable, "{waiting:?}");
    assert!(
        waiting.message().contains("REJOIN_PENDING_APPROVAL")
            && waiting.message().contains("approve-rejoin"),
        "{}",
        waiting.message()
    );
    let again = fa
        .join(&tok_p, "other-key", false, &["d1", "d2"])
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::Unavailable);
    let n = cp.node(&victim.node_id);
    assert_eq!(n["identityGeneration"], 1);
    let req = n["rejoinRequest"]["id"].as_str().unwrap().to_owned();
    assert!(waiting.message().contains(&req), "{}", waiting.message());
    assert_eq!(n["rejoinRequest"]["peer"], "127.0.0.1", "{n}");
    let events = cp.ok("nodes.events", json!({"nodeId": victim.node_id}))["events"].clone();
    assert_eq!(
        events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "rejoinRequest")
            .count(),
        1,
        "one event per request, not per retry: {events}"
    );

    // The operator approves that request (bcctl), and the same join goes through.
    let (ok, out, err) = cp.bcctl(&["nodes", "approve-rejoin", &victim.node_id, &req]);
    assert!(ok, "{out}{err}");
    let back = fa.join(&tok_p, "other-key", false, &["d1", "d2"]).unwrap();
    assert_eq!(back.node_id, victim.node_id);
    assert_eq!(back.identity_generation, 2);
    let n = cp.node(&victim.node_id);
    assert!(n.get("rejoinRequest").is_none(), "{n}");
    // The old certificate is dead: the victim's session is refused.
    let old = fa.rt.block_on(async {
        let ch = fa.channel(Some(&victim)).await;
        bc_protocol::pb::gateway_client::GatewayClient::new(ch)
            .renew(bc_protocol::pb::RenewRequest::default())
            .await
    });
    assert_eq!(old.unwrap_err().code(), tonic::Code::Unauthenticated);
}

#[test]
fn a_bcd_agent_cannot_join_an_agentless_pool_nor_re_join_with_another_pools_token() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let site = cp.ok("sites.create", json!({"name": "s", "kind": "platform"}));
    let none = id(&cp.ok(
        "pools.create",
        json!({"name": "n", "kind": "provider", "agent": "none", "siteId": site["id"]}),
    ));
    let fa = FakeAgent::new(&cp);
    let tok = cp.create_token(&["--pool", &none]);
    let err = fa.join(&tok, "k", true, &["a1", "a2"]).unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("agent: none"), "{}", err.message());
    assert!(cp.nodes().is_empty());

    // 18.15: a machine of pool A re-joining with pool B's token is told where it belongs; the
    // operator moves it, then B's token re-joins it in place.
    let a = id(&cp.ok(
        "pools.create",
        json!({"name": "a", "kind": "metal-host", "siteId": site["id"]}),
    ));
    let b = id(&cp.ok(
        "pools.create",
        json!({"name": "b", "kind": "metal-host", "siteId": site["id"]}),
    ));
    let j = fa
        .join(&cp.create_token(&["--pool", &a]), "km", true, &["m1", "m2"])
        .unwrap();
    let tok_b = cp.create_token(&["--pool", &b]);
    let err = fa.join(&tok_b, "km", true, &["m1", "m2"]).unwrap_err();
    assert!(
        err.message().contains(&format!("belongs to pool {a}")),
        "{}",
        err.message()
    );
    let (ok, out, err) = cp.bcctl(&["nodes", "move", &j.node_id, "--pool", &b]);
    assert!(ok, "{out}{err}");
    assert_eq!(cp.node(&j.node_id)["poolId"], b.as_str());
    let back = fa.join(&tok_b, "km", true, &["m1", "m2"]).unwrap();
    assert_eq!((back.node_id, back.identity_generation), (j.node_id, 2));
}

fn metric(cp: &ControlPlane, name: &str) -> f64 {
    let ep: Value =
        serde_json::from_str(&std::fs::read_to_string(cp.dir.join("endpoints.json")).unwrap())
            .unwrap();
    let text = reqwest::blocking::get(ep["metricsUrl"].as_str().unwrap())
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Issue 19.10 through the real gateway: a joined node once sent a 15 MiB SpecStatus message and
/// it was stored whole in a condition. It is cut to its limit before the store, and counted.
#[test]
fn a_15_mib_spec_status_message_is_cut_before_it_is_stored() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(&tmp.path().join("cp"), &["--metrics-listen", "127.0.0.1:0"]);
    let fa = FakeAgent::new(&cp);
    let j = fa
        .join(&cp.create_token(&[]), "kb", true, &["b1", "b2"])
        .unwrap();
    let session = fa.session(&j);
    eventually(WAIT, "session open", || {
        (cp.node(&j.node_id)["connectivity"] == "connected").then_some(())
    });
    let big = "x".repeat(15 << 20);
    let m = AgentMessage {
        epoch: 0,
        msg: Some(Msg::SpecStatus(SpecStatus {
            generation: 1,
            converged: false,
            reason: "BindFailed".into(),
            message: big,
        })),
    };
    fa.rt.block_on(session.tx.send(m)).unwrap();
    let message = eventually(WAIT, "the SpecConverged condition", || {
        let node = cp.node(&j.node_id);
        node["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "SpecConverged" && c["reason"] == "BindFailed")
            .and_then(|c| c["message"].as_str().map(str::to_owned))
    });
    assert!(
        message.chars().count() <= 1024 && message.ends_with(bc_protocol::limits::MARKER),
        "stored {} characters",
        message.len()
    );
    let cut = metric(
        &cp,
        "bcctl_agent_text_truncated_total{field=\"specStatus.message\"}",
    );
    assert!(cut >= 1.0, "the cut is counted: {cut}");
    // The session survived its oversize message.
    assert_eq!(cp.node(&j.node_id)["connectivity"], "connected");
    drop(session);
}

#[test]
fn a_flood_of_reports_never_locks_operators_out() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start_with(&tmp.path().join("cp"), &["--metrics-listen", "127.0.0.1:0"]);
    let fa = FakeAgent::new(&cp);
    let j = fa
        .join(&cp.create_token(&[]), "kf", true, &["f1", "f2"])
        .unwrap();
    let session = fa.session(&j);
    eventually(WAIT, "session open", || {
        (cp.node(&j.node_id)["connectivity"] == "connected").then_some(())
    });
    // ~200 SpecStatus a second with changing text, until the session ends.
    let tx = session.tx.clone();
    let flood = fa.rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        let mut sent = 0u64;
        loop {
            tick.tick().await;
            let m = AgentMessage {
                epoch: 0,
                msg: Some(Msg::SpecStatus(SpecStatus {
                    generation: 1,
                    converged: sent.is_multiple_of(2),
                    reason: "BindFailed".into(),
                    message: format!("changing text {sent}"),
                })),
            };
            if tx.send(m).await.is_err() {
                return sent;
            }
            sent += 1;
        }
    });
    let dropped = "bcctl_reports_dropped_total{kind=\"specStatus\"}";
    // Well into the flood (past the node's burst) before the operators start.
    eventually(WAIT, "the flood is being cut", || {
        (metric(&cp, dropped) >= 200.0).then_some(())
    });
    // Ten operator writes, each with the version it just read, each once: all succeed.
    let calls: Vec<(&str, Value)> = vec![
        ("nodes.cordon", json!({})),
        ("nodes.taint", json!({"key": "flood1"})),
        ("nodes.uncordon", json!({})),
        ("nodes.taint", json!({"key": "flood2"})),
        ("nodes.cordon", json!({})),
        ("nodes.taint", json!({"key": "flood3"})),
        ("nodes.uncordon", json!({})),
        ("nodes.taint", json!({"key": "flood4"})),
        ("nodes.cordon", json!({})),
        ("nodes.revokeIdentity", json!({})),
    ];
    for (method, extra) in calls {
        let version = cp.node(&j.node_id)["version"].clone();
        let mut body = json!({"nodeId": j.node_id, "version": version});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, v) = cp.call(method, body);
        assert_eq!(status, 200, "{method} during the flood: {v}");
        // Spread over more than a second of flood.
        std::thread::sleep(Duration::from_millis(150));
    }
    drop(session);
    let sent = fa.rt.block_on(flood).unwrap();
    assert!(sent > 500, "the flood ran on during the calls: {sent} sent");
    let cut = metric(&cp, dropped);
    assert!(cut > 0.0 && cut < sent as f64, "{cut} of {sent} dropped");
    let log = std::fs::read_to_string(cp.dir.join("serve.log")).unwrap();
    let lines = log.matches("dropping the excess").count();
    assert!(
        lines >= 1 && (lines as f64) < cut,
        "the drop log is rate-limited: {lines} lines for {cut} drops"
    );
}

/// `bcctl serve` on `dir`, run to its exit (or killed after 20 s): (success, stderr).
fn serve_once(dir: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let (bcctl, _) = bins();
    let mut child = Command::new(bcctl)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .arg("--state-dir")
        .arg(dir)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.success(), err)
}

#[test]
fn a_second_serve_and_a_damaged_state_dir_are_refused_naming_the_pid_or_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cp");
    let mut cp = ControlPlane::start(&dir);
    let endpoints = std::fs::read(dir.join("endpoints.json")).unwrap();
    let pid = cp.child.as_ref().unwrap().id();

    // 19.6: a second serve on the same dir exits naming the holder, touching nothing.
    let (ok, err) = serve_once(&dir, &[]);
    assert!(!ok);
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert_eq!(
        std::fs::read(dir.join("endpoints.json")).unwrap(),
        endpoints
    );
    assert_eq!(
        cp.call("nodes.list", json!({})).0,
        200,
        "the first still serves"
    );
    cp.stop();

    // 19.5: a missing ca.crt is never replaced by a new CA.
    let key = std::fs::read(dir.join("ca.key")).unwrap();
    let crt = std::fs::read(dir.join("ca.crt")).unwrap();
    std::fs::remove_file(dir.join("ca.crt")).unwrap();
    let (ok, err) = serve_once(&dir, &[]);
    assert!(!ok);
    assert!(
        err.contains("ca.crt is missing") && err.contains("restore"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(dir.join("ca.key")).unwrap(),
        key,
        "ca.key untouched"
    );
    assert!(!dir.join("ca.crt").exists(), "no new CA");
    std::fs::write(dir.join("ca.crt"), &crt).unwrap();

    // A zero-byte state.db does not start empty.
    let db = std::fs::read(dir.join("state.db")).unwrap();
    std::fs::write(dir.join("state.db"), b"").unwrap();
    let (ok, err) = serve_once(&dir, &[]);
    assert!(!ok);
    assert!(err.contains("state.db is empty"), "{err}");
    // --init never re-initialises it either.
    let (ok, err) = serve_once(&dir, &["--init"]);
    assert!(!ok);
    assert!(err.contains("already initialised"), "{err}");
    std::fs::write(dir.join("state.db"), &db).unwrap();

    // Whole again: it starts with the same CA.
    let pin = cp.ca_pin.clone();
    cp.restart(&[]);
    assert_eq!(cp.ca_pin, pin);
}

fn chunks(cid: &str, data: &[u8]) -> Vec<UploadChunk> {
    let sha = hex::encode(Sha256::digest(data));
    let (a, b) = data.split_at(data.len() / 2);
    vec![
        UploadChunk {
            command_id: cid.to_owned(),
            offset: 0,
            data: a.to_vec(),
            ..Default::default()
        },
        UploadChunk {
            command_id: cid.to_owned(),
            offset: a.len() as u64,
            data: b.to_vec(),
            last: true,
            total_bytes: data.len() as u64,
            sha256: sha,
        },
    ]
}

#[test]
fn two_concurrent_uploads_for_one_command_store_one_bundle_with_the_servers_digest() {
    let tmp = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(&tmp.path().join("cp"));
    let fa = FakeAgent::new(&cp);
    let j = fa
        .join(&cp.create_token(&[]), "ku", true, &["u1", "u2"])
        .unwrap();
    let cmd = cp.ok(
        "commands.create",
        json!({"nodeId": j.node_id, "name": "logs.collect"}),
    );
    let cid = id(&cmd);
    let bytes_a = vec![b'a'; 300_000];
    let bytes_b = vec![b'b'; 200_000];
    let sha_a = hex::encode(Sha256::digest(&bytes_a));

    // A starts and holds its stream open after its first chunk; B comes meanwhile.
    let ch = fa.rt.block_on(fa.channel(Some(&j)));
    let (a_tx, a_rx) = tokio::sync::mpsc::channel(4);
    let mut a_chunks = chunks(&cid, &bytes_a).into_iter();
    a_tx.blocking_send(a_chunks.next().unwrap()).unwrap();
    let upload_a = fa.rt.spawn(upload(ch.clone(), a_rx));
    let bundles = cp.dir.join("bundles");
    eventually(WAIT, "upload A in progress (its temp file written)", || {
        std::fs::read_dir(&bundles)
            .ok()?
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .then_some(())
    });
    let send_all = |data: &[u8]| {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        for c in chunks(&cid, data) {
            tx.blocking_send(c).unwrap();
        }
        fa.rt.block_on(upload(ch.clone(), rx))
    };
    let b_err = send_all(&bytes_b).expect_err("the second concurrent upload is refused");
    assert_eq!(b_err.code(), tonic::Code::Aborted, "{b_err:?}");
    assert!(
        b_err.message().contains("in progress"),
        "{}",
        b_err.message()
    );
    a_tx.blocking_send(a_chunks.next().unwrap()).unwrap();
    drop(a_tx);
    let a = fa
        .rt
        .block_on(upload_a)
        .unwrap()
        .expect("the first upload completes");
    assert_eq!(a.sha256, sha_a);

    // B again, after A: other bytes for a stored bundle are refused; A again is idempotent.
    assert_eq!(
        send_all(&bytes_b).unwrap_err().code(),
        tonic::Code::AlreadyExists
    );
    assert_eq!(send_all(&bytes_a).unwrap().sha256, sha_a);

    // The node claims another digest in its result; the download serves the computed one.
    let session = fa.session(&j);
    let claimed = "0".repeat(64);
    let result = json!({"bundleBytes": bytes_a.len(), "sha256": claimed, "truncated": false, "manifest": {}});
    fa.rt.block_on(async {
        session
            .tx
            .send(AgentMessage {
                epoch: 0,
                msg: Some(Msg::CommandUpdate(CommandUpdate {
                    id: cid.clone(),
                    state: bc_protocol::pb::CommandState::Succeeded as i32,
                    progress: 100,
                    result_json: serde_json::to_vec(&result).unwrap(),
                    error: None,
                })),
            })
            .await
            .unwrap()
    });
    eventually(WAIT, "the command's result as the node claimed it", || {
        let c = cp.ok("commands.get", json!({"commandId": cid}));
        (c["result"]["sha256"] == claimed.as_str()).then_some(())
    });
    let resp = reqwest::blocking::Client::new()
        .get(format!("{}/v1/bundles/{cid}", cp.api_url))
        .bearer_auth(&cp.token)
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let served = resp.headers()["x-bundle-sha256"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = resp.bytes().unwrap();
    assert_eq!(
        served, sha_a,
        "the digest the gateway computed, not the node's claim"
    );
    assert_eq!(hex::encode(Sha256::digest(&body)), sha_a);
    // No temp file is left behind.
    let leftovers: Vec<String> = std::fs::read_dir(cp.dir.join("bundles"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
