//! Loading the real tables of ../shared/fixtures/smbios, the UUID rule, and a property test that
//! random and mutated tables give an error or a partial result, never a panic.

use proptest::prelude::*;

use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/smbios");
const NAMES: [&str; 6] = [
    "ASRock-Single-Ryzen",
    "Beelink-EQ12",
    "Dell-PowerEdge-R630-Dual-Xeon",
    "HyperV",
    "SuperMicro-Dual-Xeon",
    "SuperMicro-Quad-Opteron",
];

fn fixture_bytes(name: &str) -> Option<Vec<u8>> {
    let p = Path::new(FIXTURES).join(format!("{name}.dmi"));
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "fixture {} unreadable: {e}",
                p.display()
            );
            eprintln!("!!! FIXTURE MISSING: {} ({e}) — test skipped", p.display());
            None
        }
    }
}

#[test]
fn every_fixture_loads_with_its_version() {
    for name in NAMES {
        let Some(bytes) = fixture_bytes(name) else {
            return;
        };
        let t = load_file(&Path::new(FIXTURES).join(format!("{name}.dmi")), None);
        let t = match t {
            Ok(t) => t,
            Err(e) => panic!("{name}: {e}"),
        };
        if name == "Beelink-EQ12" {
            // dump-bin: the _SM3_ entry point at 0 says 3.5, the table is at 0x20.
            assert!(entry::has_anchor(&bytes));
            assert_eq!((t.version, t.version_assumed), ((3, 5), false));
        } else {
            assert_eq!(
                (t.version, t.version_assumed),
                (DEFAULT_RAW_VERSION, true),
                "{name}"
            );
        }
        assert!(t.facts().system_uuid_raw.is_some(), "{name}");
    }
}

