//! The XID watch: every XID error reaches the control plane as it happens.
//!
//! The watch waits on an NVML event set registered for `nvmlEventTypeXidCriticalError` on every
//! GPU (`nvmlEventSetWait_v2`, woken every [`POLL_MS`] to notice a stop). Where NVML is missing or
//! event registration fails, it follows `/dev/kmsg` under the host root instead, starting at the
//! end (the backlog is `diag.nvml`'s business) and parsing the driver's `NVRM: Xid` lines.
//! Events go into a `tokio::sync::mpsc::Sender<XidEvent>`; the watch ends when the receiver is
//! dropped or [`XidWatch::stop`] is called. It runs on its own thread (NVML blocks). While a
//! `gpu.reset` runs, the watch shuts its NVML down and registers again afterwards; an XID raised
//! in that window is not delivered by NVML (events only reach sets registered before them).
//!
//! The driver's own kernel messages are evidence too: a GPU that fell off the bus may never get
//! an Xid line or an NVML event. So with NVML events the watch also follows `/dev/kmsg` (when it
//! can be opened) for those messages alone, and without NVML it reads them with the Xid lines
//! (see [`super::kmsg::KmsgParser`]). An NVML event carries only the XID number; the driver
//! logs the same XID with its words (and the process) in the kernel log, so the follower keeps
//! the Xid lines it reads for a moment and an NVML event takes its `message` and `pid` from the
//! matching line (same GPU, same XID), waiting up to [`TEXT_WAIT`] for it. XID 154 announces a
//! recovery action: the event carries that action, from the message where there is one, else
//! from NVML field 230. A GPU whose handle fails with `GPU_IS_LOST` (or `NVML_ERROR_UNKNOWN`, as
//! drivers before R450 answer for a lost GPU) is left out of the event set (it can raise no
//! event) rather than keeping the whole set from registering.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::Utc;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError as WrapperError;
use nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_GET_GPU_RECOVERY_ACTION;
use tokio::sync::mpsc::Sender;

use crate::hostroot::HostRoot;

use super::busid::PciAddr;
use super::kmsg::{self, KmsgError, KmsgEvent, KmsgParser, XidLine};
use super::xid;

use super::{NvmlConfig, NvmlError, open};
pub use bc_protocol::commands::xid::{XidEvent, XidSource};

/// How long one NVML wait or one empty kernel-log poll lasts, ms.
pub const POLL_MS: u32 = 250;
/// Longest an NVML event waits for the driver's kernel-log line of the same XID (its text):
/// a few polls of the follower.
pub const TEXT_WAIT: Duration = Duration::from_millis(4 * POLL_MS as u64);
/// What NVML's event data holds for an Xid the driver cannot name (`nvmlEventData_t`).
pub const NVML_UNKNOWN_XID: u64 = 999;
/// Xid lines kept for NVML events to find (the oldest go first).
const RECENT_LINES: usize = 256;

/// Xid lines the kernel-log follower read lately, for NVML events to take their words from.
#[derive(Debug, Default)]
struct Recent {
    /// The follower runs: waiting for a line can pay off.
    following: AtomicBool,
    /// NVML events waiting for their line: the follower polls faster meanwhile.
    waiting: std::sync::atomic::AtomicUsize,
    lines: parking_lot::Mutex<VecDeque<XidLine>>,
}

impl Recent {
    fn push(&self, x: XidLine) {
        let mut lines = self.lines.lock();
        if lines.len() == RECENT_LINES {
            lines.pop_front();
        }
        lines.push_back(x);
    }

    /// The oldest line of `xid` on `addr`, taken out; waits up to [`TEXT_WAIT`] for it while
    /// the follower runs.
    fn take(&self, addr: PciAddr, xid: u64, stop: &AtomicBool) -> Option<XidLine> {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let found = self.wait_for(addr, xid, stop);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        found
    }

