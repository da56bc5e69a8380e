//! The BMC section's parsers, from bytes laid out as IPMI 2.0 and DSP0270 define them. The
//! ioctl path runs against a real kernel and QEMU's BMC simulator in
//! tests/e2e/tests/topology_vm.rs.

use super::*;
use proptest::prelude::*;

type R = Result<(), Box<dyn std::error::Error>>;

#[test]
fn get_device_id_gives_firmware_as_ipmitool_prints_it() -> R {
    // Device id 0x20, revision 1, firmware 2.34 (device available), IPMI 2.0, support 0xbf,
    // manufacturer 674 (Dell, 0x0002a2 LS byte first), product 0x0100, aux revision.
    let d = [
        0x20, 0x01, 0x02, 0x34, 0x02, 0xbf, 0xa2, 0x02, 0x00, 0x00, 0x01, 1, 2, 3, 4,
    ];
    let id = parse_device_id(&d).ok_or("device id")?;
    assert_eq!(id.firmware, "2.34");
    assert_eq!(id.ipmi_version, "2.0");
    assert_eq!(id.manufacturer_id, Some(674));
    assert_eq!(id.product_id, Some(0x0100));
    // Bit 7 of the major byte is "device busy updating", not part of the version; the minor
    // byte is BCD and printed as two hex digits (1.05, not 1.5); IPMI 1.5 is stored 0x51.
    let busy = parse_device_id(&[0x20, 0x01, 0x81, 0x05, 0x51]).ok_or("short form")?;
    assert_eq!(busy.firmware, "1.05");
    assert_eq!(busy.ipmi_version, "1.5");
    assert_eq!(busy.manufacturer_id, None);
    assert!(parse_device_id(&[0x20, 0x01, 0x02]).is_none());
    Ok(())
}

#[test]
fn lan_parameters_fill_the_channel_and_unset_values_stay_absent() {
    let mut ch = BmcLanChannel {
        channel: 1,
        ..BmcLanChannel::default()
    };
    // Each answer starts with the parameter revision (0x11).
    apply_lan_parameter(&mut ch, 3, &[0x11, 10, 0, 0, 5]);
    apply_lan_parameter(&mut ch, 4, &[0x11, 0x02]);
    apply_lan_parameter(&mut ch, 5, &[0x11, 0x3c, 0xec, 0xef, 0x01, 0x02, 0xab]);
    apply_lan_parameter(&mut ch, 6, &[0x11, 255, 255, 255, 0]);
    apply_lan_parameter(&mut ch, 12, &[0x11, 10, 0, 0, 1]);
    apply_lan_parameter(&mut ch, 20, &[0x11, 0x64, 0x80]);
    assert_eq!(ch.ip_address.as_deref(), Some("10.0.0.5"));
    assert_eq!(ch.ip_source.as_deref(), Some("dhcp"));
    assert_eq!(ch.mac_address.as_deref(), Some("3c:ec:ef:01:02:ab"));
    assert_eq!(ch.subnet_mask.as_deref(), Some("255.255.255.0"));
    assert_eq!(ch.gateway.as_deref(), Some("10.0.0.1"));
    assert_eq!(ch.vlan_id, Some(100));

    let mut unset = BmcLanChannel::default();
    apply_lan_parameter(&mut unset, 3, &[0x11, 0, 0, 0, 0]);
    apply_lan_parameter(&mut unset, 5, &[0x11, 0, 0, 0, 0, 0, 0]);
    apply_lan_parameter(&mut unset, 20, &[0x11, 0x64, 0x00]);
    apply_lan_parameter(&mut unset, 12, &[0x11, 10]);
    apply_lan_parameter(&mut unset, 4, &[]);
    assert_eq!(unset, BmcLanChannel::default());
}

