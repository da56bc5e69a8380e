//! The neighbours heard, per interface, each until its TTL runs out (IEEE 802.1AB-2016 clause
//! 9.2.7.7.1: an LLDPDU's information is kept `rxTTL` seconds, replaced by the next LLDPDU of the
//! same chassis id and port id, and deleted at once by one whose TTL is 0).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bc_protocol::inventory::LldpNeighbor;

/// Most neighbours kept per link. A switch port has one; a few more appear behind an
/// unmanaged bridge or with several agents on one port. Anyone else on the segment can send
/// LLDPDUs with a new chassis id each, so the table must not grow with them: once a link holds
/// this many, an LLDPDU from a neighbour not yet heard is dropped until one expires or leaves.
pub const MAX_NEIGHBORS_PER_LINK: usize = 16;

/// Neighbours by interface name, each interface's in the order first heard.
pub type Neighbors = BTreeMap<String, Vec<LldpNeighbor>>;

/// What was heard on one link.
#[derive(Debug, Default, Clone)]
struct Link {
    /// Whether any LLDPDU arrived on it since it was added.
    heard: bool,
    /// Each neighbour with the instant its information expires.
    entries: Vec<(LldpNeighbor, Instant)>,
}

/// Neighbours per interface with their expiry.
#[derive(Debug, Default, Clone)]
pub struct Table {
    links: BTreeMap<String, Link>,
}

impl Table {
    /// Starts tracking `iface` (a link now listened on), keeping what it already has.
    pub fn add_link(&mut self, iface: &str) {
        self.links.entry(iface.to_owned()).or_default();
    }

    /// Forgets `iface` (gone, or no longer up).
    pub fn remove_link(&mut self, iface: &str) {
        self.links.remove(iface);
    }

    /// Interfaces tracked now.
    pub fn links(&self) -> impl Iterator<Item = &str> {
        self.links.keys().map(String::as_str)
    }

    /// Records an LLDPDU from `n` received on `iface` at `now`: it replaces the entry of the
    /// same chassis id and port id, or is added (dropped when the link already holds
    /// [`MAX_NEIGHBORS_PER_LINK`] live ones); a TTL of 0 deletes that entry.
    pub fn record(&mut self, iface: &str, n: LldpNeighbor, now: Instant) {
        let link = self.links.entry(iface.to_owned()).or_default();
        link.heard = true;
        let same = |e: &(LldpNeighbor, Instant)| {
            e.0.chassis_id == n.chassis_id
                && e.0.chassis_id_subtype == n.chassis_id_subtype
                && e.0.port_id == n.port_id
                && e.0.port_id_subtype == n.port_id_subtype
        };
        let at = link.entries.iter().position(same);
        if n.ttl_seconds == 0 {
            if let Some(i) = at {
                link.entries.remove(i);
            }
            return;
        }
        let expires = now + Duration::from_secs(u64::from(n.ttl_seconds));
        match at {
            Some(i) => link.entries[i] = (n, expires),
            None => {
                link.entries.retain(|(_, exp)| *exp > now);
                if link.entries.len() < MAX_NEIGHBORS_PER_LINK {
                    link.entries.push((n, expires));
                }
            }
        }
    }

    /// True when every tracked link has heard at least one LLDPDU (true for no links).
    pub fn all_heard(&self) -> bool {
        self.links.values().all(|l| l.heard)
    }

    /// The neighbours whose information has not expired at `now`; links with none left out.
    pub fn neighbors(&self, now: Instant) -> Neighbors {
        self.links
            .iter()
            .filter_map(|(name, l)| {
                let live: Vec<LldpNeighbor> = l
                    .entries
                    .iter()
                    .filter(|(_, exp)| *exp > now)
                    .map(|(n, _)| n.clone())
                    .collect();
                (!live.is_empty()).then(|| (name.clone(), live))
            })
            .collect()
    }

    /// Drops expired entries (the watcher calls it now and then so a table never grows).
    pub fn expire(&mut self, now: Instant) {
        for l in self.links.values_mut() {
            l.entries.retain(|(_, exp)| *exp > now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(chassis: &str, port: &str, ttl: u16, name: &str) -> LldpNeighbor {
        LldpNeighbor {
            chassis_id: chassis.into(),
            chassis_id_subtype: "macAddress".into(),
            port_id: port.into(),
            port_id_subtype: "interfaceName".into(),
            system_name: Some(name.into()),
            ttl_seconds: ttl,
            ..LldpNeighbor::default()
        }
    }

    #[test]
    fn entries_are_replaced_by_msap_expire_and_leave_on_ttl_zero() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.add_link("eth0");
        t.add_link("eth1");
        assert!(!t.all_heard());
        assert!(t.neighbors(t0).is_empty());
        t.record("eth0", n("c1", "p1", 120, "leaf-1"), t0);
        t.record("eth0", n("c2", "p9", 10, "leaf-2"), t0);
        t.record("eth0", n("c1", "p1", 120, "leaf-1 renamed"), t0);
        assert!(!t.all_heard(), "eth1 has heard nothing");
        let got = t.neighbors(t0);
        let names: Vec<_> = got["eth0"].iter().map(|n| n.system_name.clone()).collect();
        assert_eq!(
            names,
            [Some("leaf-1 renamed".to_owned()), Some("leaf-2".to_owned())]
        );
        assert!(!got.contains_key("eth1"));
        // leaf-2's 10 s are up at t0 + 10 s.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(t.neighbors(later)["eth0"].len(), 1);
        t.expire(later);
        assert_eq!(t.neighbors(t0)["eth0"].len(), 1, "expired entries are gone");
        // A shutdown LLDPDU removes its sender at once, and still counts as heard.
        t.record("eth1", n("c3", "p3", 0, "leaving"), t0);
        assert!(t.all_heard());
        t.record("eth0", n("c1", "p1", 0, "leaving"), t0);
        assert!(t.neighbors(t0).is_empty());
        t.remove_link("eth1");
        assert_eq!(t.links().collect::<Vec<_>>(), ["eth0"]);
    }

    #[test]
    fn a_flood_of_new_chassis_ids_is_capped_per_link_and_known_ones_still_update() {
        let t0 = Instant::now();
        let mut t = Table::default();
        t.record("eth0", n("switch", "Ethernet1", 120, "leaf-1"), t0);
        for i in 0..10_000 {
            t.record("eth0", n(&format!("spoof-{i}"), "p", u16::MAX, "x"), t0);
        }
        let got = t.neighbors(t0);
        assert_eq!(got["eth0"].len(), MAX_NEIGHBORS_PER_LINK);
        assert_eq!(got["eth0"][0].system_name.as_deref(), Some("leaf-1"));
        // The neighbour first heard is still refreshed in place.
        t.record("eth0", n("switch", "Ethernet1", 120, "leaf-1 again"), t0);
        assert_eq!(
            t.neighbors(t0)["eth0"][0].system_name.as_deref(),
            Some("leaf-1 again")
        );
        // Once it leaves, a new one takes its place; once the spoofs expire, room is back.
        t.record("eth0", n("switch", "Ethernet1", 0, ""), t0);
        t.record("eth0", n("switch-2", "Ethernet1", 120, "leaf-2"), t0);
        assert!(
            t.neighbors(t0)["eth0"]
                .iter()
                .any(|x| x.system_name.as_deref() == Some("leaf-2"))
        );
        let later = t0 + Duration::from_secs(u64::from(u16::MAX));
        t.record("eth0", n("switch-3", "Ethernet1", 120, "leaf-3"), later);
        assert_eq!(t.neighbors(later)["eth0"].len(), 1);
    }
}