    fn wait_for(&self, addr: PciAddr, xid: u64, stop: &AtomicBool) -> Option<XidLine> {
        let until = Instant::now() + TEXT_WAIT;
        loop {
            {
                let mut lines = self.lines.lock();
                if let Some(i) = lines.iter().position(|l| l.addr == addr && l.xid == xid) {
                    return lines.remove(i);
                }
            }
            if !self.following.load(Ordering::SeqCst)
                || stop.load(Ordering::SeqCst)
                || Instant::now() >= until
            {
                return None;
            }
            std::thread::sleep(FAST_POLL);
        }
    }

    /// The follower's wait when the log had nothing new: [`POLL_MS`], cut short while an NVML
    /// event waits for its line.
    fn idle(&self, stop: &AtomicBool) {
        let until = Instant::now() + Duration::from_millis(u64::from(POLL_MS));
        while Instant::now() < until && !stop.load(Ordering::SeqCst) {
            std::thread::sleep(FAST_POLL);
            if self.waiting.load(Ordering::SeqCst) > 0 {
                return;
            }
        }
    }
}

/// How often a waiting NVML event looks for its line, and the follower reads while one waits.
const FAST_POLL: Duration = Duration::from_millis(20);

/// An event for `xid` seen by `source` now, judged by [`xid::judge`]: the catalog, or for XID
/// 154 the recovery action it announces (`announced`, `nvmlDeviceGpuRecoveryAction_t`).
fn xid_event(xid: u64, announced: Option<u64>, source: XidSource) -> XidEvent {
    let (class, action, description) = xid::judge(xid, announced);
    XidEvent {
        xid,
        pci_bus_id: None,
        uuid: None,
        class,
        action,
        description,
        message: None,
        pid: None,
        source,
        observed_at: Utc::now(),
        driver_message: false,
    }
}

/// What a kernel-log follower passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KmsgScope {
    /// Xid lines and the driver's messages: the watch's only source.
    Everything,
    /// The driver's messages only: NVML delivers the XIDs.
    DriverMessages,
}

/// Neither source could be started.
#[derive(Debug, thiserror::Error)]
#[error("no XID source: NVML: {nvml}; kernel log: {kmsg}")]
pub struct WatchError {
    /// Why NVML events are unavailable.
    pub nvml: String,
    /// Why the kernel log is unavailable.
    pub kmsg: KmsgError,
}

/// A running watch. Dropping it stops the thread (without waiting).
#[derive(Debug)]
pub struct XidWatch {
    source: XidSource,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// With NVML events: the follower of the driver's kernel messages, when `/dev/kmsg` opened.
    companion: Option<JoinHandle<()>>,
}

impl XidWatch {
    /// Which source the watch uses.
    pub fn source(&self) -> XidSource {
        self.source
    }

    /// Stops the watch and waits for its thread (at most about [`POLL_MS`]).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in [self.thread.take(), self.companion.take()]
            .into_iter()
            .flatten()
        {
            let _ = t.join();
        }
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Starts the watch: NVML events when they can be registered, the kernel log otherwise. Blocks
/// briefly while NVML initializes.
pub fn spawn_xid_watch(
    cfg: &NvmlConfig,
    root: &HostRoot,
    tx: Sender<XidEvent>,
) -> Result<XidWatch, WatchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let recent = Arc::new(Recent::default());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let nvml_cfg = cfg.clone();
    let (stop2, tx2, recent2) = (stop.clone(), tx.clone(), recent.clone());
    let thread = std::thread::Builder::new()
        .name("bcd-xid-nvml".into())
        .spawn(move || nvml_thread(&nvml_cfg, &stop2, &tx2, &recent2, ready_tx));
    let nvml_reason = match (thread, ready_rx.recv()) {
        (Ok(t), Ok(Ok(()))) => {
            let companion = spawn_kmsg(root, &stop, tx, KmsgScope::DriverMessages, recent)
                .inspect_err(|e| {
                    tracing::info!(error = %e, "XID watch: the driver's kernel messages are not followed");
                })
                .ok();
            return Ok(XidWatch {
                source: XidSource::Nvml,
                stop,
                thread: Some(t),
                companion,
            });
        }
        (Ok(_), Ok(Err(reason))) => reason,
        (Ok(_), Err(_)) => "NVML watch thread ended".to_owned(),
        (Err(e), _) => e.to_string(),
    };
    tracing::info!(reason = %nvml_reason, "XID watch: NVML events unavailable, following the kernel log");
    let thread =
        spawn_kmsg(root, &stop, tx, KmsgScope::Everything, recent).map_err(|kmsg| WatchError {
            nvml: nvml_reason,
            kmsg,
        })?;
    Ok(XidWatch {
        source: XidSource::Kmsg,
        stop,
        thread: Some(thread),
        companion: None,
    })
}

