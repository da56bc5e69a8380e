//! Issue 20, item 3: PCIe links, placements, NUMA nodes, the GPU affinity matrix and degraded
//! links, on the real node_exporter tree (read in place) and on a made-up two-socket GPU node
//! with what that tree lacks: GPUs, PCIe switches, several host bridges and NUMA nodes.

use std::path::Path;

use bc_protocol::inventory::{Affinity, DeviceKind, PciDevice};

use super::field_tests::Tree;
use super::*;

const NODE_EXPORTER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/hosts/node-exporter"
);

#[test]
fn node_exporter_links_placements_and_numa_nodes() {
    let p = Path::new(NODE_EXPORTER);
    if !p.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "fixture {} is missing",
            p.display()
        );
        return;
    }
    let inv = collect(&HostRoot::new(p));
    let nvme = inv.pci_devices.iter().find(|d| d.address == "0000:01:00.0");
    let nvme = nvme.cloned().unwrap_or_default();
    assert_eq!(nvme.class, "010802");
    assert_eq!(
        (nvme.current_link_speed_gts, nvme.max_link_speed_gts),
        (Some(8.0), Some(16.0))
    );
    assert_eq!(
        (nvme.current_link_width, nvme.max_link_width),
        (Some(4), Some(4))
    );
    assert_eq!(nvme.host_bridge.as_deref(), Some("pci0000:00"));
    assert_eq!(nvme.bridges, ["0000:00:02.1"]);
    let igb = inv.pci_devices.iter().find(|d| d.address == "0000:45:00.0");
    let igb = igb.cloned().unwrap_or_default();
    assert_eq!(igb.host_bridge.as_deref(), Some("pci0000:40"));
    assert_eq!(igb.bridges, ["0000:40:01.3"]);
    assert_eq!(igb.current_link_speed_gts, Some(5.0));
    let topo = inv.topology.unwrap_or_default();
    let nodes: Vec<(u32, &str, u32)> = topo
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.cpulist.as_str(), n.cpus))
        .collect();
    assert_eq!(nodes, [(0, "0-1", 2), (1, "2-3", 2), (2, "", 0)]);
    assert_eq!(topo.numa_nodes[0].memory_bytes, Some(134_182_340 * 1024));
    // The NVMe (a Gen4 device) runs at 8 GT/s under a root port that tops out at 8 GT/s: the
    // slot, not the link, sets the pace. The root port's own x4 of x8 is a bridge: not listed.
    assert!(topo.degraded_links.is_empty(), "{:?}", topo.degraded_links);
    assert!(topo.affinity.is_empty(), "no GPU in this tree");
}

/// One PCI function of the made-up node: `dir` its path under `/sys/devices`.
struct Func<'a> {
    dir: &'a str,
    vendor: &'a str,
    class: &'a str,
    numa: i32,
    /// (current GT/s, max GT/s, current width, max width)
    link: (&'a str, &'a str, u32, u32),
}

impl Tree {
    fn func(&self, f: &Func) -> std::io::Result<()> {
        let addr = f.dir.rsplit('/').next().unwrap_or_default();
        for (file, v) in [
            ("vendor", format!("0x{}\n", f.vendor)),
            ("device", "0x1234\n".to_owned()),
            ("class", format!("0x{}\n", f.class)),
            ("numa_node", format!("{}\n", f.numa)),
            ("current_link_speed", format!("{} GT/s PCIe\n", f.link.0)),
            ("max_link_speed", format!("{} GT/s PCIe\n", f.link.1)),
            ("current_link_width", format!("{}\n", f.link.2)),
            ("max_link_width", format!("{}\n", f.link.3)),
        ] {
            self.file(&format!("{}/{file}", f.dir), v.as_bytes())?;
        }
        self.link(
            &format!("/sys/bus/pci/devices/{addr}"),
            &self.root.path(f.dir).to_string_lossy(),
        )
    }
}

const BRIDGE: &str = "060400";
const GEN5_X16: (&str, &str, u32, u32) = ("32.0", "32.0", 16, 16);

