//! PCI addresses of GPUs as NVML, `nvidia-smi` and the kernel log write them.
//!
//! NVML's `nvmlPciInfo_t.busId` is `00000000:1A:00.0` (8-digit domain), its legacy form and
//! `nvidia-smi` use `0000:1A:00.0`, and the driver's kernel log names a GPU as
//! `PCI:0000:1a:00` (no function). [`PciAddr`] is the device-level address all three share.

use std::fmt;

/// A PCI device address without the function number: domain, bus, device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddr {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number.
    pub device: u8,
}

impl PciAddr {
    /// Parses `00000000:1A:00.0`, `0000:1a:00.0`, `0000:1a:00`, `1a:00.0` (domain 0), with or
    /// without a `PCI:` prefix. The function number, if any, is dropped.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let s = s.strip_prefix("PCI:").unwrap_or(s);
        let rest = match s.rsplit_once('.') {
            Some((r, f)) if !f.is_empty() && f.chars().all(|c| c.is_ascii_hexdigit()) => r,
            Some(_) => return None,
            None => s,
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, v] => (u32::from_str_radix(d, 16).ok()?, *b, *v),
            [b, v] => (0, *b, *v),
            _ => return None,
        };
        if bus.is_empty() || bus.len() > 2 || device.is_empty() || device.len() > 2 {
            return None;
        }
        Some(Self {
            domain,
            bus: u8::from_str_radix(bus, 16).ok()?,
            device: u8::from_str_radix(device, 16).ok()?,
        })
    }

    /// `0000:1a:00.0`: the form bcd reports (function 0, which every NVIDIA GPU uses).
    pub fn to_bus_id(self) -> String {
        format!("{self}.0")
    }
}

impl fmt::Display for PciAddr {
    /// `0000:1a:00`, the kernel log's form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}",
            self.domain, self.bus, self.device
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_to_the_same_address() {
        let want = PciAddr {
            domain: 0,
            bus: 0x1a,
            device: 0,
        };
        for s in [
            "00000000:1A:00.0",
            "0000:1a:00.0",
            "PCI:0000:1a:00",
            "1a:00.0",
            " 0000:1A:00 ",
        ] {
            assert_eq!(PciAddr::parse(s), Some(want), "{s}");
        }
        assert_eq!(want.to_bus_id(), "0000:1a:00.0");
    }

    #[test]
    fn junk_is_rejected() {
        for s in ["", "GPU-1234", "0000:1a", "0000:1a:00.x", "0000:100:00.0"] {
            assert_eq!(PciAddr::parse(s), None, "{s}");
        }
    }
}