/// Starts following `/dev/kmsg` under `root` from its end, on its own thread; with
/// [`KmsgScope::DriverMessages`] it keeps the Xid lines in `recent` for NVML's events.
fn spawn_kmsg(
    root: &HostRoot,
    stop: &Arc<AtomicBool>,
    tx: Sender<XidEvent>,
    scope: KmsgScope,
    recent: Arc<Recent>,
) -> Result<JoinHandle<()>, KmsgError> {
    let io = |source| KmsgError::Io {
        path: root.path(kmsg::KMSG),
        source,
    };
    let mut f = kmsg::open(root)?;
    kmsg::seek_to_end(&mut f).map_err(io)?;
    let (stop2, root2) = (stop.clone(), root.clone());
    recent.following.store(true, Ordering::SeqCst);
    std::thread::Builder::new()
        .name("bcd-xid-kmsg".into())
        .spawn(move || {
            kmsg_thread(f, &root2, &stop2, &tx, scope, &recent);
            recent.following.store(false, Ordering::SeqCst);
        })
        .map_err(io)
}

fn register(nvml: &Nvml) -> Result<nvml_wrapper::EventSet<'_>, String> {
    let n = nvml.device_count().map_err(|e| e.to_string())?;
    let mut set = nvml.create_event_set().map_err(|e| e.to_string())?;
    for i in 0..n {
        let dev = match nvml.device_by_index(i) {
            Ok(d) => d,
            // A lost GPU raises no events; the others still can. diag.nvml reports it. Drivers
            // before R450 answer NVML_ERROR_UNKNOWN for it.
            Err(e @ (WrapperError::GpuLost | WrapperError::Unknown)) => {
                tracing::warn!(index = i, error = %e, "XID watch: GPU is lost, not registered");
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        set = dev
            .register_events(EventTypes::CRITICAL_XID_ERROR, set)
            .map_err(|e| format!("GPU {i}: {}", e.error))?;
    }
    Ok(set)
}

fn nvml_thread(
    cfg: &NvmlConfig,
    stop: &AtomicBool,
    tx: &Sender<XidEvent>,
    recent: &Recent,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(u64::from(POLL_MS));
    while !stop.load(Ordering::SeqCst) && !tx.is_closed() {
        // Blocks while a reset runs; the GPUs come back with fresh handles, so register anew.
        let gate = super::shared_access();
        let session = open(cfg).map_err(|e| e.to_string()).and_then(|nvml| {
            // The event set borrows `nvml`: the whole session runs in here, and both are shut
            // down before the gate is released.
            let set = register(&nvml)?;
            if let Some(r) = ready.take() {
                let _ = r.send(Ok(()));
            }
            serve(&set, stop, tx, recent);
            Ok(())
        });
        drop(gate);
        if let Err(e) = session {
            match ready.take() {
                Some(r) => {
                    let _ = r.send(Err(e));
                    return;
                }
                None => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "XID watch: NVML unavailable");
                    sleep_unless_stopped(backoff, stop);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        } else {
            backoff = Duration::from_millis(u64::from(POLL_MS));
        }
    }
}

/// Longest wait between attempts to re-open NVML after it went away.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let step = Duration::from_millis(u64::from(POLL_MS));
    let mut left = d;
    while !left.is_zero() && !stop.load(Ordering::SeqCst) {
        let s = left.min(step);
        std::thread::sleep(s);
        left -= s;
    }
}

