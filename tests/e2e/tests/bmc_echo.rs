//! A BMC that echoes the credentials it received (issue 30.5): a stand-in Redfish BMC in this
//! test answers every request with the `Authorization` header and the password it decodes from
//! it, in the encodings HTTP and JSON use (as sent, base64, percent-encoded, JSON `\u` escapes,
//! hex, HTML character references): one behind a 401, one behind a 500. A real `bcctl serve` and
//! a real `bcd site` verify both machines; no form of the password reaches a condition, an
//! event, a command's result, an API answer, the site agent's log or journal, serve's log or
//! the store's files. Needs no tool beyond the binaries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/bare_metal.rs"]
mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use bc_e2e::{ControlPlane, eventually};
use serde_json::{Value, json};
use support::{Seen, SiteAgent, WAIT, condition};

/// The password: a `/`, a `+`, a `:` and a non-ASCII letter, so each encoding differs from it.
const PASSWORD: &str = "Ech0/ed+Pa:ss-é9";
const USER: &str = "admin";

fn percent_all(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

fn json_u(s: &str) -> String {
    s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect()
}

fn html(s: &str) -> String {
    s.chars()
        .map(|c| format!("&#x{:x};", u32::from(c)))
        .collect()
}

/// The body a stand-in answers with, from the request's `Authorization` header.
fn echo_body(authorization: &str) -> String {
    let password = authorization
        .strip_prefix("Basic ")
        .and_then(|b| STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|pair| pair.split_once(':').map(|(_, p)| p.to_owned()))
        .unwrap_or_default();
    format!(
        concat!(
            r#"{{"error":{{"code":"Base.1.0.GeneralError","message":"login failed for {auth}","#,
            r#""@Message.ExtendedInfo":[{{"Message":"{pw_b64} {pw_pct} {auth_u}","#,
            r#""Resolution":"{auth_b64} {pw_hex} {pw_u} {pw_html} {auth_pct}"}}]}}}}"#
        ),
        auth = authorization,
        pw_b64 = URL_SAFE_NO_PAD.encode(&password),
        pw_pct = percent_all(&password),
        auth_u = json_u(authorization),
        auth_b64 = STANDARD.encode(authorization),
        pw_hex = hex::encode(&password),
        pw_u = json_u(&password),
        pw_html = html(&password),
        auth_pct = percent_all(authorization),
    )
}

/// Every form of the password the stand-ins put in an answer (and the plain one). The `\u`
/// forms are searched with backslashes removed, so a JSON answer's `\\u` counts too.
fn forms() -> Vec<String> {
    let pair = format!("{USER}:{PASSWORD}");
    let auth = format!("Basic {}", STANDARD.encode(&pair));
    vec![
        PASSWORD.to_owned(),
        STANDARD.encode(&pair),
        STANDARD_NO_PAD.encode(&pair),
        URL_SAFE_NO_PAD.encode(PASSWORD),
        STANDARD_NO_PAD.encode(PASSWORD),
        percent_all(PASSWORD),
        percent_all(PASSWORD).to_lowercase(),
        percent_all(&auth),
        STANDARD_NO_PAD.encode(&auth),
        json_u(PASSWORD).replace('\\', ""),
        json_u(&auth).replace('\\', ""),
        hex::encode(PASSWORD),
        html(PASSWORD),
    ]
}

/// A stand-in BMC on loopback answering every request with `status` and [`echo_body`]; counts
/// the answers it gave.
fn stand_in(status: &'static str) -> (String, Arc<Mutex<u32>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(Mutex::new(0u32));
    let count = Arc::clone(&answered);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let count = Arc::clone(&count);
            std::thread::spawn(move || answer(conn, status, &count));
        }
    });
    (
        format!("redfish+http://{addr}/redfish/v1/Systems/1"),
        answered,
    )
}

fn answer(mut conn: TcpStream, status: &str, count: &Mutex<u32>) {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let authorization = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("authorization")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    let body = echo_body(&authorization);
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nWWW-Authenticate: Basic realm=\"{authorization}\"\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    if conn.write_all(reply.as_bytes()).is_ok() {
        *count.lock().unwrap() += 1;
    }
}

