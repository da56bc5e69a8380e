//! A fake BMC for tests: a power state and a boot override in memory, a scripted failure, a
//! delay per operation, and counters of calls and of operations in flight at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bc_protocol::commands::bmc::{BmcFacts, BootDevice, BootDeviceResult, PowerAction, PowerState};
use parking_lot::Mutex;

use super::{Bmc, BmcError, BmcFuture, BootOverride, Connector, Endpoint, PowerDone, PowerReading};

#[derive(Debug)]
struct State {
    power: PowerState,
    boot: BootDeviceResult,
    fail: Option<BmcError>,
    delay: Duration,
    actions: Vec<String>,
}

/// A fake BMC.
#[derive(Debug)]
pub struct FakeBmc {
    address: String,
    state: Mutex<State>,
    now: AtomicUsize,
    max: AtomicUsize,
    calls: AtomicUsize,
}

/// Counts an operation in flight while alive.
struct InFlight<'a>(&'a FakeBmc);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FakeBmc {
    /// A BMC at `address`, powered off.
    pub fn new(address: &str) -> Self {
        Self {
            address: address.to_owned(),
            state: Mutex::new(State {
                power: PowerState::Off,
                boot: BootDeviceResult {
                    device: Some(BootDevice::Disk),
                    persistent: Some(true),
                    note: None,
                    transient_faults: 0,
                },
                fail: None,
                delay: Duration::ZERO,
                actions: Vec::new(),
            }),
            now: AtomicUsize::new(0),
            max: AtomicUsize::new(0),
            calls: AtomicUsize::new(0),
        }
    }

    /// Changes the power state behind the site agent's back.
    pub fn set_power(&self, p: PowerState) {
        self.state.lock().power = p;
    }

    /// Every operation fails with `e` from now on (`None`: works again).
    pub fn fail_with(&self, e: Option<BmcError>) {
        self.state.lock().fail = e;
    }

    /// Every operation takes `d` from now on.
    pub fn set_delay(&self, d: Duration) {
        self.state.lock().delay = d;
    }

    /// The most operations that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }

    /// Operations started so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The power actions and boot changes done, in order (`power on`, `boot pxe once`).
    pub fn actions(&self) -> Vec<String> {
        self.state.lock().actions.clone()
    }

    /// An unreachable error of this BMC.
    pub fn unreachable(&self) -> BmcError {
        BmcError::Unreachable {
            address: self.address.clone(),
            detail: "connection refused".to_owned(),
        }
    }

    async fn op<T>(&self, f: impl FnOnce(&mut State) -> T) -> Result<T, BmcError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        let _guard = InFlight(self);
        let delay = self.state.lock().delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut s = self.state.lock();
        if let Some(e) = &s.fail {
            return Err(e.clone());
        }
        Ok(f(&mut s))
    }
}

impl Bmc for FakeBmc {
    fn address(&self) -> &str {
        &self.address
    }

    fn facts(&self) -> BmcFuture<'_, BmcFacts> {
        Box::pin(self.op(|s| BmcFacts {
            system_path: "/redfish/v1/Systems/fake".to_owned(),
            uuid: Some("00000000-0000-0000-0000-000000000001".to_owned()),
            power: s.power,
            ..BmcFacts::default()
        }))
    }

    fn power_state(&self) -> BmcFuture<'_, PowerReading> {
        Box::pin(self.op(|s| PowerReading::settled(s.power)))
    }

    fn power(&self, action: PowerAction, boot: Option<BootOverride>) -> BmcFuture<'_, PowerDone> {
        Box::pin(self.op(move |s| {
            if let Some(b) = boot {
                s.actions.push(format!(
                    "boot {} {}",
                    b.device.as_str(),
                    if b.persistent { "persistent" } else { "once" }
                ));
            }
            s.actions.push(format!("power {}", action.as_str()));
            s.power = match action {
                PowerAction::On | PowerAction::Reboot => PowerState::On,
                PowerAction::Off | PowerAction::SoftOff => PowerState::Off,
            };
            PowerDone {
                power: s.power,
                transient_faults: 0,
            }
        }))
    }

    fn set_boot_device(
        &self,
        device: BootDevice,
        persistent: bool,
    ) -> BmcFuture<'_, BootDeviceResult> {
        Box::pin(self.op(move |s| {
            s.actions.push(format!(
                "boot {} {}",
                device.as_str(),
                if persistent { "persistent" } else { "once" }
            ));
            s.boot = BootDeviceResult {
                device: Some(device),
                persistent: Some(persistent),
                note: None,
                transient_faults: 0,
            };
            s.boot.clone()
        }))
    }
}

/// Hands out [`FakeBmc`]s by address (the same one for the same address).
#[derive(Debug, Default)]
pub struct FakeConnector {
    bmcs: Mutex<HashMap<String, Arc<FakeBmc>>>,
    connects: AtomicUsize,
}

impl FakeConnector {
    /// The fake behind `address` (`BmcAddress::display` spelling), created on first use.
    pub fn bmc(&self, address: &str) -> Arc<FakeBmc> {
        Arc::clone(
            self.bmcs
                .lock()
                .entry(address.to_owned())
                .or_insert_with(|| Arc::new(FakeBmc::new(address))),
        )
    }

    /// How many drivers were made.
    pub fn connects(&self) -> usize {
        self.connects.load(Ordering::SeqCst)
    }
}

impl Connector for FakeConnector {
    fn connect(&self, endpoint: &Endpoint) -> Result<Arc<dyn Bmc>, BmcError> {
        self.connects.fetch_add(1, Ordering::SeqCst);
        Ok(self.bmc(&endpoint.address.display()))
    }
}
