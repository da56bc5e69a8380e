//! The bare-metal controller: one loop ([`BareMetal::run_leases`]) that, every tick, sweeps the
//! site leases and the verifications (`super::site_pass`) and then runs the workflows' pass
//! over ramdisk boots ([`BareMetal::boot_pass`]), reading the workflow table.
//!
//! # Design
//! Transactions only move states and write rows; the pass does everything that leaves the
//! control plane, so a move made anywhere (a verification's result, `nodes.inspect`, an
//! inventory report) takes effect within a pass:
//! - a node in a ramdisk state without a boot gets one (`super::boot::begin`); the site's
//!   lease holder gets its assignment (the boot service learns the machine's MACs and kernel
//!   arguments) and then `bmc.power {on | reboot, bootDevice: pxe}`;
//! - a boot whose node left its state ends: the holder powers the machine off (when `ready`
//!   and the pool's `acceptance.powerOffWhenReady`, the default, or when `failed` or
//!   `retired`), and its boot service forgets the token;
//! - a node past its state's deadline fails, saying what never happened
//!   (`super::table::fail_overdue`);
//! - otherwise its workflow's next command is queued ([`super::workflow::Ramdisk::next`]) and
//!   dispatched.
//!
//! Every decision is taken on the row as it is in the deciding transaction; the pass only
//! picks what to look at.

use bc_protocol::commands::CommandArgs;
use bc_protocol::commands::bmc::{
    BootDevice, BootDeviceArgs, NetworkBootCheck, PowerAction, PowerArgs,
};
use bc_protocol::{Power, ProvisionState};
use cpl_store::{BootRecord, NodeRecord, Tx, duration_ms, now_ms};

use super::boot::{self, OWNER};
use super::workflow::Turn;
use super::{BareMetal, bmc, table};
use crate::edit::Edit;
use crate::error::OpError;

/// What the pass decided for one boot, done after its transaction.
enum Action {
    /// Push the assignment, then dispatch the holder's commands.
    Boot { site: String, holder: String },
    /// The boot ended: push the assignment, dispatch a power-off if one was queued, close the
    /// session of a node whose ramdisk identity ended.
    Ended {
        site: String,
        holder: Option<String>,
        close: Option<String>,
    },
    /// A workflow queued its next command: dispatch that node's queue.
    Dispatch { node: String },
}