/// A "Redfish over IP" record's data: `service` and `host` IPv4, `port`, `vlan`, `name`.
fn redfish_record(service: [u8; 4], host: [u8; 4], port: u16, vlan: u32, name: &str) -> Vec<u8> {
    let mut d = vec![0u8; 91];
    d[..16].copy_from_slice(&[
        0x78, 0x56, 0x34, 0x12, 0x34, 0x12, 0x78, 0x56, 0x9a, 0xbc, 0xde, 0xf0, 0x12, 0x34, 0x56,
        0x78,
    ]);
    d[16] = 1; // host address: static
    d[17] = 1; // IPv4
    d[18..22].copy_from_slice(&host);
    d[50] = 1; // service address: static
    d[51] = 1; // IPv4
    d[52..56].copy_from_slice(&service);
    d[84..86].copy_from_slice(&port.to_le_bytes());
    d[86..90].copy_from_slice(&vlan.to_le_bytes());
    d[90] = name.len() as u8;
    d.extend_from_slice(name.as_bytes());
    d
}

#[test]
fn a_redfish_over_ip_record_gives_the_service_address() -> R {
    let d = redfish_record(
        [169, 254, 95, 118],
        [169, 254, 95, 120],
        443,
        0,
        "bmc.local",
    );
    let r = parse_redfish_over_ip(&d).ok_or("record")?;
    assert_eq!(r.service_address.as_deref(), Some("169.254.95.118"));
    assert_eq!(r.host_address.as_deref(), Some("169.254.95.120"));
    assert_eq!(r.service_port, Some(443));
    assert_eq!(r.service_vlan_id, None);
    assert_eq!(r.service_hostname.as_deref(), Some("bmc.local"));
    assert_eq!(r.assignment.as_deref(), Some("static"));
    assert_eq!(
        r.service_uuid.as_deref(),
        Some("12345678-1234-5678-9abc-def012345678")
    );
    assert!(parse_redfish_over_ip(&d[..90]).is_none());
    Ok(())
}

/// An SMBIOS 3.2 type 42 structure: a PCI network host interface with one Redfish over IP
/// record, then the end-of-table structure.
fn table_with_type42(record: &[u8]) -> Vec<u8> {
    let specific = [0x03, 0x86, 0x80, 0x34, 0x12, 0, 0, 0, 0]; // PCI device 8086:1234
    let mut s = vec![42, 0, 0x2a, 0x00, HOSTIF_NETWORK, specific.len() as u8];
    s.extend_from_slice(&specific);
    s.push(1); // one protocol record
    s.push(PROTOCOL_REDFISH_OVER_IP);
    s.push(record.len() as u8);
    s.extend_from_slice(record);
    s[1] = s.len() as u8;
    s.extend_from_slice(&[0, 0]);
    s.extend_from_slice(&[127, 4, 0xff, 0xff, 0, 0]);
    s
}

#[test]
fn the_host_interface_is_found_in_an_smbios_table() -> R {
    let record = redfish_record([169, 254, 0, 1], [169, 254, 0, 2], 443, 0, "");
    let table = crate::smbios::from_raw_table(table_with_type42(&record), Some((3, 2)))?;
    let found = redfish_host_interfaces(table.data());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].service_address.as_deref(), Some("169.254.0.1"));
    assert_eq!(found[0].service_hostname, None);
    Ok(())
}

#[test]
fn the_real_tables_have_no_redfish_host_interface() -> R {
    // None of the six machines' tables describes one; the parser must not invent one.
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/smbios");
    let mut seen = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("dmi") {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        let table = crate::smbios::from_dump_bin(&bytes)
            .or_else(|_| crate::smbios::from_raw_table(bytes.clone(), None))?;
        assert!(redfish_host_interfaces(table.data()).is_empty(), "{path:?}");
        seen += 1;
    }
    assert_eq!(seen, 6);
    Ok(())
}

proptest! {
    #[test]
    fn junk_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200), p in any::<u8>()) {
        let _ = parse_device_id(&bytes);
        let _ = parse_redfish_over_ip(&bytes);
        let mut ch = BmcLanChannel::default();
        apply_lan_parameter(&mut ch, p, &bytes);
    }

    #[test]
    fn junk_host_interface_records_never_panic(record in proptest::collection::vec(any::<u8>(), 0..120)) {
        if let Ok(t) = crate::smbios::from_raw_table(table_with_type42(&record), Some((3, 2))) {
            let _ = redfish_host_interfaces(t.data());
        }
    }
}
