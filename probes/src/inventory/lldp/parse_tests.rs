use proptest::prelude::*;

use super::*;

/// A frame Debian's lldpd 1.0.16 sent on a veth (`lldpd -I lt1 -S "bcd test switch"`, system
/// hostname `bcd-lldp-far`, port description `bcd-port-far`, `-m 192.0.2.9`, tx-interval 1),
/// as an `AF_PACKET` socket read it on the peer.
const LLDPD_FRAME: &str = "0180c200000ed2c3d169690488cc020704d2c3d1696904040703d2c3d1696904\
    060200040a0c6263642d6c6c64702d6661720c0f6263642074657374207377697463680e04009c0080100c0501\
    c0000209020000000200080c6263642d706f72742d666172fe0900120f030100000000fe0900120f0100800000\
    360000";

fn lldpd_frame() -> Vec<u8> {
    hex::decode(LLDPD_FRAME).unwrap_or_default()
}

/// One TLV: header (type, 9-bit length) and value.
fn tlv(ty: u8, value: &[u8]) -> Vec<u8> {
    let len = value.len();
    let mut v = vec![
        (ty << 1) | u8::try_from(len >> 8).unwrap_or(1),
        (len & 0xff) as u8,
    ];
    v.extend_from_slice(value);
    v
}

/// An Ethernet frame to the nearest-bridge group with `tlvs` as its LLDPDU.
fn frame(tlvs: &[Vec<u8>]) -> Vec<u8> {
    let mut f = vec![
        0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e, 0x02, 0, 0, 0, 0, 1, 0x88, 0xcc,
    ];
    for t in tlvs {
        f.extend_from_slice(t);
    }
    f
}

#[test]
fn lldpds_frame_gives_what_it_was_told() {
    let n = parse_frame(&lldpd_frame()).unwrap_or_default();
    assert_eq!(
        n,
        LldpNeighbor {
            chassis_id: "d2:c3:d1:69:69:04".into(),
            chassis_id_subtype: "macAddress".into(),
            port_id: "d2:c3:d1:69:69:04".into(),
            port_id_subtype: "macAddress".into(),
            port_description: Some("bcd-port-far".into()),
            system_name: Some("bcd-lldp-far".into()),
            system_description: Some("bcd test switch".into()),
            management_addresses: vec!["192.0.2.9".into()],
            vlan_id: None,
            ttl_seconds: 4,
        }
    );
}

#[test]
fn a_switch_frame_with_names_vlan_ipv6_and_a_tag() {
    let mut mgmt6 = vec![17, 2];
    mgmt6.extend_from_slice(&"2001:db8::4".parse::<Ipv6Addr>().unwrap().octets());
    mgmt6.extend_from_slice(&[2, 0, 0, 0, 7, 0]);
    let tlvs = [
        tlv(1, &[5, 1, 192, 0, 2, 1]),
        tlv(2, b"\x05Ethernet12"),
        tlv(3, &[0, 120]),
        tlv(4, b"to gpu-17 eth0\n"),
        tlv(5, b"leaf-4\0\0"),
        tlv(6, b"SONiC Software Version: SONiC.202305"),
        tlv(7, &[0, 0x14, 0, 0x14]),
        tlv(8, &[5, 1, 10, 0, 0, 4, 2, 0, 0, 0, 1, 0]),
        tlv(8, &mgmt6),
        tlv(8, &[7, 6, 1, 2, 3, 4, 5, 6, 1, 0, 0, 0, 0, 0]),
        tlv(127, &[0x00, 0x12, 0x0f, 1, 3, 0x6c, 0, 0, 0x10]),
        tlv(127, &[0x00, 0x80, 0xc2, 1, 0x00, 0x64]),
        tlv(0, &[]),
        tlv(5, b"after the end"),
    ];
    let mut f = frame(&tlvs);
    // The same frame with its 802.1Q tag kept (VLAN 100).
    let mut tagged = f[..12].to_vec();
    tagged.extend_from_slice(&[0x81, 0x00, 0x00, 0x64]);
    tagged.extend_from_slice(&f[12..]);
    for f in [&mut f, &mut tagged] {
        let n = parse_frame(f).unwrap();
        assert_eq!(n.chassis_id, "192.0.2.1");
        assert_eq!(n.chassis_id_subtype, "networkAddress");
        assert_eq!(n.port_id, "Ethernet12");
        assert_eq!(n.port_id_subtype, "interfaceName");
        assert_eq!(n.ttl_seconds, 120);
        assert_eq!(n.port_description.as_deref(), Some("to gpu-17 eth0"));
        assert_eq!(
            n.system_name.as_deref(),
            Some("leaf-4"),
            "NULs and after End ignored"
        );
        assert_eq!(
            n.system_description.as_deref(),
            Some("SONiC Software Version: SONiC.202305")
        );
        assert_eq!(n.management_addresses, ["10.0.0.4", "2001:db8::4"]);
        assert_eq!(n.vlan_id, Some(100));
    }
}

