//! `bcd inventory` as a human-readable summary (JSON is the document itself).

use std::fmt::Write as _;

use bc_protocol::inventory::{Affinity, Inventory, Topology};

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// NUMA nodes, the GPU affinity matrix (rows GPUs, columns the other devices of interest, as
/// `nvidia-smi topo -m` prints it) and the degraded links.
fn render_topology(s: &mut String, t: &Topology) {
    for n in &t.numa_nodes {
        let _ = writeln!(
            s,
            "numa:      node{} cpus {} ({}) memory {}",
            n.id,
            if n.cpulist.is_empty() {
                "-"
            } else {
                &n.cpulist
            },
            n.cpus,
            n.memory_bytes.map_or_else(|| "-".into(), gib)
        );
    }
    let mut gpus: Vec<&str> = t.affinity.iter().map(|a| a.gpu.as_str()).collect();
    gpus.dedup();
    let mut cols: Vec<&str> = t.affinity.iter().map(|a| a.device.as_str()).collect();
    cols.sort_unstable();
    cols.dedup();
    if !gpus.is_empty() {
        let _ = write!(s, "affinity:  {:<14}", "");
        for c in &cols {
            let _ = write!(s, "{c:<14}");
        }
        let _ = writeln!(s);
        for g in gpus {
            let _ = write!(s, "           {g:<14}");
            for c in &cols {
                let cell = t
                    .affinity
                    .iter()
                    .find(|a| a.gpu == g && a.device == *c)
                    .map_or("X", |a| affinity_name(a.affinity));
                let _ = write!(s, "{cell:<14}");
            }
            let _ = writeln!(s);
        }
    }
    for d in &t.degraded_links {
        let _ = writeln!(
            s,
            "degraded:  {} x{} of x{}, {} of {} GT/s",
            d.address,
            or_dash(d.current_width),
            or_dash(d.max_width),
            or_dash(d.current_speed_gts),
            or_dash(d.max_speed_gts)
        );
    }
}

fn affinity_name(a: Affinity) -> &'static str {
    match a {
        Affinity::Pix => "PIX",
        Affinity::Pxb => "PXB",
        Affinity::Phb => "PHB",
        Affinity::Node => "NODE",
        Affinity::Sys => "SYS",
    }
}