/// Delivers events until a stop, a closed channel or a pending reset.
fn serve(
    set: &nvml_wrapper::EventSet<'_>,
    stop: &AtomicBool,
    tx: &Sender<XidEvent>,
    recent: &Recent,
) {
    while !stop.load(Ordering::SeqCst) && !tx.is_closed() && !super::reset_pending() {
        let data = match set.wait(POLL_MS) {
            Ok(d) => d,
            Err(WrapperError::Timeout) => continue,
            Err(e) => {
                tracing::warn!(error = %NvmlError::Call { call: "nvmlEventSetWait", source: e }, "XID watch");
                std::thread::sleep(Duration::from_millis(u64::from(POLL_MS)));
                continue;
            }
        };
        if !data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
            continue;
        }
        let xid = match data.event_data {
            Some(XidError::Value(v)) => v,
            // NVML's 999: an Xid the driver itself cannot name. Still an event (class unknown),
            // under that number.
            Some(XidError::Unknown) => NVML_UNKNOWN_XID,
            None => continue,
        };
        let addr = data
            .device
            .pci_info()
            .ok()
            .and_then(|p| PciAddr::parse(&p.bus_id));
        // The driver's words for the same XID, from the kernel log.
        let line = addr.and_then(|a| recent.take(a, xid, stop));
        // XID 154 says what to do: in its words, else in the value NVML holds in field 230.
        let announced = (xid == xid::RECOVERY_ACTION_CHANGED)
            .then(|| {
                line.as_ref()
                    .and_then(|l| xid::announced_recovery_action(&l.text))
                    .or_else(|| {
                        super::checks::field_u64s(
                            &data.device,
                            &[NVML_FI_DEV_GET_GPU_RECOVERY_ACTION],
                        )[0]
                    })
            })
            .flatten();
        let mut ev = xid_event(xid, announced, XidSource::Nvml);
        ev.uuid = data.device.uuid().ok().map(super::nvml_string);
        ev.pci_bus_id = addr.map(PciAddr::to_bus_id);
        if let Some(l) = line {
            ev.pid = l.pid;
            ev.message = (!l.text.is_empty()).then_some(l.text);
        }
        if tx.blocking_send(ev).is_err() {
            return;
        }
    }
}

fn kmsg_thread(
    mut f: std::fs::File,
    root: &HostRoot,
    stop: &AtomicBool,
    tx: &Sender<XidEvent>,
    scope: KmsgScope,
    recent: &Recent,
) {
    let mut buf = vec![0u8; 8192];
    let mut pending = Vec::new();
    let mut parser = KmsgParser::default();
    while !stop.load(Ordering::SeqCst) && !tx.is_closed() {
        match kmsg::read_chunk(&mut f, &mut buf, root) {
            Ok(Some(n)) => pending.extend_from_slice(&buf[..n]),
            Ok(None) => {
                recent.idle(stop);
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "XID watch: kernel log read failed");
                std::thread::sleep(Duration::from_millis(u64::from(POLL_MS)));
                continue;
            }
        }
        for line in kmsg::drain_lines(&mut pending) {
            let Some(KmsgEvent::Xid(x)) =
                kmsg::parse_record(&line).and_then(|r| parser.feed(&r.message))
            else {
                continue;
            };
            if scope == KmsgScope::DriverMessages && !x.driver_message {
                // NVML delivers this XID; its event takes the words from here.
                recent.push(x);
                continue;
            }
            let announced = (x.xid == xid::RECOVERY_ACTION_CHANGED)
                .then(|| xid::announced_recovery_action(&x.text))
                .flatten();
            let mut ev = xid_event(x.xid, announced, XidSource::Kmsg);
            ev.pci_bus_id = Some(x.addr.to_bus_id());
            ev.pid = x.pid;
            ev.driver_message = x.driver_message;
            if x.driver_message
                && let Some(d) = ev.description.as_mut()
            {
                d.push_str(" (the driver's message, no Xid line)");
            }
            ev.message = Some(x.text);
            if tx.blocking_send(ev).is_err() {
                return;
            }
        }
    }
}
