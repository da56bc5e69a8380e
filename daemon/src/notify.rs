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

    /// `READY=1`: startup finished (after the session task and converge task are running).
    pub fn ready(&self) -> Result<(), NotifyError> {
        self.send("READY=1")
    }

    /// `WATCHDOG=1`: the service is alive.
    pub fn watchdog(&self) -> Result<(), NotifyError> {
        self.send("WATCHDOG=1")
    }

    /// `STATUS=<text>`: one line shown by `systemctl status`; newlines become spaces.
    pub fn status(&self, text: &str) -> Result<(), NotifyError> {
        self.send(&format!("STATUS={}", text.replace(['\n', '\r'], " ")))
    }

    /// `STOPPING=1`: shutdown began.
    pub fn stopping(&self) -> Result<(), NotifyError> {
        self.send("STOPPING=1")
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
mod tests {
    use super::*;

    fn recv(listener: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = listener.recv(&mut buf).unwrap_or(0);
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn sends_every_message_to_a_path_socket() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path)?;
        listener.set_read_timeout(Some(Duration::from_secs(5)))?;
        let n = Notifier::new(Some(path.as_os_str()))?;
        assert!(n.enabled());
        n.ready()?;
        assert_eq!(recv(&listener), "READY=1");
        n.status("converged generation 3\nok")?;
        assert_eq!(recv(&listener), "STATUS=converged generation 3 ok");
        n.watchdog()?;
        assert_eq!(recv(&listener), "WATCHDOG=1");
        n.stopping()?;
        assert_eq!(recv(&listener), "STOPPING=1");
        Ok(())
    }

    #[test]
    fn sends_to_an_abstract_socket() -> Result<(), Box<dyn std::error::Error>> {
        let name = format!("bcd-notify-test-{}", std::process::id());
        let listener = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes())?)?;
        listener.set_read_timeout(Some(Duration::from_secs(5)))?;
        let n = Notifier::new(Some(OsStr::new(&format!("@{name}"))))?;
        n.ready()?;
        assert_eq!(recv(&listener), "READY=1");
        Ok(())
    }

    #[tokio::test]
    async fn watchdog_task_pings_repeatedly() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("wd.sock");
        let listener = UnixDatagram::bind(&path)?;
        listener.set_read_timeout(Some(Duration::from_secs(5)))?;
        let n = Arc::new(Notifier::new(Some(path.as_os_str()))?);
        let task = spawn_watchdog(n, Duration::from_millis(10));
        let got = tokio::task::spawn_blocking(move || [recv(&listener), recv(&listener)]).await?;
        task.abort();
        assert_eq!(got, ["WATCHDOG=1", "WATCHDOG=1"]);
        Ok(())
    }

    #[test]
    fn unset_is_a_no_op_and_garbage_is_an_error() -> Result<(), Box<dyn std::error::Error>> {
        let n = Notifier::new(None)?;
        assert!(!n.enabled());
        n.ready()?;
        assert!(!Notifier::new(Some(OsStr::new("")))?.enabled());
        assert!(matches!(
            Notifier::new(Some(OsStr::new("relative/sock"))),
            Err(NotifyError::BadAddress(_))
        ));
        // A socket nobody listens on is an error the caller can log, not a panic.
        let dir = tempfile::tempdir()?;
        let gone = Notifier::new(Some(dir.path().join("nobody").as_os_str()))?;
        assert!(matches!(gone.ready(), Err(NotifyError::Io { .. })));
        Ok(())
    }

    #[test]
    fn watchdog_interval_is_half_the_timeout_for_this_pid() {
        assert_eq!(
            watchdog_interval(Some("60000000"), None, 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            watchdog_interval(Some("60000000"), Some("7"), 7),
            Some(Duration::from_secs(30))
        );
        assert_eq!(watchdog_interval(Some("60000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("abc"), None, 7), None);
    }
}
