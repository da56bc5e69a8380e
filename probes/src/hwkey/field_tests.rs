//! Issue 18, items 1 and 4: the field inputs (`../shared/fixtures/field/`, read in place) and
//! inputs of the same kinds built here: UUIDs many machines share, and blades that list several
//! baseboards.

use std::path::Path;

use super::*;

const FIELD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/field");

/// The field file's report, or `None` (loudly; a failure under `CI=true`) when it is missing.
fn field_report(rel: &str) -> Option<HardwareKeyReport> {
    let p = Path::new(FIELD).join(rel);
    if !p.exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "fixture {} is missing",
            p.display()
        );
        eprintln!("!!! FIXTURE MISSING: {} — test skipped", p.display());
        return None;
    }
    let t = crate::smbios::load_file(&p, None);
    assert!(t.is_ok(), "{rel}: {:?}", t.err());
    t.ok().map(|t| report_from_table(&t, rel))
}

fn uuid_candidate(r: &HardwareKeyReport) -> Option<&Candidate> {
    r.candidates.iter().find(|c| c.kind == Kind::SystemUuid)
}

fn uuid_rejection(r: &HardwareKeyReport) -> Option<String> {
    uuid_candidate(r).and_then(|c| c.rejection.as_ref().map(ToString::to_string))
}

/// One SMBIOS structure: header, formatted area, strings (or the empty string set).
pub(crate) fn structure(kind: u8, handle: u16, formatted: &[u8], strings: &[&str]) -> Vec<u8> {
    let mut s = vec![kind, u8::try_from(4 + formatted.len()).unwrap_or(0)];
    s.extend_from_slice(&handle.to_le_bytes());
    s.extend_from_slice(formatted);
    for t in strings {
        s.extend_from_slice(t.as_bytes());
        s.push(0);
    }
    if strings.is_empty() {
        s.push(0);
    }
    s.push(0);
    s
}