#[test]
fn dell_r630_facts() {
    let Some(bytes) = fixture_bytes("Dell-PowerEdge-R630-Dual-Xeon") else {
        return;
    };
    let f = match from_raw_table(bytes, Some((3, 0))) {
        Ok(t) => t.facts(),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(f.system_vendor.as_deref(), Some("Dell Inc."));
    assert_eq!(f.system_product.as_deref(), Some("PowerEdge R630"));
    assert_eq!(f.bios_version.as_deref(), Some("2.3.4"));
    assert_eq!(f.bios_date.as_deref(), Some("11/08/2016"));
    assert_eq!(f.board_product.as_deref(), Some("02C2CP"));
    assert_eq!(f.chassis_type, Some(23));
    assert_eq!(
        f.system_uuid().as_deref(),
        Some("4c4c4544-0039-3010-8048-b7c04f384432")
    );
    assert_eq!(f.dimms.len(), 2);
    let d = &f.dimms[0];
    assert_eq!(d.locator.as_deref(), Some("A3"));
    assert_eq!(d.size_bytes, Some(16 << 30));
    assert_eq!(d.memory_type.as_deref(), Some("DDR4"));
    assert_eq!(d.speed_mts, Some(2400));
    assert_eq!(d.serial.as_deref(), Some("12BDC045"));
}

#[test]
fn populated_dimms_are_counted() {
    for (name, n) in [
        ("SuperMicro-Dual-Xeon", 16),
        ("SuperMicro-Quad-Opteron", 32),
        ("HyperV", 0),
    ] {
        let Some(bytes) = fixture_bytes(name) else {
            return;
        };
        let f = from_raw_table(bytes, None).map(|t| t.facts());
        assert_eq!(f.map(|f| f.dimms.len()).ok(), Some(n), "{name}");
    }
}

#[test]
fn uuid_byte_order_follows_the_version() {
    let raw = [0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0, 9];
    assert_eq!(
        render_uuid(&raw, (3, 5)),
        "03000200-0400-0500-0006-000700080009"
    );
    assert_eq!(
        render_uuid(&raw, (2, 6)),
        "03000200-0400-0500-0006-000700080009"
    );
    assert_eq!(
        render_uuid(&raw, (2, 5)),
        "00020003-0004-0005-0006-000700080009"
    );
    let Some(bytes) = fixture_bytes("HyperV") else {
        return;
    };
    let old = from_raw_table(bytes, Some((2, 4))).map(|t| t.facts().system_uuid());
    assert_eq!(
        old.ok().flatten().as_deref(),
        Some("ef4968b2-b04f-034e-a9d1-1a165a40c8d7")
    );
}

#[test]
fn versions_parse() {
    assert_eq!(parse_version("3.3").ok(), Some((3, 3)));
    assert_eq!(parse_version(" 2.7 ").ok(), Some((2, 7)));
    assert!(parse_version("3").is_err());
    assert!(parse_version("x.y").is_err());
}

#[test]
fn broken_files_are_errors() {
    assert!(matches!(
        from_raw_table(vec![], None),
        Err(SmbiosError::NoStructures(0))
    ));
    assert!(matches!(
        from_raw_table(vec![1, 2, 3], None),
        Err(SmbiosError::NoStructures(3))
    ));
    // An entry point whose table lies past the end of the file.
    let mut ep = vec![0u8; 0x18];
    ep[..5].copy_from_slice(b"_SM3_");
    ep[7] = 3;
    ep[0x10..0x18].copy_from_slice(&0x1000u64.to_le_bytes());
    assert!(matches!(
        from_dump_bin(&ep),
        Err(SmbiosError::TableOutOfFile { .. })
    ));
    assert!(from_dump_bin(b"_SM3_").is_err());
    assert!(matches!(
        load_file(Path::new("/nonexistent/table.dmi"), None),
        Err(SmbiosError::Io { .. })
    ));
}

#[test]
fn a_truncated_dump_gives_a_partial_table() {
    let Some(bytes) = fixture_bytes("Beelink-EQ12") else {
        return;
    };
    // Cut in the middle of the table: the structures before the cut still decode.
    let t = from_dump_bin(&bytes[..0x20 + 400]);
    let f = t.map(|t| t.facts());
    assert_eq!(
        f.ok().and_then(|f| f.bios_vendor),
        Some("American Megatrends International, LLC.".into())
    );
}

/// A `dmidecode --dump-bin` image: a 64-bit entry point announcing `announced` bytes of table
/// at 0x20, then `table`.
fn dump_bin(table: &[u8], announced: u32) -> Vec<u8> {
    let mut b = vec![0u8; 0x20];
    b[..5].copy_from_slice(b"_SM3_");
    b[6] = 0x18;
    b[7] = 3;
    b[8] = 3;
    b[0x0C..0x10].copy_from_slice(&announced.to_le_bytes());
    b[0x10..0x18].copy_from_slice(&0x20u64.to_le_bytes());
    b.extend_from_slice(table);
    b
}

#[test]
fn a_structure_past_the_announced_length_gets_a_note() {
    // Type 0 (18 bytes, one string), type 1 (27 bytes, serial string), end of table.
    let mut t = vec![0u8, 18, 0, 0, 1, 0, 0, 0];
    t.resize(18, 0);
    t.extend_from_slice(b"Made Up BIOS\0\0");
    let type1_at = t.len();
    let mut s1 = vec![1u8, 27, 1, 0, 0, 0, 0, 1];
    s1.resize(27, 0);
    t.extend_from_slice(&s1);
    t.extend_from_slice(b"SN-42\0\0");
    t.extend_from_slice(&[127, 4, 0x7f, 0, 0, 0]);
    let whole = u32::try_from(t.len()).unwrap_or(0);
    let fits = from_dump_bin(&dump_bin(&t, whole));
    assert!(
        fits.as_ref()
            .is_ok_and(|t| !t.warnings.iter().any(|w| w.contains("announced length"))),
        "{:?}",
        fits.map(|t| t.warnings)
    );
    // The entry point announces less than the type 1 structure needs.
    let short = u32::try_from(type1_at + 10).unwrap_or(0);
    let t = from_dump_bin(&dump_bin(&t, short));
    let warnings = t.as_ref().map(|t| t.warnings.clone()).unwrap_or_default();
    assert!(
        warnings.iter().any(|w| w.contains(&format!(
            "structure type 1 (handle 0x0001) at offset {type1_at} ends at byte {}",
            type1_at + 27 + 7
        )) && w.contains(&format!("announced length of {short} bytes"))),
        "{warnings:?}"
    );
    // The structures before it are decoded; it is not (dmidecode prints <TRUNCATED>).
    let f = t.map(|t| t.facts()).ok();
    assert_eq!(
        f.as_ref().and_then(|f| f.bios_vendor.as_deref()),
        Some("Made Up BIOS")
    );
    assert_eq!(f.and_then(|f| f.system_serial), None);
}

/// Everything a table can be put through: load, facts, and the hardware key report.
fn exercise(bytes: &[u8]) {
    for t in [from_dump_bin(bytes), from_raw_table(bytes.to_vec(), None)]
        .into_iter()
        .flatten()
    {
        let f = t.facts();
        let _ = f.system_uuid();
        let r = crate::hwkey::report_from_table(&t, "fuzz");
        assert_eq!(r.trusted, r.lines.len() >= 2);
        let _ = crate::hwkey::render_table(&r, true);
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, u8),
    Remove(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        let n = b.len().max(1);
        match *m {
            Mutation::Flip(i, x) => {
                if let Some(v) = b.get_mut(i % n) {
                    *v = x;
                }
            }
            Mutation::Truncate(i) => b.truncate(i % n),
            Mutation::Insert(i, x) => {
                let at = i % (b.len() + 1);
                b.insert(at, x);
            }
            Mutation::Remove(i) => {
                if !b.is_empty() {
                    b.remove(i % b.len());
                }
            }
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        exercise(&bytes);
    }

    #[test]
    fn random_bytes_behind_an_entry_point_never_panic(
        major in any::<u8>(), minor in any::<u8>(), len in any::<u32>(), addr in any::<u64>(),
        tail in proptest::collection::vec(any::<u8>(), 0..1024),
    ) {
        let mut b = vec![0u8; 0x20];
        b[..5].copy_from_slice(b"_SM3_");
        b[7] = major;
        b[8] = minor;
        b[0x0C..0x10].copy_from_slice(&len.to_le_bytes());
        b[0x10..0x18].copy_from_slice(&(addr % 0x400).to_le_bytes());
        b.extend(tail);
        exercise(&b);
    }

    #[test]
    fn mutated_real_tables_never_panic(
        which in 0..NAMES.len(),
        muts in proptest::collection::vec(mutation(), 1..12),
    ) {
        if let Some(bytes) = fixture_bytes(NAMES[which]) {
            exercise(&apply(bytes, &muts));
        }
    }
}
