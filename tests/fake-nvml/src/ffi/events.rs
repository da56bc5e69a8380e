//! Event sets: only XID events exist; `nvmlEventSetWait_v2` pops queued `xidEvents`.

use std::ffi::{c_uint, c_ulonglong};
use std::time::{Duration, Instant};

use nvml_wrapper_sys::bindings::*;

use super::*;
use crate::config::FakeConfig;

// --- events -----------------------------------------------------------------------------------

/// The event types the fake can deliver.
const SUPPORTED_EVENTS: u64 = nvmlEventTypeXidCriticalError as u64;

fn lock_sets() -> std::sync::MutexGuard<'static, Vec<Option<Registrations>>> {
    EVENT_SETS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn set_slot(set: nvmlEventSet_t) -> Result<usize, Ret> {
    (set as usize).checked_sub(1).ok_or(INVALID)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    dev: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> Ret {
    with_gpu(dev, |_| put(types, SUPPORTED_EVENTS))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> Ret {
    with_cfg(|_| {
        let mut sets = lock_sets();
        sets.push(Some(Vec::new()));
        put(set, std::ptr::without_provenance_mut(sets.len()))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    dev: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> Ret {
    with_cfg(|c| {
        let i = gpu_index(dev, c)?;
        if types & !SUPPORTED_EVENTS != 0 {
            return Err(NOT_SUPPORTED);
        }
        let slot = set_slot(set)?;
        match lock_sets().get_mut(slot) {
            Some(Some(regs)) => {
                regs.push((i, types));
                Ok(())
            }
            _ => Err(INVALID),
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> Ret {
    let Ok(slot) = set_slot(set) else {
        return INVALID;
    };
    match lock_sets().get_mut(slot) {
        Some(s @ Some(_)) => {
            *s = None;
            OK
        }
        _ => INVALID,
    }
}

/// Pops the oldest queued XID of a GPU registered in `regs`, writing the state back, and logs
/// the driver's record of it to the config's `kmsgPath` (the real driver logs every Xid it
/// raises; the record goes out before the event, so a reader of both finds it).
fn pop_xid(regs: &[(usize, u64)]) -> Result<Option<(usize, u64)>, Ret> {
    let (path, cfg) = load()?;
    let queued = |cfg: &FakeConfig| {
        regs.iter().find_map(|&(i, types)| {
            (types & SUPPORTED_EVENTS != 0
                && cfg.gpus.get(i).is_some_and(|g| !g.xid_events.is_empty()))
            .then_some(i)
        })
    };
    // Poll without the lock; take it only when there is something to pop.
    if queued(&cfg).is_none() {
        return Ok(None);
    }
    let popped = state::update(&path, |cfg| {
        queued(cfg).map(|i| {
            let x = cfg.gpus[i].xid_events.remove(0);
            let record = cfg
                .kmsg_path
                .clone()
                .map(|p| (p, x.kmsg_record(&cfg.gpus[i].pci_bus_id, next_seq())));
            (i, x.xid(), record)
        })
    })
    .map_err(|_| UNKNOWN)?;
    Ok(popped.map(|(i, xid, record)| {
        if let Some((kmsg, line)) = record {
            log_record(&kmsg, &line);
        }
        (i, xid)
    }))
}

/// A kernel log sequence number for the fake driver's records (far above what tests write).
fn next_seq() -> u64 {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(900_000);
    SEQ.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

/// Appends one record to the fake kernel log; a log that cannot be written loses the record
/// (the event is still delivered, as a driver's is when the ring buffer overflows).
fn log_record(kmsg: &std::path::Path, line: &str) {
    use std::io::Write;
    let wrote = std::fs::OpenOptions::new()
        .append(true)
        .open(kmsg)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = wrote {
        eprintln!("fake-nvml: cannot log to {}: {e}", kmsg.display());
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> Ret {
    if INIT_COUNT.load(Ordering::SeqCst) == 0 {
        return UNINIT;
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        let regs = match set_slot(set).map(|s| lock_sets().get(s).cloned()) {
            Ok(Some(Some(regs))) => regs,
            _ => return INVALID,
        };
        match pop_xid(&regs) {
            Err(e) => return e,
            Ok(Some((i, xid))) => {
                return status(put(
                    data,
                    nvmlEventData_t {
                        device: handle(i),
                        eventType: SUPPORTED_EVENTS,
                        eventData: xid,
                        gpuInstanceId: u32::MAX,
                        computeInstanceId: u32::MAX,
                    },
                ));
            }
            Ok(None) => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}
