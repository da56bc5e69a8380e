//! End-to-end harness: starts real `bcctl serve` and `bcd agent` processes on loopback ports
//! picked at run time (port 0; the server writes the bound addresses to `endpoints.json`), with
//! short timings, and kills them when dropped.
//!
//! The binaries are built once per test process (`cargo build --workspace --bins --tests`) into the same target
//! dir as the test, so `cargo test --workspace` always runs the current code.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod fake_agent;
pub mod ramdisk;
pub mod vm;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use nix::sys::signal::Signal;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use serde_json::{Value, json};

/// Heartbeat interval the tests run with.
pub const HEARTBEAT: &str = "150ms";
/// Silence after which the test control plane marks a node unreachable.
pub const UNREACHABLE_AFTER: &str = "1s";

/// `target/<profile>` of this test binary (`target/<profile>/deps/<test>`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_owned()
}

/// A `cargo` command for a test to build with, without the variables cargo set for the test
/// itself (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, …): inherited, they change the fingerprint of
/// every crate whose build reads them, and the whole workspace is rebuilt from a test.
pub fn cargo_command() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || k.starts_with("CARGO_BIN_")
            || matches!(
                k,
                "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
            )
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// `bcctl` and `bcd`, once built.
static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

/// Builds the binaries with `build(target/<profile>, target)` instead of the whole workspace,
/// unless [`bins`] has built them already in this process: for tests that need only a few
/// binaries ([`ramdisk::bins`]).
pub fn preset_bins(build: impl FnOnce(&Path, &Path)) {
    BINS.get_or_init(|| {
        let dir = profile_dir();
        let target = dir.parent().expect("target dir").to_owned();
        build(&dir, &target);
        (dir.join("bcctl"), dir.join("bcd"))
    });
}

/// Paths of the built binaries, building them once.
pub fn bins() -> &'static (PathBuf, PathBuf) {
    BINS.get_or_init(|| {
        let dir = profile_dir();
        let target = dir.parent().expect("target dir").to_owned();
        let mut cmd = cargo_command();
        // The same targets and feature resolution as `cargo test --workspace`, so after that
        // command this build has nothing to do; run alone, it brings the binaries up to date.
        cmd.args(["build", "--workspace", "--bins", "--tests", "--target-dir"])
            .arg(&target)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        if dir.file_name().and_then(|n| n.to_str()) == Some("release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("running cargo build");
        assert!(status.success(), "building bcd and bcctl failed");
        (dir.join("bcctl"), dir.join("bcd"))
    })
}

/// Polls `f` every 50 ms until it returns `Some`, or panics with `what` after `timeout`.
pub fn eventually<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(child: &Child, sig: Signal) {
    let _ = kill(Pid::from_raw(child.id() as i32), sig);
}

/// Signals the agent's whole process group: under a wrapper (`faketime`, which forks) the agent
/// is the wrapper's child, and a signal to the wrapper alone would orphan it.
fn signal_group(child: &Child, sig: Signal) {
    let _ = nix::sys::signal::killpg(Pid::from_raw(child.id() as i32), sig);
}

/// A running `bcctl serve`.
#[derive(Debug)]
pub struct ControlPlane {
    pub dir: PathBuf,
    pub child: Option<Child>,
    pub gateway_url: String,
    pub api_url: String,
    pub ca_pin: String,
    pub token: String,
    http: reqwest::blocking::Client,
}

impl ControlPlane {
    /// Starts `bcctl serve` with its state in `dir` (kept across restarts).
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// Same, with extra flags.
    pub fn start_with(dir: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        Self::start_with_args(dir, &args)
    }