/// Socket 0: host bridge `pci0000:00` with root port 00:01.0 → switch A (upstream 01:00.0,
/// downstream 02:00.0 → GPU 03:00.0, 02:01.0 → InfiniBand HCA 04:00.0, 02:02.0 → switch B
/// (upstream 05:00.0, downstream 06:00.0 → NVMe 07:00.0)); root port 00:02.0 (an x8 slot) → an
/// x16 NIC 08:00.0 at x8; host bridge `pci0000:40`, root port 40:01.0 → NIC 41:00.0.
/// Socket 1: host bridge `pci0000:80`, root port 80:01.0 → GPU 81:00.0 trained at x8 of x16.
fn gpu_node() -> std::io::Result<Tree> {
    let t = Tree::new()?;
    let rp0 = "/sys/devices/pci0000:00/0000:00:01.0";
    let up_a = format!("{rp0}/0000:01:00.0");
    let up_b = format!("{up_a}/0000:02:02.0/0000:05:00.0");
    let rp1 = "/sys/devices/pci0000:00/0000:00:02.0";
    let rp2 = "/sys/devices/pci0000:40/0000:40:01.0";
    let rp3 = "/sys/devices/pci0000:80/0000:80:01.0";
    let f = |dir: &str, vendor: &'static str, class: &'static str, numa: i32, link| {
        t.func(&Func {
            dir,
            vendor,
            class,
            numa,
            link,
        })
    };
    f(rp0, "8086", BRIDGE, 0, GEN5_X16)?;
    f(&up_a, "1000", BRIDGE, 0, GEN5_X16)?;
    f(&format!("{up_a}/0000:02:00.0"), "1000", BRIDGE, 0, GEN5_X16)?;
    f(&format!("{up_a}/0000:02:01.0"), "1000", BRIDGE, 0, GEN5_X16)?;
    f(&format!("{up_a}/0000:02:02.0"), "1000", BRIDGE, 0, GEN5_X16)?;
    f(
        &format!("{up_a}/0000:02:00.0/0000:03:00.0"),
        "10de",
        "030200",
        0,
        GEN5_X16,
    )?;
    f(
        &format!("{up_a}/0000:02:01.0/0000:04:00.0"),
        "15b3",
        "020700",
        0,
        GEN5_X16,
    )?;
    f(&up_b, "1000", BRIDGE, 0, GEN5_X16)?;
    f(&format!("{up_b}/0000:06:00.0"), "1000", BRIDGE, 0, GEN5_X16)?;
    f(
        &format!("{up_b}/0000:06:00.0/0000:07:00.0"),
        "144d",
        "010802",
        0,
        ("16.0", "16.0", 4, 4),
    )?;
    f(rp1, "8086", BRIDGE, 0, ("32.0", "32.0", 8, 8))?;
    f(
        &format!("{rp1}/0000:08:00.0"),
        "15b3",
        "020000",
        0,
        ("32.0", "32.0", 8, 16),
    )?;
    f(rp2, "8086", BRIDGE, 0, GEN5_X16)?;
    f(
        &format!("{rp2}/0000:41:00.0"),
        "8086",
        "020000",
        0,
        ("8.0", "8.0", 4, 4),
    )?;
    f(rp3, "8086", BRIDGE, 1, GEN5_X16)?;
    f(
        &format!("{rp3}/0000:81:00.0"),
        "10de",
        "030200",
        1,
        ("32.0", "32.0", 8, 16),
    )?;
    for (n, cpus, kib) in [
        (0, "0-47,96-143", "528000000"),
        (1, "48-95,144-191", "528482304"),
    ] {
        let d = format!("/sys/devices/system/node/node{n}");
        t.file(&format!("{d}/cpulist"), format!("{cpus}\n").as_bytes())?;
        t.file(
            &format!("{d}/meminfo"),
            format!("Node {n} MemTotal:       {kib} kB\nNode {n} MemFree: 1 kB\n").as_bytes(),
        )?;
    }
    Ok(t)
}

#[test]
fn the_affinity_matrix_in_nvidia_smi_terms() -> std::io::Result<()> {
    let t = gpu_node()?;
    let inv = collect(&t.root);
    let gpu = inv.pci_devices.iter().find(|d| d.address == "0000:03:00.0");
    assert_eq!(
        gpu.map(|g| g.bridges.clone()).unwrap_or_default(),
        ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]
    );
    let topo = inv.topology.unwrap_or_default();
    let row = |g: &str| -> Vec<(String, DeviceKind, Affinity)> {
        topo.affinity
            .iter()
            .filter(|a| a.gpu == g)
            .map(|a| (a.device.clone(), a.kind, a.affinity))
            .collect()
    };
    let s = |a: &str| a.to_owned();
    assert_eq!(
        row("0000:03:00.0"),
        [
            (s("0000:04:00.0"), DeviceKind::Infiniband, Affinity::Pix),
            (s("0000:07:00.0"), DeviceKind::Nvme, Affinity::Pxb),
            (s("0000:08:00.0"), DeviceKind::Nic, Affinity::Phb),
            (s("0000:41:00.0"), DeviceKind::Nic, Affinity::Node),
            (s("0000:81:00.0"), DeviceKind::Gpu, Affinity::Sys),
        ]
    );
    let far = row("0000:81:00.0");
    assert_eq!(far.len(), 5);
    assert!(far.iter().all(|(_, _, a)| *a == Affinity::Sys), "{far:?}");
    // Bridges are no devices of interest: no row, no column.
    assert!(topo.affinity.iter().all(|a| a.device != "0000:02:00.0"));
    let v = serde_json::to_value(&topo.affinity[0]).unwrap_or_default();
    assert_eq!(v["affinity"], "PIX");
    assert_eq!(v["kind"], "infiniband");
    let nodes: Vec<(u32, u32, Option<u64>)> = topo
        .numa_nodes
        .iter()
        .map(|n| (n.id, n.cpus, n.memory_bytes))
        .collect();
    assert_eq!(
        nodes,
        [
            (0, 96, Some(528_000_000 * 1024)),
            (1, 96, Some(528_482_304 * 1024))
        ]
    );
    Ok(())
}

