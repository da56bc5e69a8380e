//! systemd readiness and watchdog notifications (`sd_notify(3)`).
//!
//! # Background
//! Under `Type=notify` systemd waits for `READY=1` before it calls the unit started, and with
//! `WatchdogSec=` it kills and restarts a service that does not send `WATCHDOG=1` within that
//! time. The protocol is one datagram of `KEY=VALUE` lines to the `AF_UNIX` socket named in
//! `NOTIFY_SOCKET`: a path, or an abstract name when it starts with `@` (`sd_notify(3)`, "Notes").
//!
//! # Design
//! [`Notifier`] owns an unbound datagram socket and the target address; it is a no-op when
//! `NOTIFY_SOCKET` is unset (run by hand, in tests, under another supervisor). The environment is
//! read once by the caller and passed in, so tests need no `set_var`. [`watchdog_interval`] reads
//! `WATCHDOG_USEC`/`WATCHDOG_PID` and returns half the timeout, as `sd_watchdog_enabled(3)` advises.
//!
//! Why not the `sd-notify` crate (which `bcctl` used): it reads `NOTIFY_SOCKET` from the process
//! environment on every call (tests would need `set_var`, which is `unsafe` in edition 2024), and
//! it connects to the variable's value as a path, so an abstract `@name` socket (systemd in
//! containers, `systemd-run --user`) is never reached. Both binaries use this module instead.
//!
//! # Limitations
//! No file-descriptor store (`FDSTORE=1`) and no credentials passing; the service runs as root
//! and systemd accepts its datagrams under `NotifyAccess=main`.

use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

/// Why a notification could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is neither an absolute path nor an `@abstract` name.
    #[error("NOTIFY_SOCKET {0:?} is neither an absolute path nor @abstract")]
    BadAddress(String),
    /// The socket could not be made or the datagram not sent.
    #[error("sd_notify to {addr}: {source}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// One line of a notification (`sd_notify(3)`, "Well-known assignments").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyState<'a> {
    /// `READY=1`: startup finished.
    Ready,
    /// `WATCHDOG=1`: the service is alive.
    Watchdog,
    /// `STATUS=<text>`: one line for `systemctl status`; newlines become spaces.
    Status(&'a str),
    /// `STOPPING=1`: shutdown began.
    Stopping,
}

impl std::fmt::Display for NotifyState<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ready => f.write_str("READY=1"),
            Self::Watchdog => f.write_str("WATCHDOG=1"),
            Self::Status(text) => write!(f, "STATUS={}", text.replace(['\n', '\r'], " ")),
            Self::Stopping => f.write_str("STOPPING=1"),
        }
    }
}

/// Sends `sd_notify` messages; cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Notifier {
    target: Option<Target>,
}

#[derive(Debug)]
struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
    text: String,
}

impl Notifier {
    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Self { target: None }
    }

    /// A notifier from the process environment (`NOTIFY_SOCKET`); disabled when unset or empty.
    pub fn from_env() -> Result<Self, NotifyError> {
        Self::new(std::env::var_os("NOTIFY_SOCKET").as_deref())
    }

    /// A notifier for a `NOTIFY_SOCKET` value: `/run/systemd/notify` or `@name`; `None` or empty
    /// gives a disabled one.
    pub fn new(notify_socket: Option<&OsStr>) -> Result<Self, NotifyError> {
        let Some(raw) = notify_socket.filter(|s| !s.is_empty()) else {
            return Ok(Self::disabled());
        };
        let text = raw.to_string_lossy().into_owned();
        let bytes = raw.as_bytes();
        let io = |source| NotifyError::Io {
            addr: text.clone(),
            source,
        };
        let addr = match bytes.first() {
            Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]).map_err(io)?,
            Some(b'/') => SocketAddr::from_pathname(raw).map_err(io)?,
            _ => return Err(NotifyError::BadAddress(text)),
        };
        let socket = UnixDatagram::unbound().map_err(io)?;
        Ok(Self {
            target: Some(Target { socket, addr, text }),
        })
    }

    /// Whether messages go anywhere.
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends one raw message (newline-separated `KEY=VALUE` lines).
    pub fn send(&self, message: &str) -> Result<(), NotifyError> {
        let Some(t) = &self.target else {
            return Ok(());
        };
        t.socket
            .send_to_addr(message.as_bytes(), &t.addr)
            .map(|_| ())
            .map_err(|source| NotifyError::Io {
                addr: t.text.clone(),
                source,
            })
    }

    /// Sends `states` in one datagram, one line each, so systemd applies them together (e.g.
    /// `READY=1` with its first `STATUS=`).
    pub fn notify(&self, states: &[NotifyState<'_>]) -> Result<(), NotifyError> {
        if !self.enabled() {
            return Ok(());
        }
        let lines: Vec<String> = states.iter().map(ToString::to_string).collect();
        self.send(&lines.join("\n"))
    }

    /// `READY=1`: startup finished (after the session task and converge task are running).
    pub fn ready(&self) -> Result<(), NotifyError> {
        self.notify(&[NotifyState::Ready])
    }

    /// `WATCHDOG=1`: the service is alive.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.notify(&[NotifyState::Watchdog])
    }

    /// `STATUS=<text>`: one line shown by `systemctl status`; newlines become spaces.
    pub fn status(&self, text: &str) -> Result<(), NotifyError> {
        self.notify(&[NotifyState::Status(text)])
    }

    /// `STOPPING=1`: shutdown began.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.notify(&[NotifyState::Stopping])
    }
}

/// The watchdog ping interval: half of `WATCHDOG_USEC` (µs), or `None` when the watchdog is off,
/// the value is not a positive integer, or `WATCHDOG_PID` names another process
/// (`sd_watchdog_enabled(3)`).
pub fn watchdog_interval(
    watchdog_usec: Option<&str>,
    watchdog_pid: Option<&str>,
    my_pid: u32,
) -> Option<Duration> {
    if let Some(pid) = watchdog_pid
        && pid.trim().parse::<u32>().ok() != Some(my_pid)
    {
        return None;
    }
    let usec: u64 = watchdog_usec?.trim().parse().ok().filter(|u| *u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

/// [`watchdog_interval`] from the process environment.
pub fn watchdog_interval_from_env() -> Option<Duration> {
    watchdog_interval(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// Sends `WATCHDOG=1` every `interval` until the task is aborted. A failed send is logged and
/// retried on the next tick: a dropped ping is better than a dead pinger.
pub fn spawn_watchdog(notifier: Arc<Notifier>, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = notifier.watchdog() {
                tracing::warn!(error = %e, "watchdog ping failed");
            }
        }
    })
}

#[cfg(test)]
#[path = "notify_tests.rs"]
mod tests;
