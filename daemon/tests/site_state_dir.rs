//! Real `bcd site` processes and their state dir: one site agent per state dir, as for `bcd
//! agent` (two appliances' processes on one dir would share an identity and a command journal,
//! and both would act on the BMCs). A second one exits naming the first one's pid and the dir;
//! the first runs on; after it is killed a new one takes over.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
/// A pin no control plane has: joins to the dead address below fail before any token is sent.
const PIN: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";
/// Nothing listens here.
const DEAD: &str = "https://127.0.0.1:1";

/// A `bcd site` process, killed when dropped; its stderr goes to a file.
struct Site {
    child: Option<Child>,
    log: PathBuf,
}

impl Site {
    fn start(root: &Path, state_dir: &Path, n: u32) -> Self {
        let log = state_dir.with_extension(format!("{n}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_bcd"))
            .args(["site", "--control-plane", DEAD, "--ca-pin", PIN])
            .args([
                "--join-token",
                "abcdef.0123456789abcdef",
                "--config",
                "/dev/null",
            ])
            .arg("--state-dir")
            .arg(state_dir)
            .arg("--root")
            .arg(root)
            .args(["--reconnect-base", "100ms", "--reconnect-max", "1s"])
            .env_remove("NOTIFY_SOCKET")
            .env_remove("BCD_JOIN_TOKEN")
            .env("BCD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            child: Some(child),
            log,
        }
    }
    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Waits for the process to exit; `None` after `timeout`.
    fn exit_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Some(st) = child.try_wait().unwrap() {
                self.child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        self.kill();
    }
}

fn host_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    let k = root.join("proc/sys/kernel");
    std::fs::create_dir_all(k.join("random")).unwrap();
    std::fs::write(k.join("random/boot_id"), "7d2a-boot-of-the-site\n").unwrap();
    std::fs::write(k.join("hostname"), "site-appliance\n").unwrap();
    root
}

fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status_pid(state_dir: &Path) -> Option<u64> {
    std::fs::read_to_string(state_dir.join("status.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["pid"].as_u64())
}

#[test]
fn a_second_site_agent_on_the_same_state_dir_exits_naming_the_first_ones_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let root = host_root(tmp.path());
    let dir = tmp.path().join("state");
    // A join that can never succeed keeps the first site agent running (and retrying).
    let mut first = Site::start(&root, &dir, 1);
    eventually("the first site agent's status.json", || {
        (status_pid(&dir) == Some(u64::from(first.pid()))).then_some(())
    });
    let mut second = Site::start(&root, &dir, 2);
    let exit = second.exit_within(WAIT);
    assert!(
        exit.is_some_and(|s| !s.success()),
        "the second site agent kept running on the same state dir: {}",
        second.log()
    );
    let log = second.log();
    assert!(log.contains(&format!("pid {}", first.pid())), "{log}");
    assert!(log.contains(&dir.display().to_string()), "{log}");
    assert!(first.exit_within(Duration::from_millis(300)).is_none());
    assert_eq!(status_pid(&dir), Some(u64::from(first.pid())));

    // The lock lives as long as the process: after kill -9 a new site agent takes over.
    first.kill();
    let third = Site::start(&root, &dir, 3);
    eventually("the third site agent's status.json", || {
        (status_pid(&dir) == Some(u64::from(third.pid()))).then_some(())
    });
}
