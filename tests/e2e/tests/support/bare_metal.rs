//! What the bare-metal end-to-end tests and the enrollment benchmark share: a real `bcd site`
//! process ([`SiteAgent`]) and an API client that keeps every answer ([`Seen`]), for the leak
//! checks. Included with `#[path]` (not a test target of its own).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bc_e2e::{ControlPlane, bins, eventually};
use serde_json::{Value, json};

pub const WAIT: Duration = Duration::from_secs(90);

/// A running `bcd site` (killed on drop).
pub struct SiteAgent {
    pub child: Child,
    pub state: PathBuf,
    pub log: PathBuf,
}

impl SiteAgent {
    pub fn start(cp: &ControlPlane, dir: &Path, name: &str, token: &str) -> Self {
        Self::start_with(cp, dir, name, token, &[])
    }

    pub fn start_with(
        cp: &ControlPlane,
        dir: &Path,
        name: &str,
        token: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_env(cp, dir, name, token, extra, &[])
    }

    /// [`SiteAgent::start_with`], with `BCD_SITE_*` settings (or any variable) in `env`.
    pub fn start_env(
        cp: &ControlPlane,
        dir: &Path,
        name: &str,
        token: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let (_, bcd) = bins();
        let base = dir.join(name);
        let kernel = base.join("root/proc/sys/kernel");
        std::fs::create_dir_all(kernel.join("random")).unwrap();
        std::fs::write(kernel.join("random/boot_id"), format!("boot-of-{name}\n")).unwrap();
        std::fs::write(kernel.join("hostname"), format!("{name}\n")).unwrap();
        let state = base.join("state");
        let log = base.join("site.log");
        let child = Command::new(bcd)
            .args(["site", "--control-plane", &cp.gateway_url])
            .args(["--ca-pin", &cp.ca_pin, "--join-token", token])
            .args(["--config", "/dev/null", "--reconnect-base", "100ms"])
            .args(["--reconnect-max", "1s", "--state-dir"])
            .arg(&state)
            .arg("--root")
            .arg(base.join("root"))
            .args(extra)
            .env_remove("NOTIFY_SOCKET")
            .env("BCD_LOG", "debug")
            .env("BCD_SITE_LEASE_MARGIN_MS", "1000")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting bcd site");
        Self { child, state, log }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its node id, once joined.
    pub fn node_id(&self) -> String {
        eventually(WAIT, "the site agent's identity", || {
            let text = std::fs::read_to_string(self.state.join("node.json")).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            v["nodeId"].as_str().map(str::to_owned)
        })
    }

    /// SIGTERM, and the exit status once it exited (at most `WAIT`).
    pub fn sigterm(&mut self) -> Option<std::process::ExitStatus> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).ok()?),
            nix::sys::signal::Signal::SIGTERM,
        );
        let until = std::time::Instant::now() + WAIT;
        while std::time::Instant::now() < until {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// SIGKILL.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SiteAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every API answer the test saw, for the leak check at the end.
#[derive(Default)]
pub struct Seen(pub Vec<String>);

impl Seen {
    pub fn ok(&mut self, cp: &ControlPlane, method: &str, body: Value) -> Value {
        let v = cp.ok(method, body);
        self.0.push(v.to_string());
        v
    }

    pub fn bcctl(&mut self, cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Value {
        let (bcctl, _) = bins();
        let mut child = Command::new(bcctl)
            .args(args)
            .args(["-o", "json", "--state-dir"])
            .arg(&cp.dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running bcctl");
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .unwrap()
                .write_all(format!("{input}\n").as_bytes())
                .unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        self.0.push(stdout.clone());
        self.0.push(stderr.clone());
        assert!(out.status.success(), "bcctl {args:?}: {stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }

    pub fn node(&mut self, cp: &ControlPlane, id: &str) -> Value {
        self.ok(cp, "nodes.get", json!({"nodeId": id}))
    }

    pub fn events(&mut self, cp: &ControlPlane, id: &str) -> Vec<Value> {
        let v = self.ok(cp, "nodes.events", json!({"nodeId": id}));
        v["events"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until command `id` is over and returns it.
    pub fn finished(&mut self, cp: &ControlPlane, id: &str) -> Value {
        eventually(WAIT, &format!("command {id} over"), || {
            let c = self.ok(cp, "commands.get", json!({"commandId": id}));
            matches!(
                c["state"].as_str(),
                Some("succeeded" | "failed" | "cancelled" | "expired")
            )
            .then_some(c)
        })
    }
}

pub fn condition<'a>(node: &'a Value, type_: &str) -> Option<&'a Value> {
    node["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
