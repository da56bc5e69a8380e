use std::time::{Duration, Instant};

use bc_protocol::inventory::Nic;

use super::*;
use crate::hostroot::HostRoot;

/// A `/sys/class/net` with one interface of each kind.
fn fixture() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let nic = |name: &str, device: bool, ty: &str, oper: &str| {
        let base = d.path().join("sys/class/net").join(name);
        std::fs::create_dir_all(&base).unwrap();
        if device {
            std::fs::create_dir_all(base.join("device")).unwrap();
        }
        std::fs::write(base.join("type"), format!("{ty}\n")).unwrap();
        std::fs::write(base.join("operstate"), format!("{oper}\n")).unwrap();
    };
    nic("bcdfx1", true, "1", "up");
    nic("bcdfx0", true, "1", "up");
    nic("bcdfx2", true, "1", "down");
    nic("ib0", true, "32", "up");
    nic("veth0", false, "1", "up");
    nic("lo", false, "772", "unknown");
    d
}

#[test]
fn listens_by_default_on_physical_up_ethernet_links() {
    let d = fixture();
    assert_eq!(
        default_interfaces(&HostRoot::new(d.path())),
        ["bcdfx0", "bcdfx1"]
    );
    assert!(default_interfaces(&HostRoot::new("/nonexistent")).is_empty());
}

#[test]
fn a_wait_on_nothing_returns_at_once_and_on_a_missing_link_says_so() {
    let started = Instant::now();
    assert_eq!(wait(&[], Duration::from_secs(30)), Heard::default());
    let heard = wait(&["bcd-no-such0".to_owned()], Duration::from_secs(30));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "nothing to wait for"
    );
    assert!(heard.neighbors.is_empty());
    assert_eq!(heard.problems.len(), 1, "{heard:?}");
    assert!(heard.problems[0].contains("bcd-no-such0"), "{heard:?}");
}

#[test]
fn a_silent_link_is_waited_on_for_the_bound_and_no_longer() {
    // Loopback: as root it opens and hears no LLDPDU; without CAP_NET_RAW it is refused at once.
    let started = Instant::now();
    let heard = wait(&["lo".to_owned()], Duration::from_millis(600));
    let took = started.elapsed();
    assert!(heard.neighbors.is_empty());
    assert!(took < Duration::from_secs(3), "{took:?}");
    match heard.problems.as_slice() {
        [] => assert!(took >= Duration::from_millis(600), "{took:?}"),
        [p] => assert!(p.contains("CAP_NET_RAW"), "{p}"),
        more => panic!("{more:?}"),
    }
}

#[test]
fn the_watcher_reports_links_it_cannot_open_and_stops_when_dropped() {
    // A fixture's interfaces do not exist in this namespace: each is a problem, none a panic.
    let d = fixture();
    let w = Watcher::spawn(HostRoot::new(d.path())).unwrap();
    let started = Instant::now();
    let n = w.wait_heard(Duration::from_secs(5));
    assert!(n.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "no link to wait on"
    );
    let problems = w.problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("bcdfx0") || p.contains("CAP_NET_RAW")),
        "{problems:?}"
    );
    let started = Instant::now();
    drop(w);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "stops within a tick"
    );
}

#[test]
fn attach_puts_neighbours_on_their_nics_and_problems_in_notes() {
    let mut inv = Inventory {
        nics: vec![
            Nic {
                name: "eth0".into(),
                ..Nic::default()
            },
            Nic {
                name: "eth1".into(),
                ..Nic::default()
            },
        ],
        ..Inventory::default()
    };
    let n = LldpNeighbor {
        chassis_id: "c".into(),
        port_id: "p".into(),
        ttl_seconds: 120,
        ..LldpNeighbor::default()
    };
    let mut neighbors = Neighbors::new();
    neighbors.insert("eth1".into(), vec![n.clone()]);
    neighbors.insert("gone0".into(), vec![n.clone()]);
    attach(&mut inv, &neighbors, &["no CAP_NET_RAW".to_owned()]);
    assert!(inv.nics[0].lldp.is_empty());
    assert_eq!(inv.nics[1].lldp, [n]);
    assert_eq!(inv.notes.len(), 1);
    assert_eq!(inv.notes[0].source, "lldp");
}
