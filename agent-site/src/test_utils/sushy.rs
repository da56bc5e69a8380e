//! sushy-tools' Redfish emulator with its fake systems driver, as a test's own process: a
//! loopback port picked at run time, its own state dir (the fake driver keeps its systems in a
//! sqlite file that outlives restarts), a bcrypt auth file at cost 4 (the emulator checks it on
//! every request; cost 12 costs 0.6 s a request), optional TLS.
//!
//! It runs through a small launcher of ours (`launcher.py`, written into the temp dir), which
//! changes two things of the stock emulator: a power change applies at the next read instead of
//! 1–11 s later (the fake driver's random delay), and a system's `SerialNumber` and `Model` come
//! from its config entry (the stock template has neither).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Killed, PASSWORD, USER, free_tcp_port, tool, venv_python};

/// The launcher: the emulator's own `main()`, with the fake driver's power changes applied at
/// the next read and identity fields copied from the config into system documents.
const LAUNCHER: &str = r#"# bcd test harness: run sushy-emulator's fake driver without its random power delay, and
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
#[derive(Debug, Clone)]
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
    /// `52:54:00:00:<i>`, serial `SER-<i>`, off.
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
}

/// A running emulator (killed on drop).
#[derive(Debug)]
pub struct Sushy {
    pub port: u16,
    /// `http://127.0.0.1:<port>` or `https://…`.
    pub base: String,
    pub dir: tempfile::TempDir,
    client: reqwest::Client,
    _proc: Killed,
}

fn python_literal(s: &FakeSystem) -> String {
    let nics: Vec<String> = s.macs.iter().map(|m| format!("{{'mac': '{m}'}}")).collect();
    let mut out = format!(
        "{{'uuid': '{}', 'name': '{}', 'power_state': '{}', 'nics': [{}]",
        s.uuid,
        s.name,
        if s.on { "On" } else { "Off" },
        nics.join(", ")
    );
    if let Some(serial) = &s.serial {
        let _ = write!(
            out,
            ", 'serial': '{serial}', 'model': 'Emulated {}'",
            s.name
        );
    }
    out.push('}');
    out
}

impl Sushy {
    /// The emulator's program, or `None` (test skipped, loudly; fails under CI).
    pub fn program(test: &str) -> Option<PathBuf> {
        tool("BC_SUSHY_EMULATOR", "sushy-emulator", test)
    }

    /// Starts an emulator with `systems` (TLS with `tls` = (cert, key) PEM files), waiting until
    /// it answers. `None` when the emulator is not installed (see [`Sushy::program`]).
    pub async fn start(
        test: &str,
        systems: &[FakeSystem],
        tls: Option<(&Path, &Path)>,
    ) -> Option<Self> {
        Self::start_inner(test, systems, tls, None).await
    }

    /// Starts a plain-HTTP emulator whose systems call `notify_url` on every change (the fake
    /// driver's external notifier: an HTTP PUT of the system's stored JSON — power state, the
    /// pending power request, boot device — synchronously inside the Redfish request).
    pub async fn start_notifying(
        test: &str,
        systems: &[FakeSystem],
        notify_url: &str,
    ) -> Option<Self> {
        Self::start_inner(test, systems, None, Some(notify_url)).await
    }

