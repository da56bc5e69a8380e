//! pyghmi's `fakebmc` (IPMI 2.0 over LAN) as a test's own process, through a small launcher of
//! ours (written into the temp dir): it binds 127.0.0.1 only (the stock command binds every
//! interface), takes the user and password from its environment (the stock one has
//! admin/password built in), and implements `chassis power cycle` (refused while off, as real
//! BMCs do).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Killed, PASSWORD, USER, free_udp_port, tool, venv_python};

const LAUNCHER: &str = r#"# bcd test harness: pyghmi's FakeBmc on 127.0.0.1 with its credentials from the environment.
import os
import sys

import pyghmi.ipmi.bmc as bmc
from pyghmi.cmd.fakebmc import FakeBmc


class LoopbackBmc(FakeBmc):
    def __init__(self, port):
        users = {os.environ['FAKEBMC_USER']: os.environ['FAKEBMC_PASSWORD']}
        bmc.Bmc.__init__(self, users, port=port, address='127.0.0.1')
        self.powerstate = 'off'
        self.bootdevice = 'default'

    def power_cycle(self):
        if self.powerstate == 'off':
            return 0xd5  # "not supported in present state"
        self.powerstate = 'on'


print('listening', flush=True)
LoopbackBmc(int(sys.argv[1])).listen()
"#;

/// A running fakebmc (killed on drop).
#[derive(Debug)]
pub struct FakeBmcProcess {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub ipmitool: PathBuf,
    _proc: Killed,
}

impl FakeBmcProcess {
    /// Starts fakebmc with [`USER`]/[`PASSWORD`], waiting until ipmitool gets an answer. `None`
    /// when fakebmc or ipmitool is missing (skipped loudly; fails under CI).
    pub async fn start(test: &str) -> Option<Self> {
        let fakebmc = tool("BC_FAKEBMC", "fakebmc", test)?;
        let ipmitool = tool("BC_IPMITOOL", "ipmitool", test)?;
        let python = venv_python(&fakebmc);
        let dir = tempfile::tempdir().unwrap();
        let launcher = dir.path().join("fakebmc.py");
        std::fs::write(&launcher, LAUNCHER).unwrap();
        let port = free_udp_port();
        let log = std::fs::File::create(dir.path().join("fakebmc.log")).unwrap();
        let child = Command::new(python)
            .arg(&launcher)
            .arg(port.to_string())
            .env("FAKEBMC_USER", USER)
            .env("FAKEBMC_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting fakebmc");
        let me = Self {
            port,
            dir,
            ipmitool,
            _proc: Killed(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !me.answers() {
            assert!(
                Instant::now() < deadline,
                "fakebmc did not answer on port {port}: {}",
                std::fs::read_to_string(me.dir.path().join("fakebmc.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(me)
    }

    fn answers(&self) -> bool {
        self.ipmitool(&["chassis", "power", "status"])
            .is_some_and(|o| o.contains("Chassis Power is"))
    }

    /// Runs `ipmitool … args` against it directly (the harness's own view); stdout on success.
    pub fn ipmitool(&self, args: &[&str]) -> Option<String> {
        let out = Command::new(&self.ipmitool)
            .args(["-I", "lanplus", "-H", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", USER, "-E", "-N", "1", "-R", "1"])
            .args(args)
            .env("IPMI_PASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The BMC address (`ipmi://127.0.0.1:<port>`).
    pub fn address(&self) -> String {
        format!("ipmi://127.0.0.1:{}", self.port)
    }
}
