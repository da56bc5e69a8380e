//! Interface addresses: IPv6 from `/proc/net/if_inet6` (under any root, so fixture trees carry
//! them), IPv4 from `getifaddrs(3)` on the running machine only — procfs has no per-interface
//! list of IPv4 addresses (`/proc/net/fib_trie` names no interface).

use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::hostroot::HostRoot;

/// Addresses by interface name, each `addr/prefix`, in the order the kernel lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addresses {
    pub ipv4: HashMap<String, Vec<String>>,
    pub ipv6: HashMap<String, Vec<String>>,
}

/// Every interface's addresses under `root` (IPv4 only on a live root).
pub fn read(root: &HostRoot) -> Addresses {
    Addresses {
        ipv4: if root.is_live() {
            live_ipv4()
        } else {
            HashMap::new()
        },
        ipv6: root
            .read_to_string("/proc/net/if_inet6")
            .map(|t| parse_if_inet6(&t))
            .unwrap_or_default(),
    }
}

/// `/proc/net/if_inet6`: one address a line, `<32 hex digits> <ifindex> <prefix len, hex>
/// <scope> <flags> <name>` (`net/ipv6/addrconf.c`, `if6_seq_show`) → per interface, the
/// addresses in their compressed form with their prefix length (`fe80::1/64`). Malformed lines
/// are skipped.
pub fn parse_if_inet6(text: &str) -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [hex, _, plen, _, _, name] = f.as_slice() else {
            continue;
        };
        let (Ok(bits), Ok(plen)) = (u128::from_str_radix(hex, 16), u8::from_str_radix(plen, 16))
        else {
            continue;
        };
        if hex.len() != 32 || plen > 128 {
            continue;
        }
        let addr = std::net::Ipv6Addr::from(bits);
        out.entry((*name).to_owned())
            .or_default()
            .push(format!("{addr}/{plen}"));
    }
    out
}

/// IPv4 addresses of the running machine's interfaces; empty when `getifaddrs` fails.
fn live_ipv4() -> HashMap<String, Vec<String>> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let Ok(list) = nix::ifaddrs::getifaddrs() else {
        return out;
    };
    for ifa in list {
        let Some(addr) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) else {
            continue;
        };
        let prefix = ifa
            .netmask
            .as_ref()
            .and_then(|m| m.as_sockaddr_in())
            .map_or(32, |m| prefix_len(m.ip()));
        // An address with a label (`eth0:1`, ifconfig's aliases) belongs to `eth0`: interface
        // names cannot hold `:` (`dev_valid_name`).
        let name = match ifa.interface_name.split_once(':') {
            Some((n, _)) => n.to_owned(),
            None => ifa.interface_name,
        };
        out.entry(name)
            .or_default()
            .push(format!("{}/{prefix}", addr.ip()));
    }
    out
}

/// Leading one bits of a netmask (`255.255.255.0` → 24).
fn prefix_len(mask: Ipv4Addr) -> u32 {
    u32::from(mask).leading_ones()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_inet6_lines() {
        let m = parse_if_inet6(
            "fe800000000000000000000000000001 02 40 20 80 eth0\n\
             20010db8000000000000000000000042 02 30 00 00 eth0\n\
             20010db80000000000000000000000 02 40 00 00 eth1\n\
             20010db8000000000000000000000042 02 zz 00 00 eth1\n\
             garbage\n",
        );
        assert_eq!(
            m.get("eth0").cloned().unwrap_or_default(),
            ["fe80::1/64", "2001:db8::42/48"]
        );
        assert!(!m.contains_key("eth1"), "short or malformed lines");
    }

    #[test]
    fn netmask_prefixes() {
        assert_eq!(prefix_len(Ipv4Addr::new(255, 255, 255, 0)), 24);
        assert_eq!(prefix_len(Ipv4Addr::new(255, 255, 240, 0)), 20);
        assert_eq!(prefix_len(Ipv4Addr::UNSPECIFIED), 0);
    }

    /// On the running machine, the IPv4 addresses agree with `ip -j -4 addr` (iproute2, reading
    /// netlink); skipped where `ip` is not installed.
    #[test]
    fn live_ipv4_agrees_with_iproute2() {
        let Ok(out) = std::process::Command::new("ip")
            .args(["-j", "-4", "addr"])
            .output()
        else {
            eprintln!("ip(8) is not installed: test skipped");
            return;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            eprintln!("ip(8) gave no JSON: test skipped");
            return;
        };
        let mut want: HashMap<String, Vec<String>> = HashMap::new();
        for link in v.as_array().into_iter().flatten() {
            let name = link["ifname"].as_str().unwrap_or_default().to_owned();
            for a in link["addr_info"].as_array().into_iter().flatten() {
                if let (Some(l), Some(p)) = (a["local"].as_str(), a["prefixlen"].as_u64()) {
                    want.entry(name.clone())
                        .or_default()
                        .push(format!("{l}/{p}"));
                }
            }
        }
        let mut got = read(&HostRoot::default()).ipv4;
        for m in [&mut want, &mut got] {
            m.values_mut().for_each(|v| v.sort());
        }
        assert_eq!(got, want);
        assert!(
            read(&HostRoot::new("/nonexistent-bcd-root"))
                .ipv4
                .is_empty(),
            "IPv4 is read on a live root only"
        );
    }
}
