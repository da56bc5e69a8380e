//! DHCP over the machine's NICs in [`crate::nics::order`], a lease kept only when the control
//! plane answers from it (the module docs of [`super`] say the whole of it).

use std::process::Stdio;
use std::time::Duration;

use bcd_probes::hostroot::HostRoot;
use tokio::time::Instant;

use super::{
    Attempt, IFF_UP, MODPROBE_LIMIT, SetupConfig, SetupError, describe, ethernet_interfaces,
    link_up, run_tool, tail,
};
use crate::nics::{self, Candidate, Rank};

/// A lease: the interface that got it and what udhcpc printed.
#[derive(Debug, Clone)]
pub struct Lease {
    /// The interface.
    pub iface: String,
    /// udhcpc's output (the last lines).
    pub output: String,
    /// Interfaces tried before, without a lease or with one that could not reach the control
    /// plane (each says why it was left).
    pub tried: Vec<Attempt>,
    /// The order DHCP asked the NICs in (the first round), each with why.
    pub order: Vec<Candidate>,
    /// The control plane answered from this lease; false for the fallback lease taken when no
    /// lease reached it.
    pub reachable: bool,
}

impl Lease {
    /// One line for the log and the inventory's `network` note: the order, the lease, and why
    /// each interface before it was left.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "DHCP order: {}; lease on {}{}",
            nics::describe_order(&self.order),
            self.iface,
            if self.reachable {
                ""
            } else {
                " (the control plane did not answer from any lease; kept for the join to retry)"
            }
        );
        if !self.tried.is_empty() {
            out.push_str(&format!("; left: {}", describe(&self.tried)));
        }
        out
    }
}