impl BareMetal {
    /// Runs the controller until the task is dropped: every tick (a quarter of the lease TTL,
    /// 50 ms to 1 s) `before` runs first (the gateway flushes heartbeats and renewals there, so
    /// the lease rule never reads a stale `lastSeen`), then the lease rule, the enrollments
    /// waiting for a verification and their deadlines, and the pass over ramdisk boots.
    pub async fn run_leases<F, Fut>(self, mut before: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let period = (self.cfg.lease_ttl / 4).clamp(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_secs(1),
        );
        let started = now_ms();
        if let Err(e) = self.load_leases().await {
            tracing::error!(error = %e, "loading the site leases failed");
        }
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            before().await;
            let now = now_ms();
            let in_grace = now < started.saturating_add(duration_ms(self.cfg.grace));
            if let Err(e) = self.sweep_leases(now, in_grace).await {
                tracing::error!(error = %e, "site lease sweep failed");
            }
            self.verification_pass(now).await;
            self.boot_pass(now).await;
        }
    }

    /// The pass over ramdisk boots at `now` (see the module docs).
    pub async fn boot_pass(&self, now: i64) {
        let waiting = match self.store.read(nodes_without_boot).await {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(error = %e, "reading the ramdisk boots failed");
                return;
            }
        };
        for node_id in waiting {
            self.begin_boot(&node_id, now).await;
        }
        let boots = match self.store.read(|r| r.boots()).await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "reading the ramdisk boots failed");
                return;
            }
        };
        for b in boots {
            match self.boot_step(b, now).await {
                Ok(Some(Action::Boot { site, holder })) => {
                    self.push_site(&site).await;
                    self.commands.dispatch(&holder, false).await;
                }
                Ok(Some(Action::Ended {
                    site,
                    holder,
                    close,
                })) => {
                    if let Some(node) = close {
                        self.sessions.close(
                            &node,
                            bc_protocol::pb::GoodbyeReason::Revoked,
                            "the node failed in the ramdisk, or was retired",
                        );
                    }
                    self.push_site(&site).await;
                    if let Some(h) = holder {
                        self.commands.dispatch(&h, false).await;
                    }
                }
                Ok(Some(Action::Dispatch { node })) => {
                    self.commands.dispatch(&node, false).await;
                }
                Ok(None) => {}
                Err(e) => tracing::error!(error = %e, "a ramdisk boot step failed"),
            }
        }
    }

    /// Begins the boot of `node_id`, in a ramdisk state without one. Whatever runs on the
    /// machine now (an earlier ramdisk, an installed OS) is about to be rebooted: its identity
    /// ends with this boot, so it cannot hold the node's session (or re-connect) while the new
    /// ramdisk joins.
    async fn begin_boot(&self, node_id: &str, now: i64) {
        let (key, id) = (std::sync::Arc::clone(&self.key), node_id.to_owned());
        let live = self.sessions.live_epoch(node_id).is_some();
        let r = self
            .store
            .write(move |tx| {
                let Some(node) = tx.node(&id)? else {
                    return Ok::<_, OpError>(false);
                };
                let current = tx.boot(&id)?.is_some_and(|b| b.ended_at.is_none());
                let state = node.provision_state;
                if !table::in_ramdisk(state) || current {
                    return Ok(false);
                }
                let pool = pool_of(tx, &node)?;
                let Some(ttl) = table::deadline(pool.as_ref(), state) else {
                    return Ok(false);
                };
                let b = boot::begin(tx, &key, &id, state, ttl, now)?;
                tracing::info!(node_id = %id, token = %b.token_id, purpose = %b.purpose, "ramdisk boot begun");
                if live {
                    let mut edit = Edit::begin(tx, &id, None, OWNER)?;
                    crate::ops::nodes::bump_identity(
                        &mut edit,
                        &format!(
                            "a new ramdisk boot ({}) begins: the running system's identity ends",
                            b.token_id
                        ),
                    );
                    edit.save(tx)?;
                }
                Ok(live)
            })
            .await;
        match r {
            Ok(true) => {
                self.sessions.close(
                    node_id,
                    bc_protocol::pb::GoodbyeReason::Revoked,
                    "the machine is rebooted into a new ramdisk boot",
                );
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(node_id = %node_id, error = %e, "beginning a ramdisk boot failed")
            }
        }
    }

    /// One boot's turn, on the row as it is in this transaction (the pass's read may be stale:
    /// a report may have moved it since): end it, fail it, power the machine on into it, or
    /// queue its workflow's next command.
    async fn boot_step(&self, seen: BootRecord, now: i64) -> Result<Option<Action>, OpError> {
        let bm = self.clone();
        let timeout = duration_ms(self.cfg.command_timeout);
        self.store
            .write(move |tx| {
                let Some(mut b) = tx
                    .boot(&seen.node_id)?
                    .filter(|b| b.token_id == seen.token_id && b.ended_at.is_none())
                else {
                    return Ok(None);
                };
                let Some(node) = tx.node(&b.node_id)? else {
                    return Ok(None);
                };
                let site = node.site_id.clone().unwrap_or_default();
                let holder = bmc::live_holder(tx, bm.sessions.as_ref(), &site).ok();
                let state = node.provision_state;
                let Some(r) = table::ramdisk(state).filter(|_| state == b.purpose) else {
                    return end_boot(tx, &bm, b, &node, holder, now, timeout);
                };
                if table::fail_overdue(tx, &b, now)? {
                    return Ok(None);
                }
                if b.used_at.is_none() && b.command_id.is_none() {
                    let Some((h, epoch)) = holder else {
                        return Ok(None);
                    };
                    let action = if node.power == Power::On {
                        PowerAction::Reboot
                    } else {
                        PowerAction::On
                    };
                    // The network boot is confirmed by the site's boot service (issue 31,
                    // rule 5); the command lasts as long as its power-ons with PXE may.
                    let check = NetworkBootCheck {
                        within_ms: u64::try_from(duration_ms(bm.cfg.network_boot_timeout))
                            .unwrap_or(u64::MAX),
                        attempts: bm.cfg.network_boot_attempts.max(1),
                    };
                    let args = CommandArgs::BmcPower(PowerArgs {
                        node_id: b.node_id.clone(),
                        lease_epoch: epoch,
                        action,
                        boot_device: Some(BootDevice::Pxe),
                        network_boot: Some(check),
                    });
                    let per_try = duration_ms(bm.cfg.network_boot_timeout).saturating_add(timeout);
                    let lasts = per_try.saturating_mul(i64::from(check.attempts));
                    let rec = bmc::queue(tx, &h, &b.node_id, args, lasts, OWNER)?;
                    bmc::mark_expected(tx, &b.node_id, Power::On)?;
                    b.command_id = Some(rec.id);
                    tx.put_boot(&b)?;
                    return Ok(Some(Action::Boot { site, holder: h }));
                }
                // The ramdisk joined: the boot override goes (issue 31, rule 4; a BMC may hold
                // it as Continuous, or it was the persistent last resort of the network boot),
                // before the workflow sends anything else to the BMC.
                if b.used_at.is_some() {
                    match b.override_command_id.as_deref() {
                        None => {
                            if let Some((h, epoch)) = &holder {
                                let rec = clear_override(tx, &b.node_id, h, *epoch, timeout)?;
                                b.override_command_id = Some(rec.id);
                                tx.put_boot(&b)?;
                                return Ok(Some(Action::Dispatch { node: h.clone() }));
                            }
                        }
                        Some(id) if tx.command(id)?.is_some_and(|c| !c.state.is_final()) => {
                            return Ok(None);
                        }
                        Some(_) => {}
                    }
                }
                let pool = pool_of(tx, &node)?;
                let live = bm.sessions.live_epoch(&b.node_id).is_some();
                let mut turn = Turn {
                    boot: &mut b,
                    node: &node,
                    pool: pool.as_ref(),
                    holder,
                    live,
                    now,
                    timeout,
                };
                let next = (r.next)(tx, &mut turn)?;
                Ok(next.map(|node| Action::Dispatch { node }))
            })
            .await
    }
}

