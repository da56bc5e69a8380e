//! `bcctl serve` and `bcd agent` speak systemd's notify protocol (Type=notify units): READY once
//! they serve, STOPPING on SIGTERM. The test is the NOTIFY_SOCKET listener.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bc_e2e::{ControlPlane, bins};

fn read_until(sock: &UnixDatagram, want: &str, timeout: Duration) -> String {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + timeout;
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        if let Ok(n) = sock.recv(&mut buf) {
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            seen.push('\n');
            if seen.contains(want) {
                return seen;
            }
        }
    }
    panic!("no {want:?} on NOTIFY_SOCKET; got: {seen:?}");
}

#[test]
fn serve_and_agent_tell_systemd_ready_and_stopping() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    let (bcctl, bcd) = bins();

    let mut serve = Command::new(bcctl)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--state-dir",
        ])
        .arg(tmp.path().join("cp"))
        .env("NOTIFY_SOCKET", &path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let got = read_until(&sock, "READY=1", Duration::from_secs(20));
    assert!(got.contains("STATUS=gateway https://127.0.0.1:"), "{got}");

    // The agent, against a real control plane started the usual way.
    let cp = ControlPlane::start(&tmp.path().join("cp2"));
    let token = cp.create_token(&[]);
    let mut agent = Command::new(bcd)
        .args([
            "agent",
            "--control-plane",
            &cp.gateway_url,
            "--ca-pin",
            &cp.ca_pin,
            "--join-token",
            &token,
            "--state-dir",
        ])
        .arg(tmp.path().join("agent"))
        .env("NOTIFY_SOCKET", &path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    read_until(&sock, "READY=1", Duration::from_secs(20));
    read_until(&sock, "STATUS=connecting", Duration::from_secs(20));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    read_until(&sock, "STOPPING=1", Duration::from_secs(20));
    assert!(agent.wait().unwrap().success());

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    read_until(&sock, "STOPPING=1", Duration::from_secs(20));
    assert!(serve.wait().unwrap().success());
}
