//! What a simulated BMC holds: its behaviours, its boot override, sessions, account, tasks,
//! faults and records.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a simulated BMC behaves. `Default` is a well-behaved BMC with sessions, ETags offered (not
/// required), every standard reset type and a reported `UEFI` mode that is not required.
#[derive(Debug, Clone)]
pub struct Behaviour {
    /// A boot-override PATCH is answered 204 and nothing is stored (lost override).
    pub override_lost: bool,
    /// A one-time override is stored as `Continuous`.
    pub once_as_continuous: bool,
    /// A power-off loses a one-time override armed before it.
    pub power_off_clears_once: bool,
    /// The firmware ignores the override at this many next boots (it boots its disk; a
    /// one-time override is consumed all the same): an override lost silently.
    pub ignore_override_boots: u32,
    /// `BootSourceOverrideMode` the BMC reports (`None`: it reports none).
    pub mode: Option<String>,
    /// A boot-override PATCH without `BootSourceOverrideMode` is refused (400).
    pub mode_required: bool,
    /// A boot-override PATCH with `BootSourceOverrideMode` is refused (400).
    pub mode_refused: bool,
    /// `BootSourceOverrideTarget@Redfish.AllowableValues`.
    pub targets: Vec<String>,
    /// `BootSourceOverrideEnabled@Redfish.AllowableValues` (`None`: not advertised).
    pub enabled_values: Option<Vec<String>>,
    /// The system document carries an ETag (header and `@odata.etag`).
    pub etags: bool,
    /// A PATCH without the exact current ETag in `If-Match` is refused (428 without one, 412
    /// with `*` or another).
    pub etag_required: bool,
    /// A boot-override PATCH is answered 202 and runs as a task.
    pub patch_task: Option<TaskPlan>,
    /// A reset is answered 202 and runs as a task.
    pub reset_task: Option<TaskPlan>,
    /// `ResetType@Redfish.AllowableValues` (or the action info's).
    pub reset_types: Vec<String>,
    /// The reset types are listed in an ActionInfo resource, not on the action.
    pub reset_action_info: bool,
    /// `PoweringOn`/`PoweringOff` is reported this long after a reset.
    pub transition: Duration,
    /// A SessionService is offered.
    pub sessions: bool,
    /// Sessions open at most at once; more are refused with 503.
    pub session_slots: usize,
    /// Wrong logins within `lockout_window` that lock the account (0: never).
    pub lockout_threshold: u32,
    /// See `lockout_threshold`.
    pub lockout_window: Duration,
    /// How long a lockout lasts.
    pub lockout_duration: Duration,
    /// Every request is answered this late.
    pub delay: Duration,
    /// Every n-th request fails with this status: the odd ones before their change is made, the
    /// even ones after.
    pub every_nth_fails: Option<(u32, u16)>,
    /// How the NICs' MACs are spelled.
    pub mac_style: MacStyle,
    /// Time from a power-on to the firmware's network boot request.
    pub post_delay: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        Self {
            override_lost: false,
            once_as_continuous: false,
            power_off_clears_once: false,
            ignore_override_boots: 0,
            mode: Some("UEFI".to_owned()),
            mode_required: false,
            mode_refused: false,
            targets: s(&["None", "Pxe", "Hdd", "Cd", "BiosSetup"]),
            enabled_values: Some(s(&["Disabled", "Once", "Continuous"])),
            etags: true,
            etag_required: false,
            patch_task: None,
            reset_task: None,
            reset_types: s(&[
                "On",
                "ForceOff",
                "GracefulShutdown",
                "GracefulRestart",
                "ForceRestart",
                "ForceOn",
                "PowerCycle",
            ]),
            reset_action_info: false,
            transition: Duration::ZERO,
            sessions: true,
            session_slots: 4,
            lockout_threshold: 0,
            lockout_window: Duration::from_secs(60),
            lockout_duration: Duration::from_secs(60),
            delay: Duration::ZERO,
            every_nth_fails: None,
            mac_style: MacStyle::Colons,
            post_delay: Duration::from_millis(200),
        }
    }
}

/// A request that runs as a task: done this long after it was accepted, with this outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskPlan {
    /// How long the task runs.
    pub runs: Duration,
    /// `Retry-After` of the task monitor's 202, seconds.
    pub retry_after_s: u64,
    /// The task ends in `Exception` (nothing is changed) instead of `Completed`.
    pub fails: bool,
}

