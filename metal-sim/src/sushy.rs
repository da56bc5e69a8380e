//! sushy-tools' Redfish emulator with its fake systems driver, as a process of ours: its config
//! (systems, listen address, state dir, auth file, TLS, external notifier) and a small launcher
//! that changes two things of the stock emulator: a power change applies at the next read instead
//! of 1–11 s later (the fake driver's random delay), and a system's `SerialNumber` and `Model`
//! come from its config entry (the stock template has neither).
//!
//! Starting the process is the caller's (`bcd_site::test_utils::sushy` in tests, `bcctl dev
//! --metal`): this module writes what it needs and says which interpreter runs it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The launcher: the emulator's own `main()`, with the fake driver's power changes applied at
/// the next read and identity fields copied from the config into system documents.
pub const LAUNCHER: &str = r#"# bcd harness: run sushy-emulator's fake driver without its random power delay, and
# answer SerialNumber/Model from the config entries of SUSHY_EMULATOR_FAKE_SYSTEMS.
import json
import sys

import flask
from sushy_tools.emulator import main as emulator
from sushy_tools.emulator.resources.systems import fakedriver

_set_power_state = fakedriver.FakeDriver.set_power_state


def set_power_state_now(self, identity, state):
    _set_power_state(self, identity, state)
    system = self._systems[self.uuid(identity)]
    if system.get('pending_power'):
        system['pending_power']['apply_time'] = 0
        self._systems[system['uuid']] = system


fakedriver.FakeDriver.set_power_state = set_power_state_now


@emulator.app.after_request
def add_identity(response):
    path = flask.request.path.rstrip('/').split('/')
    if flask.request.method != 'GET' or response.status_code != 200 or len(path) != 5 \
            or path[1:4] != ['redfish', 'v1', 'Systems']:
        return response
    entry = next((s for s in emulator.app.config.get('SUSHY_EMULATOR_FAKE_SYSTEMS', [])
                  if s.get('uuid') == path[4]), None)
    if not entry:
        return response
    doc = json.loads(response.get_data())
    for key, field in (('serial', 'SerialNumber'), ('model', 'Model')):
        if entry.get(key):
            doc[field] = entry[key]
    response.set_data(json.dumps(doc))
    return response


sys.exit(emulator.main())
"#;

/// One fake system of the emulator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSystem {
    /// Its UUID (also its id: `/redfish/v1/Systems/<uuid>`).
    pub uuid: String,
    /// Its name.
    pub name: String,
    /// Powered on at start.
    pub on: bool,
    /// NIC MACs.
    pub macs: Vec<String>,
    /// `SerialNumber` (through the launcher).
    pub serial: Option<String>,
}

impl FakeSystem {
    /// System `i`: UUID `11111111-2222-3333-4444-<i as 12 digits>`, one NIC
    /// `52:54:00:<i as 3 bytes>`, serial `SER-<i>`, off.
    pub fn numbered(i: u32) -> Self {
        Self {
            uuid: format!("11111111-2222-3333-4444-{i:012}"),
            name: format!("node-{i}"),
            on: false,
            macs: vec![format!(
                "52:54:00:{:02X}:{:02X}:{:02X}",
                (i >> 16) & 0xff,
                (i >> 8) & 0xff,
                i & 0xff
            )],
            serial: Some(format!("SER-{i}")),
        }
    }

    /// The config entry (a Python dict literal); with `notify`, the fake driver calls the
    /// external notifier on every change of this system.
    fn python_literal(&self, notify: bool) -> String {
        let nics: Vec<String> = self
            .macs
            .iter()
            .map(|m| format!("{{'mac': '{m}'}}"))
            .collect();
        let mut out = format!(
            "{{'uuid': '{}', 'name': '{}', 'power_state': '{}', 'nics': [{}]",
            self.uuid,
            self.name,
            if self.on { "On" } else { "Off" },
            nics.join(", ")
        );
        if let Some(serial) = &self.serial {
            let _ = write!(
                out,
                ", 'serial': '{serial}', 'model': 'Emulated {}'",
                self.name
            );
        }
        if notify {
            out.push_str(", 'external_notifier': True");
        }
        out.push('}');
        out
    }
}

