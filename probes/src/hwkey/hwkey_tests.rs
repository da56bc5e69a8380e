//! Expected results on the real fixtures (../shared/fixtures), written down one by one.

use std::path::{Path, PathBuf};

use bc_protocol::inventory::Nic;

use super::*;
use crate::inventory::nics::PermSource;

const SMBIOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/smbios");
const NODE_EXPORTER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/fixtures/hosts/node-exporter"
);

/// The fixture path, or `None` (with a loud message) when the shared fixtures are missing;
/// under `CI=true` a missing fixture fails the test.
fn fixture(p: PathBuf) -> Option<PathBuf> {
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "fixture {} is missing",
        p.display()
    );
    eprintln!("!!! FIXTURE MISSING: {} — test skipped", p.display());
    None
}

fn table_report(name: &str) -> Option<HardwareKeyReport> {
    let p = fixture(Path::new(SMBIOS).join(format!("{name}.dmi")))?;
    let t = crate::smbios::load_file(&p, None).ok();
    assert!(t.is_some(), "{name} did not load");
    t.map(|t| report_from_table(&t, name))
}

fn key_of(lines: &[&str]) -> String {
    let mut h = Sha256::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())
}

fn rejection(r: &HardwareKeyReport, kind: Kind) -> Option<Rejection> {
    r.candidates
        .iter()
        .find(|c| c.kind == kind && c.source.starts_with("smbios") | c.source.starts_with("dmi"))
        .and_then(|c| c.rejection.clone())
}

fn check(r: &HardwareKeyReport, lines: &[&str], trusted: bool) {
    assert_eq!(r.lines, lines);
    assert_eq!(r.trusted, trusted);
    assert_eq!(r.hardware_key, key_of(lines));
    let id = r.identity();
    let mut digests: Vec<String> = lines.iter().map(|l| normalize::digest(l)).collect();
    digests.sort();
    assert_eq!(id.identifier_digests, digests);
    assert_eq!(id.hardware_key, r.hardware_key);
    assert_eq!(id.trusted, trusted);
}

#[test]
fn supermicro_quad_opteron_serials_are_all_junk() {
    let Some(r) = table_report("SuperMicro-Quad-Opteron") else {
        return;
    };
    for k in [
        Kind::SystemSerial,
        Kind::BaseboardSerial,
        Kind::ChassisSerial,
    ] {
        assert_eq!(rejection(&r, k), Some(Rejection::SequentialDigits), "{k:?}");
    }
    let chassis = r.candidates.iter().find(|c| c.kind == Kind::ChassisSerial);
    assert_eq!(chassis.and_then(|c| c.raw.as_deref()), Some("1234567890."));
    check(
        &r,
        &["system-uuid:47513848-0036-3000-48fe-003048fec30c"],
        false,
    );
}

#[test]
fn beelink_placeholders_leave_only_the_system_serial() {
    let Some(r) = table_report("Beelink-EQ12") else {
        return;
    };
    assert_eq!(
        rejection(&r, Kind::SystemUuid),
        Some(Rejection::PlaceholderUuid)
    );
    let uuid = r.candidates.iter().find(|c| c.kind == Kind::SystemUuid);
    assert_eq!(
        uuid.and_then(|c| c.raw.as_deref()),
        Some("03000200-0400-0500-0006-000700080009")
    );
    for k in [Kind::BaseboardSerial, Kind::ChassisSerial] {
        assert_eq!(
            rejection(&r, k),
            Some(Rejection::Placeholder("default string".into()))
        );
    }
    check(&r, &["system-serial:bn1004gh10075"], false);
    assert!(r.identity_source.starts_with("smbios 3.5"));
}