#[test]
fn other_subtypes_are_text_or_hex() {
    let n = parse_frame(&frame(&[
        tlv(1, b"\x07chassis-7"),
        tlv(2, &[7, 0xff, 0x00, 0x01]),
        tlv(3, &[0, 0]),
    ]))
    .unwrap();
    assert_eq!(
        (n.chassis_id.as_str(), n.chassis_id_subtype.as_str()),
        ("chassis-7", "local")
    );
    assert_eq!(
        (n.port_id.as_str(), n.port_id_subtype.as_str()),
        ("ff0001", "local")
    );
    assert_eq!(n.ttl_seconds, 0, "a shutdown LLDPDU");
    // A MAC subtype of the wrong length, an unassigned subtype, a bad network address.
    let n = parse_frame(&frame(&[
        tlv(1, &[4, 1, 2, 3]),
        tlv(2, &[42, b'x']),
        tlv(3, &[0, 9]),
    ]))
    .unwrap();
    assert_eq!(n.chassis_id, "010203");
    assert_eq!(n.port_id_subtype, "reserved-42");
    let n = parse_frame(&frame(&[
        tlv(1, &[5, 1, 10]),
        tlv(2, &[4, 9, 1, 2]),
        tlv(3, &[0, 9]),
    ]))
    .unwrap();
    assert_eq!(
        (n.chassis_id.as_str(), n.port_id.as_str()),
        ("010a", "090102")
    );
    // VLAN 0 is no VLAN; a short PVID TLV is ignored.
    let n = parse_frame(&frame(&[
        tlv(1, &[7, b'c']),
        tlv(2, &[7, b'p']),
        tlv(3, &[0, 9]),
        tlv(127, &[0x00, 0x80, 0xc2, 1, 0, 0]),
        tlv(127, &[0x00, 0x80, 0xc2, 1, 5]),
    ]))
    .unwrap();
    assert_eq!(n.vlan_id, None);
}

#[test]
fn what_is_not_an_lldpdu_says_why() {
    assert_eq!(
        parse_frame(&[0; 5]),
        Err(LldpParseError::ShortFrame { len: 5 })
    );
    let mut ip = lldpd_frame();
    ip[12..14].copy_from_slice(&[0x08, 0x00]);
    assert_eq!(
        parse_frame(&ip),
        Err(LldpParseError::NotLldp { ethertype: 0x0800 })
    );
    assert_eq!(
        parse_frame(&frame(&[tlv(2, &[7, b'p']), tlv(3, &[0, 9])])),
        Err(LldpParseError::Missing("Chassis ID"))
    );
    assert_eq!(
        parse_frame(&frame(&[tlv(1, &[7, b'c']), tlv(3, &[0, 9])])),
        Err(LldpParseError::Missing("Port ID"))
    );
    assert_eq!(
        parse_frame(&frame(&[
            tlv(1, &[7, b'c']),
            tlv(2, &[7, b'p']),
            tlv(3, &[9])
        ])),
        Err(LldpParseError::Missing("Time To Live"))
    );
    assert_eq!(
        parse_frame(&frame(&[tlv(1, &[7])])),
        Err(LldpParseError::Missing("Chassis ID")),
        "a chassis id with no bytes after its subtype"
    );
    let mut long = frame(&[tlv(1, &[7, b'c'])]);
    long.extend_from_slice(&[0x04, 0x20, 7]);
    assert_eq!(
        parse_frame(&long),
        Err(LldpParseError::Truncated {
            tlv_type: 2,
            offset: 4,
            claimed: 32,
            left: 1
        })
    );
}

#[test]
fn every_truncation_of_a_real_frame_is_an_error_or_a_subset() {
    let f = lldpd_frame();
    let full = parse_frame(&f).unwrap();
    for cut in 0..f.len() {
        match parse_frame(&f[..cut]) {
            // Cut exactly between TLVs after the mandatory three: what was read is right.
            Ok(n) => {
                assert_eq!(
                    (n.chassis_id.as_str(), n.ttl_seconds),
                    ("d2:c3:d1:69:69:04", 4)
                );
                assert!(n.system_name.is_none() || n.system_name == full.system_name);
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
        let _ = parse_frame(&bytes);
        let _ = parse_lldpdu(&bytes);
    }

    #[test]
    fn a_real_header_with_random_tlvs_never_panics(
        tail in proptest::collection::vec(any::<u8>(), 0..600)
    ) {
        let mut f = lldpd_frame()[..14].to_vec();
        f.extend_from_slice(&tail);
        let _ = parse_frame(&f);
    }

    #[test]
    fn a_real_frame_truncated_or_flipped_never_panics(
        cut in 0usize..200,
        flip in 0usize..200,
        bit in 0u8..8,
    ) {
        let mut f = lldpd_frame();
        if let Some(b) = f.get_mut(flip) {
            *b ^= 1 << bit;
        }
        f.truncate(cut);
        let _ = parse_frame(&f);
    }
}