/// How a BMC spells MAC addresses in `EthernetInterfaces`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacStyle {
    /// As the emulator does (`52:54:00:ab:cd:ef`).
    Colons,
    /// Dashes, upper case (`52-54-00-AB-CD-EF`).
    DashesUpper,
    /// No separators, upper case (`525400ABCDEF`).
    Bare,
}

/// The boot override a BMC holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootOverride {
    /// `BootSourceOverrideTarget`.
    pub target: String,
    /// `BootSourceOverrideEnabled`.
    pub enabled: String,
    /// `BootSourceOverrideMode` as set (the behaviour's `mode` is reported when `None`).
    pub mode: Option<String>,
}

impl Default for BootOverride {
    fn default() -> Self {
        Self {
            target: "None".to_owned(),
            enabled: "Disabled".to_owned(),
            mode: None,
        }
    }
}

/// What a scripted fault does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Answer this status; the change is not made.
    StatusBefore(u16),
    /// Make the change, then answer this status.
    StatusAfter(u16),
    /// Close the connection without an answer; the change is not made.
    DropBefore,
    /// Make the change, then close the connection without an answer.
    DropAfter,
    /// Answer this much later.
    Delay(Duration),
}

/// A scripted fault: the next `times` requests with `method` (`*`: any) whose path contains
/// `path` get `kind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// `GET`, `PATCH`, `POST`, `DELETE` or `*`.
    pub method: String,
    /// A part of the path.
    pub path: String,
    /// What happens.
    pub kind: FaultKind,
    /// How many requests it hits.
    pub times: u32,
}

impl Fault {
    /// `kind` for the next `times` requests of `method` whose path contains `path`.
    pub fn new(method: &str, path: &str, kind: FaultKind, times: u32) -> Self {
        Self {
            method: method.to_owned(),
            path: path.to_owned(),
            kind,
            times,
        }
    }
}

/// One request the simulator received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// When it arrived.
    pub at: Instant,
    /// Method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Body (UTF-8, lossy).
    pub body: String,
    /// `If-Match`, if sent.
    pub if_match: Option<String>,
    /// `basic`, `token`, `none`, or `bad` (credentials refused).
    pub auth: &'static str,
    /// The status answered (0: the connection was dropped).
    pub status: u16,
    /// It arrived while a task of this BMC ran (and was not that task's monitor).
    pub during_task: bool,
}

/// One boot of the system, as its firmware did it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booted {
    /// When the power-on or restart happened.
    pub at: Instant,
    /// `Pxe` or `Hdd` (what the override, or the boot order without one, chose).
    pub device: String,
    /// The override in force at the boot (before a one-time one was consumed).
    pub override_then: BootOverride,
    /// The boot service's status for the script request (a network boot with a boot URL set).
    pub script_status: Option<u16>,
}

/// The simulator's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests received.
    pub total: usize,
    /// Requests the BMC is working on now.
    pub in_flight: usize,
    /// The most it worked on at once.
    pub max_in_flight: usize,
    /// Sessions open now.
    pub sessions_live: usize,
    /// Sessions created.
    pub sessions_created: usize,
    /// Sessions deleted.
    pub sessions_deleted: usize,
    /// The most sessions open at once.
    pub sessions_peak: usize,
    /// Session creations refused because every slot was taken.
    pub sessions_refused: usize,
    /// Logins refused (wrong password, or a locked account).
    pub failed_logins: usize,
    /// Requests that arrived while a task ran (its monitor's polls excepted).
    pub requests_during_task: usize,
    /// Whether the account is locked now.
    pub locked: bool,
}

/// A task in the BMC.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub done_at: Instant,
    pub fails: bool,
    pub retry_after_s: u64,
}

/// Everything mutable, behind one lock.
pub(crate) struct State {
    pub b: Behaviour,
    pub user: String,
    pub password: String,
    pub failed: Vec<Instant>,
    pub failed_total: usize,
    pub locked_until: Option<Instant>,
    pub sessions: HashMap<u32, String>,
    pub next_session: u32,
    pub sessions_created: usize,
    pub sessions_deleted: usize,
    pub sessions_peak: usize,
    pub sessions_refused: usize,
    pub boot: BootOverride,
    pub etag: u64,
    pub transition: Option<(Instant, &'static str)>,
    pub tasks: HashMap<u32, Task>,
    pub next_task: u32,
    pub faults: Vec<Fault>,
    pub nth: u32,
    pub requests: Vec<Recorded>,
    pub in_flight: usize,
    pub max_in_flight: usize,
    pub during_task: usize,
    pub boots: Vec<Booted>,
    pub net_boot: Option<(String, String)>,
    pub on_script: Option<Arc<dyn Fn(String) + Send + Sync>>,
    /// Busy until then: every request is answered with this status and `Retry-After` (s).
    pub busy: Option<(Instant, u16, u64)>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("b", &self.b)
            .field("boot", &self.boot)
            .finish_non_exhaustive()
    }
}

