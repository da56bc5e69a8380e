//! bc-bmc-sim: a BMC behaviour simulator for the end-to-end tests (issue 31).
//!
//! # Background
//! sushy-tools' Redfish emulator answers like a well-behaved BMC: every change lands at once,
//! nothing runs as a task, no ETag is asked for, no session table fills up. Real fleets (iDRAC,
//! iLO, Supermicro, Lenovo XCC, OpenBMC) lose one-time overrides, answer 202 and finish later,
//! refuse a PATCH without the exact `If-Match`, offer a handful of session slots, lock accounts
//! after a few wrong passwords, take a minute to answer, and drop one request in three. The site
//! agent's rules for them (docs/bare-metal.md, "what the site agent does about BMC behaviour X")
//! are tested against this simulator.
//!
//! # Design
//! One [`BmcSim`] is one BMC of one system: a loopback HTTP/1.1 server (hyper) in front of a
//! running sushy-emulator, which stays the source of the system's identity, NICs and power (and,
//! through its external notifier, of QEMU machines where a test has them). The simulator:
//! - authenticates requests itself (Basic or a session's `X-Auth-Token`) against its own
//!   password, which a test can rotate, with an account lockout, and forwards to the emulator
//!   with the emulator's credentials;
//! - owns the boot override (`Boot` of the system: target, enabled, mode, allowable values) and
//!   the system's `ETag`, and decides at every power-on or restart what really boots, the way a
//!   firmware would (a one-time override is consumed; a network boot fetches the boot script
//!   from the site's boot service with the NIC's MAC, as iPXE would, when the test names one);
//! - plays each behaviour of [`Behaviour`], changeable while it runs, and scripted [`Fault`]s
//!   (an error status or a dropped connection before or after the change is made, a delay),
//!   and a busy spell ([`BmcSim::busy`]: 503 or 429 with `Retry-After` to everything);
//! - records every request ([`Recorded`]), what booted ([`Booted`]) and its counters
//!   ([`Counters`]: requests in flight — counted until the simulated BMC is done with a request,
//!   even when the client gave up on it —, sessions, failed logins, requests sent while a task
//!   ran).
//!
//! # Limitations
//! Plain HTTP only; one system per simulator; the service root, the systems collection and
//! everything else the simulator does not model pass through to the emulator as they are.

#![forbid(unsafe_code)]

mod docs;
mod server;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use state::{
    Behaviour, BootOverride, Booted, Counters, Fault, FaultKind, MacStyle, Recorded, TaskPlan,
};

/// Why a simulator cannot start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The loopback listener.
    #[error("the BMC simulator cannot listen on 127.0.0.1: {0}")]
    Listen(std::io::Error),
    /// The HTTP client toward the emulator.
    #[error("the BMC simulator's client toward the emulator: {0}")]
    Client(String),
}

/// Where a simulator forwards to and whom it lets in.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// sushy-emulator's address (plain HTTP).
    pub upstream: SocketAddr,
    /// The emulator's user and password.
    pub upstream_credentials: (String, String),
    /// The system this BMC controls (its emulator UUID).
    pub system_uuid: String,
    /// The BMC's own user and password (what the site agent must send).
    pub credentials: (String, String),
    /// The behaviours to start with.
    pub behaviour: Behaviour,
}

/// A running simulated BMC (stopped when dropped).
#[derive(Debug)]
pub struct BmcSim {
    /// Its loopback address.
    pub addr: SocketAddr,
    shared: Arc<server::Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BmcSim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BmcSim {
    /// Starts a simulator on a free loopback port, in the current tokio runtime.
    ///
    /// Errors: the listener cannot be bound, or the HTTP client cannot be built.
    pub async fn start(cfg: SimConfig) -> Result<Self, SimError> {
        let (addr, shared, task) = server::start(cfg).await?;
        Ok(Self { addr, shared, task })
    }

    /// The BMC address of its system for `nodes.enroll`
    /// (`redfish+http://127.0.0.1:<port>/redfish/v1/Systems/<uuid>`).
    pub fn address(&self) -> String {
        format!("redfish+http://{}{}", self.addr, self.shared.system)
    }

    /// Changes the behaviours from now on.
    pub fn set(&self, f: impl FnOnce(&mut Behaviour)) {
        f(&mut self.shared.st.lock().b);
    }

    /// Adds a scripted fault (matched in the order added).
    pub fn fault(&self, f: Fault) {
        self.shared.st.lock().faults.push(f);
    }

    /// The BMC's password from now on (an operator changed it on the BMC): the sessions open
    /// end with it.
    pub fn set_password(&self, password: &str) {
        let mut st = self.shared.st.lock();
        st.password = password.to_owned();
        st.sessions.clear();
    }

    /// Busy for `d` from now on: every request is answered `status` (503 or 429) with
    /// `Retry-After: retry_after_s`, and nothing is done; [`BmcSim::requests`] records each
    /// with when it came.
    pub fn busy(&self, d: Duration, status: u16, retry_after_s: u64) {
        self.shared.st.lock().busy = Some((std::time::Instant::now() + d, status, retry_after_s));
    }

    /// Ends every open session (they expired): the next request with one gets a 401.
    pub fn expire_sessions(&self) {
        self.shared.st.lock().sessions.clear();
    }

    /// Locks the account for `d` from now on: every login fails, the right password too.
    pub fn lock_out(&self, d: Duration) {
        self.shared.st.lock().locked_until = Some(std::time::Instant::now() + d);
    }

    /// When the firmware network-boots, it fetches `url?mac=<mac>` as iPXE would (the site's
    /// boot service; `mac` is the NIC it boots from) and hands a 200 answer to `on_script`.
    pub fn network_boot(
        &self,
        url: &str,
        mac: &str,
        on_script: Option<Arc<dyn Fn(String) + Send + Sync>>,
    ) {
        let mut st = self.shared.st.lock();
        st.net_boot = Some((url.to_owned(), mac.to_owned()));
        st.on_script = on_script;
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.st.lock().requests.clone()
    }

    /// What booted so far, oldest first.
    pub fn boots(&self) -> Vec<Booted> {
        self.shared.st.lock().boots.clone()
    }

    /// The boot override as the BMC holds it now.
    pub fn boot_override(&self) -> BootOverride {
        self.shared.st.lock().boot.clone()
    }

    /// Sets the boot override as if someone had (a previous boot left `Pxe`, `Continuous`).
    pub fn set_boot_override(&self, o: BootOverride) {
        let mut st = self.shared.st.lock();
        st.boot = o;
        st.etag += 1;
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        self.shared.st.lock().counters()
    }
}
