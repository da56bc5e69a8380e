use std::ffi::OsStr;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::Arc;
use std::time::Duration;

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

#[test]
fn several_states_go_in_one_datagram() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("notify.sock");
    let listener = UnixDatagram::bind(&path)?;
    listener.set_read_timeout(Some(Duration::from_secs(5)))?;
    let n = Notifier::new(Some(path.as_os_str()))?;
    n.notify(&[NotifyState::Ready, NotifyState::Status("gateway x\napi y")])?;
    assert_eq!(recv(&listener), "READY=1\nSTATUS=gateway x api y");
    Ok(())
}