#[test]
fn dell_r630_chassis_serial_equals_system_serial() {
    let Some(r) = table_report("Dell-PowerEdge-R630-Dual-Xeon") else {
        return;
    };
    assert!(matches!(
        rejection(&r, Kind::ChassisSerial),
        Some(Rejection::DuplicateOf(d)) if d.starts_with("system-serial")
    ));
    check(
        &r,
        &[
            "baseboard-serial:790h8d2.cn7475162m0382",
            "system-serial:790h8d2",
            "system-uuid:4c4c4544-0039-3010-8048-b7c04f384432",
        ],
        true,
    );
}

#[test]
fn hyperv_three_equal_serials_count_once_and_the_uuid_is_real() {
    let Some(r) = table_report("HyperV") else {
        return;
    };
    for k in [Kind::BaseboardSerial, Kind::ChassisSerial] {
        assert!(
            matches!(rejection(&r, k), Some(Rejection::DuplicateOf(_))),
            "{k:?}"
        );
    }
    check(
        &r,
        &[
            "system-serial:1519-7810-4472-8775-7272-8851-12",
            "system-uuid:b26849ef-4fb0-4e03-a9d1-1a165a40c8d7",
        ],
        true,
    );
}

#[test]
fn supermicro_dual_xeon_uuid_counts_as_its_mac() {
    let Some(r) = table_report("SuperMicro-Dual-Xeon") else {
        return;
    };
    check(
        &r,
        &[
            "baseboard-serial:vm145s005223",
            "chassis-serial:c1130lc49mh0061",
            "mac:00:25:90:eb:96:28",
            "system-serial:e09626824801435",
        ],
        true,
    );
}

#[test]
fn asrock_rack_oem_placeholders_and_mac_uuid() {
    let Some(r) = table_report("ASRock-Single-Ryzen") else {
        return;
    };
    for k in [Kind::SystemSerial, Kind::ChassisSerial] {
        assert_eq!(
            rejection(&r, k),
            Some(Rejection::Placeholder("to be filled by o.e.m".into()))
        );
    }
    check(
        &r,
        &["baseboard-serial:209624590000277", "mac:d0:50:99:fa:a8:35"],
        true,
    );
}

fn nic(
    name: &str,
    mac: &str,
    perm: Option<PermSource>,
    physical: bool,
    driver: Option<&str>,
) -> NicProbe {
    NicProbe {
        nic: Nic {
            name: name.into(),
            mac: Some(mac.into()),
            permanent_mac: perm.map(|_| mac.to_owned()),
            physical,
            driver: driver.map(str::to_owned),
            ..Nic::default()
        },
        perm_source: perm,
        addr_assign_type: Some(if perm.is_some() { 0 } else { 3 }),
    }
}

#[test]
fn a_zero_padded_uuid_and_the_nic_with_that_mac_are_one_identifier() {
    let ids = DmiIds {
        system_uuid: Read::Value("00000000-0000-0000-0000-002590EB9628".into()),
        system_serial: Read::Value("E09626824801435".into()),
        ..DmiIds::default()
    };
    let nics = [nic(
        "eno1",
        "00:25:90:eb:96:28",
        Some(PermSource::Address),
        true,
        Some("igb"),
    )];
    let r = evaluate("smbios 3.0", &ids, &nics, vec![]);
    check(
        &r,
        &["mac:00:25:90:eb:96:28", "system-serial:e09626824801435"],
        true,
    );
    assert!(matches!(
        r.candidates.last().and_then(|c| c.rejection.clone()),
        Some(Rejection::DuplicateOf(_))
    ));
}

