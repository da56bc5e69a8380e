//! Test harness pieces (feature `test-utils`, and this crate's own tests): the BMC simulators as
//! real processes — sushy-tools' Redfish emulator ([`sushy::Sushy`]) and pyghmi's fakebmc
//! ([`fakebmc::FakeBmcProcess`]) — a fault-injecting HTTP proxy ([`proxy::FaultProxy`]), and
//! the in-memory fake BMC ([`FakeBmc`]). Not for production builds.
//!
//! The tools are found through `BC_SUSHY_EMULATOR`, `BC_FAKEBMC` and `BC_IPMITOOL` (set by
//! `.ci/run`), else on `PATH`. A test that lacks one says so loudly and skips, except under
//! `CI=true`, where it fails ([`tool`]). Every process is started on a loopback port picked at
//! run time with its own temp dir, and killed when its guard drops (a failing test too).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod fakebmc;
pub mod proxy;
pub mod sushy;

use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

pub use crate::bmc::fake::{FakeBmc, FakeConnector};

/// The BMC password every simulator here is started with; redaction tests grep for it.
pub const PASSWORD: &str = "s3cret-Pa55-for-bmc";
/// The BMC user.
pub const USER: &str = "admin";

/// Whether this run is CI (`CI=true`), where a missing tool is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The program `env_var` names, else `name` on `PATH`. When neither exists: fails under CI,
/// else prints a loud notice for `test` and returns `None` (the test skips).
pub fn tool(env_var: &str, name: &str, test: &str) -> Option<PathBuf> {
    let found = bc_metal_sim::find_program(env_var, name);
    if found.is_none() {
        assert!(
            !in_ci(),
            "{name} is missing on a CI machine (set {env_var}; .ci/run installs it)"
        );
        eprintln!(
            "!!! {name} not found (set {env_var} or put it on PATH): {test} SKIPPED, nothing was checked"
        );
    }
    found
}

pub use bc_metal_sim::sushy::venv_python;

/// A free TCP port on 127.0.0.1 (bound then released: another process could take it, which
/// the loopback-only, short-lived tests here accept).
pub fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A free UDP port on 127.0.0.1.
pub fn free_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// A child process killed (and reaped) when dropped.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `f` every 50 ms until it gives `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