impl State {
    pub fn new(b: Behaviour, user: String, password: String) -> Self {
        Self {
            b,
            user,
            password,
            failed: Vec::new(),
            failed_total: 0,
            locked_until: None,
            sessions: HashMap::new(),
            next_session: 1,
            sessions_created: 0,
            sessions_deleted: 0,
            sessions_peak: 0,
            sessions_refused: 0,
            boot: BootOverride::default(),
            etag: 1,
            transition: None,
            tasks: HashMap::new(),
            next_task: 1,
            faults: Vec::new(),
            nth: 0,
            requests: Vec::new(),
            in_flight: 0,
            max_in_flight: 0,
            during_task: 0,
            boots: Vec::new(),
            net_boot: None,
            on_script: None,
            busy: None,
        }
    }

    pub fn counters(&self) -> Counters {
        Counters {
            total: self.requests.len(),
            in_flight: self.in_flight,
            max_in_flight: self.max_in_flight,
            sessions_live: self.sessions.len(),
            sessions_created: self.sessions_created,
            sessions_deleted: self.sessions_deleted,
            sessions_peak: self.sessions_peak,
            sessions_refused: self.sessions_refused,
            failed_logins: self.failed_total,
            requests_during_task: self.during_task,
            locked: self.locked(Instant::now()),
        }
    }

    pub fn locked(&self, now: Instant) -> bool {
        self.locked_until.is_some_and(|t| now < t)
    }

    /// Whether a task runs now.
    pub fn task_running(&self, now: Instant) -> bool {
        self.tasks.values().any(|t| now < t.done_at)
    }

    /// A refused login at `now`: counted, and the account locked at the threshold.
    pub fn login_failed(&mut self, now: Instant) {
        self.failed_total += 1;
        if self.locked(now) {
            return;
        }
        let window = self.b.lockout_window;
        self.failed.retain(|t| now.duration_since(*t) < window);
        self.failed.push(now);
        let threshold = self.b.lockout_threshold;
        if threshold > 0 && self.failed.len() >= threshold as usize {
            self.locked_until = Some(now + self.b.lockout_duration);
            self.failed.clear();
        }
    }

    /// Whether `user`/`password` logs in at `now` (a refusal is counted).
    pub fn login(&mut self, user: &str, password: &str, now: Instant) -> bool {
        if self.locked(now) || user != self.user || password != self.password {
            self.login_failed(now);
            return false;
        }
        self.failed.clear();
        true
    }

    /// The scripted fault for this request, if one matches (its count goes down).
    pub fn take_fault(&mut self, method: &str, path: &str) -> Option<FaultKind> {
        let i = self
            .faults
            .iter()
            .position(|f| (f.method == "*" || f.method == method) && path.contains(&f.path))?;
        let kind = self.faults[i].kind;
        self.faults[i].times = self.faults[i].times.saturating_sub(1);
        if self.faults[i].times == 0 {
            self.faults.remove(i);
        }
        Some(kind)
    }

    /// The busy answer's status and `Retry-After` (s) while the BMC is busy.
    pub fn busy_now(&mut self) -> Option<(u16, u64)> {
        match self.busy {
            Some((until, status, retry_after)) if Instant::now() < until => {
                Some((status, retry_after))
            }
            Some(_) => {
                self.busy = None;
                None
            }
            None => None,
        }
    }

    /// The every-n-th failure for this request, if it is one.
    pub fn take_nth(&mut self) -> Option<FaultKind> {
        let (n, status) = self.b.every_nth_fails?;
        self.nth += 1;
        if n == 0 || !self.nth.is_multiple_of(n) {
            return None;
        }
        Some(if (self.nth / n) % 2 == 1 {
            FaultKind::StatusBefore(status)
        } else {
            FaultKind::StatusAfter(status)
        })
    }
}
