//! Listening: which links to listen on, a set of [`LldpSocket`]s read through one `poll(2)`, and
//! the bounded [`wait`] of `bcd inventory --lldp-wait`.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use parking_lot::Mutex;

use super::parse::parse_frame;
use super::socket::{LldpSocket, LldpSocketError, MAX_FRAME};
use super::table::{Neighbors, Table};
use crate::hostroot::HostRoot;

/// `ARPHRD_ETHER` (`linux/if_arp.h`): the `type` of an Ethernet interface.
const ARPHRD_ETHER: u16 = 1;

/// The interfaces LLDP is listened on by default: physical (a `device` link under
/// `/sys/class/net/<name>`), Ethernet (`type` 1) and up with a carrier (`operstate` is `up`).
/// Sorted by name.
pub fn default_interfaces(root: &HostRoot) -> Vec<String> {
    let mut names: Vec<String> = root
        .list_dir("/sys/class/net")
        .unwrap_or_default()
        .into_iter()
        .filter(|name| {
            let base = format!("/sys/class/net/{name}");
            root.exists(format!("{base}/device"))
                && root.read_parsed::<u16>(format!("{base}/type")) == Some(ARPHRD_ETHER)
                && root.read_trimmed(format!("{base}/operstate")).as_deref() == Some("up")
        })
        .collect();
    names.sort();
    names
}

/// What a listening pass heard, and what went wrong (for the inventory's notes).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Heard {
    /// Neighbours by interface.
    pub neighbors: Neighbors,
    /// Why some link was not listened to (one line for a missing `CAP_NET_RAW`).
    pub problems: Vec<String>,
}

/// Open sockets by interface name.
#[derive(Debug, Default)]
pub(crate) struct Sockets {
    open: BTreeMap<String, LldpSocket>,
}

impl Sockets {
    /// Opens a socket on each of `ifaces` not open yet and closes those not in it; each
    /// opened one is added to `table`, each closed one removed. Returns the errors; after a
    /// permission error no further interface is tried (the answer would be the same).
    pub(crate) fn sync(&mut self, ifaces: &[String], table: &mut Table) -> Vec<LldpSocketError> {
        self.open.retain(|name, _| ifaces.contains(name));
        for name in table.links().map(str::to_owned).collect::<Vec<_>>() {
            if !self.open.contains_key(&name) {
                table.remove_link(&name);
            }
        }
        let mut errors = Vec::new();
        for name in ifaces {
            if self.open.contains_key(name) {
                continue;
            }
            match LldpSocket::open(name) {
                Ok(s) => {
                    table.add_link(name);
                    self.open.insert(name.clone(), s);
                }
                Err(e) => {
                    let stop = e.is_permission();
                    errors.push(e);
                    if stop {
                        break;
                    }
                }
            }
        }
        errors
    }

    /// True when no socket is open.
    pub(crate) fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// Waits up to `timeout` for frames, then reads every queued one into `table`; true when an
    /// LLDPDU was recorded. Junk frames are logged at debug level and dropped; a socket that
    /// fails is closed (logged).
    pub(crate) fn read_into(&mut self, timeout: Duration, table: &Mutex<Table>) -> bool {
        let ready: Vec<String> = {
            let mut fds: Vec<PollFd> = self
                .open
                .values()
                .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
                .collect();
            let t = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
            match poll(&mut fds, t) {
                Ok(0) => return false,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "lldp: poll");
                    return false;
                }
            }
            self.open
                .keys()
                .zip(&fds)
                .filter(|(_, fd)| fd.any().unwrap_or(false))
                .map(|(name, _)| name.clone())
                .collect()
        };
        let mut frames = Vec::new();
        let mut buf = vec![0u8; MAX_FRAME];
        for name in ready {
            let Some(sock) = self.open.get(&name) else {
                continue;
            };
            loop {
                match sock.recv(&mut buf) {
                    Ok(Some(n)) => frames.push((name.clone(), buf[..n.min(buf.len())].to_vec())),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "lldp: no longer listening on {name}");
                        self.open.remove(&name);
                        break;
                    }
                }
            }
        }
        let now = Instant::now();
        let mut recorded = false;
        for (name, frame) in frames {
            match parse_frame(&frame) {
                Ok(n) => {
                    tracing::debug!(iface = %name, chassis = %n.chassis_id, port = %n.port_id, "lldp: heard");
                    table.lock().record(&name, n, now);
                    recorded = true;
                }
                Err(e) => tracing::debug!(iface = %name, error = %e, "lldp: frame dropped"),
            }
        }
        recorded
    }
}

/// Logs `errors` (a missing capability as a warning naming it, others per interface) and
/// returns them as note lines.
pub(crate) fn report(errors: &[LldpSocketError]) -> Vec<String> {
    errors
        .iter()
        .map(|e| {
            tracing::warn!(error = %e, "lldp: not listening; the inventory goes on without these neighbours");
            e.to_string()
        })
        .collect()
}

/// Listens on `interfaces` until each has heard one LLDPDU or `duration` has passed, and returns
/// what was heard. Never fails: an interface that cannot be listened on is a problem line
/// (logged), and without `CAP_NET_RAW` the answer is at once no neighbours and that line.
pub fn wait(interfaces: &[String], duration: Duration) -> Heard {
    let table = Mutex::new(Table::default());
    let mut sockets = Sockets::default();
    let problems = report(&sockets.sync(interfaces, &mut table.lock()));
    let deadline = Instant::now() + duration;
    while !sockets.is_empty() && !table.lock().all_heard() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        sockets.read_into(left, &table);
    }
    let neighbors = table.lock().neighbors(Instant::now());
    Heard {
        neighbors,
        problems,
    }
}