/// Clears `IFF_UP` in `/sys/class/net/<iface>/flags`.
fn link_down(root: &HostRoot, iface: &str) -> Result<(), String> {
    let path = root.path(format!("/sys/class/net/{iface}/flags"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let flags = u64::from_str_radix(text.trim().trim_start_matches("0x"), 16)
        .map_err(|_| format!("{}: unexpected flags {text:?}", path.display()))?;
    std::fs::write(&path, format!("{:#x}\n", flags & !IFF_UP))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Brings every NIC up and waits, up to `cfg.carrier_wait`, for the boot NIC's link (or any
/// link, without a boot NIC): carrier is only known on a NIC that is up.
async fn wait_for_carrier(cfg: &SetupConfig, ifaces: &[String]) {
    for i in ifaces {
        if let Err(e) = link_up(&cfg.root, i) {
            tracing::warn!(iface = %i, error = %e, "could not bring the interface up");
        }
    }
    // Never more than a quarter of the DHCP budget: NICs without a link are still asked.
    let until = Instant::now() + cfg.carrier_wait.min(cfg.dhcp_timeout / 4);
    loop {
        let order = nics::order(&cfg.root, ifaces, cfg.boot_mac.as_deref());
        let boot_linked = |c: &Candidate| {
            c.rank == Rank::BootIf
                && cfg
                    .root
                    .read_trimmed(format!("/sys/class/net/{}/carrier", c.iface))
                    == Some("1".into())
        };
        let done = if order.iter().any(|c| c.rank == Rank::BootIf) {
            order.iter().any(boot_linked)
        } else {
            order.iter().any(|c| c.rank == Rank::Carrier)
        };
        if done || Instant::now() >= until {
            return;
        }
        tokio::time::sleep(cfg.poll).await;
    }
}

/// Gives back the lease on `iface`: udhcpc's script with `deconfig` (the address flushed, and
/// with it the routes through it).
async fn give_back(cfg: &SetupConfig, iface: &str) {
    let r = tokio::process::Command::new(&cfg.udhcpc_script)
        .arg("deconfig")
        .env("interface", iface)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(MODPROBE_LIMIT, r).await {
        Ok(Ok(out)) if out.status.success() => {}
        Ok(Ok(out)) => {
            tracing::warn!(iface = %iface, status = %out.status, said = %tail(&out.stderr), "deconfig failed");
        }
        Ok(Err(e)) => tracing::warn!(iface = %iface, error = %e, "cannot run the deconfig script"),
        Err(_) => tracing::warn!(iface = %iface, "the deconfig script hung"),
    }
    if let Err(e) = link_down(&cfg.root, iface) {
        tracing::warn!(iface = %iface, error = %e, "could not bring the interface down");
    }
}

/// Counts one more run on `iface` in `tried`, with how it ended.
fn record(tried: &mut Vec<Attempt>, iface: &str, last: String) {
    match tried.iter_mut().find(|a| a.iface == iface) {
        Some(a) => {
            a.runs += 1;
            a.last = last;
        }
        None => tried.push(Attempt {
            iface: iface.to_owned(),
            runs: 1,
            last,
        }),
    }
}

/// Rounds of udhcpc over the Ethernet interfaces in [`nics::order`] (looked up again each
/// round: a slow driver's NIC joins later) until one gets a lease from which the control plane
/// answers, or `cfg.dhcp_timeout` is spent (see the module docs for what then).
pub async fn dhcp(cfg: &SetupConfig) -> Result<Lease, SetupError> {
    let deadline = Instant::now() + cfg.dhcp_timeout;
    let script = cfg.udhcpc_script.to_string_lossy().into_owned();
    let mut tried: Vec<Attempt> = Vec::new();
    // Leased but the control plane did not answer: the fallback, best first.
    let mut unreachable: Vec<Candidate> = Vec::new();
    wait_for_carrier(cfg, &ethernet_interfaces(&cfg.root)).await;
    let mut first_order: Option<Vec<Candidate>> = None;
    loop {
        let order = nics::order(
            &cfg.root,
            &ethernet_interfaces(&cfg.root),
            cfg.boot_mac.as_deref(),
        );
        if first_order.is_none() {
            tracing::info!(order = %nics::describe_order(&order), "asking for a DHCP lease in this order");
            first_order = Some(order.clone());
        }
        for c in &order {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let iface = &c.iface;
            if let Err(e) = link_up(&cfg.root, iface) {
                tracing::warn!(iface = %iface, error = %e, "could not bring the interface up; udhcpc tries anyway");
            }
            let args = ["-i", iface, "-q", "-n", "-t", "5", "-T", "1", "-s", &script];
            tracing::info!(iface = %iface, why = %c.rank, "asking for a DHCP lease");
            let output = match run_tool(&cfg.udhcpc, &args, cfg.attempt_timeout.min(left)).await {
                Ok(output) => output,
                Err(last) => {
                    tracing::warn!(iface = %iface, udhcpc = %last, "no DHCP lease on this interface");
                    record(&mut tried, iface, last);
                    continue;
                }
            };
            match cfg.reach.check(iface).await {
                Ok(()) => {
                    tracing::info!(iface = %iface, udhcpc = %output, "DHCP lease obtained; the control plane answers");
                    return Ok(Lease {
                        iface: iface.clone(),
                        output,
                        tried,
                        order: first_order.unwrap_or_default(),
                        reachable: true,
                    });
                }
                Err(why) => {
                    tracing::warn!(iface = %iface, udhcpc = %output, error = %why, "a lease, but the control plane does not answer from it: giving it back");
                    give_back(cfg, iface).await;
                    record(
                        &mut tried,
                        iface,
                        format!(
                            "leased ({output}) but the control plane did not answer ({why}); given back"
                        ),
                    );
                    if !unreachable.iter().any(|u| u.iface == *iface) {
                        unreachable.push(c.clone());
                    }
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            unreachable.sort_by_key(|u| u.rank);
            if let Some(best) = unreachable.first() {
                return fallback(cfg, best, tried, first_order.unwrap_or_default()).await;
            }
            return Err(SetupError::NoLease {
                waited: cfg.dhcp_timeout,
                tried,
            });
        }
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
    }
}

/// No lease reached the control plane by the deadline: `best` leases again (one more udhcpc
/// run past the deadline) and the join retries from there.
async fn fallback(
    cfg: &SetupConfig,
    best: &Candidate,
    tried: Vec<Attempt>,
    order: Vec<Candidate>,
) -> Result<Lease, SetupError> {
    let script = cfg.udhcpc_script.to_string_lossy().into_owned();
    let args = [
        "-i",
        &best.iface,
        "-q",
        "-n",
        "-t",
        "5",
        "-T",
        "1",
        "-s",
        &script,
    ];
    if let Err(e) = link_up(&cfg.root, &best.iface) {
        tracing::warn!(iface = %best.iface, error = %e, "could not bring the interface up");
    }
    match run_tool(&cfg.udhcpc, &args, cfg.attempt_timeout).await {
        Ok(output) => {
            tracing::error!(iface = %best.iface, why = %best.rank, "no lease reached the control plane within the DHCP budget; keeping this one and retrying the join");
            Ok(Lease {
                iface: best.iface.clone(),
                output,
                tried,
                order,
                reachable: false,
            })
        }
        Err(last) => {
            let mut tried = tried;
            record(&mut tried, &best.iface, last);
            Err(SetupError::NoLease {
                waited: cfg.dhcp_timeout,
                tried,
            })
        }
    }
}