#[test]
fn nic_rules() {
    let nics = [
        nic(
            "eno1",
            "0c:c4:7a:00:00:01",
            Some(PermSource::Address),
            true,
            Some("ixgbe"),
        ),
        nic(
            "eno2",
            "0c:c4:7a:00:00:02",
            Some(PermSource::BondingSlave),
            true,
            Some("ixgbe"),
        ),
        nic(
            "usb0",
            "00:25:90:aa:bb:cc",
            Some(PermSource::Address),
            true,
            Some("cdc_ether"),
        ),
        nic(
            "enx",
            "02:00:00:00:00:02",
            Some(PermSource::Address),
            true,
            Some("r8152"),
        ),
        nic(
            "br0",
            "0c:c4:7a:00:00:01",
            Some(PermSource::Address),
            false,
            None,
        ),
        nic("eth9", "0c:c4:7a:00:00:09", None, true, Some("e1000e")),
        nic(
            "eth8",
            "00:00:00:00:00:00",
            Some(PermSource::Address),
            true,
            Some("e1000e"),
        ),
    ];
    let r = evaluate("none", &DmiIds::default(), &nics, vec![]);
    check(
        &r,
        &["mac:0c:c4:7a:00:00:01", "mac:0c:c4:7a:00:00:02"],
        true,
    );
    let why: Vec<Option<Rejection>> = r.candidates.iter().map(|c| c.rejection.clone()).collect();
    assert_eq!(
        why,
        vec![
            None,
            None,
            Some(Rejection::BmcUsbNic("cdc_ether".into())),
            Some(Rejection::SharedMac),
            Some(Rejection::VirtualInterface),
            Some(Rejection::NotPermanent("addr_assign_type 3".into())),
            Some(Rejection::ZeroMac),
        ]
    );
}

#[test]
fn node_exporter_tree_dmi_ids_give_a_trusted_key_and_its_macs_are_rejected() {
    let Some(root) = fixture(PathBuf::from(NODE_EXPORTER)) else {
        return;
    };
    let r = report(&HostRoot::new(root));
    assert_eq!(r.identity_source, "/sys/class/dmi/id");
    check(
        &r,
        &[
            "baseboard-serial:7n62ai2.grtcl6944100gp",
            "system-serial:7n62ai2",
            "system-uuid:83340ca8-cb49-4474-8c29-d2088ca84dd9",
        ],
        true,
    );
    let eth0 = r
        .candidates
        .iter()
        .find(|c| c.source.starts_with("nic eth0"));
    assert_eq!(
        eth0.and_then(|c| c.raw.as_deref()),
        Some("01:01:01:01:01:01")
    );
    assert_eq!(
        eth0.and_then(|c| c.rejection.clone()),
        Some(Rejection::MulticastMac)
    );
    for bond in ["bond0", "dmz", "int"] {
        let c = r
            .candidates
            .iter()
            .find(|c| c.source.starts_with(&format!("nic {bond} ")));
        assert_eq!(
            c.and_then(|c| c.rejection.clone()),
            Some(Rejection::VirtualInterface),
            "{bond}"
        );
    }
}

#[test]
fn a_machine_without_smbios_or_nics_is_untrusted_and_says_so() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let r = report(&HostRoot::new(dir.path()));
    assert_eq!(r.identity_source, "none");
    assert!(r.hardware_key.is_empty());
    assert!(!r.trusted);
    assert!(r.notes.iter().any(|n| n.contains("no SMBIOS")));
    let id = compute(&HostRoot::new(dir.path()));
    assert!(id.hardware_key.is_empty() && !id.trusted && id.identifier_digests.is_empty());
    Ok(())
}