    async fn start_inner(
        test: &str,
        systems: &[FakeSystem],
        tls: Option<(&Path, &Path)>,
        notify_url: Option<&str>,
    ) -> Option<Self> {
        let program = Self::program(test)?;
        let python = venv_python(&program);
        let dir = tempfile::tempdir().unwrap();
        let htpasswd = dir.path().join("htpasswd");
        let hash = Command::new(&python)
            .args([
                "-c",
                "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
                PASSWORD,
            ])
            .output()
            .expect("running the emulator's python for bcrypt");
        assert!(hash.status.success(), "bcrypt: {hash:?}");
        let hash = String::from_utf8_lossy(&hash.stdout).trim().to_owned();
        std::fs::write(&htpasswd, format!("{USER}:{hash}\n")).unwrap();
        let port = free_tcp_port();
        let state = dir.path().join("state");
        let list: Vec<String> = systems
            .iter()
            .map(|s| {
                let mut l = python_literal(s);
                if notify_url.is_some() {
                    l.insert_str(l.len() - 1, ", 'external_notifier': True");
                }
                l
            })
            .collect();
        let mut conf = format!(
            "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\nSUSHY_EMULATOR_LISTEN_PORT = {port}\n\
             SUSHY_EMULATOR_FAKE_DRIVER = True\nSUSHY_EMULATOR_STATE_DIR = '{}'\n\
             SUSHY_EMULATOR_AUTH_FILE = '{}'\nSUSHY_EMULATOR_FAKE_SYSTEMS = [\n    {}\n]\n",
            state.display(),
            htpasswd.display(),
            list.join(",\n    ")
        );
        if let Some(url) = notify_url {
            let _ = writeln!(conf, "EXTERNAL_NOTIFICATION_URL = '{url}'");
        }
        if let Some((cert, key)) = tls {
            let _ = write!(
                conf,
                "SUSHY_EMULATOR_SSL_CERT = '{}'\nSUSHY_EMULATOR_SSL_KEY = '{}'\n",
                cert.display(),
                key.display()
            );
        }
        let conf_path = dir.path().join("emulator.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let launcher = dir.path().join("launcher.py");
        std::fs::write(&launcher, LAUNCHER).unwrap();
        let log = std::fs::File::create(dir.path().join("emulator.log")).unwrap();
        let child = Command::new(&python)
            .arg(&launcher)
            .arg("--config")
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting sushy-emulator");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(insecure_tls())
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let s = Self {
            port,
            base: format!("{scheme}://127.0.0.1:{port}"),
            dir,
            client,
            _proc: Killed(child),
        };
        s.wait_ready(systems.len()).await;
        Some(s)
    }

    async fn wait_ready(&self, systems: usize) {
        // The fake driver loads its systems at the first request (10 s for 1,000 of them).
        let deadline = Instant::now() + Duration::from_secs(60 + systems as u64 / 20);
        loop {
            let r = self
                .client
                .get(format!("{}/redfish/v1/Systems", self.base))
                .basic_auth(USER, Some(PASSWORD))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "sushy-emulator did not answer on port {}: {}",
                self.port,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The emulator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("emulator.log")).unwrap_or_default()
    }

    /// `host:port` of the emulator.
    pub fn socket(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The BMC address of system `uuid` (`redfish+http://127.0.0.1:<port>/redfish/v1/Systems/<uuid>`).
    pub fn address(&self, uuid: &str) -> String {
        format!("redfish+{}/redfish/v1/Systems/{uuid}", self.base)
    }

    /// The BMC address without a system path (the only system).
    pub fn root_address(&self) -> String {
        format!("redfish+{}", self.base)
    }

    /// The system's document as the emulator serves it now.
    pub async fn system(&self, uuid: &str) -> Value {
        self.client
            .get(format!("{}/redfish/v1/Systems/{uuid}", self.base))
            .basic_auth(USER, Some(PASSWORD))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// `PowerState` of the system now.
    pub async fn power(&self, uuid: &str) -> String {
        self.system(uuid).await["PowerState"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// A reset sent straight to the emulator (an out-of-band power change).
    pub async fn reset(&self, uuid: &str, reset_type: &str) {
        let r = self
            .client
            .post(format!(
                "{}/redfish/v1/Systems/{uuid}/Actions/ComputerSystem.Reset",
                self.base
            ))
            .basic_auth(USER, Some(PASSWORD))
            .json(&serde_json::json!({ "ResetType": reset_type }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "reset: {}", r.status());
    }
}

/// A rustls config that accepts any server certificate: the harness's own checks of a TLS
/// emulator (never the site agent's).
fn insecure_tls() -> rustls::ClientConfig {
    let v = crate::bmc::tls::BmcCertVerifier::new(crate::bmc::TlsMode::Insecure, None).unwrap();
    crate::bmc::tls::BmcCertVerifier::client_config(std::sync::Arc::new(v)).unwrap()
}

/// A self-signed certificate for 127.0.0.1 written as `<name>.crt`/`<name>.key` into `dir`;
/// returns the two paths and the certificate's SHA-256 (lowercase hex of the DER).
pub fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf, String) {
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("bmc {name}"));
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k, crate::bmc::tls::fingerprint(cert.der()))
}