    /// Starts `bcctl serve` with exactly `extra` after the timings (no default listen addresses).
    pub fn start_with_args(dir: &Path, extra: &[&str]) -> Self {
        let (bcctl, _) = bins();
        // A new dir is initialised explicitly (`--init`): it is not empty, it holds serve.log.
        let new = !dir.join("state-dir.json").exists() && !dir.join("state.db").exists();
        std::fs::create_dir_all(dir).unwrap();
        let _ = std::fs::remove_file(dir.join("endpoints.json"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let mut child = Command::new(bcctl)
            .arg("serve")
            .args([
                "--heartbeat-interval",
                HEARTBEAT,
                "--unreachable-after",
                UNREACHABLE_AFTER,
            ])
            .arg("--state-dir")
            .arg(dir)
            .args(if new { &["--init"][..] } else { &[][..] })
            .args(extra)
            .env("BCCTL_LOG", "info,controlplane_lite=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting bcctl serve");
        let ep: Value = eventually(Duration::from_secs(20), "endpoints.json", || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "bcctl serve exited early: {status}\n{}",
                    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
                );
            }
            let text = std::fs::read_to_string(dir.join("endpoints.json")).ok()?;
            serde_json::from_str(&text).ok()
        });
        let token = std::fs::read_to_string(dir.join("api-token"))
            .unwrap()
            .trim()
            .to_owned();
        Self {
            dir: dir.to_owned(),
            child: Some(child),
            gateway_url: ep["gatewayUrl"].as_str().unwrap().to_owned(),
            api_url: ep["apiUrl"].as_str().unwrap().to_owned(),
            ca_pin: ep["caPin"].as_str().unwrap().to_owned(),
            token,
            http: reqwest::blocking::Client::new(),
        }
    }

    /// Calls the operator API; returns (HTTP status, JSON body).
    pub fn call(&self, method: &str, body: Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/v1/{method}", self.api_url))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .expect("operator API reachable");
        let status = resp.status().as_u16();
        (status, resp.json().unwrap_or(Value::Null))
    }

    /// Calls the operator API and asserts success.
    pub fn ok(&self, method: &str, body: Value) -> Value {
        let (status, v) = self.call(method, body);
        assert_eq!(status, 200, "{method} failed: {v}");
        v
    }

    /// Runs `bcctl <args> --state-dir <dir>` and returns (success, stdout, stderr).
    pub fn bcctl(&self, args: &[&str]) -> (bool, String, String) {
        let (bcctl, _) = bins();
        let out = Command::new(bcctl)
            .args(args)
            .arg("--state-dir")
            .arg(&self.dir)
            .output()
            .expect("running bcctl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A platform site `s1` with a `metal-host` pool `p1` in it; returns the pool's id. The pool
    /// accepts an untrusted hardware key: the test machines have no SMBIOS, so a real agent's key
    /// is untrusted, and metal pools require a trusted one by default (issue 18 item 9).
    pub fn metal_host_pool(&self) -> String {
        let site = self.ok("sites.create", json!({"name": "s1", "kind": "platform"}));
        let pool = self.ok(
            "pools.create",
            json!({"name": "p1", "kind": "metal-host", "siteId": site["id"],
                   "acceptance": {"requireTrustedKey": false}}),
        );
        pool["id"].as_str().unwrap().to_owned()
    }

    /// Creates a join token through `bcctl tokens create -o json`.
    pub fn create_token(&self, extra: &[&str]) -> String {
        let mut args = vec!["tokens", "create", "-o", "json"];
        args.extend_from_slice(extra);
        let (ok, out, err) = self.bcctl(&args);
        assert!(ok, "tokens create failed: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["caPin"].as_str(), Some(self.ca_pin.as_str()));
        v["token"].as_str().unwrap().to_owned()
    }

    /// Every node's NodeDetail.
    pub fn nodes(&self) -> Vec<Value> {
        self.ok("nodes.list", json!({}))["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// One node's NodeDetail.
    pub fn node(&self, id: &str) -> Value {
        self.ok("nodes.get", json!({"nodeId": id}))
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts `bcctl serve` again on the same state dir and the same ports (agents keep their
    /// URL), after [`ControlPlane::kill9`] or [`ControlPlane::stop`].
    pub fn restart(&mut self, extra: &[&str]) {
        let listen = format!("127.0.0.1:{}", port_of(&self.gateway_url));
        self.restart_with_gateway(&listen, extra);
    }

    /// Same, with the gateway on `listen` (`127.0.0.1:<port>`) instead of its old port (the
    /// API keeps its port): a control plane that moved, as one replica of a list going away and
    /// another answering looks to an agent.
    pub fn restart_with_gateway(&mut self, listen: &str, extra: &[&str]) {
        let api = format!("127.0.0.1:{}", port_of(&self.api_url));
        let mut args: Vec<&str> = vec!["--listen", listen, "--api-listen", &api];
        args.extend_from_slice(extra);
        let fresh = Self::start_with_args(&self.dir, &args);
        *self = fresh;
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        signal(&c, Signal::SIGTERM);
        c.wait().ok()
    }
}

/// The port of `https://host:port`.
fn port_of(url: &str) -> String {
    url.rsplit(':')
        .next()
        .unwrap_or("0")
        .trim_end_matches('/')
        .to_owned()
}

/// A loopback port nothing listens on now: bound, read and released. A URL at it is a dead
/// control-plane replica until something binds it.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A running `bcd agent`.
#[derive(Debug)]
pub struct Agent {
    pub state_dir: PathBuf,
    pub log: PathBuf,
    pub child: Option<Child>,
}

impl Agent {
    /// Starts `bcd agent` against `cp` with `token` (None: reuse the stored identity).
    pub fn start(cp: &ControlPlane, state_dir: &Path, token: Option<&str>, extra: &[&str]) -> Self {
        Self::start_with_pin(cp, state_dir, token, &cp.ca_pin, extra)
    }

    /// Same, with an explicit CA pin.
    pub fn start_with_pin(
        cp: &ControlPlane,
        state_dir: &Path,
        token: Option<&str>,
        pin: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_full(cp, state_dir, token, pin, extra, &[])
    }

    /// Same, run under a wrapper command (e.g. `faketime -f -180s`).
    pub fn start_full(
        cp: &ControlPlane,
        state_dir: &Path,
        token: Option<&str>,
        pin: &str,
        extra: &[&str],
        wrapper: &[&str],
    ) -> Self {
        Self::spawn(&[&cp.gateway_url], state_dir, token, pin, extra, wrapper)
    }

    /// Starts `bcd agent` with the gateway URLs `urls` (one `--control-plane` flag each; an item
    /// may itself be a comma-separated list) instead of one control plane's.
    pub fn start_at(
        urls: &[&str],
        state_dir: &Path,
        token: Option<&str>,
        pin: &str,
        extra: &[&str],
    ) -> Self {
        Self::spawn(urls, state_dir, token, pin, extra, &[])
    }

    fn spawn(
        urls: &[&str],
        state_dir: &Path,
        token: Option<&str>,
        pin: &str,
        extra: &[&str],
        wrapper: &[&str],
    ) -> Self {
        let (_, bcd) = bins();
        std::fs::create_dir_all(state_dir).unwrap();
        let log_path = state_dir.with_extension("log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let mut cmd = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(bcd);
                c
            }
            None => Command::new(bcd),
        };
        // Its own process group, so kill9/signal reach the agent under a wrapper too.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.arg("agent");
        for url in urls {
            cmd.args(["--control-plane", url]);
        }
        cmd.args(["--ca-pin", pin])
            .arg("--state-dir")
            .arg(state_dir)
            .args(["--reconnect-base", "100ms", "--reconnect-max", "1s"])
            .args(extra)
            .env("BCD_LOG", "info,bcd=debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(t) = token {
            cmd.args(["--join-token", t]);
        }
        let child = cmd.spawn().expect("starting bcd agent");
        Self {
            state_dir: state_dir.to_owned(),
            log: log_path,
            child: Some(child),
        }
    }

    /// The node id from the state dir, once joined.
    pub fn node_id(&self) -> String {
        eventually(
            Duration::from_secs(20),
            "agent identity (node.json)",
            || {
                let text = std::fs::read_to_string(self.state_dir.join("node.json")).ok()?;
                let v: Value = serde_json::from_str(&text).ok()?;
                v["nodeId"].as_str().map(str::to_owned)
            },
        )
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit (panics after `timeout`).
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("agent running");
        let status = eventually(timeout, "agent exit", || child.try_wait().ok().flatten());
        self.child = None;
        status
    }

    /// Sends `sig` to the agent (its process group).
    pub fn signal(&self, sig: Signal) {
        if let Some(c) = &self.child {
            signal_group(c, sig);
        }
    }

    /// SIGTERM, then wait for exit.
    pub fn sigterm(&mut self) -> ExitStatus {
        if let Some(c) = &self.child {
            signal_group(c, Signal::SIGTERM);
        }
        self.wait_exit(Duration::from_secs(15))
    }

    /// SIGKILL to the agent's process group (the agent and any wrapper), then reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal_group(&c, Signal::SIGKILL);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Logical CPUs of this machine from `/proc/cpuinfo`.
pub fn real_cpu_threads() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(':').next().map(str::trim) == Some("processor"))
        .count() as u64
}

/// (name, MAC) of this machine's physical interfaces (those with a `device` link) from
/// `/sys/class/net`.
pub fn real_macs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/class/net") {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == "lo" || !e.path().join("device").exists() {
                continue;
            }
            if let Ok(mac) = std::fs::read_to_string(e.path().join("address")) {
                out.push((name, mac.trim().to_ascii_lowercase()));
            }
        }
    }
    out.sort();
    out
}