/// What the emulator is started with.
#[derive(Debug, Clone)]
pub struct EmulatorConfig<'a> {
    /// Loopback port.
    pub port: u16,
    /// The fake driver's state (a sqlite file that outlives restarts: give each run its own).
    pub state_dir: &'a Path,
    /// An htpasswd file (bcrypt only; see [`htpasswd_script`]).
    pub htpasswd: &'a Path,
    /// The systems.
    pub systems: &'a [FakeSystem],
    /// TLS certificate and key (PEM files); plain HTTP without.
    pub tls: Option<(&'a Path, &'a Path)>,
    /// Where every change of a system is PUT (its stored JSON), inside the Redfish request that
    /// made it; `None`: no notifier.
    pub notify_url: Option<&'a str>,
}

impl EmulatorConfig<'_> {
    /// The config file's text (Python, read by the emulator's `--config`).
    pub fn text(&self) -> String {
        let list: Vec<String> = self
            .systems
            .iter()
            .map(|s| s.python_literal(self.notify_url.is_some()))
            .collect();
        let mut conf = format!(
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {}\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = '{}'\n\
             SUSHY_EMULATOR_AUTH_FILE = '{}'\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n    {}\n]\n",
            self.port,
            self.state_dir.display(),
            self.htpasswd.display(),
            list.join(",\n    ")
        );
        if let Some(url) = self.notify_url {
            let _ = writeln!(conf, "EXTERNAL_NOTIFICATION_URL = '{url}'");
        }
        if let Some((cert, key)) = self.tls {
            let _ = write!(
                conf,
                "SUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\n",
                cert.display(),
                key.display()
            );
        }
        conf
    }
}

/// A Python one-liner for the emulator's interpreter that prints the htpasswd line of `argv[1]`
/// (user) and `argv[2]` (password) with bcrypt at cost 4 (the emulator checks it on every request;
/// cost 12 costs 0.6 s a request). `bcrypt` comes with sushy-tools.
pub fn htpasswd_script() -> &'static str {
    "import bcrypt, sys; print(sys.argv[1] + ':' + bcrypt.hashpw(sys.argv[2].encode(), bcrypt.gensalt(rounds=4)).decode())"
}

/// The Python interpreter of the virtualenv a console script (`sushy-emulator`, `fakebmc`)
/// belongs to: the `python3` beside it, else `python3` on `PATH`.
pub fn venv_python(script: &Path) -> PathBuf {
    let dir = script.parent().unwrap_or(Path::new("."));
    for n in ["python3", "python"] {
        if dir.join(n).exists() {
            return dir.join(n);
        }
    }
    PathBuf::from("python3")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_names_every_system_and_the_notifier() {
        let mut s = FakeSystem::numbered(7);
        s.macs = vec!["00:1B:21:AA:BB:07".into()];
        let c = EmulatorConfig {
            port: 8000,
            state_dir: Path::new("/tmp/st"),
            htpasswd: Path::new("/tmp/pw"),
            systems: &[s],
            tls: None,
            notify_url: Some("http://127.0.0.1:9/notify"),
        };
        let t = c.text();
        assert!(t.contains("SUSHY_EMULATOR_LISTEN_PORT = 8000"), "{t}");
        assert!(
            t.contains("'uuid': '11111111-2222-3333-4444-000000000007'")
                && t.contains("'nics': [{'mac': '00:1B:21:AA:BB:07'}]")
                && t.contains("'serial': 'SER-7'")
                && t.contains("'external_notifier': True"),
            "{t}"
        );
        assert!(
            t.contains("EXTERNAL_NOTIFICATION_URL = 'http://127.0.0.1:9/notify'"),
            "{t}"
        );
        let quiet = EmulatorConfig {
            notify_url: None,
            ..c
        }
        .text();
        assert!(
            !quiet.contains("notifier") && !quiet.contains("NOTIFICATION"),
            "{quiet}"
        );
    }
}