#[test]
fn bond_members_use_perm_hwaddr_and_sysfs_tables_are_read() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = HostRoot::new(dir.path());
    for (name, perm) in [("eno1", "0c:c4:7a:11:22:33"), ("eno2", "0c:c4:7a:11:22:34")] {
        let base = root.path(format!(
            "/sys/devices/pci0000:00/0000:01:00.{}/net/{name}",
            &name[3..]
        ));
        std::fs::create_dir_all(base.join("bonding_slave"))?;
        std::fs::write(base.join("address"), "0c:c4:7a:11:22:33\n")?;
        std::fs::write(base.join("addr_assign_type"), "3\n")?;
        std::fs::write(base.join("bonding_slave/perm_hwaddr"), format!("{perm}\n"))?;
        std::fs::create_dir_all(root.path("/sys/class/net"))?;
        std::os::unix::fs::symlink(&base, root.path(format!("/sys/class/net/{name}")))?;
        std::os::unix::fs::symlink(base.join("../.."), base.join("device"))?;
    }
    // A real dump-bin image split the way the kernel exports it: entry point and table.
    if let Some(p) = fixture(Path::new(SMBIOS).join("Beelink-EQ12.dmi")) {
        let bytes = std::fs::read(p)?;
        std::fs::create_dir_all(root.path("/sys/firmware/dmi/tables"))?;
        std::fs::write(root.path(crate::smbios::SYS_ENTRY_POINT), &bytes[..0x18])?;
        std::fs::write(root.path(crate::smbios::SYS_TABLE), &bytes[0x20..])?;
    }
    let r = report(&root);
    let mut want = vec!["mac:0c:c4:7a:11:22:33", "mac:0c:c4:7a:11:22:34"];
    if root.exists(crate::smbios::SYS_TABLE) {
        want.push("system-serial:bn1004gh10075");
        assert!(
            r.identity_source.starts_with("smbios 3.5"),
            "{}",
            r.identity_source
        );
    }
    check(&r, &want, true);
    Ok(())
}

#[test]
fn the_report_hides_serials_unless_asked() {
    let Some(r) = table_report("HyperV") else {
        return;
    };
    let hidden = render_table(&r, false);
    assert!(!hidden.contains("1519-7810"));
    assert!(hidden.contains("hardwareKeyTrusted: true"));
    let shown = render_table(&r, true);
    assert!(shown.contains("1519-7810-4472-8775-7272-8851-12"));
    let j = render_json(&r, false);
    assert_eq!(j["hardwareKeyTrusted"], true);
    assert_eq!(j["hardwareKey"], r.hardware_key);
    assert!(!j.to_string().contains("1519-7810"));
    assert_eq!(j["candidates"].as_array().map(Vec::len), Some(4));
    assert!(render_json(&r, true).to_string().contains("1519-7810"));
}

fn args(smbios: Option<PathBuf>, version: Option<&str>, output: &str) -> HardwareKeyArgs {
    HardwareKeyArgs {
        root: PathBuf::from("/nonexistent-bcd-root"),
        smbios,
        smbios_version: version.map(str::to_owned),
        output: output.into(),
        show_values: false,
    }
}

#[test]
fn the_command_reads_dump_bin_and_raw_files() {
    let Some(beelink) = fixture(Path::new(SMBIOS).join("Beelink-EQ12.dmi")) else {
        return;
    };
    let out = run(&args(Some(beelink), None, "json")).unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(j["hardwareKeyTrusted"], false);
    assert_eq!(j["hardwareKey"], key_of(&["system-serial:bn1004gh10075"]));
    assert!(
        j["identitySource"]
            .as_str()
            .is_some_and(|s| s.starts_with("smbios 3.5"))
    );
    let Some(hyperv) = fixture(Path::new(SMBIOS).join("HyperV.dmi")) else {
        return;
    };
    // Read as SMBIOS 2.4, the UUID's first three fields are taken as stored.
    let out = run(&args(Some(hyperv.clone()), Some("2.4"), "json")).unwrap_or_default();
    let j: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(
        j["hardwareKey"],
        key_of(&[
            "system-serial:1519-7810-4472-8775-7272-8851-12",
            "system-uuid:ef4968b2-b04f-034e-a9d1-1a165a40c8d7",
        ])
    );
    assert!(run(&args(Some(hyperv), Some("three"), "json")).is_err());
    assert!(
        run(&args(
            Some(PathBuf::from("/nonexistent.dmi")),
            None,
            "table"
        ))
        .is_err()
    );
    let table = run(&args(None, None, "table")).unwrap_or_default();
    assert!(table.contains("hardwareKeyTrusted: false"));
    assert!(table.contains("no SMBIOS"));
}