/// Queues `bmc.setBootDevice none` for `node_id`'s BMC on holder `h` (lease `epoch`): the boot
/// override goes, read back by the site agent.
fn clear_override(
    tx: &Tx<'_>,
    node_id: &str,
    h: &str,
    epoch: u64,
    timeout: i64,
) -> Result<cpl_store::CommandRecord, OpError> {
    let args = CommandArgs::BmcSetBootDevice(BootDeviceArgs {
        node_id: node_id.to_owned(),
        lease_epoch: epoch,
        device: BootDevice::None,
        persistent: false,
    });
    bmc::queue(tx, h, node_id, args, timeout, OWNER)
}

/// The nodes in a ramdisk state whose boot has not begun (or ended).
fn nodes_without_boot(r: &cpl_store::Reader<'_>) -> Result<Vec<String>, OpError> {
    let mut waiting = Vec::new();
    for s in table::ramdisk_states() {
        for b in r.bmcs_in_state(s.as_str())? {
            if r.boot(&b.node_id)?.is_none_or(|x| x.ended_at.is_some()) {
                waiting.push(b.node_id);
            }
        }
    }
    Ok(waiting)
}

fn pool_of(tx: &Tx<'_>, node: &NodeRecord) -> Result<Option<cpl_store::Pool>, OpError> {
    Ok(match &node.pool_id {
        Some(p) => tx.pool(p)?,
        None => None,
    })
}

/// Ends boot `b` of `node`, which left its ramdisk state: a `failed` or `retired` machine, or
/// a `ready` one whose pool powers it off, is powered off through `holder` — without a live
/// holder the boot stays open and the next pass tries again. A `failed` node's ramdisk
/// identity ends with it (`identityGeneration + 1`; the session is closed after the commit).
fn end_boot(
    tx: &Tx<'_>,
    bm: &BareMetal,
    mut b: BootRecord,
    node: &NodeRecord,
    holder: Option<(String, u64)>,
    now: i64,
    timeout: i64,
) -> Result<Option<Action>, OpError> {
    let state = node.provision_state;
    let pool = pool_of(tx, node)?;
    let off = match state {
        ProvisionState::Ready => pool
            .as_ref()
            .and_then(|p| p.acceptance.power_off_when_ready)
            .unwrap_or(true),
        ProvisionState::Failed | ProvisionState::Retired => true,
        _ => false,
    };
    if off && holder.is_none() {
        return Ok(None);
    }
    let mut queued = None;
    // A boot that ends before its override was cleared (it never joined, or left the ramdisk
    // at once): cleared now, so a later power-on by hand does not boot the network.
    if b.command_id.is_some()
        && b.override_command_id.is_none()
        && let Some((h, epoch)) = &holder
    {
        let rec = clear_override(tx, &b.node_id, h, *epoch, timeout)?;
        b.override_command_id = Some(rec.id);
        queued = Some(h.clone());
    }
    b.ended_at = Some(now);
    tx.put_boot(&b)?;
    if off && let Some((h, epoch)) = &holder {
        let args = CommandArgs::BmcPower(PowerArgs {
            node_id: b.node_id.clone(),
            lease_epoch: *epoch,
            action: PowerAction::Off,
            boot_device: None,
            network_boot: None,
        });
        bmc::queue(tx, h, &b.node_id, args, timeout, OWNER)?;
        queued = Some(h.clone());
        bmc::mark_expected(tx, &b.node_id, Power::Off)?;
    }
    let ended = matches!(
        state,
        ProvisionState::Failed | ProvisionState::Retired | ProvisionState::Deployed
    );
    let close = ended && bm.sessions.live_epoch(&b.node_id).is_some();
    // A retired or deployed node's ramdisk identity ended with that move; a failed one's ends
    // here.
    if close && state == ProvisionState::Failed {
        let mut edit = Edit::begin(tx, &b.node_id, None, OWNER)?;
        crate::ops::nodes::bump_identity(
            &mut edit,
            "the node failed in the ramdisk: the ramdisk's identity ends",
        );
        edit.save(tx)?;
    }
    tracing::info!(node_id = %b.node_id, state = %state, power_off = queued.is_some(), "ramdisk boot ended");
    Ok(Some(Action::Ended {
        site: node.site_id.clone().unwrap_or_default(),
        holder: queued,
        close: close.then(|| b.node_id.clone()),
    }))
}
