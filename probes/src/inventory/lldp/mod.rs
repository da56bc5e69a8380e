//! LLDP neighbours (issue 20.2): which switch port each link is cabled to, from the LLDPDUs
//! (IEEE 802.1AB-2016) the switch sends to the nearest-bridge group every ~30 s.
//!
//! # Design
//! - [`parse`]: an Ethernet frame into a [`LldpNeighbor`]; every length checked, junk is an
//!   error, never a panic (property-tested).
//! - [`socket`]: one `AF_PACKET` socket per interface, bound to EtherType 0x88CC, with the
//!   multicast membership that makes the NIC pass the group address up.
//! - [`table`]: neighbours per interface until their TTL runs out.
//! - [`wait`] (`bcd inventory --lldp-wait`): listens on given links until each heard one
//!   LLDPDU or the time is up. [`Watcher`] (node agent, ramdisk): a thread that listens on every
//!   physical, up link ([`default_interfaces`]) and keeps the table; the inventory reads a copy
//!   ([`attach`]) and never waits on the wire, except the ramdisk's first, through
//!   [`Watcher::wait_heard`].
//!
//! Without `CAP_NET_RAW` nothing is heard: the reason is logged once and becomes an inventory
//! note (source `lldp`); the rest of the inventory is unaffected.
//!
//! # Limitations
//! The sockets listen in the calling process's network namespace, so only on a live root. Only
//! the TLVs of [`LldpNeighbor`] are read (no capabilities, LLDP-MED, DCBX). A link bridged or
//! bonded in the kernel is listened on through its physical members.

pub mod parse;
#[allow(unsafe_code)]
pub mod socket;
pub mod table;

mod listen;
mod watch;

use bc_protocol::inventory::Inventory;
pub use bc_protocol::inventory::LldpNeighbor;

pub use listen::{Heard, default_interfaces, wait};
pub use table::Neighbors;
pub use watch::{RESCAN, Watcher, WatcherError};

/// Puts `neighbors` on the inventory's NICs of the same name, and each of `problems` as a note
/// (source `lldp`).
pub fn attach(inv: &mut Inventory, neighbors: &Neighbors, problems: &[String]) {
    for nic in &mut inv.nics {
        if let Some(n) = neighbors.get(&nic.name) {
            nic.lldp.clone_from(n);
        }
    }
    for p in problems {
        super::note(&mut inv.notes, "lldp", p.clone());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