/// One section per block; absent sections say so.
pub fn render_table(inv: &Inventory) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "hostname:  {}", or_dash(inv.hostname.as_deref()));
    match &inv.system {
        Some(sys) => {
            let _ = writeln!(
                s,
                "system:    {} {} (SMBIOS {}), BIOS {} {} {}, board {} {}",
                or_dash(sys.vendor.as_deref()),
                or_dash(sys.product.as_deref()),
                or_dash(sys.smbios_version.as_deref()),
                or_dash(sys.bios_vendor.as_deref()),
                or_dash(sys.bios_version.as_deref()),
                or_dash(sys.bios_date.as_deref()),
                or_dash(sys.board_vendor.as_deref()),
                or_dash(sys.board_product.as_deref()),
            );
        }
        None => {
            let _ = writeln!(s, "system:    (no SMBIOS)");
        }
    }
    if let Some(c) = &inv.cpu {
        let _ = writeln!(
            s,
            "cpu:       {} | {} sockets, {} cores, {} threads, {} | {} flags",
            or_dash(c.model.as_deref()),
            or_dash(c.sockets),
            or_dash(c.cores),
            c.threads,
            or_dash(c.architecture.as_deref()),
            c.flags.len()
        );
    }
    if let Some(m) = &inv.memory {
        let _ = writeln!(
            s,
            "memory:    {} total, {} DIMMs",
            gib(m.total_bytes),
            m.dimms.len()
        );
        for d in &m.dimms {
            let _ = writeln!(
                s,
                "  dimm     {:<28} {:>10} {:<6} {:>5} MT/s",
                or_dash(d.locator.as_deref()),
                d.size_bytes.map_or_else(|| "-".into(), gib),
                or_dash(d.memory_type.as_deref()),
                or_dash(d.speed_mts)
            );
        }
    }
    if let Some(os) = &inv.os {
        let _ = writeln!(
            s,
            "os:        {} | kernel {} | up {} s | boot {}",
            or_dash(os.distro.as_deref()),
            or_dash(os.kernel.as_deref()),
            os.uptime_s
                .map_or_else(|| "-".into(), |u| format!("{u:.0}")),
            or_dash(inv.boot_mode.map(|b| format!("{b:?}").to_lowercase()))
        );
    }
    let _ = writeln!(s, "disks:");
    for d in &inv.disks {
        let _ = writeln!(
            s,
            "  {:<10} {:>10} {:<6} {:<32} rot={} serial={} fw={} hctl={} sectors={}/{}{}",
            d.name,
            gib(d.size_bytes),
            or_dash(d.transport.as_deref()),
            or_dash(d.model.as_deref()),
            or_dash(d.rotational),
            or_dash(d.serial.as_deref()),
            or_dash(d.firmware.as_deref()),
            or_dash(d.hctl.as_deref()),
            or_dash(d.logical_sector_bytes),
            or_dash(d.physical_sector_bytes),
            if d.holders.is_empty() {
                String::new()
            } else {
                format!(" holders={}", d.holders.join(","))
            }
        );
    }
    let _ = writeln!(s, "nics:");
    for n in &inv.nics {
        let _ = writeln!(
            s,
            "  {:<12} {:<17} perm={:<17} {:<8} {:>6} Mb/s link={} mtu={} pci={} {}{}",
            n.name,
            or_dash(n.mac.as_deref()),
            or_dash(n.permanent_mac.as_deref()),
            or_dash(n.driver.as_deref()),
            or_dash(n.speed_mbps),
            or_dash(n.link),
            or_dash(n.mtu),
            or_dash(n.pci_address.as_deref()),
            if n.physical { "physical" } else { "virtual" },
            n.port_guid
                .as_deref()
                .map(|g| format!(" guid={g}"))
                .unwrap_or_default()
        );
        for l in &n.lldp {
            let _ = writeln!(
                s,
                "    lldp: {} port {} ({}) chassis {} vlan {} ttl {}s",
                or_dash(l.system_name.as_deref()),
                l.port_id,
                or_dash(l.port_description.as_deref()),
                l.chassis_id,
                or_dash(l.vlan_id),
                l.ttl_seconds
            );
        }
    }
    let _ = writeln!(s, "pci:       {} functions", inv.pci_devices.len());
    for p in inv
        .pci_devices
        .iter()
        .filter(|p| p.nvidia_gpu || p.mellanox || p.infiniband)
    {
        let _ = writeln!(
            s,
            "  {} {}:{} class {} driver {}{}",
            p.address,
            p.vendor_id,
            p.device_id,
            p.class,
            or_dash(p.driver.as_deref()),
            if p.nvidia_gpu {
                " [NVIDIA GPU]"
            } else if p.infiniband {
                " [InfiniBand]"
            } else {
                " [Mellanox]"
            }
        );
    }
    for p in &inv.infiniband {
        let _ = writeln!(
            s,
            "ib:        {} port {} {} {} {}",
            p.device,
            p.port,
            or_dash(p.state.as_deref()),
            or_dash(p.rate.as_deref()),
            or_dash(p.link_layer.as_deref())
        );
    }
    let _ = writeln!(s, "gpus:      {}", inv.gpus.len());
    for g in &inv.gpus {
        let _ = writeln!(
            s,
            "  {} {} ({}){}",
            g.pci_bus_id,
            or_dash(g.name.as_deref()),
            g.source,
            if g.mig_enabled == Some(true) {
                format!(", MIG on, {} MIG devices", g.mig_devices.len())
            } else {
                String::new()
            }
        );
        for m in &g.mig_devices {
            let _ = writeln!(
                s,
                "    mig {} {} {}",
                m.index,
                or_dash(m.name.as_deref()),
                or_dash(m.uuid.as_deref())
            );
        }
    }
    if let Some(t) = &inv.topology {
        render_topology(&mut s, t);
    }
    if !inv.notes.is_empty() {
        let _ = writeln!(s, "notes:");
        for n in &inv.notes {
            let _ = writeln!(s, "  - [{}] {}", n.source, n.message);
        }
    }
    s
}
