use super::*;

/// The shared SMBIOS fixtures directory.
pub(crate) const FIXTURES: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/smbios");

#[test]
fn dump_facts() {
    for name in [
        "ASRock-Single-Ryzen",
        "Beelink-EQ12",
        "Dell-PowerEdge-R630-Dual-Xeon",
        "HyperV",
        "SuperMicro-Dual-Xeon",
        "SuperMicro-Quad-Opteron",
    ] {
        let t = load_file(&Path::new(FIXTURES).join(format!("{name}.dmi")), None);
        match t {
            Ok(t) => {
                let f = t.facts();
                println!(
                    "{name}: v{:?} ser={:?} board={:?} ch={:?} uuid={:?} dimms={}",
                    t.version,
                    f.system_serial,
                    f.board_serial,
                    f.chassis_serial,
                    f.system_uuid(),
                    f.dimms.len()
                );
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
}