#[test]
fn a_gpu_trained_at_x8_of_x16_is_degraded_and_an_x8_slot_is_not() -> std::io::Result<()> {
    let t = gpu_node()?;
    let topo = collect(&t.root).topology.unwrap_or_default();
    assert_eq!(topo.degraded_links.len(), 1, "{:?}", topo.degraded_links);
    let d = &topo.degraded_links[0];
    assert_eq!(d.address, "0000:81:00.0");
    assert_eq!(d.kind, Some(DeviceKind::Gpu));
    assert_eq!((d.current_width, d.max_width), (Some(8), Some(16)));
    assert_eq!(
        (d.current_speed_gts, d.max_speed_gts),
        (Some(32.0), Some(32.0))
    );
    // The NIC 08:00.0 is x16 but sits in an x8 root port: x8 is all the link can be.
    assert!(
        topo.degraded_links
            .iter()
            .all(|d| d.address != "0000:08:00.0")
    );
    Ok(())
}

#[test]
fn a_link_below_its_speed_is_degraded_too() {
    let dev = PciDevice {
        address: "0000:03:00.0".into(),
        vendor_id: "10de".into(),
        class: "030200".into(),
        current_link_speed_gts: Some(2.5),
        max_link_speed_gts: Some(32.0),
        current_link_width: Some(16),
        max_link_width: Some(16),
        ..PciDevice::default()
    };
    let d = topology::degraded(&dev, None).unwrap_or_default();
    assert_eq!(
        (d.current_speed_gts, d.max_speed_gts),
        (Some(2.5), Some(32.0))
    );
    // A Gen4 upstream port caps it at 16 GT/s: still below.
    let port = PciDevice {
        max_link_speed_gts: Some(16.0),
        ..PciDevice::default()
    };
    let d = topology::degraded(&dev, Some(&port)).unwrap_or_default();
    assert_eq!(d.max_speed_gts, Some(16.0));
    // Unknown values never make a link degraded.
    let unknown = PciDevice {
        current_link_speed_gts: None,
        current_link_width: None,
        ..dev
    };
    assert_eq!(topology::degraded(&unknown, None), None);
}

#[test]
fn an_unknown_numa_node_is_node_0_only_on_a_one_node_machine() {
    let dev = |addr: &str, hb: &str, numa: Option<i32>| PciDevice {
        address: addr.into(),
        host_bridge: Some(hb.into()),
        bridges: vec![format!("{}:01.0", &addr[..7])],
        numa_node: numa,
        ..PciDevice::default()
    };
    let g = dev("0000:17:00.0", "pci0000:16", None);
    let n = dev("0000:31:00.0", "pci0000:30", None);
    assert_eq!(topology::affinity(&g, &n, 1), Affinity::Node);
    assert_eq!(topology::affinity(&g, &n, 0), Affinity::Node);
    assert_eq!(topology::affinity(&g, &n, 2), Affinity::Sys);
    let n0 = dev("0000:31:00.0", "pci0000:30", Some(0));
    let g0 = dev("0000:17:00.0", "pci0000:16", Some(0));
    assert_eq!(topology::affinity(&g0, &n0, 2), Affinity::Node);
    // Two functions of one device share every bridge: one switch at most.
    let f1 = PciDevice {
        address: "0000:17:00.1".into(),
        ..g0.clone()
    };
    assert_eq!(topology::affinity(&g0, &f1, 2), Affinity::Pix);
}

#[test]
fn no_topology_without_nodes_gpus_or_degraded_links() {
    let inv = collect(&HostRoot::new("/nonexistent-bcd-root"));
    assert_eq!(inv.topology, None);
}

#[test]
fn the_table_shows_the_matrix_and_the_degraded_link() -> std::io::Result<()> {
    let t = gpu_node()?;
    let table = render_table(&collect(&t.root));
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("0000:03:00.0") && l.contains("PIX"))
        .unwrap_or_default();
    let cells: Vec<&str> = row.split_whitespace().collect();
    // Columns: 03:00.0 (itself), 04, 07, 08, 41, 81.
    assert_eq!(
        cells,
        ["0000:03:00.0", "X", "PIX", "PXB", "PHB", "NODE", "SYS"]
    );
    assert!(table.contains("degraded:  0000:81:00.0 x8 of x16, 32 of 32 GT/s"));
    assert!(table.contains("numa:      node1 cpus 48-95,144-191 (96)"));
    Ok(())
}