/// The 16 bytes an SMBIOS 2.6+ table stores for the rendered UUID (first three fields
/// little-endian).
pub(crate) fn stored(rendered: &str) -> [u8; 16] {
    let hex: String = rendered.chars().filter(|c| *c != '-').collect();
    let mut b = [0u8; 16];
    for (i, x) in b.iter_mut().enumerate() {
        *x = u8::from_str_radix(hex.get(i * 2..i * 2 + 2).unwrap_or("zz"), 16).unwrap_or(0);
    }
    b[0..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    b
}

/// Type 1 with `uuid` (rendered) and `serial`, then `boards` (type 2: feature flags, board
/// type, serial), then end of table: a raw SMBIOS 3.0 table.
pub(crate) fn table(uuid: &str, serial: &str, boards: &[(u8, u8, &str)]) -> Vec<u8> {
    let mut f = vec![1, 2, 0, 3];
    f.extend_from_slice(&stored(uuid));
    f.extend_from_slice(&[6, 0, 0]);
    let mut t = structure(1, 0x0100, &f, &["Made Up", "MU-1", serial]);
    for (i, (flags, kind, serial)) in boards.iter().enumerate() {
        let f = [1, 2, 0, 3, 0, *flags, 0, 0, 3, *kind, 0];
        let handle = 0x0200 + u16::try_from(i).unwrap_or(0);
        t.extend(structure(2, handle, &f, &["Made Up", "Board", serial]));
    }
    t.extend(structure(127, 0x7f00, &[], &[]));
    t
}

fn table_report(bytes: Vec<u8>) -> HardwareKeyReport {
    match crate::smbios::from_raw_table(bytes, Some((3, 0))) {
        Ok(t) => report_from_table(&t, "synthetic"),
        Err(e) => panic!("synthetic table: {e}"),
    }
}

/// UUIDs that many machines share, each with the words its rejection must carry.
const SHARED: &[(&str, &str)] = &[
    // FreeBSD's hostid deny list.
    ("07090201-0103-0301-0807-060504030201", "FreeBSD"),
    ("11111111-2222-3333-4444-555555555555", "FreeBSD"),
    ("890e2d14-cacd-45d1-ae66-bc80e8bfeb0f", "FreeBSD"),
    ("8E275844-178F-44A8-ACEB-A7D7E5178C63", "FreeBSD"),
    ("dc698397-fa54-4cf2-82c8-b1b5307a6a7f", "FreeBSD"),
    // The same, read in the other byte order (a pre-2.6 reading of the table).
    ("978369dc-54fa-f24c-82c8-b1b5307a6a7f", "other byte order"),
    // *-ffff-ffff-ffff-ffffffffffff.
    (
        "3a7c91d2-ffff-ffff-ffff-ffffffffffff",
        "ffff-ffff-ffff-ffffffffffff",
    ),
    // One byte repeated.
    ("fefefefe-fefe-fefe-fefe-fefefefefefe", "one byte repeated"),
    ("11111111-1111-1111-1111-111111111111", "one byte repeated"),
    ("a5a5a5a5-a5a5-a5a5-a5a5-a5a5a5a5a5a5", "one byte repeated"),
    // Dell's layout with the tag bytes zero, spaces, or a mix; and read the other way round.
    ("4c4c4544-0000-0010-8000-80c04f000000", "Dell"),
    ("4c4c4544-0020-2010-8020-a0c04f202020", "Dell"),
    ("4c4c4544-0000-2010-8000-80c04f200000", "Dell"),
    ("44454c4c-0000-1020-8020-80c04f202020", "other byte order"),
    ("44454c4c-0020-1020-8020-a0c04f202020", "Dell"),
    // Dell's layout with a junk tag.
    ("4c4c4544-0030-3010-8030-b0c04f303030", "Dell"),
];

#[test]
fn dell_blank_tag_uuid_is_rejected_with_its_reason() {
    let Some(r) = field_report("uuid-placeholders/dell-blank-tag.bin") else {
        return;
    };
    assert_eq!(
        uuid_candidate(&r).and_then(|c| c.raw.as_deref()),
        Some("4c4c4544-0000-2010-8020-80c04f202020")
    );
    let why = uuid_rejection(&r).unwrap_or_default();
    assert!(why.contains("shared by many machines"), "{why}");
    assert!(!r.lines.iter().any(|l| l.starts_with("system-uuid")));
    assert!(!r.trusted, "{:?}", r.lines);
}

#[test]
fn a_uuid_of_one_repeated_byte_is_rejected() {
    let Some(r) = field_report("uuid-placeholders/x-repeated-5858.bin") else {
        return;
    };
    assert_eq!(
        uuid_candidate(&r).and_then(|c| c.raw.as_deref()),
        Some("58585858-5858-5858-5858-585858585858")
    );
    let why = uuid_rejection(&r).unwrap_or_default();
    assert!(why.contains("one byte repeated (0x58)"), "{why}");
    assert!(!r.trusted, "{:?}", r.lines);
}

#[test]
fn a_dell_replacement_board_has_one_identifier_and_is_untrusted() {
    let Some(r) = field_report("uuid-placeholders/dell-replacement-board.bin") else {
        return;
    };
    assert!(uuid_rejection(&r).is_some_and(|w| w.contains("Dell")));
    assert_eq!(r.lines, ["baseboard-serial:cnfcp0022b0045"]);
    assert!(!r.trusted);
    // The blank system and chassis serials (seven spaces) are no value at all.
    for k in [Kind::SystemSerial, Kind::ChassisSerial] {
        assert!(
            !r.candidates.iter().any(|c| c.kind == k && c.kept()),
            "{k:?}"
        );
    }
}

#[test]
fn every_shared_uuid_is_rejected_from_a_table_and_from_dmi_id() -> std::io::Result<()> {
    for (uuid, why) in SHARED {
        // In a table, beside a real system serial: one identifier, so untrusted.
        let r = table_report(table(uuid, "MUS4417-22Q", &[]));
        let got = uuid_rejection(&r).unwrap_or_default();
        assert!(got.contains(why), "{uuid}: {got:?}");
        assert_eq!(r.lines, ["system-serial:mus4417-22q"], "{uuid}");
        assert!(!r.trusted, "{uuid}");
        // Through the kernel's copy when the table cannot be read.
        let dir = tempfile::tempdir()?;
        let root = HostRoot::new(dir.path());
        std::fs::create_dir_all(root.path("/sys/class/dmi/id"))?;
        std::fs::write(
            root.path("/sys/class/dmi/id/product_uuid"),
            format!("{uuid}\n"),
        )?;
        std::fs::write(
            root.path("/sys/class/dmi/id/product_serial"),
            "MUS4417-22Q\n",
        )?;
        let r = report(&root);
        assert_eq!(r.identity_source, "/sys/class/dmi/id");
        let got = uuid_rejection(&r).unwrap_or_default();
        assert!(got.contains(why), "dmi-id {uuid}: {got:?}");
        assert!(!r.trusted, "dmi-id {uuid}");
    }
    Ok(())
}

#[test]
fn dell_uuids_with_a_programmed_tag_are_kept() {
    // The R630 fixture's UUID (tag 790H8D2) and the blade's (tag 7XQ2J93).
    for (uuid, serial) in [
        ("4c4c4544-0039-3010-8048-b7c04f384432", "790H8D2"),
        ("4c4c4544-0058-5110-8032-b7c04f4a3933", "7XQ2J93"),
    ] {
        let r = table_report(table(uuid, serial, &[]));
        assert_eq!(uuid_rejection(&r), None, "{uuid}");
        assert!(r.trusted, "{uuid}");
    }
}

/// Feature flags of a hosting board (bit 0) that is also replaceable (bit 3).
const HOSTING: u8 = 0x09;
/// Board types (DSP0134 table 15).
const MOTHERBOARD: u8 = 0x0a;
const INTERCONNECT: u8 = 0x0d;
const IO_MODULE: u8 = 0x07;

#[test]
fn both_orders_of_a_blades_boards_give_one_key() {
    let (Some(a), Some(b)) = (
        field_report("duplicate-boards/as-reported.bin"),
        field_report("duplicate-boards/reversed.bin"),
    ) else {
        return;
    };
    assert!(
        a.lines
            .contains(&"baseboard-serial:7xq2j93.cnfcw0089a00g6".to_owned()),
        "{:?}",
        a.lines
    );
    assert_eq!(b.lines, a.lines);
    assert_eq!(b.hardware_key, a.hardware_key);
    assert!(a.trusted && b.trusted);
}

#[test]
fn the_hosting_board_is_chosen_wherever_it_is_listed() {
    let uuid = "4c4c4544-0058-5110-8032-b7c04f4a3933";
    let hosting = (HOSTING, MOTHERBOARD, ".7XQ2J93.CNFCW0089A00G6.");
    let others = [
        (0x0c, INTERCONNECT, "CNFCW0089B01X3"),
        (0x04, IO_MODULE, "IOM0042X77"),
    ];
    let orders: [Vec<(u8, u8, &str)>; 3] = [
        vec![hosting, others[0], others[1]],
        vec![others[0], hosting, others[1]],
        vec![others[1], others[0], hosting],
    ];
    let keys: Vec<String> = orders
        .iter()
        .map(|boards| {
            let r = table_report(table(uuid, "7XQ2J93", boards));
            assert!(
                r.lines
                    .contains(&"baseboard-serial:7xq2j93.cnfcw0089a00g6".to_owned()),
                "{:?}",
                r.lines
            );
            r.hardware_key
        })
        .collect();
    assert!(keys.iter().all(|k| *k == keys[0]));
    // No board says "hosting": the first is read, as before.
    let r = table_report(table(uuid, "7XQ2J93", &[others[1], others[0]]));
    assert!(
        r.lines.contains(&"baseboard-serial:iom0042x77".to_owned()),
        "{:?}",
        r.lines
    );
}

#[test]
fn the_inventory_reads_the_hosting_board_too() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let root = HostRoot::new(dir.path());
    let t = table(
        "4c4c4544-0058-5110-8032-b7c04f4a3933",
        "7XQ2J93",
        &[
            (0x0c, INTERCONNECT, "CNFCW0089B01X3"),
            (HOSTING, MOTHERBOARD, ".7XQ2J93.CNFCW0089A00G6."),
        ],
    );
    let mut ep = vec![0u8; 0x18];
    ep[..5].copy_from_slice(b"_SM3_");
    ep[6] = 0x18;
    ep[7] = 3;
    ep[0x0C..0x10].copy_from_slice(&u32::try_from(t.len()).unwrap_or(0).to_le_bytes());
    std::fs::create_dir_all(root.path("/sys/firmware/dmi/tables"))?;
    std::fs::write(root.path(crate::smbios::SYS_ENTRY_POINT), &ep)?;
    std::fs::write(root.path(crate::smbios::SYS_TABLE), &t)?;
    let mut notes = Vec::new();
    let system = crate::inventory::system::collect(&root, &mut notes).system;
    assert_eq!(
        system.and_then(|s| s.board_serial).as_deref(),
        Some(".7XQ2J93.CNFCW0089A00G6.")
    );
    Ok(())
}
