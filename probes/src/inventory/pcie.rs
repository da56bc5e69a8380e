//! One PCI function's PCIe link (`current_link_speed`, `max_link_width`, … of kernel ABI
//! `sysfs-bus-pci`) and its place in the hierarchy: the host bridge and the bridges above it, read
//! from its canonical sysfs path (`/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0`).

use std::path::Path;

use crate::hostroot::HostRoot;

/// A function's link as sysfs reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Link {
    /// `current_link_speed`, GT/s.
    pub current_speed_gts: Option<f64>,
    /// `max_link_speed`, GT/s.
    pub max_speed_gts: Option<f64>,
    /// `current_link_width`, lanes.
    pub current_width: Option<u32>,
    /// `max_link_width`, lanes.
    pub max_width: Option<u32>,
}

/// Where a function sits: its host bridge (`pci0000:00`) and the bridges from the root port down
/// to it, root port first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    pub host_bridge: Option<String>,
    pub bridges: Vec<String>,
}

/// GT/s from a link speed as the kernel writes it: `16.0 GT/s PCIe` (5.x and later), `8 GT/s`
/// or `2.5 GT/s` (older kernels). `None` for `Unknown`, `0`, or anything else.
pub fn parse_speed_gts(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    (it.next() == Some("GT/s") && v.is_finite() && v > 0.0).then_some(v)
}

/// The link of the function whose sysfs directory is `dir` (`/sys/bus/pci/devices/<addr>`).
/// A width of 0 (no link trained) counts as absent.
pub fn link(root: &HostRoot, dir: &str) -> Link {
    let speed = |f: &str| {
        root.read_trimmed(format!("{dir}/{f}"))
            .and_then(|s| parse_speed_gts(&s))
    };
    let width = |f: &str| {
        root.read_parsed::<u32>(format!("{dir}/{f}"))
            .filter(|w| *w > 0)
    };
    Link {
        current_speed_gts: speed("current_link_speed"),
        max_speed_gts: speed("max_link_speed"),
        current_width: width("current_link_width"),
        max_width: width("max_link_width"),
    }
}

/// `pci0000:00`, `pci10000:e0` (a VMD domain): a PCI host bridge's directory in `/sys/devices`.
fn is_host_bridge(c: &str) -> bool {
    c.strip_prefix("pci")
        .and_then(|r| r.split_once(':'))
        .is_some_and(|(dom, bus)| is_hex(dom, 4..=8) && is_hex(bus, 2..=2))
}

/// `0000:03:00.0` (or a wider domain): a PCI function's directory name.
pub fn is_function(c: &str) -> bool {
    let mut parts = c.splitn(3, ':');
    let (Some(dom), Some(bus), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let Some((dev, func)) = rest.split_once('.') else {
        return false;
    };
    is_hex(dom, 4..=8)
        && is_hex(bus, 2..=2)
        && is_hex(dev, 2..=2)
        && func.len() == 1
        && func.bytes().all(|b| (b'0'..=b'7').contains(&b))
}

fn is_hex(s: &str, len: std::ops::RangeInclusive<usize>) -> bool {
    len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The placement of function `address` from the canonical path of
/// `/sys/bus/pci/devices/<address>` (a symlink on a live machine; in a fixture tree made from an
/// archive, a link file holding the target, see [`HostRoot`]): the last host bridge component,
/// then every function directory after it but the function itself. Empty when the path cannot
/// be resolved.
pub fn placement(root: &HostRoot, address: &str) -> Placement {
    const DIR: &str = "/sys/bus/pci/devices";
    let direct = root.path(format!("{DIR}/{address}"));
    let target = if direct.is_dir() {
        Some(direct)
    } else {
        root.read_link(format!("{DIR}/{address}"))
            .map(|t| root.path(DIR).join(t))
    };
    match target.map(std::fs::canonicalize) {
        Some(Ok(p)) => placement_from_path(&p, address),
        _ => Placement::default(),
    }
}

/// [`placement`] on a path already resolved.
pub fn placement_from_path(path: &Path, address: &str) -> Placement {
    let comps: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let Some(hb) = comps.iter().rposition(|c| is_host_bridge(c)) else {
        return Placement::default();
    };
    let mut bridges: Vec<String> = comps[hb + 1..]
        .iter()
        .filter(|c| is_function(c))
        .cloned()
        .collect();
    if bridges.last().map(String::as_str) != Some(address) {
        return Placement::default();
    }
    bridges.pop();
    Placement {
        host_bridge: comps.get(hb).cloned(),
        bridges,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_speeds_as_every_kernel_writes_them() {
        assert_eq!(parse_speed_gts("16.0 GT/s PCIe"), Some(16.0));
        assert_eq!(parse_speed_gts("8 GT/s"), Some(8.0));
        assert_eq!(parse_speed_gts("2.5 GT/s PCIe"), Some(2.5));
        assert_eq!(parse_speed_gts("Unknown"), None);
        assert_eq!(parse_speed_gts("0 GT/s"), None);
        assert_eq!(parse_speed_gts("8.0 MB/s"), None);
        assert_eq!(parse_speed_gts(""), None);
    }

    #[test]
    fn placement_names_the_host_bridge_and_the_bridges_above() {
        let p = placement_from_path(
            Path::new(
                "/sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/0000:18:08.0/0000:19:00.0",
            ),
            "0000:19:00.0",
        );
        assert_eq!(p.host_bridge.as_deref(), Some("pci0000:16"));
        assert_eq!(p.bridges, ["0000:16:02.0", "0000:17:00.0", "0000:18:08.0"]);
        // A VMD domain: the last host bridge counts, its own bridges only.
        let v = placement_from_path(
            Path::new(
                "/sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:1d.0/10000:e1:00.0",
            ),
            "10000:e1:00.0",
        );
        assert_eq!(v.host_bridge.as_deref(), Some("pci10000:e0"));
        assert_eq!(v.bridges, ["10000:e0:1d.0"]);
        // A path that does not end at the function tells nothing.
        assert_eq!(
            placement_from_path(
                Path::new("/sys/devices/pci0000:00/0000:00:01.0"),
                "0000:01:00.0"
            ),
            Placement::default()
        );
        assert!(!is_function("0000:00:01.8") && !is_function("0:0:0:0"));
    }
}
