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

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Killed, PASSWORD, USER, free_tcp_port, tool, venv_python};

pub use bc_metal_sim::sushy::FakeSystem;
use bc_metal_sim::sushy::{EmulatorConfig, LAUNCHER, htpasswd_script};

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
        let line = Command::new(&python)
            .args(["-c", htpasswd_script(), USER, PASSWORD])
            .output()
            .expect("running the emulator's python for bcrypt");
        assert!(line.status.success(), "bcrypt: {line:?}");
        std::fs::write(
            &htpasswd,
            format!("{}\n", String::from_utf8_lossy(&line.stdout).trim()),
        )
        .unwrap();
        let port = free_tcp_port();
        let state = dir.path().join("state");
        let conf = EmulatorConfig {
            port,
            state_dir: &state,
            htpasswd: &htpasswd,
            systems,
            tls,
            notify_url,
        }
        .text();
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