/// Every regular file under `dir`, as text (lossy), with its path.
fn files(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files(&p));
        } else if let Ok(bytes) = std::fs::read(&p) {
            out.push((
                p.display().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
    }
    out
}

/// The failed `bmc.verify` of machine `node`, once there is one.
fn failed_verify(seen: &mut Seen, cp: &ControlPlane, node: &str) -> Option<Value> {
    let all = seen.ok(cp, "commands.list", json!({"limit": 1000}));
    all["commands"].as_array()?.iter().find_map(|c| {
        (c["name"] == "bmc.verify" && c["args"]["nodeId"] == node && c["state"] == "failed")
            .then(|| c.clone())
    })
}

#[test]
fn a_bmc_echoing_the_credentials_leaks_no_form_of_the_password() {
    let (addr_401, answered_401) = stand_in("401 Unauthorized");
    let (addr_500, answered_500) = stand_in("500 Internal Server Error");
    let dir = tempfile::tempdir().unwrap();
    let mut cp = ControlPlane::start_with(
        &dir.path().join("cp"),
        &["--site-lease-ttl", "4s", "--power-sync-interval", "1s"],
    );
    let mut seen = Seen::default();
    let site = seen.ok(
        &cp,
        "sites.create",
        json!({"name": "dc1", "kind": "platform"}),
    );
    let site = site["id"].as_str().unwrap().to_owned();
    let token = cp.create_token(&["--site", &site]);
    let mut agent = SiteAgent::start(&cp, dir.path(), "site-a", &token);
    eventually(WAIT, "the site agent holding the lease", || {
        let s = seen.ok(&cp, "sites.get", json!({"siteId": site}));
        s["lease"]["holderNodeId"].as_str().map(str::to_owned)
    });

    let mut nodes = Vec::new();
    for (name, address) in [("refused", &addr_401), ("faulty", &addr_500)] {
        let n = seen.ok(
            &cp,
            "nodes.enroll",
            json!({"siteId": site, "name": name, "inspect": false, "bmc": {
                "address": address, "username": USER, "password": PASSWORD}}),
        );
        nodes.push(n["id"].as_str().unwrap().to_owned());
    }
    // Both verifications fail, each with a reason and a message saying what the BMC answered.
    for (id, code) in [(&nodes[0], "BMC_AUTH_FAILED"), (&nodes[1], "BMC_ERROR")] {
        let c = eventually(WAIT, &format!("{id}'s verification failed"), || {
            failed_verify(&mut seen, &cp, id)
        });
        assert_eq!(c["error"]["code"], code, "{c:#}");
        let n = eventually(WAIT, &format!("{id}'s BmcVerified condition"), || {
            let n = seen.node(&cp, id);
            condition(&n, "BmcVerified")
                .is_some_and(|c| c["status"] == "false")
                .then_some(n)
        });
        let message = condition(&n, "BmcVerified").unwrap()["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains("HTTP"), "{message}");
    }
    assert!(*answered_401.lock().unwrap() > 0 && *answered_500.lock().unwrap() > 0);
    for id in &nodes {
        seen.events(&cp, id);
    }
    seen.ok(&cp, "nodes.list", json!({}));
    seen.ok(&cp, "sites.get", json!({"siteId": site}));
    seen.bcctl(&cp, &["commands", "list"], None);
    // The site agent's log says why its commands failed, and what it said is checked below.
    let log = agent.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("command finished") && l.contains("BMC_AUTH_FAILED")),
        "{log}"
    );

    agent.kill9();
    cp.stop();
    let mut places: Vec<(String, String)> = seen
        .0
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("API answer {i}"), a.clone()))
        .collect();
    places.push(("the site agent's log".into(), agent.log_text()));
    places.extend(files(&agent.state));
    places.extend(files(&cp.dir));
    assert!(
        places.iter().any(|(p, _)| p.ends_with("state.db")),
        "the store was read"
    );
    let mut leaks = Vec::new();
    for (place, text) in &places {
        let flat = text.replace('\\', "");
        for form in forms() {
            if text.contains(&form) || flat.contains(&form) {
                leaks.push(format!("{place}: {form}"));
            }
        }
    }
    assert!(
        leaks.is_empty(),
        "the password leaked:\n{}",
        leaks.join("\n")
    );
}
